"""Defaults from a config file, as flags: ``config.toml`` in platformdirs'
config folder (``~/.config/localllm/config.toml`` on Linux; ``localllm config``
shows the path and what it sets).

Top-level keys are flag names without dashes (``ctx = 8192``, ``kv-type =
"q8_0"``, ``temp = 0.7``) and apply to every command that has that flag; a
``[run]``-style table applies to one command and wins. A value becomes the
flag it names, inserted before the command line's own, so a flag typed wins
and every value goes through the same checks as a typed one. The file is
untrusted: bad TOML, an unknown key or a bad value is one line naming the file
and the key, exit 2. ``[mcp.servers.NAME]`` tables are MCP servers, checked by
``localllm.mcp.config``; ``[sessions]``, the saved sessions' KV budget, by
``localllm.chat.kept``. A model table's ``tuned`` key is ``localllm tune``'s
record of the settings it wrote there (``localllm.tune.section``): checked,
never a flag.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from localllm import paths
from localllm.errors import UsageError
from localllm.mcp import config as mcp_config
from localllm.tune import section
from localllm.util import config_toml


def config_file() -> Path:
    """The config file's path (``paths.config_file``: ``LOCALLLM_CONFIG``, else
    ``LOCALLLM_HOME``'s, else platformdirs' user config folder)."""
    return paths.config_file()


MAX_CONFIG_BYTES = config_toml.MAX_CONFIG_BYTES


def load(path: Path | None = None) -> dict[str, Any]:
    """The file's table ({} when there is none), read under bounds (``util.config_toml``)."""
    return config_toml.read(path or config_file())


def _options(sub: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s[2:]: a for s, a in sub._option_string_actions.items() if s.startswith("--")}  # noqa: SLF001 - argparse has no public map


MODELS = "models"  # [models."NAME"]: one model's settings (issue 46), applied wherever that model is loaded


def tokens(table: dict[str, Any], command: str, subparsers: dict[str, argparse.ArgumentParser], path: Path,
           model: str | None = None) -> list[str]:
    """The flags ``table`` sets for ``command`` (and, when it loads ``model``, that
    model's ``[models."NAME"]`` table's, which win), checked as typed ones are."""
    from localllm.chat import kept  # lazy: the kept sessions' module (4.6 ms measured), for a config file that has tables

    known = set().union(*(_options(p) for p in subparsers.values()))
    for key, value in table.items():
        if key == MODELS and isinstance(value, dict):
            _check_models(value, known, path)
        elif key == mcp_config.TABLE:  # [mcp.servers.NAME]: MCP servers (localllm.mcp), not flags
            mcp_config.parse_settings(value, path)
        elif key == kept.TABLE:  # [sessions]: the kept KV caches' disk budget (chat.kept), not flags
            kept.parse_settings(value, path)
        elif isinstance(value, dict):
            if key not in subparsers:
                raise UsageError(f"{path}: [{key}] is not a localllm command")
            unknown = [k for k in value if k not in _options(subparsers[key])]
            if unknown:
                raise UsageError(f"{path}: [{key}] has no option '{unknown[0]}' (localllm {key} --help lists them)")
        elif key not in known:
            raise UsageError(f"{path}: '{key}' is no localllm option (give flag names without dashes, e.g. ctx = 8192)")
    sub = subparsers.get(command)
    if sub is None:
        return []
    opts = _options(sub)
    merged = {k: v for k, v in table.items() if not isinstance(v, dict) and k in opts}
    if command != mcp_config.TABLE:  # the [mcp] table holds servers, not the mcp command's flags
        merged.update(table.get(command, {}) if isinstance(table.get(command), dict) else {})
    merged.update(model_table(table, model, opts))
    out: list[str] = []
    for key, value in merged.items():
        out += _flag(key, value, opts[key], path)
    return out


def model_table(table: dict[str, Any], model: str | None, opts: dict[str, argparse.Action]) -> dict[str, Any]:
    """``[models."NAME"]``'s settings for ``model`` (the name as given, or a path's
    file name without .gguf; case does not matter: ``tune.section.model_entry``),
    those ``opts`` has: ``parallel`` applies to serve, not to run, as a top-level
    key applies where the flag exists; ``tune``'s record is no flag."""
    found = section.model_entry(table, model)
    return {k: v for k, v in found[1].items() if k in opts} if found else {}


def _check_models(models: dict[str, Any], known: set[str], path: Path) -> None:
    for name, settings in models.items():
        if not isinstance(settings, dict):
            raise UsageError(f'{path}: models.{name!r} must be a table: [models."{name}"] with flag names, e.g. ctx = 8192')
        if section.TUNED in settings:  # what localllm tune wrote: checked, never a flag
            section.check_record(settings[section.TUNED], f'{path}: [models."{name}"]')
        unknown = [k for k in settings if (k not in known or k in _NOT_PER_MODEL) and k != section.TUNED]
        if unknown:
            raise UsageError(f'{path}: [models."{name}"] has no option \'{unknown[0]}\' (a model\'s table takes load and sampling options, e.g. ctx)')


# options that name or choose the model, or belong to the server rather than to a model
SERVER_WIDE = frozenset({"model", "models", "models-max", "keep-alive", "sleep-idle-seconds", "host", "port", "api-key", "alias", "cors",
                         "models-preset", "default-model"})
_NOT_PER_MODEL = SERVER_WIDE


def _flag(key: str, value: Any, action: argparse.Action, path: Path) -> list[str]:
    where = f"{path}: {key} = {value!r}"
    if action.nargs == 0:  # a switch
        if not isinstance(value, bool):
            raise UsageError(f"{where}: give true or false")
        return [f"--{key}"] if value else []
    if isinstance(value, (dict, list, bool)) or value is None:
        raise UsageError(f"{where}: give a number or a string")
    text = str(value)
    check_value(text, action, where)
    return [f"--{key}", text]


def check_value(text: str, action: argparse.Action, where: str) -> None:
    """``text`` as ``action`` would take it typed (its type and choices), or one line
    starting with ``where``: the config file's values, and a presets INI's (``preset_ini``)."""
    try:
        checked = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError, UsageError) as exc:
        raise UsageError(f"{where}: {exc}") from None
    if action.choices is not None and checked not in action.choices:
        raise UsageError(f"{where}: choose one of {', '.join(map(str, action.choices))}")

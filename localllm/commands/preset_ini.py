"""llama-server's presets INI (``--models-preset``), read into the config
file's shape, so a llama-server user's file works as it is.

llama-server's format (``docs/preset.md``, ``common/preset.cpp``): keys before
any section (``version = 1``) describe the file; ``[*]`` holds options for every
model; ``[NAME]`` one model's. Keys are llama-server's option names without the
dashes (``ctx-size``, ``c``, ``n-gpu-layers``, ``temp``); ``load-on-startup =
true`` loads that model when the server starts. Here a section's name is a
model of ``localllm list``.

The file is untrusted: only a regular file is read, at most ``config_toml.MAX_CONFIG_BYTES``; an
unknown option, a llama-server option serve refuses, a server-wide option in a
model's section or a section's ``model``/``hf`` (a file or download: here
models are named from ``localllm list``) is one line naming the file, the
section and the key. Values go through the same checks as typed ones (the
caller parses the flags made here).
"""

from __future__ import annotations

import argparse
import configparser
from dataclasses import dataclass, field
from pathlib import Path

from localllm.commands import config_file as config
from localllm.errors import UsageError
from localllm.util import config_toml

EVERY = "*"
_FILE_KEYS = frozenset({"version"})  # about the file, before any section
_TRUE, _FALSE = frozenset({"1", "true", "on", "yes", "enabled"}), frozenset({"0", "false", "off", "no", "disabled"})
_SOURCE = frozenset({"model", "m", "hf", "hf-repo", "hfr", "hf-file", "hff", "model-url", "mu"})


@dataclass(frozen=True)
class Preset:
    """The file's flags: for every model (``[*]``), per model (by lower-case name), and what loads at start."""

    path: Path
    every: tuple[str, ...] = ()
    models: dict[str, tuple[str, ...]] = field(default_factory=dict)
    on_startup: tuple[str, ...] = ()

    def flags(self, name: str) -> list[str]:
        """``[*]``'s flags, then ``name``'s section's (which win)."""
        return [*self.every, *self.models.get(name.lower(), ())]


def read(path: Path, serve: argparse.ArgumentParser, refused: frozenset[str]) -> Preset:
    """The preset at ``path`` for ``serve``'s parser; ``refused``: the option strings serve refuses by name."""
    text = _text(path)
    parser = configparser.ConfigParser(interpolation=None, strict=True, default_section="\0none", delimiters=("=",),
                                       comment_prefixes=(";", "#"), inline_comment_prefixes=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys as written: -c and -C differ
    try:
        parser.read_string("[\0file]\n" + text, source=str(path))
    except configparser.Error as exc:
        raise UsageError(f"{path}: not a presets INI ({str(exc).splitlines()[0][:200]})") from None
    opts = {s.lstrip("-"): a for s, a in serve._option_string_actions.items()}  # noqa: SLF001 - argparse has no public map
    every: tuple[str, ...] = ()
    models: dict[str, tuple[str, ...]] = {}
    startup: list[str] = []
    for section in parser.sections():
        items = dict(parser.items(section))
        if section == "\0file":
            unknown = [k for k in items if k not in _FILE_KEYS]
            if unknown:
                raise UsageError(f"{path}: '{unknown[0]}' before any section: put options under [*] (every model) or [NAME] (one model)")
            continue
        where = f"{path}: [{section}]"
        if not section.strip() or not section.isprintable():
            raise UsageError(f"{where}: a section names a model of localllm list, or * for every model")
        flags: list[str] = []
        for key, value in items.items():
            if key == "load-on-startup":
                if _switch(value, f"{where} {key}"):
                    if section == EVERY:
                        raise UsageError(f"{where}: load-on-startup names one model: put it in that model's section")
                    startup.append(section)
                continue
            flags += _flag(key, value, opts, refused, where)
        if section == EVERY:
            every = tuple(flags)
        else:
            models[section.lower()] = tuple(flags)
    return Preset(path, every, models, tuple(startup))


def _text(path: Path) -> str:
    text = config_toml.read_text(path, what="a presets INI", fix="a presets INI is a text file)")
    if text is None:
        raise UsageError(f"--models-preset {path}: no such file")
    return text


def _switch(value: str, where: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise UsageError(f"{where} = {value!r}: give true or false")


def _flag(key: str, value: str, opts: dict[str, argparse.Action], refused: frozenset[str], where: str) -> list[str]:
    """``key = value`` as serve's flag (llama-server's names are serve's aliases)."""
    if key in _SOURCE:
        raise UsageError(f"{where}: '{key}' is not read here: a section names a model of localllm list "
                         "(localllm add PATH or localllm pull REPO adds one)")
    action = opts.get(key)
    spelled = f"--{key}" if action is not None and f"--{key}" in action.option_strings else f"-{key}"
    if action is None or spelled in refused:
        raise UsageError(f"{where}: '{key}' is not an option serve takes (localllm serve --help lists them)")
    if action.dest.replace("_", "-") in config.SERVER_WIDE or key in config.SERVER_WIDE:
        raise UsageError(f"{where}: '{key}' is the server's, not a model's: give it to serve itself")
    if action.nargs == 0:
        return [spelled] if _switch(value, f"{where} {key}") else []
    text = value.strip()
    config.check_value(text, action, f"{where} {key} = {text!r}")
    return [f"{spelled}={text}"]

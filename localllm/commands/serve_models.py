"""Each model's own options in router mode: what ``serve NAME`` would load it with.

``serve MODEL`` applies the config file's ``[models."NAME"]`` table when the
command line is parsed (``cli.with_config``). The router serves many models
from one command line, so it asks here, per model, for the same result:

    the config file (top level, [serve], [models."NAME"])
    < the presets INI's [*]  < its [NAME]  (--models-preset, llama-server's)
    < what was typed on serve's command line

(llama-server's order: its command line, then the model's section, then
``[*]``). The result is a whole ``serve`` namespace, so a model's fit (the
router's memory plan) and its child's command line come from the same values,
checked by the same parser as typed ones.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import TYPE_CHECKING

from localllm.commands._common import say
from localllm.errors import UsageError

if TYPE_CHECKING:
    from localllm.commands.preset_ini import Preset


class PerModel:
    """``serve``'s options for each model the router loads."""

    def __init__(self, args: argparse.Namespace, preset: Preset | None, refused: frozenset[str] = frozenset()) -> None:
        from localllm.commands import config_file as config  # lazy: the config file's reader (tomllib, tempfile: ~11 ms), which --help does not need

        self.base = args
        self.serve: argparse.ArgumentParser = args.subparsers["serve"]
        self.typed: list[str] = list(args.typed_argv or [])
        self.preset = preset
        self._refused = refused
        self.path = config.config_file()
        self.table = config.load(self.path)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one per router, for the router's life
    def args(self, name: str) -> argparse.Namespace:
        """The namespace ``serve`` would have for ``name``: the layers above, parsed as typed ones are."""
        from localllm.commands import config_file as config  # lazy: as in __init__

        if not self.table and self.preset is None:
            return self.base
        subs = self.base.subparsers
        flags = config.tokens(self.table, "serve", subs, self.path, model=name)
        flags = ["--default-model" if f == "--model" else f for f in flags]  # the config's default model: the router's to autoload (cli.with_config)
        if self.preset is not None:
            flags += self.preset.flags(name)
        parsed = self.serve.parse_args([*flags, *self.typed])
        parsed.command = "serve"
        parsed.subparsers = subs
        parsed.model = None
        parsed.model_flag = None
        return parsed

    def reload(self) -> None:
        """Read the config file and the presets INI again (llama-server's POST /models/reload);
        a file that became bad keeps the options read before, and says why."""
        from localllm.commands import config_file as config  # lazy: as in __init__
        from localllm.commands import preset_ini  # lazy: as preset_of

        try:
            table = config.load(self.path)
            preset = preset_ini.read(self.preset.path, self.serve, self._refused) if self.preset is not None else None
        except UsageError as exc:
            say(f"reload: kept the options read before: {exc}")
            return
        self.table, self.preset = table, preset
        self.args.cache_clear()

    def check(self) -> None:
        """Parse each named model's options now, so a bad combination is said at start, not at its first request."""
        from localllm.commands import config_file as config  # lazy: as in __init__

        named = set(self.preset.models) if self.preset is not None else set()
        tables = self.table.get(config.MODELS)
        named |= set(tables) if isinstance(tables, dict) else set()
        for name in sorted(named):
            self.args(name)


def preset_of(path: str | None, serve: argparse.ArgumentParser, refused: frozenset[str]) -> Preset | None:
    """``--models-preset``'s file (``path``), read with serve's parser (None without one)."""
    from localllm.commands import preset_ini  # lazy: configparser, for router mode with a preset only

    return None if path is None else preset_ini.read(Path(path).expanduser(), serve, refused)

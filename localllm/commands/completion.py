"""``localllm completion bash|zsh|fish``: a completion script for the shell,
made from the parser itself (commands, each command's flags and the choices of
its options), with model names asked at completion time from ``localllm
completion --names`` (every name ``list`` knows, and the catalog's).

    source <(localllm completion bash)          # ~/.bashrc
    source <(localllm completion zsh)           # ~/.zshrc
    localllm completion fish | source           # ~/.config/fish/config.fish
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localllm.errors import UsageError

if TYPE_CHECKING:
    from localllm.flags import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser("completion", help="a shell completion script (bash, zsh, fish), model names included")
    p.add_argument("shell", nargs="?", choices=("bash", "zsh", "fish"), default=None, help="the shell")
    p.add_argument("--names", action="store_true", help="print the model names a model argument takes, one per line")
    p.set_defaults(subparsers=None)  # every command's parser: cli.main hands them over


@dataclass(frozen=True)
class Options:
    shell: str | None
    names: bool
    subparsers: dict[str, argparse.ArgumentParser]  # each command's parser (cli.main: the commands do not import the CLI)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(shell=ns.shell, names=ns.names, subparsers=dict(ns.subparsers or {}))


def model_names() -> list[str]:
    """Names a model argument takes: the registry's (built-in, pulled, found,
    added) and the catalog's, each quant too; no header is read. A name comes from
    a file on disk, so it is untrusted: one with a control character (a newline
    would split it into two names, an escape would draw on the terminal) is left
    out; the scripts quote every other one."""
    # lazy: the catalog loads gguf (~0.1 s), the registry hashlib and tempfile (~12 ms): --help (register above) needs neither
    from localllm.store import curated, registry

    names = {e.name for e in registry.discover()}
    for m in curated.load():
        names.add(m.name)
        names.update(f"{m.name}:{f.quant.lower()}" for f in m.files)
    return sorted(n for n in names if n and not any(ord(c) < 32 or ord(c) == 127 for c in n))


def _flags(sub: argparse.ArgumentParser) -> list[str]:
    return sorted(s for s in sub._option_string_actions if s.startswith("-"))  # noqa: SLF001 - argparse has no public map


def bash(subs: dict[str, argparse.ArgumentParser]) -> str:
    cases = "\n".join(f"    {name}) opts={shlex.quote(' '.join(_flags(p)))};;" for name, p in subs.items())
    return f"""# localllm completion for bash (and zsh through bashcompinit)
_localllm() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="${{COMP_WORDS[1]}}" opts=""
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W {shlex.quote(' '.join(subs))} -- "$cur")); return
  fi
  case "$cmd" in
{cases}
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    return
  fi
  # Model and file names come from disk: never through compgen -W, which expands
  # each word again ($(...), backticks, $((...)) would run), nor through an
  # unquoted $(...), which splits and globs. Each is matched as plain text and
  # inserted escaped (printf %q), so it completes as itself.
  COMPREPLY=()
  local name
  while IFS= read -r name; do
    [[ "$name" == "$cur"* ]] && COMPREPLY+=("$(printf '%q' "$name")")
  done < <(localllm completion --names 2>/dev/null)
  while IFS= read -r name; do
    COMPREPLY+=("$(printf '%q' "$name")")
  done < <(compgen -f -- "$cur")
}}
complete -F _localllm localllm
"""


def zsh(subs: dict[str, argparse.ArgumentParser]) -> str:
    return "# localllm completion for zsh\nautoload -U +X bashcompinit && bashcompinit\n" + bash(subs)


def fish(subs: dict[str, argparse.ArgumentParser]) -> str:
    lines = ["# localllm completion for fish", "complete -c localllm -f",
             f"complete -c localllm -n __fish_use_subcommand -a {shlex.quote(' '.join(subs))}"]
    for name, p in subs.items():
        seen = f"__fish_seen_subcommand_from {name}"
        for flag in _flags(p):
            kind = "-l" if flag.startswith("--") else "-o"
            lines.append(f"complete -c localllm -n {shlex.quote(seen)} {kind} {shlex.quote(flag.lstrip('-'))}")
        lines.append(f"complete -c localllm -n {shlex.quote(seen)} -a '(localllm completion --names 2>/dev/null)'")
    return "\n".join(lines) + "\n"


SHELLS = {"bash": bash, "zsh": zsh, "fish": fish}


def run(args: argparse.Namespace) -> int:
    opts = Options.from_args(args)
    if opts.names:
        print("\n".join(model_names()))
        return 0
    if opts.shell is None:
        raise UsageError("name the shell: localllm completion bash (or zsh, fish)")
    print(SHELLS[opts.shell](opts.subparsers), end="")
    return 0

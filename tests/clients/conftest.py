"""The real clients people point at ``localllm serve`` (issue 59, item 6): their
own CLIs from npm (Claude Code, Codex, opencode), installed pinned by
``scripts/install.sh --test`` under ``.venv/clients``, each run against the
router on loopback started as a new user starts it: ``localllm serve`` and
nothing else (the default context is the plan's, not a flag)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import router as rt
from tests.helpers.paths import REPO
from tests.helpers.router import isolated_env
from tests.helpers.server import Server

CLIENTS = REPO / ".venv" / "clients"


def client_bin(name: str) -> Path:
    """A client's program, as install.sh --test installed it; a failure that names the fix if it did not."""
    path = CLIENTS / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/install.sh --test (it installs the pinned npm clients)")
    return path


def pinned(package: str) -> str:
    """The version install.sh pinned for ``package`` (its .pinned line)."""
    for word in (CLIENTS / ".pinned").read_text().split():
        name, _, version = word.rpartition("@")
        if name == package:
            return version
    raise AssertionError(f"{package} is not among {CLIENTS / '.pinned'}")


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, gemma: Path) -> Iterator[Server]:
    """``localllm serve`` with no MODEL, in a data directory of its own (Gemma 3 linked
    in, as it would be after its first use). No option but its key, its port and
    ``-n 64``: the reply's length where a request names none (Codex names none, and
    a model that does not stop would write to the end of the context); the context
    is serve's default."""
    env = rt.with_gemma(isolated_env(tmp_path_factory.mktemp("clients")), gemma)
    yield from rt.running(env, "-n", "64", small=False)


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """A client's environment: a home of its own, nothing sent anywhere but to serve."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_"))}
    home.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local" / "share"),
               XDG_CACHE_HOME=str(home / ".cache"), XDG_STATE_HOME=str(home / ".local" / "state"), DISABLE_AUTOUPDATER="1",
               DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", NO_COLOR="1", **extra)
    return env


def answered(server: Server, path: str) -> list[str]:
    """The router's log lines for ``path``'s requests (each names its status)."""
    return [ln for ln in server.lines if f" {path} " in ln or ln.rstrip().endswith(f" {path}")]

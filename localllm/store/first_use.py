"""Pull on first use, as ``ollama run`` and ``llama-cli -hf`` do: ``run``,
``chat``, ``tui`` and ``serve`` of a Hub name that is not downloaded show the
plan first (the file, its size, whether it fits and how, and the time to
download it at the rate its header came at), ask on a terminal, then pull it.

The plan comes from the model's header alone (``names.header_of``: a sparse
stub, llama.cpp's dry run included), so nothing is downloaded for a model that
would not fit. ``--yes`` skips the question; ``--no-pull`` refuses; with the Hub
off (``HF_HUB_OFFLINE``) it is one line. Without a terminal there is no one to
ask: it pulls, as Ollama does.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from localllm.engine_api import LoadConfig
from localllm.errors import InputError
from localllm.plan import fitting, hardware, prepare
from localllm.store import hub, names, resolver
from localllm.util import fmt

Ask = Callable[[str], bool]


def model_path(name: str | None, *, yes: bool = False, no_pull: bool = False, ask: Ask | None = None,
               say: Callable[[str], None] = print, progress: bool = True, vram: int | None = None, n_ctx: int | None = None,
               request: fitting.Request | None = None) -> Path:
    """The file ``name`` stands for (``resolver.resolve``); a Hub name not yet
    downloaded is planned with ``request`` (the options given: the default
    load otherwise), asked about (``ask``: None when there is no terminal),
    and pulled."""
    try:
        return resolver.resolve(name)
    except names.NotDownloaded as nd:
        return _pull_first(nd, yes=yes, no_pull=no_pull, ask=ask, say=say, progress=progress, vram=vram, n_ctx=n_ctx,
                           request=request or fitting.Request(LoadConfig()))


def _pull_first(nd: names.NotDownloaded, *, yes: bool, no_pull: bool, ask: Ask | None, say: Callable[[str], None],
                progress: bool, vram: int | None, n_ctx: int | None, request: fitting.Request) -> Path:
    h = nd.name
    if no_pull:
        raise InputError(f"{h.typed} is not downloaded (--no-pull): localllm pull {h.pull_arg} gets it")
    if hub.offline(False):
        raise InputError(f"{h.typed} is not downloaded, and the Hub is off (HF_HUB_OFFLINE): localllm pull {h.pull_arg} when online")
    t0 = time.perf_counter()
    with names.header_of(h) as (stub, remote):
        rate = remote.header_bytes / max(time.perf_counter() - t0, 1e-3)
        hw = hardware.detect(vram)
        lp = prepare.prepare_load(stub, request, hw, n_ctx=n_ctx)
    fit = lp.fit
    c = fit.config
    how = (f"fits: {fit.sentence}, context {c.n_ctx:,}, KV {c.type_k}" if fit.fits else f"does not fit: {fit.sentence}")
    eta = remote.file.size / rate
    say(f"{remote.label} is not downloaded: {fmt.size(remote.file.size)}; {how}; "
        f"about {_duration(eta)} to download at {fmt.size(rate)}/s (the rate its header came at)")
    if not fit.fits:
        raise InputError(f"{h.typed} does not fit, so it was not downloaded: {fit.sentence}")
    if not yes and ask is not None and not ask(f"download {remote.file.filename} ({fmt.size(remote.file.size)}) now? [Y/n] "):
        raise InputError(f"{h.typed} not downloaded (you said no): localllm pull {h.pull_arg} gets it later")
    result = hub.pull_all(h.repo_id, remote.file.filename, names.REVISION, progress=progress, reason="pulled on first use",
                          offline_mode=False)
    say(f"downloaded {fmt.size(result.downloaded_bytes)}; sha256 verified; now it is {result.name}")
    return Path(result.path)


def terminal_ask() -> Ask | None:
    """A yes/no question on the terminal (Enter means yes), or None without one."""
    if sys.stdin is None or not sys.stdin.isatty() or not sys.stderr.isatty():
        return None
    return _ask


def _ask(question: str) -> bool:
    print(question, end="", file=sys.stderr, flush=True)
    try:
        answer = input()
    except EOFError:
        return False
    return answer.strip().lower() in ("", "y", "yes")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

"""The context a server asks for when the user names none (issue 59, item 3):
the trained one, as llama-server's ``-c 0``, then fitted to the device; ``run``
keeps at most 4096. Decided in one place (``fitting.default_ctx``) and said
with its reason (``fitting.context_why``) by serve's start line and ``/api/ps``."""

from __future__ import annotations

from pathlib import Path

from localllm.engine_api import LoadConfig
from localllm.plan import fitting, prepare
from localllm.plan.hardware import Hardware


def _fit(path: Path, n_ctx: int, ram: int, n_seq: int = 1) -> fitting.Fit:
    hw = Hardware(None, None, None, "none", ram, ram)
    return prepare.prepare_load(path, fitting.Request(LoadConfig(n_ctx=n_ctx, n_seq=n_seq)), hw, n_ctx=n_ctx, n_seq=n_seq, dry_run=None).fit


def test_a_server_asks_for_the_trained_context_and_run_for_at_most_4096() -> None:
    assert fitting.default_ctx(32768, serving=True) == 32768
    assert fitting.default_ctx(32768) == 4096
    assert fitting.default_ctx(2048, serving=True) == fitting.default_ctx(2048) == 2048
    assert fitting.default_ctx(None, serving=True) == fitting.DEFAULT_CTX


def test_the_trained_context_when_it_fits_else_the_largest_that_does(gemma: Path) -> None:
    trained = 32768
    roomy = _fit(gemma, trained * 4, ram=64 * 2**30, n_seq=4)
    assert roomy.config.n_ctx == trained * 4
    assert fitting.context_why(roomy, 4) == "32768: the trained context"
    # the same four sequences on a machine with about 450 MiB: the pool shrinks, parallel counted
    tight = _fit(gemma, trained * 4, ram=450 * 2**20, n_seq=4)
    assert tight.fits and tight.config.n_ctx < trained * 4
    per = tight.config.n_ctx // 4
    assert fitting.context_why(tight, 4) == f"{per}: the largest that fits (asked 32768, trained 32768)"
    one = _fit(gemma, trained, ram=450 * 2**20)  # one sequence gets more of the same memory
    assert one.config.n_ctx > per

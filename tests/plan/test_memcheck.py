"""The post-load memory check: n/a only where llama.cpp logged no allocations;
a check that itself breaks says so instead of passing for n/a."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.plan import memcheck

LINE = "llama_context:        CPU compute buffer size =     4.51 MiB"


def test_no_allocation_lines_is_n_a(synth_model: Path) -> None:
    assert memcheck.check_after_load(synth_model, LoadConfig(n_ctx=512), ["unrelated line"]) is None


def test_a_check_that_breaks_is_reported_not_hidden(synth_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kw: object) -> memcheck.MemoryCheck:
        raise TypeError("bad operand")

    monkeypatch.setattr(memcheck, "check_load", broken)
    mc = memcheck.check_after_load(synth_model, LoadConfig(n_ctx=512), [LINE])
    assert mc is not None and not mc.ok and mc.error == "TypeError: bad operand"
    assert mc.report_lines() == ["memory check: the check itself failed (TypeError: bad operand); the load went on: please report it"]
    assert mc.to_dict()["error"] == "TypeError: bad operand"

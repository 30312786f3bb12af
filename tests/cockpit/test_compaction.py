"""Compaction in the cockpit's session, without its screen: due at the settings'
fraction of the context once there are turns to summarize, run on the engine
thread, its figures kept until another model loads; the setting read back from
a saved session."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from localllm.cockpit.session import CockpitSession
from localllm.cockpit.settings import Settings
from localllm.compaction.split import SUMMARY_LABEL
from localllm.plan.hardware import Hardware
from localllm.testing import ScriptedEngine

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)


def _session(model: Path, engine: ScriptedEngine, **settings) -> CockpitSession:
    s = CockpitSession(model, lambda: engine, ROOMY, Settings(**{"n_ctx": 1024, "system_prompt": "", **settings}))
    s.bandwidth = 20e9
    res = s.load(s.request())
    assert res is not None and res.error is None
    s.adopt(res)
    s.start_chat(res)
    return s


def _say(s: CockpitSession, text: str) -> None:
    assert s.chat is not None
    s.generate(s.chat, {"role": "user", "content": text}, [], 0, threading.Event())


def test_due_at_the_fraction_once_there_are_turns_to_summarize(synth_model: Path) -> None:
    engine = ScriptedEngine(ttft_ms=0, itl_ms=0, tokens=20, n_ctx=100)
    s = _session(synth_model, engine, compact_at=0.5)
    try:
        _say(s, "one two three")
        _say(s, "four five six")
        assert s.chat is not None and s.chat.context_used >= 50
        assert not s.compaction_due()  # over half full, but only the two turns kept whole
        _say(s, "seven eight nine")
        assert s.compaction_due()
        s.settings = replace(s.settings, compact_at=None)
        assert not s.compaction_due()  # off: the sliding window alone
    finally:
        s.close()


def test_a_compaction_runs_on_the_engine_thread_and_its_figures_stay_with_the_model(synth_model: Path) -> None:
    threads: list[str] = []

    class Watched(ScriptedEngine):
        def prefill(self, tokens):
            threads.append(threading.current_thread().name)
            return super().prefill(tokens)

    s = _session(synth_model, Watched(ttft_ms=0, itl_ms=0, tokens=12))
    try:
        for word in ("alpha", "beta", "gamma", "delta", "epsilon"):
            _say(s, word)
        assert s.chat is not None
        result = s.compact(s.chat)
        assert result is not None and s.compacted is result and result.tokens_after < result.tokens_before
        assert threads and all(t.startswith("llama") for t in threads)
        assert [m["role"] for m in s.chat.messages] == ["system", "user", "assistant", "user", "assistant"]  # the last two turns whole
        assert s.chat.messages[0]["content"].startswith(SUMMARY_LABEL)
        res = s.load(s.request())
        assert res is not None
        s.adopt(res)
        assert s.compacted is None  # another load: the figures were the other chat's
    finally:
        s.close()


@pytest.mark.parametrize("saved, want", [({"compact_at": None}, None), ({"compact_at": 0.5}, 0.5), ({"compact_at": 1.5}, 0.85),
                                         ({"compact_at": "yes"}, 0.85), ({}, 0.85)])
def test_the_setting_is_read_back_from_a_saved_session(saved: dict, want: float | None) -> None:
    assert Settings.from_dict(saved).compact_at == want
    assert Settings().compact_at == 0.85  # on by default in the cockpit

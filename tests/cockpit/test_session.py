"""The cockpit's session without its screen, on the scripted engine: a load and
its rollback, a reply generated on the engine thread and told in events, the
next message counted, the conversation saved, an engine lost, the figures."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from localllm.chat import sessions
from localllm.cockpit import events
from localllm.cockpit.loading import LoadResult
from localllm.cockpit.session import CockpitSession
from localllm.cockpit.settings import Settings
from localllm.errors import EngineError
from localllm.plan.hardware import Hardware
from localllm.testing import ScriptedEngine
from tests.helpers.engines import FailingEngine

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)


class Heard:
    """The session's events, as its threads emit them."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self.done = threading.Event()

    def __call__(self, event: object) -> None:
        self.events.append(event)
        if isinstance(event, events.ReplyEnded):
            self.done.set()

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


def _session(model: Path, engine: ScriptedEngine, **settings) -> tuple[CockpitSession, Heard]:
    s = CockpitSession(model, lambda: engine, ROOMY, Settings(**{"n_ctx": 1024, "system_prompt": "", **settings}))
    s.bandwidth = 20e9  # measured once a process: given, for a quick test
    heard = Heard()
    s.emit = heard
    return s, heard


def _loaded(s: CockpitSession, **kw) -> LoadResult:
    res = s.load(s.request(**kw))
    assert res is not None
    s.adopt(res)
    if res.error is None:
        s.start_chat(res)
    return res


@pytest.fixture
def session(synth_model: Path):
    s, heard = _session(synth_model, ScriptedEngine(ttft_ms=5, itl_ms=1, tokens=6))
    yield s, heard
    s.close()


def test_a_load_fits_and_starts_a_chat(session) -> None:
    s, _ = session
    res = _loaded(s)
    assert res.error is None and s.backend is res.backend and s.chat is not None
    assert s.load_config is not None and s.load_config.n_ctx == 1024
    assert s.footprint is not None and s.footprint.budget_label == "RAM" and s.footprint.budget == ROOMY.ram_available_bytes
    assert s.engine.lost_text == "" and threading.current_thread().name != "llama"


def test_the_loads_run_on_the_one_engine_thread(synth_model: Path) -> None:
    threads: list[str] = []

    class Watched(ScriptedEngine):
        def load(self, path, config, header=None):
            threads.append(threading.current_thread().name)
            return super().load(path, config)

    s, _ = _session(synth_model, Watched(ttft_ms=1, itl_ms=1, tokens=2))
    try:
        _loaded(s)
        _loaded(s, settings=replace(s.settings, n_ctx=512))
    finally:
        s.close()
    assert len(threads) == 2 and len(set(threads)) == 1 and threads[0].startswith("llama")


def test_a_failed_load_brings_the_previous_model_back(synth_model: Path) -> None:
    first, second = FailingEngine(), FailingEngine(EngineError("llama.cpp could not allocate the KV cache"))
    made = iter([first, second])
    s, _ = _session(synth_model, first)
    s.backend_factory = lambda: next(made)
    try:
        _loaded(s)
        res = _loaded(s, settings=replace(s.settings, n_ctx=2048))
        assert res.error == "llama.cpp could not allocate the KV cache" and res.kept
        assert s.backend is first and first.loads == 2 and second.closed == 1  # loaded again as it was; the new one not left open
        assert s.settings.n_ctx == 1024 and s.load_config is not None and s.load_config.n_ctx == 1024  # what was asked never became current
    finally:
        s.close()


def test_a_model_that_cannot_load_leaves_no_model(synth_model: Path, tmp_path: Path) -> None:
    s, _ = _session(synth_model, ScriptedEngine())
    try:
        res = _loaded(s, path=tmp_path / "gone.gguf")
        assert res.error and not res.kept and s.backend is None and s.chat is None
    finally:
        s.close()


def test_a_reply_is_told_in_batches_then_its_end(session) -> None:
    s, heard = session
    _loaded(s)
    assert s.chat is not None
    s.generate(s.chat, {"role": "user", "content": "hello"}, [], 0, threading.Event())
    tokens, ended = heard.of(events.Tokens), heard.of(events.ReplyEnded)
    assert len(ended) == 1 and ended[0].error is None and not ended[0].stopped
    assert ended[0].stats is not None and ended[0].stats.ttft_ms is not None
    assert "".join(t.text for t in tokens) == s.chat.messages[-1]["content"]
    assert sum(len(t.stamps) for t in tokens) == 6 and tokens[0].first_text_ns is not None


def test_a_stopped_reply_ends_at_its_next_token(session) -> None:
    s, heard = session
    _loaded(s)
    stop = threading.Event()
    stop.set()
    assert s.chat is not None
    s.generate(s.chat, {"role": "user", "content": "hello"}, [], 0, stop)
    ended = heard.of(events.ReplyEnded)
    assert ended and ended[0].stopped and sum(len(t.stamps) for t in heard.of(events.Tokens)) == 1


def test_the_next_message_is_counted_on_the_engine_thread(session) -> None:
    s, _ = session
    assert s.count(s.counting({"role": "user", "content": "a b c"}, [], ("key",))) is None  # no chat yet
    _loaded(s)
    counted = s.count(s.counting({"role": "user", "content": "a b c"}, [], ("key",)))
    assert counted is not None and counted.key == ("key",) and counted.new_tokens >= 3 and counted.line is None


def test_the_conversation_is_saved_in_order_off_the_caller(session) -> None:
    s, _ = session
    _loaded(s)
    s.persist(extra_user={"role": "user", "content": "hello"})
    s.wait_for_saves()
    [saved] = sessions.list_sessions()
    assert [m["content"] for m in saved.messages] == ["hello"] and s.saved is not None and saved.id == s.saved.id


def test_a_failing_disk_is_told_once_and_again_when_it_works(session, monkeypatch: pytest.MonkeyPatch) -> None:
    s, heard = session
    _loaded(s)
    real = sessions.save
    monkeypatch.setattr(sessions, "save", lambda saved: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    for text in ("one", "two"):
        s.persist(extra_user={"role": "user", "content": text})
    s.wait_for_saves()
    monkeypatch.setattr(sessions, "save", real)
    s.persist()
    s.wait_for_saves()
    told = [e.text for e in heard.of(events.SaveState)]
    assert len(told) == 2 and "No space left on device" in (told[0] or "") and told[1] is None


def test_a_lost_engine_is_told_once_and_a_new_thread_takes_over(session) -> None:
    s, heard = session
    _loaded(s)
    hung = threading.Event()
    fut = s.engine.submit(hung.wait)  # llama.cpp's aborting thread never comes back
    s.lose("worker 127.0.0.1:50052 stopped answering")
    s.lose("another worker too")
    assert s.engine.wait(fut) is None
    assert [e.text for e in heard.of(events.EngineLost)] == ["worker 127.0.0.1:50052 stopped answering"]
    s.lost("worker 127.0.0.1:50052 stopped answering")
    assert s.backend is None and s.chat is None and s.engine.run(lambda: 42) == 42
    hung.set()


def test_the_roofline_and_a_starved_decode(session) -> None:
    s, heard = session
    _loaded(s)
    assert s.chat is not None
    s.generate(s.chat, {"role": "user", "content": "hello"}, [], 0, threading.Event())
    stats = heard.of(events.ReplyEnded)[0].stats
    assert stats is not None
    ceiling = s.ceiling(stats)
    assert ceiling is not None and ceiling > 0
    assert s.starved(100.0) is None  # the first rate is the reference
    found = s.starved(25.0)
    assert found is not None and found[0][0] == 100.0 and found[1] >= 1
    s.bandwidth = None
    assert s.ceiling(stats) is None  # not measured: no roofline


def test_the_end_closes_the_model_and_the_threads(synth_model: Path) -> None:
    engine = FailingEngine()
    s, _ = _session(synth_model, engine)
    _loaded(s)
    s.close()
    assert engine.closed == 1
    with pytest.raises(RuntimeError):
        s.engine.submit(lambda: None)


def test_no_context_set_is_the_plans_default(synth_model: Path) -> None:
    """The default context is decided once, by the plan (``fitting.default_ctx``): the cockpit's settings leave it blank."""
    from localllm.modelfile.gguf_file import read_header
    from localllm.modelfile.model_info import describe
    from localllm.plan import fitting

    assert Settings().n_ctx is None
    s, _ = _session(synth_model, ScriptedEngine(), n_ctx=None)
    try:
        _loaded(s)
        trained = describe(read_header(synth_model)).context_length
        assert s.load_config is not None and s.load_config.n_ctx == fitting.default_ctx(trained)
        assert s.settings.n_ctx is None and s.settings.ctx_for(trained) == fitting.default_ctx(trained)
    finally:
        s.close()


def test_a_saved_context_is_kept_or_left_to_the_plan() -> None:
    assert Settings.from_dict({"n_ctx": 2048}).n_ctx == 2048
    assert Settings.from_dict({"n_ctx": None}).n_ctx is None
    assert Settings.from_dict({"n_ctx": 0}).n_ctx is None and Settings.from_dict({"n_ctx": "huge"}).n_ctx is None
    assert Settings(n_ctx=8192).ctx_for(2048) == 2048 and Settings(n_ctx=1024).ctx_for(None) == 1024


def test_a_text_conversation_left_is_kept_and_reopens_without_being_read_again(session, synth_model: Path) -> None:
    """Issue 61: leaving a text conversation keeps its KV cache beside its session
    (no image needed); reopened, it is loaded on the engine thread and said so."""
    s, heard = session
    _loaded(s)
    assert s.chat is not None
    s.generate(s.chat, {"role": "user", "content": "hello"}, [], 0, threading.Event())
    s.persist()
    s.leave().result()
    s.wait_for_saves()
    [saved] = sessions.list_sessions()
    assert saved.kv is not None and saved.kv["images"] == [] and sessions.state_path(saved.id).stat().st_size > 0
    _loaded(s, messages=list(saved.messages), saved=saved)
    s.engine.submit(lambda: None).result()  # the resume queued before it has run
    [resumed] = heard.of(events.Resumed)
    assert resumed.text is None and resumed.images == 0 and s.backend is not None and s.backend.context_used == saved.kv["cells"]

"""The cockpit's session: the model loaded, the conversation on it, and the
threads that serve them, apart from any screen.

Every llama.cpp call runs on one engine thread (``EngineThread``); sessions are
written on a disk thread (``Saver``). A front end (the Textual cockpit) calls
the blocking methods here from its own worker threads (``load``, ``count``,
``generate``) and the quick ones from its UI thread; what the threads learn
on their own comes back through ``emit`` (``localllm.cockpit.events``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from localllm.audio.projector import AudioInfo
from localllm.audio.sound import AudioClip
from localllm.chat import sessions
from localllm.chat.session import ChatSession
from localllm.cockpit import loading, replies, saving
from localllm.cockpit.attachments import Count, Pending, count, count_file
from localllm.cockpit.engine_thread import EngineThread
from localllm.cockpit.events import EngineLost, Progress
from localllm.cockpit.loading import Footprint, LoadRequest, LoadResult
from localllm.cockpit.settings import Settings
from localllm.compaction import KEEP_TURNS, compactable, should_compact
from localllm.compaction.conversation import Compaction, compact
from localllm.engine_api import Engine, GenerationStats, LoadConfig
from localllm.forecast import Forecaster, reply_room
from localllm.measure.starved import StarveWatch, advice, busiest_process
from localllm.plan.hardware import Hardware, physical_cores
from localllm.plan.workers import Endpoint
from localllm.vision.image import RGBImage
from localllm.vision.projector import ProjectorInfo

PROGRESS_NS = 100_000_000  # a long prefill's progress: at most ten events a second


def _nothing(event: object) -> None:
    """The events of a session no front end listens to."""


class CockpitSession:
    """What the cockpit holds apart from its screen: the model and its figures,
    the chat and its saved session, the engine and disk threads."""

    def __init__(self, model_path: Path, backend_factory: Callable[[], Engine], hardware: Hardware, settings: Settings) -> None:
        self.model_path = model_path  # the loaded model's file (before the first load: the one to load)
        self.backend_factory = backend_factory
        self.hardware = hardware
        self.settings = settings  # the loaded model's settings (they become current with it)
        self.emit: Callable[[object], None] = _nothing  # the front end's: takes the events of the session's threads
        self.backend: Engine | None = None
        self.load_config: LoadConfig | None = None
        self.chat: ChatSession | None = None
        self.saved: sessions.SavedSession | None = None
        self.footprint: Footprint | None = None
        self.bandwidth: float | None = None  # bytes/s, measured once, for the decode roofline
        self.gpu_bandwidth: float | None = None  # the GPU's, where hardware.gpu_memory_bandwidth knows it
        self.memory_check: object = None  # memcheck.MemoryCheck of the loaded model, or None
        self.rpc: list[Endpoint] = []  # workers whose devices join the local ones (--rpc)
        self.mmproj: Path | None = None  # --mmproj, or the projector found beside the first model
        self.mmproj_model: Path | None = None  # the model it goes with
        self.no_mmproj = False
        self.projector_info: ProjectorInfo | None = None  # the projector loaded with the model, or None (text only)
        self.audio_info: AudioInfo | None = None  # its audio encoder (a clip's tokens), or None: no audio taken
        self.forecaster = Forecaster()  # this model's measured prefills and encodes (new at each load)
        self.wrap: list[int] = []  # what the template added to a typed message's tokens, measured on the last turns
        self.image_refs: dict[str, dict[str, Any]] = {}  # each attached picture's path and pixels' sha256, by sha256
        self.engine = EngineThread()
        self.saver = saving.Saver(lambda event: self.emit(event))
        self._starve = StarveWatch()  # each model's best decode rate here, for the starved-decode advice
        self._progress_ns = 0  # the last prefill progress told (engine thread)
        self.compacted: Compaction | None = None  # the last compaction of the loaded model's chat, for the figures

    # -- loading ------------------------------------------------------------------------
    def request(self, path: Path | None = None, settings: Settings | None = None, *, messages: list[dict[str, str]] | None = None,
                saved: sessions.SavedSession | None = None, redraw: bool = False,
                image_refs: list[dict[str, Any]] | None = None) -> LoadRequest:
        """A load of ``path`` with ``settings`` (by default the current ones), read
        off the session now: the engine thread reads its request, never the session.
        The conversation's images go with ``messages``: those at hand (a reload
        with other settings), else read again from ``image_refs`` (a saved session)."""
        previous = (self.backend, self.model_path, self.load_config) if self.backend is not None and self.load_config is not None else None
        have = {im.sha256: im for im in self.chat.images} if self.chat is not None and messages is not None else {}
        if messages is not None and image_refs is None and self.chat is not None:
            image_refs = self.refs(self.chat.images)
        return LoadRequest(path or self.model_path, settings or self.settings, messages, saved, redraw, previous, self.bandwidth,
                           self.gpu_bandwidth, (self.mmproj, self.mmproj_model, self.no_mmproj), have, image_refs,
                           hardware=self.hardware, rpc=tuple(self.rpc), lost_text=self.engine.lost_text)

    def load(self, req: LoadRequest) -> LoadResult | None:
        """Load ``req`` on the engine thread and wait (off the UI thread); None when llama.cpp aborted meanwhile."""
        return self.engine.run(loading.load, req, self.backend_factory)

    def adopt(self, res: LoadResult) -> None:
        """A load's result becomes the session's: the new model and its figures, or
        (failed, the previous model not restored) no model at all."""
        if res.error is not None:
            if not res.kept:
                self.backend = self.chat = self.load_config = self.footprint = None
            return
        req = res.request
        self.backend, self.footprint, self.bandwidth, self.gpu_bandwidth = res.backend, res.footprint, res.bandwidth, res.gpu_bandwidth
        self.memory_check = res.memory_check
        self.model_path, self.settings, self.load_config = req.path, req.settings, res.config
        self.forecaster = Forecaster()  # another model, or other settings: other rates
        self.compacted = None
        self.wrap = []
        self.projector_info = res.projector
        self.audio_info = getattr(getattr(self.backend, "projector", None), "audio_info", None)  # the llama.cpp engine's loaded projector
        if hasattr(self.backend, "prefill_progress"):  # an engine that says how far a prompt's read has got
            self.backend.prefill_progress = self._prefill_progress  # type: ignore[union-attr]
        if req.redraw:
            self.saved = req.saved

    def start_chat(self, res: LoadResult) -> ChatSession:
        """The chat on the model ``adopt`` took, with the result's conversation and
        images; a kept KV cache of its saved session is loaded on the engine thread
        (``Resumed``). Raises what the chat could not start with (the chat is then None)."""
        assert self.backend is not None and self.load_config is not None
        self.chat = None
        chat = loading.new_chat(self.backend, self.load_config, self.model_path, self.settings, res.messages)
        self.chat = chat
        chat.images = list(res.images)
        saved = res.request.saved
        if saved is not None and saved.kv is not None:
            self.engine.submit(self._resume_kv, chat, saved)
        for im in res.images:  # where each came from, for the next save
            ref = next((r for r in res.request.image_refs or [] if r.get("sha256") == im.sha256), None)
            if ref is not None and ref.get("path"):
                self.image_refs[im.sha256] = dict(ref)
        return chat

    def lose(self, text: str) -> None:
        """On llama.cpp's aborting thread (``rpc.keep_alive_on_abort``): the engine is lost (``EngineLost``, once)."""
        if self.engine.lose(text):
            self.emit(EngineLost(text))

    def lost(self, text: str) -> None:
        """After ``EngineLost``: a new engine thread and no model (the old one is held by llama.cpp)."""
        self.engine.renew(text)
        self.backend = self.chat = self.load_config = None

    # -- the next message: its count, a file's tokens, a long prefill's progress --------------
    def counting(self, message: dict[str, str], chips: list[Pending], key: tuple,
                 images: int | None = None) -> Callable[[], Count | None] | None:
        """``message`` (with ``chips``) to count against the chat, read off the session
        now (on the UI thread); run it on the engine thread with ``count``. None
        with no chat; the count gives None where it cannot be made (a template that
        cannot render it, the model closed meanwhile): the forecast is then n/a."""
        chat, config, fp = self.chat, self.load_config, self.footprint
        if chat is None or config is None:
            return None
        kw: dict[str, Any] = dict(tokens_per_image=self.projector_info.tokens_per_image if self.projector_info is not None else None,
                  reply=reply_room(self.settings.max_tokens, chat.n_ctx or config.n_ctx), images=images, audio=self.audio_info,
                  wrap=sorted(self.wrap)[len(self.wrap) // 2] if self.wrap else 0,
                  max_ctx_by_kv_type=fp.max_ctx_by_kv_type if fp is not None else None,
                  trained_ctx=fp.trained_ctx if fp is not None else None)

        def job() -> Count | None:
            try:
                return count(chat, key, message, chips, **kw)
            except Exception:  # noqa: BLE001 - a template that cannot render it, a model closed meanwhile: the forecast is n/a
                return None

        return job

    def count(self, job: Callable[[], Count | None] | None, timeout: float | None = None) -> Count | None:
        """A ``counting`` job run on the engine thread, waited for (at most ``timeout`` seconds)."""
        return self.engine.wait(self.engine.submit(job), timeout) if job is not None else None

    def count_file(self, pending: Pending) -> Pending | None:
        """A file's block counted by the model's tokenizer on the engine thread, waited for (None: not counted)."""
        def run() -> Pending | None:
            try:
                return count_file(self.backend, pending) if self.backend is not None else None
            except Exception:  # noqa: BLE001 - the model closed meanwhile: counted again after the load
                return None

        return self.engine.run(run)

    def _prefill_progress(self, done: int, total: int) -> None:
        """On the engine thread (the engine's ``prefill_progress``): a long prompt's read, at most ten times a second."""
        now = time.perf_counter_ns()
        if 0 < done < total and now - self._progress_ns < PROGRESS_NS:
            return
        self._progress_ns = now
        self.emit(Progress(done, total, now))

    # -- compaction ---------------------------------------------------------------------
    def compaction_due(self) -> bool:
        """After a reply: the context has reached the settings' fraction (``compact_at``)
        and there are turns before the kept ones to summarize (else the sliding window goes on alone)."""
        chat = self.chat
        return (chat is not None and not chat.completion and should_compact(chat.context_used, chat.n_ctx, self.settings.compact_at)
                and compactable(chat.messages, KEEP_TURNS))

    def compact(self, chat: ChatSession) -> Compaction | None:
        """``chat``'s older turns summarized by the model on the engine thread, waited
        for (call it off the UI thread); None when there was nothing to summarize.
        Raises what stopped it (the conversation is then as it was)."""
        result = self.engine.run(compact, chat)
        if result is not None:
            self.compacted = result
        return result

    # -- replies ------------------------------------------------------------------------
    def generate(self, chat: ChatSession, message: dict[str, str], images: list[RGBImage | AudioClip], submitted_ns: int,
                 stop: threading.Event) -> None:
        """The reply to ``message`` on the engine thread (``replies.generate``), waited for: call it off the UI thread."""
        self._progress_ns = 0
        self.engine.run(replies.generate, chat, message, submitted_ns, images, stop, self.emit)

    def observe(self, s: GenerationStats, sent: Count | None) -> None:
        """A reply's prefill (and encode) join the forecaster's measurements, and
        the template's turn markers join what a typed message is counted with."""
        audio = None if sent is None or sent.images and sent.audio_chunks else bool(sent.audio_chunks)  # both: the encode cannot be split
        self.forecaster.observe_stats(s, audio=audio)
        if sent is not None and sent.text_tokens >= 0 and not s.images and not s.context_shifts and s.prompt_tokens >= sent.text_tokens:
            self.wrap = [*self.wrap[-7:], s.prompt_tokens - sent.text_tokens]

    def ceiling(self, s: GenerationStats) -> float | None:
        """This machine's decode roofline for the loaded model at the reply's context (None: not known)."""
        info = self.backend.info if self.backend is not None else None
        return replies.ceiling(s, self.footprint, self.bandwidth, self.gpu_bandwidth, info)

    def starved(self, rate: float | None) -> tuple[tuple[float, str], int] | None:
        """A reply far below what this model did before here (once per model): the
        rate it did, and the thread count to advise; None otherwise."""
        reference = self._starve.check(self.model_path, rate)
        if reference is None or rate is None:
            return None
        return reference, (self.load_config.n_threads if self.load_config else None) or physical_cores()

    @staticmethod
    def advice(rate: float, reference: tuple[float, str], threads: int) -> str:
        """The starved decode's line, naming the busiest other program (looked up for half a second: off the UI thread)."""
        return advice(rate, reference, threads, busiest_process())

    def threads_text(self) -> str:
        """The decode thread count as the engine chose it, and its last move (issue 50)."""
        ctl = getattr(self.backend, "threads", None)  # the llama.cpp engine's; the scripted fake has none
        return ctl.short("token") if ctl is not None else "threads n/a"

    # -- saving ---------------------------------------------------------------------------
    def refs(self, images: Sequence[RGBImage | AudioClip]) -> list[dict[str, Any]]:
        """The images as a saved session keeps them: path and pixels' sha256 (a name only, where it is not known)."""
        return [dict(self.image_refs.get(im.sha256) or {"name": im.name, **({"kind": "audio"} if isinstance(im, AudioClip) else {})})
                for im in images]

    def persist(self, extra_user: dict[str, str] | None = None, images: Sequence[RGBImage | AudioClip] = ()) -> None:
        """Save the chat: after the user's message (``extra_user``, with ``images``), and after each reply."""
        if self.chat is None:
            return
        self.saved = saving.updated(self.saved, self.chat, str(self.model_path), self.settings, self.refs, extra_user, images)
        self.saver.save(self.saved)

    def save(self, saved: sessions.SavedSession) -> None:
        self.saver.save(saved)

    def wait_for_saves(self) -> None:
        """Block until the saves queued so far are on disk (off the UI thread)."""
        self.saver.wait()

    def leave(self) -> Any:
        """The conversation is left (a new chat, another session, quit): its KV cache
        is kept beside its saved session, on the engine thread. The future of that."""
        return self.engine.submit(self._keep_kv, self.chat, self.saved)

    def _keep_kv(self, chat: ChatSession | None, saved: sessions.SavedSession | None) -> None:
        if chat is None or saved is None or self.backend is None:
            return
        if saving.keep_kv(chat, saved):
            self.saver.save(saved)

    def _resume_kv(self, chat: ChatSession, saved: sessions.SavedSession) -> None:
        self.emit(saving.resume_kv(chat, saved))

    def keep_alive_on_abort(self) -> None:
        """Over --rpc: a worker that dies mid-reply makes llama.cpp abort; the session is told (``lose``) and stays up."""
        from localllm.engine.rpc import keep_alive_on_abort  # lazy: loads llama.cpp (~169 ms here), which the session does not load at import

        keep_alive_on_abort(self.lose)

    def close(self) -> None:
        """The end: the conversation left (``leave``), the model closed, the threads ended, the last saves on disk."""
        try:
            if self.rpc:
                from localllm.engine import rpc  # lazy: loads llama.cpp (~169 ms here), which the session does not load at import

                rpc.drop_keep_alive(self.lose)
            if self.backend is not None:
                self.leave().result()
                self.engine.submit(self.backend.close).result()
            self.engine.shutdown()
        finally:
            self.saver.shutdown()

"""The next message in the cockpit, before Enter: the files and pictures attached
to it (chips), its tokens counted as typing pauses, its TTFT forecast; and, once
sent, a long prefill's progress on the same line.

A mixin of ``LocalLLMApp`` (as ``controls.py`` is): the Textual half only. Files
are read by ``localllm.cockpit.attachments`` in a worker, counted by the session
on its engine thread (``CockpitSession.counting``, ``count_file``), and the
answers come back as messages (``AttachRead``, ``Counted``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import App
from textual.reactive import reactive

from localllm.cockpit.attachments import Count, Pending, is_audio, is_image
from localllm.cockpit.attachments import message as attach_message
from localllm.cockpit.attachments import read as read_attachment
from localllm.cockpit.wording import printable, reason
from localllm.errors import InputError
from localllm.tui.attachments import AttachBar, AttachScreen, ReloadConfirm
from localllm.tui.messages import AttachRead, Counted, PrefillProgress
from localllm.tui.prompt import PromptBox

if TYPE_CHECKING:
    from localllm.chat import sessions
    from localllm.chat.session import ChatSession
    from localllm.cockpit.session import CockpitSession
    from localllm.engine_api import Engine, LoadConfig
    from localllm.tui.attachments import ForecastLine
    from localllm.tui.chatview import ChatView, MessageView
    from localllm.tui.widgets import LatencyPanel

COUNT_DELAY_S = 0.2  # the prompt's tokens are counted once typing pauses this long (on the engine thread)


class NextMessage(App):
    """Attachments, the count and the forecast of the next message (a mixin of ``LocalLLMApp``)."""

    chips: list[Pending]  # attached, going with the next message
    count: Count | None  # the box's message, counted
    _count_timer: Any = None
    _said_after = False  # the forecast line shows the last reply's forecast against its measured TTFT

    if TYPE_CHECKING:  # what the mixin uses of the app
        core: CockpitSession
        busy: reactive[bool]
        chat: ChatSession | None
        backend: Engine | None
        load_config: LoadConfig | None
        saved: sessions.SavedSession | None
        model_path: Path
        _view: ChatView
        _prompt: PromptBox
        _chips: AttachBar
        _forecast: ForecastLine
        _latency: LatencyPanel
        _reply: MessageView | None
        _sent_images: int
        _reply_start_ns: int
        _reply_prefix: int

        def _gone(self) -> bool: ...

        def reload_model(self, path: Path | None = None, settings: Any = None, *, messages: list[dict[str, str]] | None = None,
                         saved: sessions.SavedSession | None = None, redraw: bool = False,
                         image_refs: list[dict[str, Any]] | None = None) -> None: ...

    # -- a long prefill's progress ------------------------------------------------------
    @on(PrefillProgress)
    def _prefill_progressed(self, msg: PrefillProgress) -> None:
        """Tokens read of the prompt and the time left (the forecaster's shape, scaled
        by how this read is going): shown for a prompt of more than one batch, or with images."""
        if self._gone() or self._reply is None or self._latency.ttft_ms is not None:
            return
        ev = msg.event
        n_batch = self.load_config.n_batch if self.load_config is not None else 512
        if ev.total <= n_batch and not self._sent_images:
            return
        p = self.core.forecaster.progress(ev.done, ev.total, (ev.t_ns - self._reply_start_ns) / 1e6, prefix=self._reply_prefix)
        self._said_after = False
        self._forecast.say(p.line() + (" (the images are encoded first)" if self._sent_images and not ev.done else ""))

    # -- the count and the forecast ---------------------------------------------------------
    def _count_key(self) -> tuple:
        """What the box's message depends on: its text, the chips, the chat's state."""
        chat = self.chat
        return (self._prompt.text.strip(), tuple((c.id, c.tokens) for c in self.chips), id(chat),
                len(chat.messages) if chat is not None else 0, chat.context_used if chat is not None else 0, id(self.backend))

    def _schedule_count(self) -> None:
        """Count the box's message once typing pauses (``COUNT_DELAY_S``)."""
        if self._count_timer is not None:
            self._count_timer.stop()
        self._count_timer = self.set_timer(COUNT_DELAY_S, self._recount)

    def _recount(self) -> None:
        self._count_timer = None
        if self.busy or self.chat is None or self.load_config is None:
            return  # counted again when the reply (or the load) ends
        text = self._prompt.text.strip()
        if not text and not self.chips:
            self.count = None
            if not self._said_after:  # the last reply's forecast against measured stays until something is typed
                self._forecast.say("")
            return
        key = self._count_key()
        self._count_worker(self.core.counting(attach_message(text, self.chips), list(self.chips), key), key)

    @work(thread=True, exclusive=True, group="count", exit_on_error=False)
    def _count_worker(self, job: Any, key: tuple) -> None:
        self.post_message(Counted(self.core.count(job), key))

    def _count_now(self, message: dict[str, str], chips: list[Pending], images: int | None = None) -> Count | None:
        """The message counted now, on the engine thread (idle: no reply streams), waited for (a few ms)."""
        return self.core.count(self.core.counting(message, chips, self._count_key(), images), timeout=60)

    @on(Counted)
    def _counted(self, msg: Counted) -> None:
        if self._gone() or self.busy or msg.key != self._count_key():
            return  # the box, the chips or the chat changed meanwhile: counted again
        self.count = msg.count
        self._said_after = False
        c = msg.count
        if c is None:
            self._forecast.say("≈ n/a new tokens: the prompt could not be counted")
        elif c.line:
            self._forecast.say(c.line + (" · Enter offers to reload" if c.fix else ""), warn=True)
        else:
            f = self.core.forecaster.predict(c.new_tokens, prefix=self.chat.context_used if self.chat else 0, images=c.images,
                                             audio_chunks=c.audio_chunks)
            self._forecast.say(f.line() + ("" if c.image_tokens_known else " (images' tokens: by picture size, not counted)"))

    @on(PromptBox.Changed, "#prompt")
    def _prompt_changed(self) -> None:
        self._schedule_count()

    # -- the chips ------------------------------------------------------------------------
    def _set_chips(self, chips: list[Pending]) -> None:
        self.chips = chips
        self._chips.show(chips)
        self._schedule_count()

    def _chips_after_load(self) -> None:
        """Another model (or the same one reloaded): pictures need its projector, clips its audio encoder, files its tokenizer."""
        if not self.chips:
            self._schedule_count()
            return
        info = self.core.projector_info
        kept: list[Pending] = []
        for c in self.chips:
            if c.image is not None and info is None:
                self._view.add("note", f"{printable(c.name)} is no longer attached: this model has no projector")
                continue
            if c.audio is not None and (info is None or not info.has_audio):
                self._view.add("note", f"{printable(c.name)} is no longer attached: this model's projector has no audio encoder")
                continue
            if c.image is not None:
                c.tokens = info.tokens_per_image if info is not None else None
            elif c.audio is not None:
                c.tokens = self.core.audio_info.tokens(c.audio.seconds) if self.core.audio_info is not None else None
            elif c.file is not None:
                c.tokens = None
                self._count_chip(c)
            kept.append(c)
        self._set_chips(kept)

    def action_attach(self) -> None:
        """Ctrl+F: a path, asked for; attached as a pasted path is."""
        if self.chat is None:
            self._view.add("note", "no model is loaded: F2 picks one")
            return

        def chosen(paths: list[str] | None) -> None:
            if paths:
                self._attach_paths([Path(p) for p in paths])

        info = self.core.projector_info
        self.push_screen(AttachScreen(info is not None, info is not None and info.has_audio), chosen)

    @on(PromptBox.Dropped, "#prompt")
    def _dropped(self, event: PromptBox.Dropped) -> None:
        self._attach_paths(event.paths)

    @on(PromptBox.RemoveLast)
    def _remove_last(self) -> None:
        if self.chips:
            self._set_chips(self.chips[:-1])

    @on(AttachBar.Remove)
    def _remove_chip(self, event: AttachBar.Remove) -> None:
        self._set_chips([c for c in self.chips if c.id != event.chip_id])
        self._prompt.focus()

    def _attach_paths(self, paths: list[Path]) -> None:
        if self.chat is None:
            self._view.add("note", "no model is loaded: F2 picks one")
            return
        info = self.core.projector_info
        self._read_attachments(paths, info is not None, info.tokens_per_image if info is not None else None,
                               info is not None and info.has_audio)

    @work(thread=True, group="attach", exit_on_error=False)
    def _read_attachments(self, paths: list[Path], vision: bool, tokens_per_image: int | None, hearing: bool = False) -> None:
        """Read ``paths`` in order off the UI thread (Pillow, pypdf, a sound file's frames), then count each
        file's tokens on the engine thread. ``hearing``: the projector has an audio encoder."""
        for path in paths:
            try:
                if not vision and is_image(path):
                    raise InputError(f"{path.name} is a picture, and this model has no projector: start localllm tui with --mmproj FILE "
                                     f"(none was found beside {self.model_path.name})")
                if not hearing and not is_image(path) and is_audio(path):
                    raise InputError(f"{path.name} is a sound file, and this model has no audio encoder: start localllm tui with "
                                     "--mmproj FILE (an audio model's projector)")
                pending = read_attachment(path, tokens_per_image=tokens_per_image, audio=self.core.audio_info)
            except Exception as exc:  # noqa: BLE001 - a bad file is one line; the chat goes on
                self.post_message(AttachRead(None, reason(exc)))
                continue
            self.post_message(AttachRead(pending))
            if pending.file is not None:
                self._count_on_engine(pending)

    def _count_on_engine(self, pending: Pending) -> None:
        """A file's block counted by the model's tokenizer (engine thread), then the chip updated (worker thread)."""
        if self.core.count_file(pending) is not None:
            self.post_message(AttachRead(pending))

    @work(thread=True, group="attach", exit_on_error=False)
    def _count_chip(self, pending: Pending) -> None:
        self._count_on_engine(pending)

    @on(AttachRead)
    def _attach_read(self, msg: AttachRead) -> None:
        if self._gone():
            return
        if msg.pending is None:
            self._view.add("note", f"not attached: {msg.error or 'unreadable'}")
            return
        p = msg.pending
        if p.media is not None:  # where a picture or a clip came from, for the saved session
            self.core.image_refs[p.media.sha256] = p.ref()
        known = any(c.id == p.id for c in self.chips)
        if not known and p.file is not None:
            for note in p.file.notes:
                self._view.add("note", f"{printable(p.name)}: {printable(note)}")
        self._set_chips([p if c.id == p.id else c for c in self.chips] if known else [*self.chips, p])

    def _offer_reload(self, line: str, n_ctx: int, kv: str) -> None:
        """The message does not fit: reload with a context and KV cache type that hold it (asked first)."""

        def answered(yes: bool | None) -> None:
            if yes and not self.busy:
                new = dataclasses.replace(self.core.settings, n_ctx=n_ctx, type_k=kv, type_v=kv)
                self._view.add("note", f"reloading with a context of {n_ctx:,} and the KV cache in {kv}")
                self.reload_model(settings=new, messages=self.chat.messages if self.chat else None, saved=self.saved)

        self.push_screen(ReloadConfirm(line, n_ctx, kv), answered)

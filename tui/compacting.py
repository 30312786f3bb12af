"""Compaction in the cockpit: ``/compact`` typed in the prompt box (or Ctrl+P →
Compact), and automatically after a reply once the context reaches the
settings' fraction (85% by default; F3 turns it off, leaving the sliding
window alone), each with a line in the chat saying so. The memory panel shows
the last one's tokens before and after and the time it took.

Two mixins of ``LocalLLMApp``, because Textual calls a message's handlers
along the class order: ``Compacting`` comes before ``Replying`` among its bases,
so it sees the prompt's Enter first and keeps ``/compact`` from reaching the
model (``prevent_default``); ``AutoCompacting`` comes after it, so a reply's
end has been drawn (and the app is no longer busy) when it decides, in the same
step, whether to compact: nothing can be sent in between. The summary is written
on the engine thread (``CockpitSession.compact``) from a thread worker; the app
is busy meanwhile, as during a reply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import on, work
from textual.app import App
from textual.message import Message
from textual.reactive import reactive

from localllm.cockpit.wording import reason
from localllm.compaction import KEEP_TURNS
from localllm.compaction.conversation import Compaction
from localllm.tui.messages import ReplyDone
from localllm.tui.prompt import PromptBox

if TYPE_CHECKING:
    from localllm.chat.session import ChatSession
    from localllm.cockpit.session import CockpitSession
    from localllm.cockpit.settings import Settings
    from localllm.tui.chatview import ChatView
    from localllm.tui.widgets import MemoryPanel

COMMAND = "/compact"


class Compacted(Message):
    """The engine thread's compaction ended: its figures (None: nothing to summarize), or why it failed."""

    def __init__(self, result: Compaction | None, error: str | None) -> None:
        super().__init__()
        self.result, self.error = result, error


class Compacting(App):
    """``/compact`` and the automatic compaction (a mixin of ``LocalLLMApp``)."""

    if TYPE_CHECKING:  # what the mixin uses of the app
        core: CockpitSession
        busy: reactive[bool]
        chat: ChatSession | None
        settings: Settings
        _view: ChatView
        _memory: MemoryPanel

        def _gone(self) -> bool: ...
        def _update_footprint(self) -> None: ...
        def _schedule_count(self) -> None: ...

    compacting = False  # a compaction runs: Enter waits for it

    @on(PromptBox.Submitted, "#prompt")
    def _typed_compact(self, event: PromptBox.Submitted) -> None:
        """``/compact`` runs here and is not sent; any message waits while a compaction runs."""
        if self.compacting:
            event.prevent_default()
            self.notify("not sent: the conversation is being compacted; your message stays in the box", severity="warning")
            return
        if event.text.strip() != COMMAND:
            return
        event.prevent_default()
        if self.busy:
            self.notify("not now: a reply is streaming or a model loading; /compact stays in the box", severity="warning")
            return
        event.box.take()
        self.compact_now()

    def compact_now(self, auto: bool = False) -> None:
        """Summarize the chat's older turns now (the last ones kept whole), with a line saying so."""
        chat = self.chat
        if chat is None:
            self._view.add("note", "no model is loaded: F2 picks one")
            return
        if self.busy:
            return
        if auto and self.settings.compact_at is not None:
            full = chat.context_used / max(chat.n_ctx, 1)
            self._view.add("note", f"the context is {full:.0%} full: compacting the older turns into a summary the model writes "
                                   f"(auto at {self.settings.compact_at:.0%}; F3 sets it, or leaves it to the sliding window)")
        else:
            self._view.add("note", f"compacting the turns before the last {KEEP_TURNS} into a summary the model writes …")
        self.busy = self.compacting = True
        self._compact(chat)

    def forget_compaction(self) -> None:
        """A new chat, another model: the last compaction's figures were another chat's."""
        self.core.compacted = None
        self._memory.set_compaction(None)

    @work(thread=True, exclusive=True, group="compact", exit_on_error=False)
    def _compact(self, chat: ChatSession) -> None:
        try:
            self.post_message(Compacted(self.core.compact(chat), None))
        except Exception as exc:  # noqa: BLE001 - said in the chat log; the conversation is as it was
            self.post_message(Compacted(None, reason(exc)))

    @on(Compacted)
    def _compacted(self, msg: Compacted) -> None:
        self.busy = self.compacting = False
        if self._gone():
            return
        r = msg.result
        if msg.error is not None:
            self._view.add("note", f"not compacted: {msg.error}")
        elif r is None:
            self._view.add("note", f"nothing to compact: the conversation is no longer than the {KEEP_TURNS} turns kept whole")
        else:
            self._view.add("note", r.line())
            self._memory.set_compaction(r.tokens_before, r.tokens_after, r.seconds)
            self.core.persist()  # the saved session holds what the model holds
        self._update_footprint()
        self._schedule_count()  # the box's message, forecast on the compacted cache


class AutoCompacting(App):
    """After a reply, the automatic compaction (a mixin of ``LocalLLMApp``, after ``Replying``)."""

    if TYPE_CHECKING:
        core: CockpitSession
        busy: reactive[bool]

        def _gone(self) -> bool: ...
        def compact_now(self, auto: bool = False) -> None: ...

    @on(ReplyDone)
    def _compact_if_due(self, _msg: ReplyDone) -> None:
        if not self._gone() and not self.busy and self.core.compaction_due():
            self.compact_now(auto=True)

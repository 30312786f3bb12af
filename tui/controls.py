"""The conversation's controls in the cockpit: copy the last reply or code
block, regenerate the last reply, edit the last message and send it again,
raw text or Markdown; and the clock of a reasoning model's thinking.

A mixin of ``LocalLLMApp`` (kept out of app.py, which holds the engine and the
panels). Copying goes through ``App.copy_to_clipboard``: an OSC 52 sequence
the terminal puts on the clipboard, over SSH too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import App
from textual.binding import Binding
from textual.reactive import reactive

from localllm.cockpit.attachments import typed_part, without_markers
from localllm.reasoning.split import Markers
from localllm.tui.chatview import ChatView, MessageView
from localllm.tui.markdown import THINK, answer_of, code_blocks
from localllm.vision.marker import MARKER

if TYPE_CHECKING:
    from localllm.audio.sound import AudioClip
    from localllm.chat.session import ChatSession
    from localllm.cockpit.attachments import Count, Pending
    from localllm.tui.prompt import PromptBox
    from localllm.vision.image import RGBImage

BINDINGS = [
    Binding("ctrl+o", "copy_reply", "Copy reply", show=False),
    Binding("ctrl+n", "copy_code", "Copy code", show=False),
    Binding("ctrl+r", "regenerate", "Regenerate", show=False),
    Binding("ctrl+g", "edit_last", "Edit last message", show=False),
    Binding("ctrl+t", "toggle_raw", "Raw text / Markdown", show=False),
]


class ThinkClock:
    """Where a reply's thinking block ends, from its tokens as they arrive:
    the thinking's token count and time, and the time to the first answer
    token (TTFT's counterpart for a reasoning model)."""

    def __init__(self, start_ns: int, *, opened: bool = False, marks: Markers = THINK) -> None:
        self.start_ns = start_ns
        self.open, self.close = marks.open, marks.close
        self._text = ""
        self._tokens = 0
        self._first_ns: int | None = None
        # None until the reply's start says; True at once where the template's generation prompt opened the block
        # (DeepSeek R1's ends in "<think>\n": the reply starts inside it and only writes "</think>")
        self.thinking: bool | None = True if opened else None
        self.think_tokens: int | None = None
        self.think_ms: float | None = None
        self.answer_ms: float | None = None  # Enter to the first answer token

    def feed(self, pieces: tuple[str, ...], stamps: list[int]) -> None:
        """The batch's tokens; it keeps only the text it still needs (the
        reply's start, the tail where the closing marker may be arriving)."""
        for piece, t in zip(pieces, stamps, strict=False):
            self._tokens += 1
            self._first_ns = t if self._first_ns is None else self._first_ns
            if self.answer_ms is not None:
                continue  # all is known
            self._text += piece
            if self.thinking is None:
                head = self._text.lstrip()
                if len(head) >= len(self.open) or not self.open.startswith(head):
                    self.thinking = head.startswith(self.open)
            if self.thinking and self.think_tokens is None:
                if self.close not in self._text:
                    self._text = self._text[-len(self.close):]  # a marker split over tokens is still found
                    continue
                self.think_tokens, self.think_ms = self._tokens, (t - self._first_ns) / 1e6
                self._text = self._text.split(self.close, 1)[1]
            if self.thinking is not None and self._text.strip():
                self.answer_ms = (t - self.start_ns) / 1e6


class ConversationControls(App):
    """The bindings above, as actions of the app (``LocalLLMApp``)."""

    if TYPE_CHECKING:
        busy: reactive[bool]
        chat: ChatSession | None
        _view: ChatView
        _prompt: PromptBox
        _editing: bool

        _last_sent: tuple[str, list[Pending], str] | None

        def _start_reply(self, message: dict[str, str], images: list[RGBImage | AudioClip] | None = None, count: Count | None = None) -> None: ...

        def _set_chips(self, chips: list[Pending]) -> None: ...

    def _replies(self) -> list[MessageView]:
        return [m for m in reversed(self._view.messages) if m.role == "assistant" and m.text.strip()]

    def action_copy_reply(self) -> None:
        replies = self._replies()
        if not replies:
            self.notify("no reply to copy yet", severity="warning")
            return
        text = answer_of(replies[0].text, self._view.think_marks)
        self.copy_to_clipboard(text)
        self.notify(f"copied the last reply ({len(text.splitlines())} lines, {len(text)} characters)")

    def action_copy_code(self) -> None:
        for reply in self._replies():
            blocks = code_blocks(reply.text, self._view.think_marks)
            if blocks:
                language, code = blocks[-1]
                self.copy_to_clipboard(code)
                self.notify(f"copied the last code block ({language or 'no language'}, {len(code.splitlines())} lines)")
                return
        self.notify("no code block in the replies yet", severity="warning")

    def action_toggle_raw(self) -> None:
        self._view.toggle_raw()
        self.notify("raw text: the replies as the model wrote them" if self._view.raw else "Markdown")

    def _last_exchange(self, doing: str) -> MessageView | None:
        """The log's last user message, when the last exchange can be taken back."""
        if self.busy:
            self.notify(f"a reply is streaming: Esc stops it, then {doing}", severity="warning")
            return None
        chat = self.chat
        users = [m for m in self._view.messages if m.role == "user"]
        if chat is None or not users or len(chat.messages) < 2 or chat.messages[-1]["role"] != "assistant":
            self.notify(f"nothing to {doing} yet", severity="warning")
            return None
        return users[-1]

    def action_regenerate(self) -> None:
        """The last reply again, from the same message (sampled anew)."""
        user = self._last_exchange("regenerate")
        if user is None or self.chat is None:
            return
        last = self.chat.messages[-2]
        n = last["content"].count(MARKER)
        images = self.chat.images[-n:] if n else []  # sent again with it: rewind takes them off the conversation
        text = self.chat.rewind()
        if text is None:
            return
        later = self._view.messages[self._view.messages.index(user) + 1:]
        if later:
            self._view.truncate(later[0])
        self._start_reply({"role": "user", "content": without_markers(text), **({"data": last["data"]} if last.get("data") else {})},
                          images)

    def action_edit_last(self) -> None:
        """Put the last message in the box; Enter sends it in place of the old
        exchange (which stays until then), Esc keeps the old one."""
        if self._last_exchange("edit") is None or self.chat is None:
            return
        last = self.chat.messages[-2]
        content, data = last["content"], bool(last.get("data"))
        sent = self._last_sent
        if sent is not None and without_markers(content) == sent[2]:  # its files and images go back on the chips
            self._prompt.value = sent[0]
            self._set_chips(list(sent[1]))
        elif data or MARKER in content:  # a message from before (a saved session): its text only
            self._prompt.value = typed_part(content, data)
            self.notify("its attachments are not carried into the edit: attach them again (Ctrl+F)", severity="warning")
        else:
            self._prompt.value = content
        self._editing = True
        self.notify("editing your last message: Enter sends it in place of the old one, Esc cancels")

    def _take_back_for_edit(self) -> None:
        """The edited message is being sent: the exchange it replaces goes."""
        self._editing = False
        users = [m for m in self._view.messages if m.role == "user"]
        if self.chat is not None and users and self.chat.rewind() is not None:
            self._view.truncate(users[-1])

"""``run --file`` and ``chat``'s ``/file``: files read into the prompt, counted
with the model's tokenizer, and refused before sending when they do not fit.

The reading and its bounds are ``localllm.attach``'s; whether the prompt fits,
and the ``--ctx``/KV type that would, are ``localllm.forecast.room``'s on the
planner's largest context per cache type (``Fit.max_ctx_by_kv_type``). The
file's text is data: ``run`` tokenizes its prompt through the engine's
``chat_tokens`` (a message holding special-token text is tokenized as plain
text), ``chat`` marks the message ``"data"`` for the session's untrusted spans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from localllm import attach
from localllm.attach import Attachment
from localllm.chat import untrusted
from localllm.commands._common import say
from localllm.engine_api import Engine, GenerationStats
from localllm.errors import InputError, UsageError
from localllm.forecast import Forecast, Forecaster, Room, check
from localllm.forecast.prompt import check_message, count, names, reply_room
from localllm.util import fmt

if TYPE_CHECKING:
    from localllm.plan.prepare import LoadPlan as Fitted


def read_all(paths: Sequence[str] | None, *, quiet: bool = False) -> list[Attachment]:
    """Each ``--file``, read (one line naming the first that is refused), its notes said."""
    out = [attach.read(p) for p in paths or ()]
    if not quiet:
        for a in out:
            for note in a.notes:
                say(f"{a.name}: {note}")
    return out


def compose(prompt: str, attachments: Sequence[Attachment]) -> str:
    """The user's message: each file's labelled block, then the prompt (``attach.message``)."""
    return attach.message(prompt, attachments)


def check_run(backend: Engine, fitted: Fitted, prompt: str, attachments: Sequence[Attachment], *, raw: bool, n_predict: int, tools: bool,
              quiet: bool) -> list[Attachment]:
    """``run --file``: the attachments with their tokens counted (and said, but
    for --json), after checking that the prompt and the reply fit the context
    (an ``InputError`` naming ``--ctx``/``--kv-type`` that would, else). With
    ``--tools`` the prompt goes through a chat session that parses special
    tokens in a user's message: a file holding control-token text is refused
    there rather than read as turns."""
    tokens = backend.prompt_tokens(prompt, chat=not raw)
    room = Room(len(tokens), 0, reply_room(n_predict, backend.n_ctx), backend.n_ctx)
    line = check(room, fitted.fit.max_ctx_by_kv_type, trained_ctx=fitted.fit.trained_ctx,
                 what=f"the prompt with {names(attachments)}")
    if line:
        raise InputError(line)
    if tools and any(untrusted.holds_special(backend, a.text) for a in attachments):
        raise UsageError("a --file holds the text of the model's control tokens: with --tools it cannot be kept as data; drop --tools")
    counted = count(backend, attachments)
    if not quiet:
        for a in counted:
            say(f"attached {a.chip()} (the prompt: {len(tokens):,} tokens of {backend.n_ctx:,})")
    return counted


def to_json(attachments: Sequence[Attachment]) -> list[dict[str, Any]]:
    return [{"name": a.name, "path": a.path, "kind": a.kind, "size": a.size, "chars": len(a.text), "pages": a.pages,
             "pages_read": a.pages_read, "tokens": a.tokens, "notes": list(a.notes)} for a in attachments]


def file_command(text: str) -> str | None:
    """The path of a ``/file PATH`` line (quotes a terminal adds around a
    dropped path removed), "" for a bare ``/file``, None for any other line."""
    s = text.strip()
    if s != "/file" and not s.startswith("/file "):
        return None
    arg = s[len("/file"):].strip()
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "'\"":
        arg = arg[1:-1]
    return arg


def check_chat(backend: Engine, fitted: Fitted, messages: list[dict[str, Any]], new: dict[str, Any],
               attachments: Sequence[Attachment], n_predict: int) -> tuple[int, str | None]:
    """A chat message with files: its new tokens, and the line to refuse it with
    when it, what the context holds and the reply do not fit (None: it fits)."""
    room, line = check_message(backend, messages, new, n_predict=n_predict, max_ctx_by_kv_type=fitted.fit.max_ctx_by_kv_type,
                               trained_ctx=fitted.fit.trained_ctx, attachments=attachments)
    if line and room.new_tokens + room.reply <= room.n_ctx:
        line += "; or /clear to start over"
    return room.new_tokens, line


class ChatFiles:
    """``chat``'s ``/file``: the files waiting for the next message, the check
    before it is sent, and the TTFT forecast of each turn (from the turns before it)."""

    def __init__(self, backend: Engine, fitted: Fitted, n_predict: int, *, quiet: bool = False, tools: bool = False) -> None:
        self.backend = backend
        self.fitted = fitted
        self.n_predict = n_predict
        self.quiet = quiet
        self.tools = tools
        self.pending: list[Attachment] = []
        self.sent: list[Attachment] = []  # the last message's
        self.forecaster = Forecaster()
        self.forecast: Forecast | None = None  # the last message's, made before it was sent
        self._counted = 0  # the last message's tokens as counted before sending
        self._wrap: list[int] = []  # what turns added to their text's tokens (the template's turn markers), measured

    def command(self, text: str) -> bool:
        """Handle a ``/file PATH`` line (True), or leave any other line (False).
        A refused file is one line; the chat goes on."""
        path = file_command(text)
        if path is None:
            return False
        if not path:
            say("usage: /file PATH (a text file or a PDF; it goes with your next message)")
            return True
        try:
            a = count(self.backend, [attach.read(path)])[0]
        except InputError as exc:
            say(f"error: {exc}")
            return True
        self.pending.append(a)
        for note in a.notes:
            say(f"{a.name}: {note}")
        say(f"attached {a.chip()}: it goes with your next message")
        return True

    def prepare(self, messages: list[dict[str, Any]], text: str, *, images: int = 0) -> tuple[dict[str, str] | None, str | None]:
        """The message to send for ``text`` (with the files waiting, marked as
        data) and None; or None and the line to refuse it with (the files are
        dropped: attach them again after ``/clear`` or a larger ``--ctx``).
        ``images``: pictures going with it (their encode joins the forecast;
        their tokens are not counted here)."""
        files, self.pending = self.pending, []
        self.sent = files
        if not files:
            message = {"role": "user", "content": text}
            # the text's tokens (cheap: this is inside TTFT's clock) and the template's wrapping as the last turns measured it
            n_new = len(self.backend.tokenize(text, add_special=False, parse_special=False))
            self._counted = n_new if self.backend.context_used else -1  # a first turn's wrapping holds the whole template head: not learnt
            n_new += sorted(self._wrap)[len(self._wrap) // 2] if self._wrap else 0
        else:
            message = {"role": "user", "content": compose(text, files), "data": "file"}
            if self.tools and any(untrusted.holds_special(self.backend, a.text) for a in files):
                return None, f"{names(files)} holds the text of the model's control tokens: with --tools it cannot be kept as data"
            n_new, line = check_chat(self.backend, self.fitted, messages, message, files, self.n_predict)
            if line:
                return None, line
            self._counted = -1  # exact (the template's wrapping included): nothing to learn from
        self.forecast = self.forecaster.predict(n_new, prefix=self.backend.context_used, images=images)
        if files and not self.quiet:
            say(self.forecast.line())
        return message, None

    def observe(self, stats: GenerationStats | None) -> None:
        if stats is None:
            return
        self.forecaster.observe_stats(stats)
        if self._counted >= 0 and not stats.context_shifts and stats.prompt_tokens >= self._counted:
            self._wrap = [*self._wrap[-7:], stats.prompt_tokens - self._counted]

    def json(self) -> dict[str, Any]:
        """The turn's forecast beside its measured TTFT (``ttft_ms``), and its files."""
        f = self.forecast
        out: dict[str, Any] = {"ttft_forecast_ms": f.ttft_ms if f else None, "forecast": f.to_dict() if f else None}
        if self.sent:
            out["attachments"] = to_json(self.sent)
        return out

    def vs(self) -> str:
        """`` (forecast 1.20 s)`` after the summary line's TTFT, or nothing with no forecast."""
        f = self.forecast
        return f" (forecast {fmt.ms(f.ttft_ms)})" if f is not None and f.ttft_ms is not None and f.new_tokens else ""

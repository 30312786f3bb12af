"""A chat session in the core, for the CLI's ``chat`` and the TUI.

It keeps the messages, renders them with the model's chat template, and feeds
the engine only what is new each turn (the template's text after what the cache
already holds), so a turn costs its own tokens, not the whole history. When the
context fills, the engine shifts it: the system prompt (the first ``n_keep``
tokens) stays, the oldest turns after it go, and what remains is not re-read.
Each shift is recorded (tokens dropped, time taken, in place or re-processed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localllm import paths
from localllm.audio.sound import AudioClip
from localllm.chat import untrusted
from localllm.engine_api import Engine, Generation, SamplingConfig, TokenEvent
from localllm.engine_api.errors import InvalidSetting
from localllm.engine_api.stats import GenerationStats, ShiftRecord
from localllm.errors import UsageError
from localllm.util.fmt import safe
from localllm.vision.image import RGBImage
from localllm.vision.marker import MARKER, with_images


class NoChatTemplate(UsageError, ValueError):
    """A base model (no chat template) cannot chat. Also a ValueError, which is
    what callers caught before."""


@dataclass
class Turn:
    """One exchange, with the numbers the UI shows for it."""

    user: str
    reply: str
    stats: GenerationStats
    before: tuple[str, int] | None = None  # the cached text and KV length before it: what ``rewind`` goes back to


TURN_MARGIN = 16  # tokens a template wraps a message in: ChatML 8 (its role lines, end mark and generation prompt), others a few more


@dataclass
class ChatSession:
    backend: Engine
    system_prompt: str | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    messages: list[dict[str, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    shifts: list[ShiftRecord] = field(default_factory=list)
    n_keep: int = 0
    sliding_window: bool = True  # shift a full context (keeping the system prompt) instead of stopping
    keep_override: int | None = None  # tokens to keep at a shift; default: the system prompt's
    prompt_cache: Path | None = None  # where the system prompt's KV state is saved and loaded from
    prompt_cache_hit: bool = False  # the last fresh start loaded the system prompt from disk
    completion: bool = False  # a base model (no chat template): the conversation is one text the model continues
    thinking: bool | None = None  # the template's enable_thinking (chat's --reasoning, /think; the cockpit's setting); None: llama.cpp's, on
    on_notice: Callable[[str], None] | None = None  # one-line notices (a prompt cache rebuilt); default: stderr
    tools: list[dict[str, Any]] | None = None  # OpenAI's tool objects, for the template (localllm.mcp's ToolChat sets them)
    # the messages as the template gets them (a tool-call format's rewrite, serve/tools.py's for_template); None: as they are
    prepare: Callable[[list[dict[str, str]]], list[dict[str, Any]]] | None = None
    _cached_text: str = ""  # the rendered conversation the KV cache stands for
    _special: dict[str, bool] = field(default_factory=dict)  # tool results' texts: whether each holds special-token text
    images: list[RGBImage | AudioClip] = field(default_factory=list)  # the conversation's images (and clips: an audio model), in marker order
    _pending: list[RGBImage | AudioClip] = field(default_factory=list)  # this turn's images (send's ``images``)

    def __post_init__(self) -> None:
        if not self.completion and not self.backend.has_chat_template:
            raise NoChatTemplate("this model has no chat template (a base model): use {raw}, or {template_choice}")
        if self.system_prompt and not self.messages:
            self.messages.append({"role": "system", "content": self.system_prompt})

    @property
    def context_used(self) -> int:
        return self.backend.context_used

    @property
    def n_ctx(self) -> int:
        return self.backend.n_ctx

    def clear(self) -> None:
        """Start over with the same system prompt."""
        self.backend.reset()
        self.messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        self._cached_text = ""
        self.turns.clear()
        self.images = []

    def held_text(self) -> str:
        """The rendered conversation the KV cache stands for ('' when it holds nothing)."""
        return self._cached_text if self.backend.context_used else ""

    def text_after_reply(self) -> str | None:
        """What the cache stands for once the last reply is in it: the messages
        before it rendered for a reply, then its text (as ``_turn`` leaves it);
        None when the conversation does not end with a reply."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            return None
        return self._render(self.messages[:-1], add_generation_prompt=True) + self.messages[-1]["content"]

    def adopt_cache(self, text: str) -> None:
        """The cache was loaded holding ``text`` (a saved session's state,
        ``chat.resume``): the next turn extends it, the system prompt kept at a
        shift as ``_media_reply`` keeps it."""
        self._cached_text = text
        head = self._render(self.messages[:1], add_generation_prompt=False) if self.system_prompt else ""
        self.n_keep = len(self._tok(head)) if head and text.startswith(head) else 0

    def reply_opening(self) -> str:
        """What the template writes to open a reply (whether it opens the thinking there:
        ``chat.thinking.Fold``): a one-message conversation's end, rendered as this
        session renders (its thinking switch), so a turn does not render the whole
        conversation a second time to learn it."""
        return self._render([{"role": "user", "content": "."}], add_generation_prompt=True)[-200:]

    def _tok(self, text: str) -> list[int]:
        # A template writes special tokens as text; typed text continued by a base model stays text.
        return self.backend.tokenize(text, add_special=False, parse_special=not self.completion)

    def _render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        """The conversation as the model reads it: its chat template, or in
        completion mode the plain text, each message continuing the last (a
        space before typed text that would otherwise glue to the previous word)."""
        if not self.completion:
            shown = self.prepare(messages) if self.prepare is not None else messages
            extra: dict[str, object] | None = None if self.thinking is None else {"enable_thinking": self.thinking}
            if self.tools:
                return self.backend.render_chat(shown, add_generation_prompt=add_generation_prompt, tools=self.tools, extra=extra)
            return self.backend.render_chat(shown, add_generation_prompt=add_generation_prompt, extra=extra)
        text = ""
        for m in messages:
            piece = m["content"] + ("\n\n" if m["role"] == "system" else "")
            if m["role"] == "user" and text and piece and not text[-1].isspace() and not piece[0].isspace():
                piece = " " + piece
            text += piece
        return text

    def _new_tokens(self, rendered: str, data: list[tuple[int, int]] | None = None, newest: str = "") -> list[int]:
        """Tokens to append for this turn. If the template's text extends what the
        cache stands for, only the new part; otherwise start over, keeping the
        system prompt's tokens separate so their count is exact."""
        cache = self.backend.cache_tokens
        if self._cached_text and cache and rendered.startswith(self._cached_text):
            return self._tok_data(rendered, len(self._cached_text), data)
        self.backend.reset()
        head = ""
        if self.system_prompt:
            head = self._render(self.messages[:1], add_generation_prompt=False)
            if not rendered.startswith(head):
                head = ""
        # In completion mode no template writes BOS: the tokenizer adds it where the model wants it.
        bos = self.backend.tokenize("", add_special=True, parse_special=False) if self.completion else []
        head_tokens = bos + (self._tok(head) if head else [])
        self.n_keep = len(head_tokens)
        rest = self._tok_fitting(self._tok_data(rendered, len(head), data), newest)
        if head_tokens and self.prompt_cache is not None:
            # Reuse the system prompt's KV state from disk, or compute and save it.
            self.prompt_cache_hit = self.prompt_cache.exists() and self.backend.load_state(self.prompt_cache)
            if self.prompt_cache_hit and self.backend.cache_tokens == head_tokens:
                return rest
            reason = self.backend.state_error if self.prompt_cache.exists() else None
            if self.prompt_cache_hit:
                reason = "for another system prompt"
            if reason:
                # Never loaded, never trusted: delete it and build it again.
                self.prompt_cache.unlink(missing_ok=True)
                self._notice(f"the prompt cache {self.prompt_cache} was {reason}: deleted, rebuilding it")
            self.prompt_cache_hit = False
            self.backend.reset()
            self.backend.prefill(head_tokens)
            self.prompt_cache.parent.mkdir(parents=True, exist_ok=True)
            self.backend.save_state(self.prompt_cache)
            return rest
        return head_tokens + rest

    def _tok_fitting(self, rest: list[int], newest: str) -> list[int]:
        """A conversation read again from its start (a turn taken back after the window slid,
        a saved chat longer than the context): with the sliding window on, what does not fit
        is left out as the window would have dropped it, the oldest tokens after the kept
        ones, to half the rest of the context (llama.cpp's shift: ``n_discard = n_left / 2``),
        or less where the ``newest`` message needs more. A newest message that does not fit
        by itself, and any conversation without the window, the engine refuses as too long."""
        room = self.n_ctx - self.n_keep
        if not self.sliding_window or self.n_keep + len(rest) < self.n_ctx:
            return rest
        need = len(self._tok(newest)) + TURN_MARGIN if newest else 0
        if need >= room:
            return rest
        kept = rest[len(rest) - max(room // 2, need):]
        self._notice(f"the conversation is longer than the context: its oldest {len(rest) - len(kept)} tokens were left out,"
                     " as the sliding window drops them")
        return kept

    def _tok_data(self, rendered: str, start: int, data: list[tuple[int, int]] | None) -> list[int]:
        """``rendered[start:]``'s tokens, the ``data`` spans (tool results) as plain text."""
        if not data:
            return self._tok(rendered[start:])
        return untrusted.tokens(self.backend, rendered, start, len(rendered), data)

    def _data_spans(self, messages: list[dict[str, str]], rendered: str) -> list[tuple[int, int]]:
        """Where the tool results, and the messages marked ``"data"`` (a user's
        message holding attached files, localllm.attach), that hold special-token
        text sit in ``rendered``."""
        if self.completion:
            return []
        which = [i for i, m in enumerate(messages) if (m.get("role") in untrusted.UNTRUSTED_ROLES or m.get("data"))
                 and self._holds_special(m.get("content") or "")]
        if not which:
            return []
        return untrusted.spans(lambda ms: self._render(ms, add_generation_prompt=True), messages, which, rendered)

    def _holds_special(self, text: str) -> bool:
        """``untrusted.holds_special``, remembered per text: each turn asks again about every result so far."""
        if text not in self._special:
            if len(self._special) > 256:
                self._special.clear()
            self._special[text] = untrusted.holds_special(self.backend, text)
        return self._special[text]

    def _notice(self, msg: str) -> None:
        if self.on_notice is not None:
            self.on_notice(msg)
        else:
            import sys


            print(f"localllm: {safe(msg)}", file=sys.stderr, flush=True)

    def send(self, text: str, start_ns: int | None = None, images: list[RGBImage | AudioClip] | None = None) -> Generation:
        """Stream the reply to ``text``; the turn is recorded when it ends, and
        the returned ``Generation`` carries its stats once closed.
        ``start_ns``: when the user submitted it (TTFT's clock; now by default),
        so rendering, tokenizing and a prompt-cache load count in TTFT.
        ``images``: pictures for a vision model, placed before the text."""
        return self.send_messages([{"role": "user", "content": text}], start_ns=start_ns, images=images)

    def send_messages(self, new: list[dict[str, str]], start_ns: int | None = None, images: list[RGBImage | AudioClip] | None = None) -> Generation:
        """Stream the reply to ``new`` messages (a user's, or tool results:
        ``{"role": "tool", "tool_call_id", "content"}``, whose text stays text).
        ``images``: pictures for a vision model, placed before the user's text."""
        self._pending = list(images or [])
        if self._pending or self.images:  # typed text never holds a marker of its own; the images' go first
            user = next((i for i, m in enumerate(new) if m.get("role") == "user"), None)
            if user is None and self._pending:
                raise UsageError("images go with a user's message")
            new = [{**m, "content": with_images(str(m["content"]), len(self._pending) if i == user else 0)} if isinstance(m.get("content"), str) else m
                   for i, m in enumerate(new)]
        start = start_ns if start_ns is not None else time.perf_counter_ns()
        return Generation(lambda out: self._turn(out, new, start))

    def rewind(self) -> str | None:
        """Take the last exchange back (to regenerate it, or send an edited
        message in its place): its user message, or None when there is none.
        The KV cache keeps what came before when it can (no context shift in
        that turn); otherwise the next turn reads the conversation again."""
        if not self.messages or self.messages[-1]["role"] != "assistant" or len(self.messages) < 2 or self.messages[-2]["role"] != "user":
            return None
        text = self.messages[-2]["content"]
        self.messages = self.messages[:-2]
        if text.count(MARKER) and self.images:
            self.images = self.images[: -text.count(MARKER)]
        turn = self.turns.pop() if self.turns and self.turns[-1].user == text else None
        if turn is not None and turn.before is not None and not turn.stats.context_shifts and turn.before[1] <= self.backend.context_used:
            self._cached_text = turn.before[0]
            self.backend.truncate(turn.before[1])
        else:
            self._cached_text = ""
        return text

    def _turn(self, out: Generation, new: list[dict[str, str]], start: int) -> Iterator[TokenEvent]:
        messages = self.messages + new
        text = next((str(m["content"]) for m in new if m.get("role") == "user"), "")
        rendered = self._render(messages, add_generation_prompt=True)
        # what the cache holds now, if this turn extends it (as _new_tokens decides)
        extends = self._cached_text and self.backend.context_used and rendered.startswith(self._cached_text)
        before = (self._cached_text, self.backend.context_used) if extends else None
        media = bool(self._pending or self.images)  # a conversation with images goes through libmtmd (_media_reply)
        tokens = [] if media else self._new_tokens(rendered, self._data_spans(messages, rendered), text)
        pieces: list[str] = []
        reply: Generation | None = None
        refused = False
        try:
            n_keep = self.n_keep if self.keep_override is None else self.keep_override
            reply = (self._media_reply(rendered, start) if media
                     else self.backend.extend(tokens, self.sampling, n_keep=n_keep, shift=self.sliding_window, start_ns=start))
            for event in reply:
                pieces.append(event.text)
                yield event
        except InvalidSetting:
            refused = not pieces  # the engine refused the turn (too long for the context) before a token
            raise
        finally:
            if reply is not None:
                reply.close()  # the engine's own finally: its stats exist from here
            stats = reply.stats if reply is not None else None
            out.finish(stats, reply.spec if reply is not None else None)
            if not refused:  # the message (its markers) joins the conversation: so do its images
                self.images += self._pending
            self._pending = []
            if not refused:  # a refused message is not part of the conversation: the next one must not carry it
                text_out = "".join(pieces)
                self.messages = messages + [{"role": "assistant", "content": text_out}]
                self._cached_text = rendered + text_out
                if stats is not None:
                    self.shifts.extend(stats.context_shifts)
                    self.turns.append(Turn(text, text_out, stats, before))

    def _media_reply(self, rendered: str, start: int) -> Generation:
        """The reply in a conversation that holds images: only what the cache
        lacks goes to the engine, so an image already in the cache is not encoded
        again; a fresh start reads the whole conversation, its images included
        (unless a reopened saved session loaded its kept cache first: chat.resume)."""
        engine: Any = self.backend  # only the llama.cpp engine takes images (extend_images)
        keep = self.keep_override
        if self._cached_text and self.backend.context_used and rendered.startswith(self._cached_text):
            n_keep = self.n_keep if keep is None else keep
            return engine.extend_images(rendered[len(self._cached_text):], self._pending, self.sampling, n_keep=n_keep,
                                        shift=self.sliding_window, start_ns=start)
        self.backend.reset()
        head = self._render(self.messages[:1], add_generation_prompt=False) if self.system_prompt else ""
        self.n_keep = len(self._tok(head)) if head and rendered.startswith(head) else 0
        return engine.extend_images(rendered, self.images + self._pending, self.sampling,
                                    n_keep=self.n_keep if keep is None else keep, shift=self.sliding_window, start_ns=start)


def prompt_cache_path(model: Path, system_prompt: str, type_k: str, type_v: str, swa_full: bool) -> Path:
    """Where a system prompt's KV state lives: keyed by the model file (path,
    size, modification time), the prompt and the cache settings, since a state
    only loads into the same model with the same cache layout."""
    import hashlib


    st = model.stat()
    key = f"{model.resolve()}|{st.st_size}|{st.st_mtime_ns}|{type_k}|{type_v}|{swa_full}|{system_prompt}"
    return paths.data_dir() / "prompt-cache" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".state")

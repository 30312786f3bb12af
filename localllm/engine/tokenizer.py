"""Text <-> tokens with llama.cpp's vocabulary, and the chat template on top.

The engine and the batch engine (``localllm serve``) both hand a loaded
vocabulary to a ``Tokenizer``, so a prompt is tokenized and templated the same
way whichever of them answers it.
"""

from __future__ import annotations

import ctypes
import json
import re
import secrets
from collections.abc import Sequence
from typing import Any

import llama_cpp

from localllm.engine.template import TemplateChoice
from localllm.errors import EngineError, InputError
from localllm.modelfile.gguf_file import GGUFHeader
from localllm.reasoning import markers
from localllm.reasoning.budget import Budget


class Tokenizer:
    """A loaded model's vocabulary: tokens, their bytes, BOS/EOG, chat rendering."""

    def __init__(self, vocab: object, header: GGUFHeader | None, template: TemplateChoice | None = None) -> None:
        self.vocab = vocab
        self.header = header
        self.template = template or TemplateChoice()
        # A token's bytes and its end-of-generation flag, looked up once per id (at
        # most the vocabulary's size): the engines ask for every token they stream,
        # serve's on its engine thread's serial path between two decodes.
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._eog: dict[int, bool] = {}
        self._shown: frozenset[int] = frozenset()
        self._shown_for: object = self  # the template source ``_shown`` was read from (self: none yet)

    def _require(self) -> None:
        if not self.vocab:
            raise EngineError("no model is loaded")

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        self._require()
        raw = text.encode("utf-8")
        cap = len(raw) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        piece = self._pieces.get((token, special))
        if piece is None:
            piece = self._pieces[(token, special)] = self._token_bytes(token, special)
        return piece

    def _token_bytes(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def shown(self) -> frozenset[int]:
        """The control tokens a reply shows as their text: those of the chat
        template's tool-call format and thinking markers that are one token of
        this vocabulary (``toolcalls.preserved``; llama.cpp's ``preserved_tokens``,
        kept where ``common_tokenize`` gives one id, tools/server/server-schema.cpp).
        Read again when the template in use changes (``--template``)."""
        source = self.template.source(self.header) if self.vocab else None
        if source != self._shown_for:
            from localllm import toolcalls  # lazy: the tool-call formats, read once per template; an engine that never generates skips them

            ids = (self.tokenize(t, add_special=False, parse_special=True) for t in toolcalls.preserved(source))
            self._shown, self._shown_for = frozenset(i[0] for i in ids if len(i) == 1), source
        return self._shown

    def thinking_budget(self, limit: int, prompt: Sequence[int] = ()) -> Budget | None:
        """A fresh thinking budget of ``limit`` tokens over this template's thinking
        markers (``localllm.reasoning``), primed with the prompt's last tokens;
        None where there is nothing to bound: -1 (unlimited), or a template that
        does not think in text. The markers are read as llama-server reads them,
        special tokens parsed (tools/server/server-schema.cpp, reasoning_budget_*)."""
        if limit < 0 or not self.vocab:
            return None
        marks, _ = markers(self.template.source(self.header))
        if marks is None:
            return None
        budget = Budget(limit, marks.open.encode(), marks.close.encode(), self.tokenize(marks.close, add_special=False, parse_special=True))
        tail = prompt[-(len(marks.open) + 8):]  # the generation prompt's end: an opening marker (a token a character at most) and what follows
        budget.prime([self.token_bytes(t, special=True) for t in tail])
        return budget

    def reply_bytes(self, token: int) -> bytes:
        """A generated token's bytes as a reply shows them: a ``shown`` control
        token as its text, any other (end of generation, ``<|im_end|>``) as
        nothing, as llama-server renders a generated token (server-context.cpp,
        ``accept_special_token``). Without it a model whose call opens with a
        control token (``[TOOL_CALLS]``, ``<|tool_calls_section_begin|>``) writes
        calls the parser never sees."""
        return self.token_bytes(token, special=token in self.shown())

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return eog

    @property
    def n_vocab(self) -> int:
        return int(llama_cpp.llama_vocab_n_tokens(self.vocab))

    def bos_token(self) -> int | None:
        """The beginning-of-sequence token when the vocabulary adds one to a text
        (llama_vocab_get_add_bos), else None."""
        self._require()
        if not llama_cpp.llama_vocab_get_add_bos(self.vocab):
            return None
        bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        return bos if bos >= 0 else None

    # -- chat ------------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return self.template.available(self.header)

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, continue_final: bool = False,
                    tools: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None) -> str:
        """Apply the chat template (the model's, or ``use_template``'s) under
        time and size limits; a failing template is an ``InputError``. ``extra``:
        more template variables (``enable_thinking``, ``chat_template_kwargs``);
        ``continue_final``: the last (assistant) message continued, as ``chat_tokens``.
        ``enable_thinking`` is true unless ``extra`` says otherwise, as llama.cpp
        always sets it (common/chat.cpp, ``common_chat_templates_inputs``): a template
        that reads it as "off unless set" (llama.cpp's DeepSeek R1) thinks, as there."""
        extra = {"enable_thinking": True, **(extra or {})}
        if continue_final and messages and messages[-1].get("role") == "assistant":
            return self.render_chat(messages[:-1], tools=tools, extra=extra) + (messages[-1].get("content") or "")
        self._require()
        # BOS/EOS as llama.cpp's vocabulary has them (it ignores ids out of range).
        bos = llama_cpp.llama_vocab_bos(self.vocab)
        eos = llama_cpp.llama_vocab_eos(self.vocab)
        bos_text = self.token_bytes(bos, special=True).decode("utf-8", "replace") if bos >= 0 else ""
        eos_text = self.token_bytes(eos, special=True).decode("utf-8", "replace") if eos >= 0 else ""
        return self.template.render(self.header, messages, bos_text, eos_text, add_generation_prompt, tools, extra)

    def chat_tokens(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None, continue_final: bool = False) -> list[int]:
        """The chat template's tokens for ``messages``, where a message's text is
        only ever text: the template's own special tokens are parsed, but a
        message holding special-token text (``<|im_end|>``) cannot forge a turn.
        Such a message is tokenized apart, as plain text, between the template's
        pieces (found with a random marker in its place); other messages are
        tokenized with the whole prompt, exactly as llama.cpp would. ``tools``
        and assistant messages' ``tool_calls`` reach the template as JSON it
        re-encodes, where no marker survives: one holding special-token text is
        an ``InputError`` naming it instead; so is such text in ``extra``'s values
        (a request's ``chat_template_kwargs``: the template writes them raw).
        ``continue_final``: the last (assistant) message is continued, not closed
        (a prefill): the others with the generation prompt, then its text, as text."""
        runs, _ = self.chat_runs(messages, (), add_generation_prompt=add_generation_prompt, tools=tools, extra=extra,
                                 continue_final=continue_final)
        return runs[0]

    def chat_runs(self, messages: list[dict[str, Any]], marks: Sequence[str], *, add_generation_prompt: bool = True,
                  tools: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None,
                  continue_final: bool = False) -> tuple[list[list[int]], list[int]]:
        """``chat_tokens``, the rendered prompt cut where ``marks`` stand (serve's images:
        each mark was put in a message's text where its picture goes). Returns the token
        runs between the marks and, for each cut, which mark stood there, in prompt
        order (a mark the template drops is not there; one it repeats is there twice).
        Each run is tokenized apart, as libmtmd tokenizes the text between its media
        markers; without ``marks``, one run: exactly ``chat_tokens``."""
        if continue_final and messages and messages[-1].get("role") == "assistant":
            runs, order = self.chat_runs(messages[:-1], marks, tools=tools, extra=extra)
            runs[-1] += self.tokenize(messages[-1].get("content") or "", add_special=False, parse_special=False)
            return runs, order
        self._no_special_in("tools", tools)
        self._no_special_in("chat_template_kwargs", extra)
        for i, m in enumerate(messages):
            self._no_special_in(f"messages[{i}].tool_calls", m.get("tool_calls"))
            self._no_special_in(f"messages[{i}].reasoning_content", m.get("reasoning_content"))
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools, extra=extra)
        forged = [i for i, m in enumerate(messages) if self._holds_special(m.get("content", ""))]
        if not forged:
            return self._cut([(text, True)], marks)
        nonce = secrets.token_hex(8)
        stand_in = {i: f"\x1e{nonce}:{i}\x1e" for i in forged}
        marked = self.render_chat([dict(m, content=stand_in[i]) if i in stand_in else m for i, m in enumerate(messages)],
                                  add_generation_prompt=add_generation_prompt, tools=tools, extra=extra)
        found = sorted((marked.find(mark), i) for i, mark in stand_in.items() if marked.count(mark) == 1)
        if len(found) != len(forged):
            raise InputError("a message holds special-token text, and this chat template repeats or drops it: "
                             "it cannot be kept apart from the template's own tokens")
        segments: list[tuple[str, bool]] = []  # (text, parse special tokens)
        pos = 0
        for at, i in found:
            segments += [(marked[pos:at], True), (messages[i]["content"], False)]
            pos = at + len(stand_in[i])
        return self._cut([*segments, (marked[pos:], True)], marks)

    def _cut(self, segments: Sequence[tuple[str, bool]], marks: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """``segments`` tokenized one by one (special tokens parsed or not), cut where ``marks`` stand."""
        runs: list[list[int]] = [[]]
        order: list[int] = []
        split = re.compile("(" + "|".join(re.escape(m) for m in marks) + ")") if marks else None
        index = {m: k for k, m in enumerate(marks)}
        for text, special in segments:
            for k, part in enumerate(split.split(text) if split is not None else [text]):
                if k % 2:  # a mark (re.split keeps the captured separators at odd places)
                    order.append(index[part])
                    runs.append([])
                else:
                    runs[-1] += self.tokenize(part, add_special=False, parse_special=special)
        return runs, order

    def text_runs(self, text: str, marks: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """A plain prompt (no chat template) as ``tokenize(text)`` reads it, cut at ``marks``
        as ``chat_runs`` cuts: the BOS token first where the vocabulary adds one."""
        runs, order = self._cut([(text, False)], marks)
        bos = self.bos_token()
        if bos is not None:
            runs[0].insert(0, bos)
        return runs, order

    def _no_special_in(self, field: str, value: object) -> None:
        if value and self._holds_special(json.dumps(value, ensure_ascii=False)):
            raise InputError(f"'{field}' holds the text of one of the model's special tokens: "
                             "it would reach the prompt as a control token, so it is refused")

    def _holds_special(self, text: str) -> bool:
        """Whether ``text`` holds the text of a special token (it tokenizes
        differently when special tokens are parsed)."""
        if not text:
            return False
        return self.tokenize(text, add_special=False, parse_special=True) != self.tokenize(text, add_special=False, parse_special=False)

    def prompt_tokens(self, prompt: str, *, chat: bool) -> list[int]:
        """Tokens for a user prompt: through the chat template when there is one."""
        if chat and self.has_chat_template:
            # The template writes BOS itself where the model wants it.
            return self.chat_tokens([{"role": "user", "content": prompt}])
        return self.tokenize(prompt, add_special=True, parse_special=False)

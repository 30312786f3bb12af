"""The vocabulary's fill-in-the-middle tokens, for serve's ``/infill``.

llama-server builds an infill prompt from ``llama_vocab_fim_pre/suf/mid/rep/sep/pad``
(tools/server/server-common.cpp, ``format_prompt_infill``) and refuses the route when
pre, suf or mid is missing (server-context.cpp, ``post_infill``). These are the same
calls, made once when the model is loaded, so the route itself is pure logic over ids.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp

from localllm.engine.tokenizer import Tokenizer
from localllm.errors import EngineError


@dataclass(frozen=True)
class FimTokens:
    """The FIM token ids (None where llama.cpp has none: ``LLAMA_TOKEN_NULL``, -1), and
    the BOS that ``format_prompt_infill`` puts first when the vocabulary adds one."""

    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    rep: int | None = None  # the repository-level pattern's [FIM_REP] (arXiv 2409.12186)
    sep: int | None = None  # its file separator [FIM_SEP]
    pad: int | None = None
    bos: int | None = None  # llama_vocab_bos when llama_vocab_get_add_bos, else None

    def missing(self) -> list[str]:
        """llama-server's words for what a model lacks for infill (empty: it can infill)."""
        return [f"{word} token is missing" for word, tid in (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid)) if tid is None]


def fim_tokens(tok: Tokenizer) -> FimTokens:
    """``tok``'s FIM tokens, read from llama.cpp (which also finds them by their texts,
    e.g. ``<|fim_prefix|>``, when the GGUF names none: llama-vocab.cpp)."""
    if not tok.vocab:
        return FimTokens()
    n_vocab = tok.n_vocab

    def tid(fn) -> int | None:
        t = int(fn(tok.vocab))
        return t if 0 <= t < n_vocab else None

    return FimTokens(pre=tid(llama_cpp.llama_vocab_fim_pre), suf=tid(llama_cpp.llama_vocab_fim_suf), mid=tid(llama_cpp.llama_vocab_fim_mid),
                     rep=tid(llama_cpp.llama_vocab_fim_rep), sep=tid(llama_cpp.llama_vocab_fim_sep), pad=tid(llama_cpp.llama_vocab_fim_pad),
                     bos=tok.bos_token())


def prompt_text(tok: Tokenizer, tokens: list[int]) -> str:
    """``tokens`` as llama-server writes a prompt in its answers (``common_detokenize``
    with special tokens: ``llama_detokenize``, which also drops the space SentencePiece
    put before the first token)."""
    if not tokens or not tok.vocab:
        return ""
    arr = (llama_cpp.llama_token * len(tokens))(*tokens)
    cap = 8 * len(tokens) + 16
    for _ in range(2):
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(tok.vocab, arr, len(tokens), buf, cap, False, True)
        if n >= 0:
            return buf.raw[:n].decode("utf-8", errors="replace")
        cap = -n
    raise EngineError("llama_detokenize asked for more room twice")

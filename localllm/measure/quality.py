"""What quantization costs: perplexity, KL divergence and top-1 agreement.

The statistics ``llama-perplexity --kl-divergence`` reports, computed the same
way: the text is cut into chunks of ``chunk`` tokens, each chunk is evaluated
from an empty cache with the model's BOS token as its first token, and only the second half of each chunk is scored (every
scored token then has at least chunk/2 tokens of context). For each scored
position: the negative log-likelihood of the true next token (perplexity), the
KL divergence KL(reference || candidate) of the next-token distributions, and
whether both models' most likely token is the same (top-1 agreement).

Pure numpy; the logits come from any callable (``engine.LlamaCppBackend.logits``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

LogitsFn = Callable[[Sequence[int], int], np.ndarray]  # (tokens, first): the rows of positions first..


def eval_text() -> str:
    """The text that ships for quality checks: public-domain prose (the US
    Declaration of Independence and two of Lincoln's addresses), ~2.6k tokens."""
    return files("localllm.models").joinpath("data/prose.txt").read_text(encoding="utf-8")


def log_softmax(x: np.ndarray) -> np.ndarray:
    """In float64, in place on one copy: a chunk's logits are 128 rows of the
    vocabulary (49k-262k), and each temporary array of that size was fresh memory
    to fault in. Four of them took 0.77-1.35 s a call here against 0.045 s with
    one copy and one temporary (scripts/kv_cache_quality.py --quick: 3.4 s of 12.8)."""
    y = np.array(x, dtype=np.float64)  # a copy: the caller's logits stay as they were
    y -= y.max(axis=-1, keepdims=True)
    y -= np.log(np.exp(y).sum(axis=-1, keepdims=True))
    return y


@dataclass
class QualityReport:
    name: str
    perplexity: float
    reference_perplexity: float
    kl_mean: float
    kl_p99: float
    top1_agreement: float  # share of positions where both argmaxes agree
    positions: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(
    reference: LogitsFn,
    candidates: Mapping[str, LogitsFn],
    tokens: Sequence[int],
    chunk: int = 256,
    bos: int | None = None,
    on_chunk: Callable[[int, int], None] | None = None,
) -> list[QualityReport]:
    """Score every candidate against the reference on ``tokens``.

    ``bos``: the model's beginning-of-sequence token when its vocabulary adds
    one. llama-perplexity puts it in place of each chunk's first token
    (tools/perplexity/perplexity.cpp: ``if (add_bos && j == 0) tokens[batch_start]
    = llama_vocab_bos(vocab)``); without it a model such as Gemma 3 reads every
    chunk but the first as a text cut mid-stream, and its perplexity triples.
    ``on_chunk(done, total)`` is called after each chunk."""
    if len(tokens) < chunk:
        raise ValueError(f"need at least {chunk} tokens of text, got {len(tokens)}")
    ref_nll: list[float] = []
    nll: dict[str, list[float]] = {k: [] for k in candidates}
    kl: dict[str, list[np.ndarray]] = {k: [] for k in candidates}
    agree: dict[str, int] = {k: 0 for k in candidates}
    first = chunk // 2
    starts = range(0, len(tokens) - chunk + 1, chunk)
    for i, start in enumerate(starts):
        window = list(tokens[start : start + chunk])
        if bos is not None:
            window[0] = bos
        targets = np.asarray(window[first + 1 :])
        ref = log_softmax(reference(window, first)[:-1])  # only the scored half's rows are asked for
        ref_nll.extend((-ref[np.arange(len(targets)), targets]).tolist())
        ref_top = ref.argmax(axis=-1)
        p = np.exp(ref)
        for name, fn in candidates.items():
            cand = log_softmax(fn(window, first)[:-1])
            nll[name].extend((-cand[np.arange(len(targets)), targets]).tolist())
            agree[name] += int((cand.argmax(axis=-1) == ref_top).sum())
            np.subtract(ref, cand, out=cand)  # p * (ref - cand), in place: no fresh vocabulary-sized arrays (log_softmax)
            cand *= p
            kl[name].append(np.maximum(cand.sum(axis=-1), 0.0))
        if on_chunk is not None:
            on_chunk(i + 1, len(starts))  # chunks done, of all: a progress bar with the time left
    ref_ppl = math.exp(float(np.mean(ref_nll)))
    out = []
    for name in candidates:
        k = np.concatenate(kl[name])
        out.append(
            QualityReport(
                name=name,
                perplexity=math.exp(float(np.mean(nll[name]))),
                reference_perplexity=ref_ppl,
                kl_mean=float(k.mean()),
                kl_p99=float(np.percentile(k, 99)),
                top1_agreement=agree[name] / len(k),
                positions=len(k),
            )
        )
    return out


KV_CHUNK = 256  # tokens a chunk: quantize --eval's, doctor's and tune's


def kv_cache_quality(path: Path, types: Sequence[str] = ("q8_0", "q4_0"), *, max_tokens: int = KV_CHUNK, threads: int | None = None,
                     on_chunk: Callable[[int, int], None] | None = None) -> list[QualityReport]:
    """What a quantized KV cache costs: the same weights loaded with an f16 cache
    and with each of ``types``, scored by ``compare`` on the first ``max_tokens``
    tokens of the shipped text (``quantize --eval``'s method, one 256-token chunk
    a context). One place for it: ``doctor`` shows the q8_0 figure, ``tune`` each
    cache type's next to its speed, ``scripts/kv_cache_quality.py`` the table."""
    from localllm.engine import LlamaCppBackend  # lazy: loads llama.cpp, which the scoring maths does not need
    from localllm.engine_api import LoadConfig  # lazy: with the engine

    backends: dict[str, LlamaCppBackend] = {}
    try:
        for kv in ("f16", *types):
            b = LlamaCppBackend()
            backends[kv] = b  # closed below even when the load fails
            # not through the load path (localllm.runtime): the cache types are what is measured, so each engine
            # gets exactly this config, one 256-token chunk, never a fitted one (tests/architecture/test_one_load_path.py)
            b.load(path, LoadConfig(n_ctx=KV_CHUNK, n_batch=KV_CHUNK, n_ubatch=KV_CHUNK, n_outputs_max=0, type_k=kv, type_v=kv,
                                    flash_attn="on", n_threads=threads))
        ref = backends["f16"]
        tokens = ref.tokenize(eval_text())[:max(max_tokens, KV_CHUNK)]
        return compare(ref.logits, {kv: backends[kv].logits for kv in types}, tokens, chunk=KV_CHUNK, bos=ref.bos_token(), on_chunk=on_chunk)
    finally:
        for b in backends.values():
            b.close()

"""Quality of quantized files against their source, through llama.cpp.

Loads each model with a context the size of one evaluation chunk and every
position's logits kept (``n_outputs_max=0``), and hands them to
``localllm.measure.quality.compare``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from localllm.engine_api import LoadConfig
from localllm.measure.quality import QualityReport, compare, eval_text

CHUNK = 256


def _load(path: Path, threads: int | None):
    # lazy: loads gguf, llama.cpp (~155 ms here), which evaluate does not load at import
    from localllm.engine import LlamaCppBackend

    b = LlamaCppBackend()
    b.load(path, LoadConfig(n_ctx=CHUNK, n_batch=CHUNK, n_ubatch=CHUNK, n_outputs_max=0, n_threads=threads))
    return b


def evaluate(source: Path, candidates: Sequence[Path], *, max_tokens: int | None = None, threads: int | None = None,
             on_chunk: Callable[[int, int], None] | None = None) -> list[QualityReport]:
    """Perplexity, KL divergence (mean, p99) and top-1 agreement of each
    candidate; ``on_chunk(done, total)`` after each chunk of text."""
    ref = _load(source, threads)
    loaded = {}
    try:
        for c in candidates:
            loaded[str(c)] = _load(c, threads)
        tokens = ref.tokenize(eval_text())
        if max_tokens:
            tokens = tokens[:max_tokens]
        return compare(ref.logits, {name: b.logits for name, b in loaded.items()}, tokens, chunk=CHUNK, bos=ref.bos_token(),
                       on_chunk=on_chunk)
    finally:
        ref.close()
        for b in loaded.values():
            b.close()

"""The two runs bench_vision and bench_audio make on our side, whatever the media.

A picture and a clip reach the engine the same way (``stream_images``: its media
list goes to libmtmd as it is), so one load-encode-reply and one two-turn chat
serve both benchmarks; each passes its media already read (``load_image`` or
``load_audio``) and its own prompt, context and template, which are what it
gives llama-mtmd-cli too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Setup:
    """What both sides are given: the model, its projector, the threads, the context and the template."""

    model: Path
    proj: Path
    threads: int
    n_ctx: int
    template: str  # as llama-mtmd-cli is told (--chat-template): the synthetic models have none


def one_reply(s: Setup, prompt: str, media: Any) -> Any:
    """One fresh load (as llama-mtmd-cli does per run), one reply of one token: the generation's stats."""
    from localllm.engine import LlamaCppBackend
    from localllm.engine_api import LoadConfig, SamplingConfig

    b = LlamaCppBackend()
    try:
        b.load(s.model, LoadConfig(n_ctx=s.n_ctx, n_threads=s.threads))
        b.load_projector(s.proj)
        b.use_template(s.template)
        with b.stream_images(prompt, [media], SamplingConfig(temperature=0, max_tokens=1)) as g:
            list(g)
        assert g.stats is not None and g.stats.encode_ms is not None and g.stats.ttft_ms is not None
        return g.stats
    finally:
        b.close()


def two_turns(s: Setup, prompts: tuple[str, str], media: Any) -> tuple[float, float]:
    """A chat's first turn with the media and a second without: both TTFTs (ms). The
    media stays in the KV cache, so the second turn encodes nothing again."""
    from localllm.chat.session import ChatSession
    from localllm.engine import LlamaCppBackend
    from localllm.engine_api import LoadConfig, SamplingConfig

    b = LlamaCppBackend()
    try:
        b.load(s.model, LoadConfig(n_ctx=s.n_ctx, n_threads=s.threads))
        b.load_projector(s.proj)
        b.use_template(s.template)
        session = ChatSession(b, sampling=SamplingConfig(temperature=0, max_tokens=2))
        with session.send(prompts[0], images=[media]) as g:
            list(g)
        with session.send(prompts[1]) as g:
            list(g)
        first, second = (t.stats for t in session.turns)
        assert first is not None and second is not None and first.ttft_ms is not None and second.ttft_ms is not None
        return first.ttft_ms, second.ttft_ms
    finally:
        b.close()

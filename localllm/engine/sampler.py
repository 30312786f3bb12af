"""llama.cpp's sampler chain for one ``SamplingConfig``.

Its own module because two engines build it (one sequence here, one chain per
sequence in ``batch_engine``) and both must sample the same way: greedy at
temperature 0, else top-k, top-p, min-p, temperature, then a seeded draw.
"""

from __future__ import annotations

import llama_cpp

from localllm.engine_api import SamplingConfig


def new_sampler(s: SamplingConfig) -> object:
    """A sampler chain the caller frees with ``free_sampler``."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if s.temperature <= 0:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        return chain
    seed = llama_cpp.LLAMA_DEFAULT_SEED if s.seed is None else s.seed & 0xFFFFFFFF
    if s.top_k > 0:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(s.top_k))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(s.top_p, 1))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_min_p(s.min_p, 1))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(s.temperature))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
    return chain


def free_sampler(chain: object) -> None:
    llama_cpp.llama_sampler_free(chain)


def sample(chain: object, ctx: object, i: int = -1) -> int:
    """Sample (and accept) a token from row ``i`` of the last decode's logits."""
    return int(llama_cpp.llama_sampler_sample(chain, ctx, i))

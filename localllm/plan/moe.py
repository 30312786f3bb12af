"""Mixtures of experts in the fit: which configs to try, most on the GPU first.

A MoE layer's experts are most of its bytes, but a token reads only
``n_expert_used`` of ``n_expert`` of them: kept in RAM they cost the CPU a
small read per token, while attention, norms, router and shared experts (and
the KV cache) stay on the GPU with their layer. So when a MoE model does not
fit the GPU, its experts move to RAM layer by layer before any whole layer
moves, and the layers that move after that take their experts' place in RAM
already, as llama.cpp's own ``--fit`` does (common/fit.cpp: "for a MoE model,
same as dense model but with all MoE tensors in system memory"; its step 4
then fills the GPU back with whole layers while they fit).
"""

from __future__ import annotations

from localllm.engine_api import LoadConfig

Step = tuple[int, int]  # (n_gpu_layers, n_cpu_moe)


def offload_steps(n_layer: int, has_experts: bool, want: LoadConfig, *, gpu: bool, ngl_fixed: bool,
                  moe_fixed: bool) -> tuple[list[Step], list[Step]]:
    """The (GPU layers, experts in RAM) the fit may try, most on the GPU first,
    in two lists: the experts' steps (every layer offloaded, the experts of 0, 1,
    ... all layers in RAM), tried first at the context asked; then the layers'
    steps (one layer fewer at a time, every expert in RAM), where the policy
    chooses between a smaller context and fewer layers. What the user fixed
    (``--ngl``, ``--cpu-moe``/``--n-cpu-moe``) stays as it is; a dense model
    (``has_experts`` False) has no experts' steps."""
    n_all = n_layer + 1
    if not gpu:
        return [], [(want.n_gpu_layers, want.n_cpu_moe)]
    ngls = [want.n_gpu_layers] if ngl_fixed else list(range(n_all, -1, -1))
    if moe_fixed or not has_experts:
        return [], [(n, want.n_cpu_moe) for n in ngls]
    experts = [(ngls[0], m) for m in range(n_layer)] + [(ngls[0], -1)]
    return experts, [(n, -1 if n else 0) for n in ngls]


def experts_phrase(n_cpu_moe: int, n_layer: int) -> str:
    """``n_cpu_moe`` in words: "the experts of 12 of 48 layers in RAM"."""
    n = n_layer if n_cpu_moe < 0 else min(n_cpu_moe, n_layer)
    return f"the experts of all {n_layer} layers in RAM" if n == n_layer else f"the experts of {n} of {n_layer} layers in RAM"

"""Write a synthetic vision model: a tiny text GGUF and a gemma3-type projector.

No vision model ships on PyPI, so the fast tests build one: random weights in
shapes that libmtmd loads and runs. The projector follows the loader in
``$V/tools/mtmd/clip.cpp`` (``load_tensors``: the ``v.*`` ViT, then for
PROJECTOR_TYPE_GEMMA3 ``mm.input_projection.weight`` and
``mm.soft_emb_norm.weight``) and the graph in ``$V/tools/mtmd/models/siglip.cpp``
(an average pool of ``n_merge`` x ``n_merge`` patches, an RMS norm, then the
projection). ``clip_n_mmproj_embd`` reads the projection's ``ne[0]``, which must
equal the text model's n_embd, or ``mtmd_init_from_file`` refuses the pair.

Two sizes:

- ``small`` (the fast tests): 32 px images, 4 px patches (8 x 8), a pool of 4,
  so 4 image tokens; a 32-wide ViT of one block; about 60 KB.
- ``large``: SigLIP-so400m's width (1152, ff 4304, 16 heads) and its patch grid
  at 384 px (14 px patches, 27 x 27), with ``blocks`` blocks (1 by default) so
  that it stays small on disk; a pool of 3 (27 is not a multiple of Gemma 3's 4,
  and clip.cpp counts ``n_patches / n_merge^2`` tokens: 81).

    python -m scripts.make_vision_model OUTDIR [--size small|large] [--blocks N]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from scripts.synth_gguf import SynthSpec, write_llama_gguf


@dataclass(frozen=True)
class ProjectorSpec:
    n_embd_text: int = 64  # the projection's output width: the text model's n_embd
    image_size: int = 32
    patch_size: int = 4
    n_embd: int = 32  # the ViT's width
    n_ff: int = 64
    n_head: int = 2
    n_block: int = 1
    n_merge: int = 4  # clip.vision.projector.scale_factor: the pool's side
    dtype: str = "f32"  # the 2-D weights: f32 or f16
    seed: int = 1


SMALL = ProjectorSpec()
LARGE = ProjectorSpec(image_size=384, patch_size=14, n_embd=1152, n_ff=4304, n_head=16, n_block=1, n_merge=3, dtype="f16")


def tokens_per_image(spec: ProjectorSpec) -> int:
    """What clip.cpp's ``clip_n_output_tokens`` gives for GEMMA3: patches / n_merge^2."""
    return (spec.image_size // spec.patch_size) ** 2 // spec.n_merge**2


def write_projector(path: str | Path, spec: ProjectorSpec = SMALL) -> Path:
    """Write a gemma3-type mmproj GGUF of ``spec`` with random weights."""
    path = Path(path)
    rng = np.random.default_rng(spec.seed)
    wdtype = np.float16 if spec.dtype == "f16" else np.float32
    E, F = spec.n_embd, spec.n_ff
    n_patches = (spec.image_size // spec.patch_size) ** 2

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(wdtype)

    def vec(n: int, value: float = 0.0) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", f"synthetic-gemma3-mmproj-{spec.n_embd}")
    w.add_string("clip.projector_type", "gemma3")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_uint32("clip.vision.image_size", spec.image_size)
    w.add_uint32("clip.vision.patch_size", spec.patch_size)
    w.add_uint32("clip.vision.embedding_length", E)
    w.add_uint32("clip.vision.feed_forward_length", F)
    w.add_uint32("clip.vision.projection_dim", spec.n_embd_text)
    w.add_uint32("clip.vision.block_count", spec.n_block)
    w.add_uint32("clip.vision.attention.head_count", spec.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_uint32("clip.vision.projector.scale_factor", spec.n_merge)
    w.add_bool("clip.use_gelu", True)
    # numpy shapes are ggml's ne reversed: a conv kernel of ne [p, p, 3, E], positions of ne [E, n_patches]
    w.add_tensor("v.patch_embd.weight", mat(E, 3, spec.patch_size, spec.patch_size))
    w.add_tensor("v.patch_embd.bias", vec(E))
    # F32 whatever ``dtype``: the ViT adds it to the patches with ggml_add, which has no f32 + f16 on the CPU (a GGML abort)
    w.add_tensor("v.position_embd.weight", mat(n_patches, E).astype(np.float32))
    for i in range(spec.n_block):
        b = f"v.blk.{i}"
        for name in ("ln1", "ln2"):
            w.add_tensor(f"{b}.{name}.weight", vec(E, 1.0))
            w.add_tensor(f"{b}.{name}.bias", vec(E))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"{b}.{name}.weight", mat(E, E))
            w.add_tensor(f"{b}.{name}.bias", vec(E))
        w.add_tensor(f"{b}.ffn_up.weight", mat(F, E))
        w.add_tensor(f"{b}.ffn_up.bias", vec(F))
        w.add_tensor(f"{b}.ffn_down.weight", mat(E, F))
        w.add_tensor(f"{b}.ffn_down.bias", vec(E))
    w.add_tensor("v.post_ln.weight", vec(E, 1.0))
    w.add_tensor("v.post_ln.bias", vec(E))
    w.add_tensor("mm.soft_emb_norm.weight", vec(E, 1.0))
    # ne [n_embd_text, E]: siglip.cpp transposes it before the mul_mat, clip_n_mmproj_embd reads ne[0]
    w.add_tensor("mm.input_projection.weight", mat(E, spec.n_embd_text))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_vision_model(out_dir: str | Path, *, size: str = "small", blocks: int = 1, n_embd: int = 64) -> tuple[Path, Path]:
    """Write ``model.gguf`` and ``mmproj-model.gguf`` (the Hub's naming) into
    ``out_dir``; returns (model, projector)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = write_llama_gguf(out / "model.gguf", SynthSpec(n_embd=n_embd, name="synthetic-vision-text"))
    base = LARGE if size == "large" else SMALL
    spec = ProjectorSpec(**{**base.__dict__, "n_embd_text": n_embd, "n_block": blocks if size == "large" else base.n_block})
    proj = write_projector(out / "mmproj-model.gguf", spec)
    return model, proj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--size", choices=("small", "large"), default="small")
    ap.add_argument("--blocks", type=int, default=1, help="ViT blocks of the large projector")
    ap.add_argument("--embd", type=int, default=64, help="the text model's n_embd (and the projection's width)")
    a = ap.parse_args()
    for p in write_vision_model(a.out_dir, size=a.size, blocks=a.blocks, n_embd=a.embd):
        print(p)


if __name__ == "__main__":
    main()

"""What a projector (mmproj) GGUF says about itself, and whether it fits a model.

A vision model in llama.cpp is two files: the text model and a projector whose
``general.architecture`` is ``clip`` (``$V/tools/mtmd/clip.cpp``). libmtmd
refuses a pair whose widths differ (``mtmd.cpp``: "mismatch between text model
(n_embd = ...) and mmproj (n_embd = ...)"), but only after loading both, and
with a line on stderr, and loads a projector of another family whose width
happens to match; here the headers are compared first (width and family), so
the user gets one line naming both files. The figures follow clip.cpp's ``load_hparams``
(keys, the GEMMA3 pool of 4) and ``clip_n_output_tokens`` (tokens per image).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localllm.errors import InputError
from localllm.modelfile.gguf_file import GGUFHeader, read_header

# projector types whose image is one fixed grid pooled n_merge x n_merge (clip.cpp, clip_n_output_tokens)
_POOLED = {"gemma3": 4, "idefics3": 2, "internvl": 2, "llama4": 2, "nemotron_v2_vl": 2}
_PLAIN = {"mlp", "ldp", "ldpv2", "mlp_norm"}  # llava-style: one token a patch
# The text architectures a projector type feeds, where llama.cpp's converter pairs them one way only
# (convert_hf_to_gguf.py: Gemma3ForConditionalGeneration writes gemma3 + a gemma3 projector; both Qwen2-VL and
# Qwen2.5-VL write qwen2vl). A type not listed is not checked: a llava-style MLP feeds many families.
FAMILIES = {"gemma3": ("gemma3",), "gemma3nv": ("gemma3n",), "gemma4v": ("gemma4",), "gemma4uv": ("gemma4",),
            "qwen2vl_merger": ("qwen2vl",), "qwen2.5vl_merger": ("qwen2vl",), "qwen3vl_merger": ("qwen3vl", "qwen3vlmoe"),
            "llama4": ("llama4",), "lfm2": ("lfm2", "lfm2moe")}
MAX_IMAGE_SIZE = 8192  # no released vision encoder takes more than ~2k px a side; past this a header is absurd
MAX_TOKENS_PER_IMAGE = 65536  # the context holds them all; more is no real projector


@dataclass(frozen=True)
class ProjectorInfo:
    path: Path
    projector_type: str
    has_vision: bool
    has_audio: bool
    image_size: int | None
    patch_size: int | None
    n_embd_vision: int | None  # the ViT's width
    n_embd_out: int | None  # what it hands the text model: must equal the model's n_embd
    n_block: int | None
    n_ff: int | None  # the ViT's feed-forward width
    n_merge: int | None
    tokens_per_image: int | None  # None: depends on the picture's size (dynamic resolution), known once encoded
    weight_bytes: int  # its tensors' data, as stored

    def to_dict(self) -> dict[str, object]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}

    def line(self) -> str:
        """One line: the projector's file, type, image size and tokens an image (or that it takes audio alone)."""
        if not self.has_vision:
            return f"projector {self.path.name} ({self.projector_type}, audio only)"
        size = f"{self.image_size} px" if self.image_size else "n/a"
        tokens = f"{self.tokens_per_image} tokens an image" if self.tokens_per_image is not None else "tokens by each picture's size"
        return f"projector {self.path.name} ({self.projector_type}, images at {size}, {tokens})"


def is_projector(header: GGUFHeader) -> bool:
    """A clip GGUF (an mmproj), not a model that generates."""
    return header.architecture == "clip"


def read_projector(path: str | Path) -> ProjectorInfo:
    """The projector at ``path``; ``InputError`` (one line) for a file that is
    not one or whose figures are absurd."""
    header = read_header(path)
    p = Path(path)
    if not is_projector(header):
        raise InputError(f"{p} is not a projector (mmproj) GGUF: its architecture is {header.architecture}")
    return describe(header)


def describe(header: GGUFHeader) -> ProjectorInfo:
    """The figures of a clip header (``is_projector``)."""
    p = header.path

    def num(key: str) -> int | None:
        v = header.get(key)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    ptype = str(header.get("clip.projector_type") or header.get("clip.vision.projector_type") or "unknown")
    has_vision = bool(header.get("clip.has_vision_encoder", False))
    image_size, patch = num("clip.vision.image_size"), num("clip.vision.patch_size")
    if has_vision and image_size is not None and not 1 <= image_size <= MAX_IMAGE_SIZE:
        raise InputError(f"projector {p} has an absurd clip.vision.image_size ({image_size}; at most {MAX_IMAGE_SIZE})")
    if has_vision and patch is not None and (not 1 <= patch <= (image_size or MAX_IMAGE_SIZE)):
        raise InputError(f"projector {p} has an absurd clip.vision.patch_size ({patch})")
    for t in header.tensors:
        # llama.cpp's converter writes these in F32 (conversion/base.py: "1D tensors or norms only handle F32",
        # POS_EMBD always F32); another type reaches a ggml_add/ggml_mul with no kernel for it and aborts the process
        if (len(t.shape) <= 1 or t.name.endswith("position_embd.weight") or "_norm" in t.name) and t.type.name != "F32":
            raise InputError(f"projector {p} stores {t.name} as {t.type.name}, where llama.cpp wants F32: a damaged or hand-made file")
    proj = next((t for t in header.tensors if t.name == "mm.input_projection.weight"), None)
    n_out = int(proj.shape[0]) if proj is not None and proj.shape else num("clip.vision.projection_dim")
    if n_out is None and not has_vision:  # an audio-only projector (localllm.audio.projector reads its encoder)
        n_out = num("clip.audio.projection_dim")
    merge = num("clip.vision.projector.scale_factor") or _POOLED.get(ptype)
    tokens: int | None = None
    if has_vision and image_size and patch:
        side = image_size // patch
        if ptype in _POOLED and merge:
            tokens = side * side // (merge * merge)
        elif ptype in _PLAIN:
            tokens = side * side
    if tokens is not None and tokens > MAX_TOKENS_PER_IMAGE:
        raise InputError(f"projector {p} would make {tokens} tokens of one image (image_size {image_size}, patch {patch}): absurd")
    return ProjectorInfo(
        path=p,
        projector_type=ptype,
        has_vision=has_vision,
        has_audio=bool(header.get("clip.has_audio_encoder", False)),
        image_size=image_size,
        patch_size=patch,
        n_embd_vision=num("clip.vision.embedding_length"),
        n_embd_out=n_out,
        n_block=num("clip.vision.block_count"),
        n_ff=num("clip.vision.feed_forward_length"),
        n_merge=merge if ptype in _POOLED else None,
        tokens_per_image=tokens,
        weight_bytes=sum(t.n_bytes for t in header.tensors),
    )


def check_pair(model: GGUFHeader, projector: ProjectorInfo) -> None:
    """Raise ``InputError`` naming both files when ``projector`` cannot feed ``model``."""
    mp, pp = model.path, projector.path
    if is_projector(model):
        raise InputError(f"{mp} is a projector (mmproj), not a model: give the text model as MODEL and {mp.name} as --mmproj"
                         + (f" (and not {pp.name})" if pp != mp else ""))
    if not projector.has_vision and not projector.has_audio:
        raise InputError(f"projector {pp} has neither a vision nor an audio encoder: nothing can go through it to {mp.name}")
    family = FAMILIES.get(projector.projector_type)
    if family is not None and model.architecture not in family:
        raise InputError(f"projector {pp.name} does not fit model {mp.name}: it is a {projector.projector_type} projector, for "
                         f"{' or '.join(family)} models, and the model is {model.architecture} (another model's projector?)")
    n_embd = model.arch_key("embedding_length")
    if isinstance(n_embd, int) and projector.n_embd_out is not None and n_embd != projector.n_embd_out:
        raise InputError(f"projector {pp.name} does not fit model {mp.name}: it hands over {projector.n_embd_out}-wide embeddings, "
                         f"the model's n_embd is {n_embd} (another model's projector?)")


def refuse_projector_as_model(path: Path, header: GGUFHeader, mmproj: Path | None = None) -> None:
    """A projector given where a model goes (``run mmproj.gguf``): one line naming both files."""
    if is_projector(header):
        other = f" and {mmproj.name} as --mmproj" if mmproj is not None else " and this file as --mmproj"
        raise InputError(f"{path} is a projector (mmproj), not a model: give the text model as MODEL{other}")


def beside(model: Path) -> Path | None:
    """The projector next to ``model`` in its folder (a Hub snapshot or a folder of
    files), as llama-server's ``-hf`` finds one: a ``*mmproj*.gguf``; of several,
    the one whose name shares the longest stem with the model's, else the
    smallest (f16 before f32). None when there is none."""
    folder = model.parent
    try:
        found = [p for p in folder.iterdir() if "mmproj" in p.name.lower() and p.name.lower().endswith(".gguf") and p.is_file()]
    except OSError:
        return None
    if not found:
        return None

    def rank(p: Path) -> tuple[int, int, str]:
        common = 0
        for a, b in zip(p.name.lower().replace("mmproj-", ""), model.name.lower()):
            if a != b:
                break
            common += 1
        try:
            size = p.stat().st_size
        except OSError:
            size = 1 << 62
        return (-common, size, p.name)

    return sorted(found, key=rank)[0]

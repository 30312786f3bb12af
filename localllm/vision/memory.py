"""A projector's memory, as llama.cpp allocates it, and as its load log says.

``$V/tools/mtmd/clip.cpp`` puts every weight of a projector in one buffer, on
one device: the first GPU (or integrated GPU) when libmtmd may use one
(``mtmd_context_params.use_gpu``), else the CPU ("CLIP using %s backend"); it
logs their sum as ``model size`` (``ggml_nbytes`` of each tensor: exactly the
tensor table's sizes). The compute buffer is sized by ``reserve_compute_meta``
on a warm-up image at ``image_size`` ("%s compute buffer size"), so it is read
from the log once loaded; before that, ``compute_estimate`` is an estimate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from localllm.vision.projector import ProjectorInfo

MIB = 1024 * 1024
_MODEL_SIZE = re.compile(r"model size:\s+([0-9.]+) MiB")
_COMPUTE = re.compile(r"reserve_compute_meta:\s+(\S+) compute buffer size =\s+([0-9.]+) MiB")
_BACKEND = re.compile(r"CLIP using (\S+) backend")


@dataclass(frozen=True)
class ProjectorMemory:
    device: str  # where clip.cpp puts the weights and the compute buffer: "GPU" or "CPU"
    weights_bytes: int  # derived: the tensor table's sizes, clip.cpp's "model size"
    compute_bytes: int | None  # an estimate before a load (compute_estimate); None where there is no formula
    audio: bool = False  # the estimate is (or holds) an audio encoder's

    def to_dict(self) -> dict[str, object]:
        what = "ViT activations on one warm-up image" if not self.audio else "the audio encoder's activations on one 30 s chunk"
        return {"device": self.device, "weights_bytes": self.weights_bytes, "weights_source": "the GGUF's tensor sizes (clip.cpp: model size)",
                "compute_bytes": self.compute_bytes, "compute_source": f"estimate ({what}, flash attention on)"}


def planned(info: ProjectorInfo, *, gpu: bool, audio_compute: int | None = None) -> ProjectorMemory:
    """What loading ``info`` will take, before it is loaded. ``audio_compute``: its
    audio encoder's buffer (``audio.projector.AudioInfo.compute_estimate``, which
    the caller reads: the audio package sits beside this one). clip.cpp gives each
    encoder its own context and buffer, so a projector with both needs both; one
    not known makes the whole n/a."""
    vision = compute_estimate(info) if info.has_vision else 0
    audio = audio_compute if info.has_audio else 0
    compute = None if vision is None or audio is None else vision + audio
    return ProjectorMemory(device="GPU" if gpu else "CPU", weights_bytes=info.weight_bytes, compute_bytes=compute, audio=info.has_audio)


def compute_estimate(info: ProjectorInfo) -> int | None:
    """An estimate of clip.cpp's compute buffer for a ViT projector: the warm-up
    image's patches times the widest live activations, the feed-forward's and
    two of the residual stream's, in f32 (with flash attention, which clip.cpp
    turns on where the device has it, no patches-by-patches matrix is kept).
    Within 25% of the logged buffer on the synthetic projectors (tests/vision)."""
    if not info.image_size or not info.patch_size or not info.n_embd_vision:
        return None
    n_patches = (info.image_size // info.patch_size) ** 2
    n_ff = info.n_ff or 4 * info.n_embd_vision  # a ViT's usual ratio where the header lacks it
    return n_patches * (n_ff + 2 * info.n_embd_vision) * 4


@dataclass(frozen=True)
class LoggedMemory:
    device: str | None  # "CLIP using X backend"
    weights_bytes: int | None  # "model size" (MiB, to 0.01)
    compute_bytes: dict[str, int]  # per buffer type: "X compute buffer size"

    def to_dict(self) -> dict[str, object]:
        return {"device": self.device, "weights_bytes": self.weights_bytes, "compute_bytes": dict(self.compute_bytes)}


def parse_log(lines: list[str]) -> LoggedMemory:
    """clip.cpp's own figures from its load log (the last warm-up's compute buffers)."""
    device = weights = None
    compute: dict[str, int] = {}
    for line in lines:
        if (m := _BACKEND.search(line)) is not None:
            device = m.group(1)
        elif (m := _MODEL_SIZE.search(line)) is not None:
            weights = int(float(m.group(1)) * MIB)
        elif (m := _COMPUTE.search(line)) is not None:
            compute[m.group(1)] = int(float(m.group(2)) * MIB)
    return LoggedMemory(device, weights, compute)

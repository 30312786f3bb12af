"""Which projector goes with a model, and whether it fits beside it: for every
front end that loads one (``run``, ``chat``, ``plan`` through
``commands/vision_cli``; the cockpit directly, since it may not import the CLI).

The projector is the one given (``--mmproj``), else one found beside the model
(``projector.beside``, as llama-server's ``-hf`` finds it), unless the user
said ``--no-mmproj``. A given one that is wrong is an error; a found one that
is wrong (another model's, in a shared folder) is a notice, and the model runs
text only. The fit counts the projector (weights derived, compute estimated:
``memory.planned``) against what the model's fit left on the device clip.cpp
puts it; ``fit`` is the planner's ``fitting.Fit``, read by attribute (vision
sits below plan).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localllm.errors import LocalLLMError, UsageError
from localllm.modelfile.gguf_file import GGUFHeader, read_header
from localllm.util import fmt
from localllm.vision.memory import ProjectorMemory, planned
from localllm.vision.projector import beside, check_pair, read_projector, refuse_projector_as_model


def choose(model: Path, given: str | Path | None, *, no_mmproj: bool = False,
           header: GGUFHeader | None = None) -> tuple[Path | None, str | None]:
    """(the projector for ``model`` or None, a notice or None). A projector given
    as the model, ``given`` with ``no_mmproj``, or a given projector that does not
    match the model raise one line; a found one that does not match is the notice."""
    header = header if header is not None else read_header(model)
    mmproj = Path(given).expanduser() if given else None
    refuse_projector_as_model(model, header, mmproj)
    if mmproj is not None and no_mmproj:
        raise UsageError("--mmproj and --no-mmproj contradict each other")
    if mmproj is not None:
        check_pair(header, read_projector(mmproj))
        return mmproj, None
    found = None if no_mmproj else beside(model)
    if found is None:
        return None, None
    try:
        check_pair(header, read_projector(found))
    except LocalLLMError as exc:
        return None, f"not using the projector beside the model ({exc}): text only; --mmproj FILE names one"
    return found, None


def need(mem: ProjectorMemory) -> int:
    """Bytes the projector takes: its weights and its compute buffer (estimated)."""
    return mem.weights_bytes + (mem.compute_bytes or 0)


def room(fit: Any, path: Path, audio_compute: int | None = None) -> tuple[ProjectorMemory, int | None]:
    """The projector's memory on the device clip.cpp puts it, and what the model's
    fit leaves there (None: no RAM figure). ``audio_compute``: see ``memory.planned``."""
    mem = planned(read_projector(path), gpu=fit.gpu_budget is not None, audio_compute=audio_compute)
    if mem.device == "GPU":
        return mem, fit.gpu_budget - fit.plan.total_gpu_bytes - fit.margin
    return mem, None if fit.ram is None else fit.ram - fit.plan.total_cpu_bytes


def shortfall(fit: Any, path: Path) -> str | None:
    """The one line to refuse the projector with when it does not fit beside the model; None when it fits."""
    mem, free = room(fit, path)
    n = need(mem)
    if free is None or free >= n:
        return None
    return (f"does not fit with the projector {path.name}: it needs {fmt.size(n)} on the {mem.device} (weights "
            f"{fmt.size(mem.weights_bytes)}, compute ≈ {fmt.size(mem.compute_bytes or 0)}, an estimate), "
            f"{fmt.size(max(free, 0))} is left after the model: try --no-mmproj, a smaller --ctx or a smaller quant")

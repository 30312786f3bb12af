"""A vision model on the command line: ``--mmproj``, ``--image`` and chat's ``/image``.

What can be checked without llama.cpp is checked before the model loads: the
model is not a projector, every image reads and is within bounds, the projector
fits the model (``vision.projector``); each failure is one line. The projector
is the one given, else one found beside the model (``vision.projector.beside``,
as llama-server's ``-hf`` finds it), unless ``--no-mmproj``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.audio.sound import AudioClip
from localllm.commands import audio_cli
from localllm.commands._common import say
from localllm.errors import InputError, LocalLLMError, UsageError
from localllm.vision import choice
from localllm.vision.image import RGBImage, load_image
from localllm.vision.projector import ProjectorInfo

if TYPE_CHECKING:
    from localllm.flags import Vision


def projector_path(vision: Vision, model: Path, *, quiet: bool = False) -> Path | None:
    """The projector for ``model``: ``--mmproj``, else one beside it; checked against its header
    (``vision.choice.choose``). A given one that is wrong is an error; a found one that is wrong
    (another model's, in a shared folder) is a notice, and the model runs text-only."""
    found, notice = choice.choose(model, vision.mmproj, no_mmproj=vision.no_mmproj)
    if notice and not quiet:
        say(notice)
    return found


def prepare(vision: Vision, model: Path, *, quiet: bool, alone: bool) -> tuple[list[RGBImage | AudioClip], Path | None]:
    """``run``'s images and sound files (decoded, bounded: pictures first, then clips, as the
    prompt holds them) and projector, before any load; ``quiet``: no notice (--json);
    ``alone``: neither --speculate nor --tools, which media cannot go with."""
    images = [load_image(f) for f in vision.images]
    clips = audio_cli.load_clips(vision.audio)
    proj = projector_path(vision, model, quiet=quiet)
    audio_cli.check(clips, images, proj, model)
    if images and proj is None:
        raise UsageError(f"--image needs a vision model: no projector beside {model.name}; pass --mmproj FILE")
    if images and not alone:
        raise UsageError("--image goes without --speculate and --tools")
    if clips and not alone:
        raise UsageError("--audio goes without --speculate draft and --tools")
    return [*images, *clips], proj


def attach(backend: Any, path: Path, *, quiet: bool = False) -> ProjectorInfo:
    """Load the projector on the loaded model and say what it is."""
    info = backend.load_projector(path)
    if not quiet:
        say(f"vision: {describe(info)}")
    return info


def describe(info: ProjectorInfo) -> str:
    """One line: the projector's file, type, image size and tokens an image."""
    return info.line()


def image_command(arg: str, backend: Any, attached: list[RGBImage]) -> None:
    """chat's ``/image FILE``: the picture, read and bounded now, goes with the next
    message. A bad file or no projector is one line on stderr; the chat goes on."""
    if not arg:
        say("usage: /image FILE (a PNG, JPEG, WebP or GIF, sent with your next message)")
        return
    if backend.projector is None:
        say("error: /image needs a vision model: start chat with --mmproj FILE (none was found beside the model)")
        return
    try:
        im = load_image(arg)
    except LocalLLMError as exc:
        say(f"error: {exc}")
        return
    attached.append(im)
    n = backend.projector.info.tokens_per_image
    say(f"attached {im.label}, {im.file_bytes / 1024:.0f} KiB, {n if n is not None else 'n/a'} image tokens: sent with your next message")


def memory_lines(backend: Any) -> list[str]:
    """``run -v``: the projector's memory as planned (vision.memory) beside what clip.cpp logged."""
    proj = backend.projector
    if proj is None:
        return []
    plan, logged = proj.planned_memory, proj.logged_memory

    def mib(n: int | None) -> str:
        return f"{n / 2**20:.2f} MiB" if n is not None else "n/a"

    compute = ", ".join(f"{dev} {mib(n)}" for dev, n in logged.compute_bytes.items()) or "n/a"
    return [
        f"projector memory: weights {mib(plan.weights_bytes)} on the {plan.device} (from its tensors),"
        f" logged {mib(logged.weights_bytes)} on {logged.device or 'n/a'}",
        f"projector memory: compute buffer ≈ {mib(plan.compute_bytes)} (estimate), logged {compute}",
    ]


def json_block(backend: Any) -> dict[str, Any] | None:
    """``run --json``'s ``projector``: what it is, its memory planned and logged."""
    proj = backend.projector
    if proj is None:
        return None
    return {**proj.info.to_dict(), "memory": {"planned": proj.planned_memory.to_dict(), "logged": proj.logged_memory.to_dict()}}


def check_fit(fitted: Any, path: Path) -> None:
    """The projector counted against what the model's fit leaves (``vision.choice.room``).
    Not fitting is one line naming the shortfall; the model's own fit is not redone."""
    line = choice.shortfall(fitted.fit, path)
    if line:
        raise InputError(line)

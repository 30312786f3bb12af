"""A model loaded for the cockpit, through the one load path (``localllm.runtime``).

The cockpit asks for a model with its settings (``LoadRequest``); the engine
thread fits it (``runtime.plan``), closes the model loaded before (two at once
may not fit), loads the new one and, if that fails, loads the previous one
again as it was (``runtime.reload_or_restore``): a bad file or an absurd
setting costs nothing. The answer (``LoadResult``) says what became loaded,
its memory figures, its projector and the conversation to carry on; nothing
of the session changes before it is applied (``CockpitSession.adopt``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localllm import runtime, speculation
from localllm.audio.projector import describe_audio
from localllm.audio.sound import AudioClip
from localllm.chat import sessions
from localllm.chat.session import ChatSession, prompt_cache_path
from localllm.cockpit.attachments import restore_images
from localllm.cockpit.settings import Settings
from localllm.cockpit.wording import printable, reason
from localllm.engine_api import Engine, LoadConfig
from localllm.errors import InputError
from localllm.measure.predict import measured_ram_bandwidth
from localllm.modelfile.gguf_file import read_header
from localllm.plan import fitting, hardware, planner
from localllm.plan.hardware import Hardware, gpu_memory_bandwidth, physical_cores
from localllm.plan.workers import Endpoint, probe_all
from localllm.store import resolver
from localllm.store.builtin import CATALOG, embedded_path, path_of
from localllm.vision import choice as projector_choice
from localllm.vision.image import RGBImage
from localllm.vision.marker import MARKER
from localllm.vision.projector import ProjectorInfo


@dataclass
class Footprint:
    """The loaded model's memory plan, as the memory panel shows it."""

    shape: planner.ModelShape
    plan: planner.MemoryPlan
    budget_label: str
    budget: int
    placement: object = None  # placement.Placement, with --rpc: per device
    max_ctx_by_kv_type: Mapping[str, int] | None = None  # the fit's largest context per KV cache type (what would hold a message)
    trained_ctx: int | None = None


@dataclass
class LoadRequest:
    """A model to load, and what becomes current once it is loaded (nothing
    changes before: a load that fails leaves the session as it was)."""

    path: Path
    settings: Settings
    messages: list[dict[str, str]] | None  # the conversation to carry on (None: a new chat)
    saved: sessions.SavedSession | None  # the saved session that conversation belongs to
    redraw: bool  # show ``messages`` in the chat log instead of what it shows now
    # What the engine thread needs of the session, read when the request is
    # made: the engine thread reads its request, never the session.
    previous: tuple[Engine, Path, LoadConfig] | None = None  # the loaded model, closed first and reloaded on failure
    bandwidth: float | None = None  # the RAM bandwidth measured before (None: measure it)
    gpu_bandwidth: float | None = None
    # a vision model's projector: (--mmproj, the model it was given for, --no-mmproj), decided on the engine thread
    mmproj: tuple[Path | None, Path | None, bool] = (None, None, False)
    images: Mapping[str, RGBImage | AudioClip] | None = None  # the conversation's images at hand (by sha256: a reload with other settings)
    image_refs: list[dict[str, Any]] | None = None  # where each of the conversation's images was read from, in marker order
    hardware: Hardware | None = None  # the machine the fit is for
    rpc: tuple[Endpoint, ...] = ()  # workers whose devices join the local ones (--rpc)
    lost_text: str = ""  # why llama.cpp lost its engine thread before, if it did (over --rpc: a load would never end)


@dataclass
class LoadResult:
    """The engine thread's answer to a LoadRequest: the loaded engine and its
    numbers, or the error and whether the previous model is still loaded."""

    request: LoadRequest
    backend: Engine | None = None
    config: LoadConfig | None = None
    note: str = ""  # how the fit changed the settings, if it did
    footprint: Footprint | None = None
    bandwidth: float | None = None
    error: str | None = None
    kept: bool = False  # the load failed and the previous model is loaded again
    gpu_bandwidth: float | None = None  # the GPU's memory bandwidth, where it is known
    memory_check: object = None  # memcheck.MemoryCheck of this load, or None
    projector: ProjectorInfo | None = None  # the vision projector loaded with it, or None
    notes: list[str] = field(default_factory=list)  # lines for the log: a projector not loaded, an image not read again
    messages: list[dict[str, str]] | None = None  # the conversation, its lost images' markers replaced
    images: list[RGBImage | AudioClip] = field(default_factory=list)  # its images and clips, in marker order

    def __post_init__(self) -> None:
        if self.messages is None:
            self.messages = self.request.messages


def shown(path: Path) -> str:
    """A file's name as the screen may show it: control characters escaped, so a
    model's name cannot move the cursor or forge a line."""
    return printable(path.name)


def ensure_built_in(path: Path) -> Path:
    """``path`` itself, once a built-in model that lives there is assembled (the
    file of gemma3-270m is made from its PyPI package on first use)."""
    if not path.exists():
        for entry in CATALOG:
            if embedded_path(entry.name) == path:
                return path_of(entry)
    return path


def choose_config(req: LoadRequest, projector: Path | None = None) -> tuple[runtime.Planned, str, Footprint]:
    """Ask the load path's fitting service, as the CLI does: the settings' cache
    types are kept, blank GPU layers are fitted, the context shrinks (or layers
    move to the CPU, by the policy) when the budget is short. With --rpc,
    across the workers' devices, a local GPU and the CPU. The header is read
    once, by ``runtime.plan``; the memory panel's shape comes from it."""
    hw, s = req.hardware, req.settings
    assert hw is not None, "a load request names the machine"
    if req.rpc and req.lost_text:
        # llama.cpp keeps the lost connection (its dispatcher, held) for this endpoint in this
        # process, and would queue the new load's calls to it: the load would never end
        raise InputError("llama.cpp still holds the connection to the worker that stopped: "
                         "quit (Ctrl+Q) and start localllm tui --rpc again")
    # llama.cpp's dry run referees the compute figure where the replay does not cover the model;
    # does not fit (the model, or its projector beside it): one line, before the model loaded now is closed
    request = runtime.LoadRequest(model=req.path, options=s.load_options(), hardware=hw, rpc=req.rpc,
                                  lora=tuple(s.adapter_specs()), projector=projector, projector_optional=True,
                                  n_outputs=speculation.rows(s.speculate))  # rows of logits for draftless speculation's drafts
    planned = runtime.plan(request).check()
    fit = planned.fit
    shape = planner.ModelShape.from_header(planned.header)
    note = "" if fit.outcome is fitting.Outcome.FITS_AS_ASKED else f"auto-fit: {fit.sentence}"
    if req.rpc:
        pl = planned.placement
        return planned, note, Footprint(shape, pl.plan, "RAM", hw.ram_available_bytes, pl)
    if hw.gpu_budget is not None:
        label = {"--vram": "GPU budget (--vram)", "nvml": f"GPU {hw.gpu_name}", "apple-unified": "unified memory"}.get(hw.gpu_source, "GPU")
        fp = Footprint(shape, planned.lp.plan, label, hw.gpu_budget)
    else:
        fp = Footprint(shape, planned.lp.plan, "RAM", hw.ram_available_bytes)
    fp.max_ctx_by_kv_type, fp.trained_ctx = fit.max_ctx_by_kv_type, fit.trained_ctx
    return planned, note, fp


def projector_for(req: LoadRequest, notes: list[str]) -> Path | None:
    """The projector to load with ``req.path`` (engine thread): --mmproj for the model
    it was given with, else one found beside the model (checked against it), unless
    --no-mmproj. One found that does not match is a note, and the model runs text only."""
    given, given_for, no_mmproj = req.mmproj
    if no_mmproj:
        return None
    if given is not None and given_for is not None and req.path == given_for:
        return given
    found, notice = projector_choice.choose(req.path, None)
    if notice:
        notes.append(notice)
    return found


def projector_note(path: Path, info: ProjectorInfo | None, error: Exception | None) -> str:
    """The log's line on the projector the load path loaded (or why not: the chat goes on text only)."""
    if isinstance(error, runtime.NoImages):  # the scripted fake takes no images
        return f"this engine takes no images: the projector {shown(path)} is not loaded"
    if info is None:
        return f"the projector {shown(path)} was not loaded: {reason(error) if error is not None else 'n/a'} · text only"
    if not info.has_vision:  # an audio model's: what a clip costs instead of a picture
        audio = describe_audio(read_header(path))
        per = f"{audio.tokens_per_chunk} tokens each 30 s of sound" if audio is not None and audio.tokens_per_chunk else "tokens n/a"
        return f"audio: projector {shown(path)} ({printable(info.projector_type)}, {per}) · Ctrl+F attaches a sound file"
    size = f"{info.image_size} px" if info.image_size else "n/a"
    tokens = f"{info.tokens_per_image} tokens an image" if info.tokens_per_image is not None else "tokens by picture size"
    return f"vision: projector {shown(path)} ({printable(info.projector_type)}, images at {size}, {tokens}) · Ctrl+F attaches"


def load(req: LoadRequest, backend_factory: Callable[[], Engine]) -> LoadResult:
    """Load the requested model through the load path (on the engine thread).
    The previous one is closed first (two models at once may not fit); if the new
    one fails, the previous one is loaded again as it was (``runtime.reload_or_restore``)."""
    notes: list[str] = []
    try:
        ensure_built_in(req.path)  # gemma3-270m chosen on F2 before its first use: assembled here, off the UI thread
        projector = projector_for(req, notes)
        planned, note, fp = choose_config(req, projector)
    except Exception as exc:  # noqa: BLE001 - a bad file must not end the app
        return LoadResult(req, error=reason(exc), kept=req.previous is not None)
    previous = None
    if req.previous is not None:
        old, old_path, old_cfg = req.previous
        old_projector = getattr(getattr(old, "projector", None), "path", None)  # loaded again with the old model, if it comes back
        # --lora is given on the command line only: the previous model had the same adapters
        previous = runtime.Previous(old, old_path, old_cfg, projector=old_projector, lora=tuple(req.settings.adapter_specs()))
    switched = runtime.reload_or_restore(previous, planned, backend_factory)
    if switched.loaded is None:
        assert switched.error is not None, "a switch that loaded nothing says why"
        error = reason(switched.error)
        if switched.restore_error is not None and previous is not None:
            error += f"; reloading {shown(previous.path)} failed too: {reason(switched.restore_error)}"
        if switched.projector_error is not None and previous is not None and previous.projector is not None:
            error += "; " + projector_note(previous.projector, None, switched.projector_error)
        return LoadResult(req, error=error, kept=switched.kept)
    loaded = switched.loaded
    bandwidth = req.bandwidth
    if bandwidth is None:
        try:
            bandwidth = measured_ram_bandwidth(loaded.config.n_threads or physical_cores())  # once a process: a reload reads it again
        except Exception:  # noqa: BLE001 - the roofline line is then left out
            bandwidth = None
    gpu_bandwidth = req.gpu_bandwidth if req.bandwidth is not None else gpu_memory_bandwidth()
    info = loaded.projector
    if projector is not None:
        notes.append(projector_note(projector, info, loaded.projector_error))
    messages, images = req.messages, list[RGBImage | AudioClip]()
    if messages and any(MARKER in m["content"] for m in messages):  # the conversation's images, read again where not at hand
        messages, images, lost = restore_images(messages, req.image_refs or [], can_see=info is not None, have=req.images or {},
                                                can_hear=info is not None and info.has_audio)
        notes += lost
    return LoadResult(req, backend=loaded.engine, config=loaded.config, note=note, footprint=fp, bandwidth=bandwidth,
                      gpu_bandwidth=gpu_bandwidth, memory_check=loaded.memory_check, projector=info, notes=notes,
                      messages=messages, images=images)


def new_chat(backend: Engine, config: LoadConfig, model: Path, s: Settings, messages: Sequence[dict[str, str]] | None) -> ChatSession:
    """A chat on the loaded model. A model without a chat template (a base
    model) gets completion mode: the conversation is one text it continues,
    with no system prompt (a base model has no notion of one)."""
    completion = not backend.has_chat_template
    system = None if completion else (s.system_prompt or None)
    chat = ChatSession(
        backend,
        system_prompt=system,
        sampling=s.sampling(),
        sliding_window=s.sliding_window,
        thinking=s.thinking,
        keep_override=s.n_keep,
        completion=completion,
        prompt_cache=prompt_cache_path(model, system, config.type_k, config.type_v, config.swa_full) if system else None,
    )
    if messages:
        chat.messages = ([{"role": "system", "content": system}] if system else []) + [m for m in messages if m["role"] != "system"]
    return chat


@dataclass(frozen=True)
class Start:
    """What the cockpit starts with, checked before its screen opens."""

    path: Path  # the model to load first
    hardware: Hardware
    backend_factory: Callable[[], Engine]
    projector: Path | None  # --mmproj, or the one found beside the model
    notice: str | None  # a projector found beside the model that does not fit it


def start(model: str | None, *, vram: int | None, backend_factory: Callable[[], Engine] | None, rpc: Sequence[Endpoint] | None,
          mmproj: str | Path | None, no_mmproj: bool) -> Start:
    """The model named (``resolver.resolve``), its header read (a bad file is a
    one-line error before the screen opens), its projector chosen, the --rpc
    workers probed (one that is down is one line too) and the machine detected."""
    path = resolver.resolve(model)
    header = read_header(path)
    projector, notice = projector_choice.choose(path, mmproj, no_mmproj=no_mmproj, header=header)
    if rpc:
        probe_all(list(rpc))
    if backend_factory is None:
        from localllm.engine import LlamaCppBackend  # lazy: loads llama.cpp (~155 ms here), which the cockpit does not load at import

        backend_factory = LlamaCppBackend
    return Start(path, hardware.detect(vram), backend_factory, projector, notice)

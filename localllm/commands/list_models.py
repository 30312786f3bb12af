"""``localllm list``: every model localllm can name, read from its header, judged
against the GPU budget; ``--catalog``: the curated 4-6 GB list; ``--sessions``:
the saved chat sessions and their kept KV state (``list_sessions``)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from localllm import flags
from localllm.errors import LocalLLMError, UsageError
from localllm.util import fmt
from localllm.util.units import Size

if TYPE_CHECKING:
    from localllm.flags import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser("list", help="models here: pulled, Hugging Face cache, LM Studio, Ollama, added; and whether each fits")
    p.add_argument("--catalog", action="store_true", help="the curated list of models for 4-6 GiB GPUs, with the planner's verdicts")
    p.add_argument("--sessions", action="store_true", help="saved chat sessions, each with its kept KV state, against the disk budget")
    p.add_argument("--vram", type=flags.size, default=None, metavar="SIZE", help="judge fit against this GPU budget (default: detected)")
    p.add_argument("--json", action="store_true", help="a JSON list")


@dataclass(frozen=True)
class Options:
    catalog: bool
    vram: Size | None
    json: bool
    sessions: bool = False

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(catalog=ns.catalog, vram=ns.vram, json=ns.json, sessions=ns.sessions)


@dataclass
class Row:
    name: str
    source: str
    owner: str
    path: str
    architecture: str | None
    quant: str | None
    size_bytes: int | None
    context_length: int | None
    fits: bool | None
    fit: str  # the verdict in words, or why the file could not be read
    repo: str | None
    projector: str | None = None  # a vision model: the projector beside it (vision.projector.beside)
    media: str | None = None  # what that projector takes: "vision", "audio" or "vision, audio"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rows(hw: Any) -> list[Row]:
    """One row per registry model, judged against ``hw`` (a hardware.Hardware)."""
    # lazy: loads gguf, numpy (~87 ms here), which list_models does not load at import
    from localllm.modelfile.gguf_file import read_header

    # lazy: loads gguf, numpy (~82 ms here), which list_models does not load at import
    from localllm.modelfile.model_info import describe

    # lazy: loads gguf, numpy (~116 ms here), which list_models does not load at import
    from localllm.plan import planner, verdict
    from localllm.store import registry  # lazy: the store's registry (hashlib, tempfile: ~12 ms), which --help (register above) does not need

    ram = hw.ram_available_bytes
    out = []
    for e in registry.discover():
        if not e.present:
            out.append(Row(e.name, e.source, e.owner, str(e.path), None, e.quant, None, None, None, "made on first use", e.repo))
            continue
        try:
            header = read_header(e.path)
            info = describe(header)
            v = verdict.judge(planner.ModelShape.from_header(header), info.context_length, hw.gpu_budget, ram)
            near = _projector(e.path, header)
            out.append(
                Row(e.name, e.source, e.owner, str(e.path), info.architecture, info.file_type, info.size_bytes, info.context_length, v.full_gpu, v.text, e.repo,
                    str(near) if near is not None else None, _media(near))
            )
        except LocalLLMError as exc:
            out.append(Row(e.name, e.source, e.owner, str(e.path), None, e.quant, None, None, False, f"unreadable: {exc}", e.repo))
    return out


def _projector(path: Any, header: Any) -> Any:
    """The projector beside the model that fits it (vision.projector), else None: a stray or another model's is no mark."""
    # lazy: loads gguf (~200 ms here), which list_models does not load at import
    from localllm.vision.projector import beside, check_pair, read_projector

    near = beside(path)
    if near is None:
        return None
    try:
        check_pair(header, read_projector(near))
    except LocalLLMError:
        return None
    return near


def _media(near: Any) -> str | None:
    """What the projector ``near`` takes besides text (its header's encoders), or None."""
    if near is None:
        return None
    from localllm.vision.projector import read_projector  # lazy: as in _projector

    try:
        p = read_projector(near)
    except LocalLLMError:
        return None
    return ", ".join(k for k, on in (("vision", p.has_vision), ("audio", p.has_audio)) if on) or None


MIN_PATH = 20  # narrower than this, each path goes on a line of its own under its row
WIDE = 100  # below this many columns the source and architecture columns are left out (--json has them)


def render(table: list[Row], budget_note: str, columns: int | None = None) -> str:
    """The table in ``columns`` cells (the terminal's width, 80 when unknown):
    the path column takes what the others leave, or a line of its own under
    each row, shortened with ``~`` and an ellipsis (``--json`` keeps the full path)."""
    import shutil

    columns = columns or shutil.get_terminal_size((80, 24)).columns
    wide = columns >= WIDE
    head = ("NAME", *(("SOURCE", "ARCH") if wide else ()), "QUANT", "SIZE", "CTX", "FITS " + budget_note)
    body = [
        (
            r.name + (f" ({r.media or 'vision'})" if r.projector else ""),
            *((r.source, r.architecture or "-") if wide else ()),
            r.quant or "-",
            fmt.size(r.size_bytes) if r.size_bytes else "-",
            f"{r.context_length:,}" if r.context_length else "-",
            r.fit,
        )
        for r in table
    ]
    right = (4, 5) if wide else (2, 3)
    used = max(len(line) for line in fmt.table(head, body, right=right).splitlines())
    room = columns - used - 2
    if room >= MIN_PATH:
        paths = [fmt.short_path(r.path, room) for r in table]
        return fmt.table((*head, "PATH"), [(*b, p) for b, p in zip(body, paths)], right=right)
    lines = fmt.table(head, body, right=right).splitlines()
    return "\n".join([lines[0]] + [f"{line}\n  {fmt.safe(fmt.short_path(r.path, columns - 2))}" for line, r in zip(lines[1:], table)])


def run(args: argparse.Namespace) -> int:
    opts = Options.from_args(args)
    if opts.sessions:
        if opts.catalog:
            raise UsageError("list shows --catalog or --sessions, not both: give one")
        from localllm.commands import list_sessions  # lazy: the saved sessions' store (~11 ms), which --help does not need

        return list_sessions.run(as_json=opts.json)
    if opts.catalog:
        # lazy: loads gguf, numpy (~142 ms here), which list_models does not load at import
        from localllm.commands import list_catalog

        return list_catalog.run(as_json=opts.json)

    from localllm.plan import hardware  # lazy: reads the GPU and RAM (~3 ms at import), which --help (register above) does not need

    hw = hardware.detect(opts.vram)
    table = rows(hw)
    if opts.json:
        fmt.print_json([r.to_dict() for r in table])
        return 0
    note = f"({fmt.size(hw.gpu_budget)} GPU)" if hw.gpu_budget else "(RAM)"
    print(render(table, note))
    return 0

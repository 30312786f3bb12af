"""``localllm inspect``: the model's architecture and sizes, read from its header."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from localllm import flags
from localllm.util import fmt

if TYPE_CHECKING:
    from localllm.flags import Subparsers
    from localllm.modelfile.model_info import ModelInfo
    from localllm.vision.projector import ProjectorInfo


def register(sub: Subparsers) -> None:
    p = sub.add_parser("inspect", help="what a GGUF model is, from its header (no load)")
    flags.add_model(p)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


@dataclass(frozen=True)
class Options:
    model: str | None
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(model=ns.model, json=ns.json)


def render(info: ModelInfo, tool_format: str = "") -> str:
    """``tool_format``: the tool-call format the chat template speaks (localllm.toolcalls.detect); "" when unknown."""
    rows = [
        ("name", info.name),
        ("path", info.path),
        ("architecture", info.architecture),
        ("parameters", f"{fmt.count(info.n_params)} ({info.n_params:,})"),
        ("file size", f"{fmt.size(info.size_bytes)} ({info.size_bytes:,} bytes)"),
        ("file type", f"{info.file_type}, {info.bits_per_weight:.2f} bits per weight"),
        ("layers", str(info.n_layer)),
        ("embedding", str(info.n_embd)),
        ("heads", f"{info.n_head} query, {info.n_head_kv} key/value (GQA {info.gqa_ratio:g}:1)"),
        ("head dims", f"key {info.head_dim_k}, value {info.head_dim_v}"),
        ("trained context", f"{info.context_length:,} tokens"),
    ]
    if info.sliding_window:
        rows.append(("sliding window", f"{info.sliding_window} tokens on {len(info.swa_layers)} of {info.n_layer} layers: {_ranges(info.swa_layers)}"))
    else:
        rows.append(("sliding window", "none"))
    rows.append(("vocabulary", f"{info.n_vocab:,} tokens"))
    rows.append(("chat template", "yes" if info.chat_template else "no (a base model: use run --raw)"))
    if tool_format:
        rows.append(("tool calls", tool_format if tool_format != "generic" else "generic (no format of its own: tools described in a system message)"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {fmt.safe(v)}" for k, v in rows]  # name and path come from the file
    lines.append("")
    total = sum(t.bytes for t in info.tensor_types) or 1
    lines.append(fmt.table(("tensor type", "tensors", "size", "share"),
                           [(t.type, str(t.count), fmt.size(t.bytes), f"{100 * t.bytes / total:.1f}%") for t in info.tensor_types], right=(1, 2, 3)))
    return "\n".join(lines)


def _ranges(idx: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def projector_rows(p: ProjectorInfo) -> list[tuple[str, str]]:
    """A projector's figures (vision.projector: clip.cpp's keys and token count; audio.projector for its audio encoder)."""
    tokens = str(p.tokens_per_image) if p.tokens_per_image is not None else "n/a (depends on the picture's size)"
    rows = [
        ("projector", f"{p.path.name} ({p.projector_type}, {fmt.size(p.weight_bytes)})"),
        ("takes", capabilities(p)),
    ]
    if p.has_vision:
        rows += [("image size", f"{p.image_size} px, patches of {p.patch_size} px" if p.image_size else "n/a"), ("tokens per image", tokens)]
    a = audio_of(p)
    if a is not None:
        per = f"{a.tokens_per_chunk} tokens each 30 s" if a.tokens_per_chunk is not None else "tokens n/a"
        rows.append(("audio encoder", f"{a.projector_type}, {a.n_mel or 'n/a'} mel bins, {per}"))
    rows.append(("projector width", f"{p.n_embd_out} (the text model's n_embd)" if p.n_embd_out else "n/a"))
    return rows


def capabilities(p: ProjectorInfo | None) -> str:
    """What a model takes besides text, in words: "images", "audio", "images and audio" (or "text only")."""
    kinds = [k for k, on in (("images", p is not None and p.has_vision), ("audio", p is not None and p.has_audio)) if on]
    return " and ".join(kinds) or "text only"


def audio_of(p: ProjectorInfo) -> Any:
    """The audio encoder's figures (audio.projector.AudioInfo), or None."""
    if not p.has_audio:
        return None
    from localllm.audio.projector import describe_audio  # lazy: as run's imports, only for an audio projector
    from localllm.modelfile.gguf_file import read_header  # lazy: as above

    return describe_audio(read_header(p.path))


def _media_json(p: ProjectorInfo | None) -> dict[str, object]:
    a = audio_of(p) if p is not None else None
    return {"capabilities": {"vision": bool(p and p.has_vision), "audio": bool(p and p.has_audio)},
            "audio_encoder": a.to_dict() if a is not None else None}


def _projector_only(p: ProjectorInfo, as_json: bool) -> int:
    if as_json:
        fmt.print_json({"projector": p.to_dict(), **_media_json(p)})
    else:
        rows = [("path", str(p.path)), *projector_rows(p), ("note", "a projector (mmproj) is not a model: run the text model with --mmproj this file")]
        width = max(len(k) for k, _ in rows)
        print("\n".join(f"{k:<{width}}  {fmt.safe(v)}" for k, v in rows))
    return 0


def run(args: argparse.Namespace) -> int:
    # lazy: the header reader and the store load gguf (~0.1 s), which --help (this module's register) does not need
    from localllm import toolcalls
    from localllm.modelfile.gguf_file import read_header  # lazy: as above
    from localllm.modelfile.model_info import inspect_model  # lazy: as above
    from localllm.store import names, resolver  # lazy: as above
    from localllm.vision.projector import beside, describe, is_projector  # lazy: as above

    opts = Options.from_args(args)
    proj: ProjectorInfo | None = None
    try:
        path = resolver.resolve(opts.model)
        header = read_header(path)
        if is_projector(header):
            return _projector_only(describe(header), opts.json)
        near = beside(path)
        proj = describe(read_header(near)) if near is not None else None
        info = inspect_model(path)
        template = header.get("tokenizer.chat_template")
        tool_format = toolcalls.detect(template).name if isinstance(template, str) else ""
    except names.NotDownloaded as nd:
        with names.header_of(nd.name) as (stub, remote):
            info = replace(inspect_model(stub), path=f"{remote.label} (not downloaded: its header read from the Hub, nothing stored)")
        tool_format = ""
    if opts.json:
        fmt.print_json({**info.to_dict(), "tool_call_format": tool_format or None, "projector": proj.to_dict() if proj is not None else None,
                        **_media_json(proj)})
    else:
        print(render(info, tool_format))
        if proj is not None:
            print("\n" + "\n".join(f"{k:<16}  {fmt.safe(v)}" for k, v in projector_rows(proj)))
    return 0

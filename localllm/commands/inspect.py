"""``localllm inspect``: the model's architecture and sizes, read from its header."""

from __future__ import annotations

import argparse
from dataclasses import replace

from localllm.modelfile.model_info import ModelInfo, inspect_model
from localllm.store import names, resolver
from localllm.util import fmt


def render(info: ModelInfo) -> str:
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


def run(args: argparse.Namespace) -> int:
    try:
        info = inspect_model(resolver.resolve(args.model))
    except names.NotDownloaded as nd:
        with names.header_of(nd.name) as (stub, remote):
            info = replace(inspect_model(stub), path=f"{remote.label} (not downloaded: its header read from the Hub, nothing stored)")
    if args.json:
        fmt.print_json(info.to_dict())
    else:
        print(render(info))
    return 0

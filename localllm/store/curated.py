"""The curated list in ``models/catalog.toml``: models for 4-6 GiB GPUs and the
planner's verdict for each quant on a 4 GiB and a 6 GiB budget.

Units (``localllm.util.units``): one style, binary, as everywhere in localllm:
the budgets are 4 and 6 GiB (2³⁰ bytes, how GPU memory is reported) and the
keys say so (``fits_4gib``); a file's size is shown in GiB and given in bytes
in ``--json`` (``size_bytes``). The TOML keeps the Hub listing's decimal figure
(``size_gb``, 10⁹ bytes), the only place a GB appears.

The planner needs a model's shape; before a download there is no header, so the
TOML carries the published configuration and the file size, and ``shape()``
spreads the bytes over the tensors by parameter count. Pure Python: reading the
TOML is the only I/O, and it happens when asked.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from localllm.plan import planner, verdict
from localllm.util.units import GB, format_size, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

BUDGETS = {"4gib": parse_size("4GiB"), "6gib": parse_size("6GiB")}


def budget_label(key: str) -> str:
    """``4 GiB``: a budget in the unit it is computed in."""
    return format_size(BUDGETS[key], digits=0)


@dataclass(frozen=True)
class CatalogFile:
    quant: str
    file: str
    size_gb: float
    fits: dict[str, str]  # the verdicts stored in the TOML, by budget key


@dataclass(frozen=True)
class CatalogProjector:
    """A vision model's projector (mmproj), as the catalog writes it down: its file,
    its approximate size, and the ViT's shape that sizes clip.cpp's compute buffer."""

    file: str
    size_gb: float
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int

    def reserved_bytes(self) -> int:
        """What it takes beside the model: its weights and the compute buffer
        estimated as ``vision.memory.compute_estimate`` estimates a real one's."""
        from localllm.vision import choice  # lazy: only for a vision model's verdict
        from localllm.vision.memory import planned  # lazy: as choice
        from localllm.vision.projector import ProjectorInfo  # lazy: as choice

        info = ProjectorInfo(Path(self.file), "", True, False, self.image_size, self.patch_size, self.n_embd, None, None, self.n_ff, None, None,
                             int(self.size_gb * GB))
        return choice.need(planned(info, gpu=True))


@dataclass(frozen=True)
class CatalogModel:
    name: str
    repo: str
    architecture: str
    license: str
    context: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    tied: bool
    sliding_window: int
    swa_pattern: int
    files: tuple[CatalogFile, ...]
    # A mixture of experts: experts per layer, those a token uses, an expert's
    # feed-forward width and a shared expert's (0: none); n_expert 0: dense.
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    mmproj: CatalogProjector | None = None  # a vision model: the projector pull fetches beside it, counted in the verdicts


def load(text: str | None = None) -> list[CatalogModel]:
    data = tomllib.loads(text if text is not None else catalog_text())
    out = []
    for m in data["model"]:
        fs = tuple(
            CatalogFile(q, f["file"], float(f["size_gb"]), {k: f.get(f"fits_{k}", "") for k in BUDGETS})
            for q, f in m["files"].items()
        )
        out.append(
            CatalogModel(
                m["name"], m["repo"], m["architecture"], m["license"], int(m["context"]), int(m["n_layer"]),
                int(m["n_embd"]), int(m["n_head"]), int(m["n_head_kv"]), int(m["head_dim"]), int(m["n_ff"]),
                int(m["n_vocab"]), bool(m.get("tied", False)), int(m.get("sliding_window", 0)),
                int(m.get("swa_pattern", 0)), fs, int(m.get("n_expert", 0)), int(m.get("n_expert_used", 0)),
                int(m.get("n_ff_exp", 0)), int(m.get("n_ff_shexp", 0)), _projector(m.get("mmproj")),
            )
        )
    return out


def _projector(p: dict[str, Any] | None) -> CatalogProjector | None:
    if p is None:
        return None
    return CatalogProjector(p["file"], float(p["size_gb"]), int(p["image_size"]), int(p["patch_size"]), int(p["n_embd"]), int(p["n_ff"]))


def catalog_text() -> str:
    return files("localllm.models").joinpath("catalog.toml").read_text(encoding="utf-8")


def shape(m: CatalogModel, size_bytes: int) -> planner.ModelShape:
    q = m.n_head * m.head_dim
    kv = m.n_head_kv * m.head_dim
    # a MoE layer: the experts' gate/up/down, the router and a shared expert instead of one feed-forward block
    experts = 3 * m.n_embd * m.n_ff_exp * m.n_expert
    ffn = experts + m.n_embd * m.n_expert + 3 * m.n_embd * m.n_ff_shexp if m.n_expert else 3 * m.n_embd * m.n_ff
    layer = m.n_embd * q + 2 * m.n_embd * kv + q * m.n_embd + ffn + 2 * m.n_embd
    embed = m.n_vocab * m.n_embd
    output = 0 if m.tied else m.n_vocab * m.n_embd
    per_param = size_bytes / (m.n_layer * layer + embed + output + m.n_embd)
    swa = frozenset(i for i in range(m.n_layer) if m.swa_pattern and i % m.swa_pattern < m.swa_pattern - 1) if m.sliding_window else frozenset()
    return planner.ModelShape(
        architecture=m.architecture,
        n_layer=m.n_layer,
        n_embd=m.n_embd,
        n_ff=[m.n_ff] * m.n_layer,
        n_head=[m.n_head] * m.n_layer,
        n_head_kv=[m.n_head_kv] * m.n_layer,
        head_dim_k=m.head_dim,
        head_dim_v=m.head_dim,
        n_vocab=m.n_vocab,
        n_swa=m.sliding_window,
        swa_layers=swa,
        layer_bytes=[int(layer * per_param)] * m.n_layer,
        input_bytes=int(embed * per_param),
        output_bytes=int((output + m.n_embd) * per_param),
        tied_bytes=int(embed * per_param) if m.tied else 0,
        q_norm=m.architecture == "gemma3",
        n_expert=m.n_expert,
        n_expert_used=m.n_expert_used,
        n_ff_exp=m.n_ff_exp,
        n_ff_shexp=m.n_ff_shexp,
        layer_expert_bytes=[int(experts * per_param)] * m.n_layer if m.n_expert else None,
        layer_active_bytes=[int((layer - experts + experts * m.n_expert_used // m.n_expert) * per_param)] * m.n_layer if m.n_expert else None,
    )


_JUDGED: dict[str, verdict.Verdict] = {}


def judge(m: CatalogModel, f: CatalogFile, budget_key: str) -> verdict.Verdict:
    """The verdict for a fixed budget: pure, so each is computed once a process
    (the planner replays llama.cpp's compute graph for each context it tries:
    ~30 ms a verdict, and list --catalog, the cockpit's catalog and the catalog
    check each want all of them)."""
    key = repr((m.architecture, m.n_layer, m.n_embd, m.n_ff, m.n_head, m.n_head_kv, m.head_dim, m.n_vocab, m.sliding_window,
                m.swa_pattern, m.tied, m.n_expert, m.n_expert_used, m.n_ff_exp, m.n_ff_shexp, m.context, f.size_gb, budget_key, m.mmproj))
    found = _JUDGED.get(key)
    if found is None:
        # a vision model's projector goes on the GPU beside it (clip.cpp's device): the model fits what it leaves
        budget = BUDGETS[budget_key] - (m.mmproj.reserved_bytes() if m.mmproj is not None else 0)
        found = _JUDGED[key] = verdict.judge(shape(m, int(f.size_gb * GB)), m.context, budget, None)
    return found


def rows() -> list[dict[str, Any]]:
    """One row per (model, quant) with the verdicts computed now."""
    out = []
    for m in load():
        for f in m.files:
            verdicts = {k: judge(m, f, k) for k in BUDGETS}
            out.append({
                "name": m.name, "repo": m.repo, "quant": f.quant, "file": f.file, "size_bytes": int(f.size_gb * GB),
                "context": m.context, "architecture": m.architecture, "license": m.license,
                "vision": m.mmproj is not None, "mmproj_file": m.mmproj.file if m.mmproj else None,
                "mmproj_size_bytes": int(m.mmproj.size_gb * GB) if m.mmproj else None,
                **{f"fits_{k}": v.text for k, v in verdicts.items()},
                **{f"full_gpu_{k}": v.full_gpu for k, v in verdicts.items()},
            })
    return out

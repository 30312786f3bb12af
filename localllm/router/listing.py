"""The router's own answers about its models: OpenAI's and llama-server router's
``/v1/models``, Ollama's ``/api/tags`` and ``/api/ps``.

They list what ``localllm list`` lists (the catalog), loaded or not, and are
answered without loading anything: the sizes come from the files, the family,
parameter count and quantization from each file's header, read once per file
version (``Catalog.facts``); a built-in model not assembled yet is listed by
its name alone.

A loaded model also shows what its load was planned to hold (the router's
memory plan: ``residency``), as Ollama's ``/api/ps`` does: ``size`` (bytes in
all), ``size_vram`` (of them on the GPU), ``context_length`` (tokens a request
may use), and a ``localllm`` object with the bytes per device (weights, KV
cache, compute and output buffers, each where it comes from), the context,
the GPU layers and when it will be unloaded. Without a memory plan (``--rpc``)
``size`` is the file's and ``size_vram`` null, as before.

Each model's ``digest`` is its file's sha256, as Ollama's: clients tell models
apart by it (``store.digest``: read once per file version, in a thread).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from localllm.plan import fitting
from localllm.router.catalog import Catalog, Facts
from localllm.router.children import Child
from localllm.router.pool import Pool
from localllm.store import digest
from localllm.store.registry import ModelEntry

OWNER = "localllm"


def status(pool: Pool, name: str) -> str:
    """llama-server router's ``status.value``: loaded, loading or unloaded."""
    child = pool.children.get(name)
    if child is None or child.state in ("stopping", "stopped"):
        return "unloaded"
    return "loaded" if child.state == "loaded" else "loading"


async def openai_models(catalog: Catalog, pool: Pool) -> dict:
    data = []
    for e in await catalog.entries():
        value = status(pool, e.name)
        row = {"id": e.name, "object": "model", "created": int(_mtime(e) or 0), "owned_by": OWNER,
               "status": {"value": value}, "aliases": list(e.aliases), "source": e.source}
        child = pool.children.get(e.name)
        if value == "loaded" and child is not None and child.plan is not None:
            row.update(planned(child))
        data.append(row)
    return {"object": "list", "data": data}


def planned(child: Child) -> dict[str, Any]:
    """What a loaded child's load was planned to hold: Ollama's ``size``, ``size_vram``
    and ``context_length``, and localllm's bytes per device (``LoadPlan``'s figures)."""
    lp = child.plan
    p = lp.fit.plan
    config = lp.config
    gpu, cpu = lp.total
    parallel = max(config.n_seq, 1)
    bytes_ = {
        "gpu": {"weights": p.weights_gpu_bytes, "kv": p.kv_gpu_bytes + p.rs_gpu_bytes, "compute": lp.compute[0], "output": lp.output[0],
                "total": gpu},
        "cpu": {"weights": p.weights_cpu_bytes, "kv": p.kv_cache_bytes - p.kv_gpu_bytes + p.rs_bytes - p.rs_gpu_bytes,
                "compute": lp.compute[1], "output": lp.output[1], "total": cpu},
    }
    d = lp.to_dict()
    return {
        "size": gpu + cpu, "size_vram": gpu, "context_length": config.n_ctx // parallel,
        "localllm": {
            "bytes": bytes_, "sources": d["sources"], "n_ctx": config.n_ctx, "n_ctx_per_request": config.n_ctx // parallel,
            "context": fitting.context_why(lp.fit, parallel),
            "parallel": parallel, "type_k": config.type_k, "type_v": config.type_v, "gpu_layers": lp.fit.gpu_layers,
            "n_layers": lp.fit.n_layers, "fit": lp.fit.sentence, "gpu_budget_bytes": lp.fit.gpu_budget, "pid": child.pid,
            "expires_at": _rfc3339(child.expires_wall),
        },
    }


def _mtime(entry: ModelEntry) -> float | None:
    try:
        return entry.path.stat().st_mtime
    except OSError:
        return None  # a built-in model not assembled yet


def ollama_name(name: str) -> str:
    """Ollama lists a model without a tag as ``NAME:latest`` (the router accepts both)."""
    return name if ":" in name else f"{name}:latest"


def _details(facts: Facts, entry: ModelEntry) -> dict:
    n = facts.n_params
    size = None if n is None else f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
    family = facts.architecture
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family] if family else None,
            "parameter_size": size, "quantization_level": facts.file_type or entry.quant}


def _rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


async def ollama_tags(catalog: Catalog) -> dict:
    models = []
    entries = await catalog.entries()
    digests = await asyncio.gather(*(digest.digest(e.path) for e in entries))  # null for a built-in model not assembled yet
    for e, sha in zip(entries, digests):
        facts = await catalog.facts(e)
        models.append({"name": ollama_name(e.name), "model": ollama_name(e.name), "modified_at": _rfc3339(facts.modified),
                       "size": facts.size, "digest": sha, "details": _details(facts, e)})
    return {"models": models}


async def ollama_ps(catalog: Catalog, pool: Pool) -> dict:
    """The loaded models, with when each unloads (``expires_at``: null for never)."""
    models = []
    by_name = {e.name: e for e in await catalog.entries()}
    for name, child in list(pool.children.items()):
        entry = by_name.get(name)
        if child.state != "loaded" or entry is None:
            continue
        facts = await catalog.facts(entry)
        row = {"name": ollama_name(name), "model": ollama_name(name), "size": facts.size, "digest": await digest.digest(entry.path),
               "details": _details(facts, entry), "expires_at": _rfc3339(child.expires_wall), "size_vram": None}
        if child.plan is not None:
            row.update(planned(child))
        models.append(row)
    return {"models": models}

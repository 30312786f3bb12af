"""The router's ``GET /metrics``: every loaded child's Prometheus text, merged.

Each child (``serve --metrics``, which the router passes on) renders its own
``serve.prometheus`` text; the router fetches each loaded child's, adds a
``model="NAME"`` label to every sample line, keeps each metric's ``# HELP`` and
``# TYPE`` lines once, groups the samples under them, and appends its own
gauges (``localllm_router_models_loaded``, ``localllm_router_loads_total``).
``merge`` is pure (tested without a process); ``collect`` does the fetching.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import httpx2

CONTENT_TYPE = "text/plain; version=0.0.4"
FETCH_S = 5.0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labelled(line: str, model: str) -> str:
    """A sample line with ``model="MODEL"`` as its first label."""
    label = f'model="{_escape(model)}"'
    name_end = len(line)
    for i, ch in enumerate(line):
        if ch in "{ \t":
            name_end = i
            break
    name, rest = line[:name_end], line[name_end:]
    if rest.startswith("{"):
        inner = rest[1:]
        return f"{name}{{{label}{',' if not inner.lstrip().startswith('}') else ''}{inner}"
    return f"{name}{{{label}}}{rest}"


def _family(sample: str, typed: dict[str, str]) -> str:
    """The metric name a sample belongs to: a histogram's ``_bucket``/``_sum``/``_count`` go under their family."""
    name = sample.split("{", 1)[0].split(None, 1)[0]
    for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
        if name.endswith(suffix) and name[: -len(suffix)] in typed:
            return name[: -len(suffix)]
    return name


def merge(texts: Iterable[tuple[str, str]], extra: str = "") -> str:
    """The Prometheus text of ``texts`` (pairs of model name and that model's
    text), each sample labelled with its model, each family's HELP and TYPE
    once, then ``extra`` (the router's own lines) as they are."""
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    samples: dict[str, list[str]] = {}  # in the order the families first appear
    for model, text in texts:
        for raw in text.splitlines():
            line = raw.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    target = helps if parts[1] == "HELP" else types
                    target.setdefault(parts[2], line)
                    samples.setdefault(parts[2], [])
                continue  # other comments are dropped
            samples.setdefault(_family(line, types), []).append(labelled(line, model))
    out: list[str] = []
    for family, lines in samples.items():
        if family in helps:
            out.append(helps[family])
        if family in types:
            out.append(types[family])
        out.extend(lines)
    text = "\n".join(out)
    if extra.strip():
        text = f"{text}\n{extra.strip()}" if text else extra.strip()
    return text + "\n"


def router_lines(loaded: int, loads: int) -> str:
    """The router's own gauges."""
    return "\n".join([
        "# HELP localllm_router_models_loaded models loaded now, each in a child process",
        "# TYPE localllm_router_models_loaded gauge",
        f"localllm_router_models_loaded {loaded}",
        "# HELP localllm_router_loads_total child processes started to load a model",
        "# TYPE localllm_router_loads_total counter",
        f"localllm_router_loads_total {loads}",
    ])


async def collect(client: httpx2.AsyncClient, children: list[tuple[str, str]], authorization: bytes) -> list[tuple[str, str]]:
    """Each ``(name, url)`` child's /metrics text (a child that does not answer in ``FETCH_S`` is left out)."""

    async def one(name: str, url: str) -> tuple[str, str] | None:
        try:
            resp = await client.get(f"{url}/metrics", headers={"authorization": authorization.decode()}, timeout=FETCH_S)
        except httpx2.HTTPError:
            return None
        return (name, resp.text) if resp.status_code == 200 else None

    got = await asyncio.gather(*(one(n, u) for n, u in children))
    return [g for g in got if g is not None]

"""One load path: no module loads a model but ``localllm.runtime`` (issue 60).

The load sequence (resolve, fit, "does not fit", load, memory check, LoRA,
projector, template) was written out by hand in eight places and drifted: a
bare ``backend.load`` with no memory check in ``chat``, no fit in ``bench``.
Now the library, every command, the smoke test and the cockpit call
``runtime.open_model`` (or its halves, ``runtime.plan`` and ``runtime.load``,
or ``runtime.reload_or_restore``). This test reads every module of the product
trees and the scripts with ``ast`` and fails on a model load anywhere else.

The rule: the ``Engine`` protocol's load is ``engine.load(path, config)`` (serve's
batch engine adds its sequences), so any call of an attribute named ``load``
with two or more arguments is a model load, whatever the receiver is called
(but ``runtime.load(planned, engine)``, the load path's own second half);
so is ``load_checked`` (the runtime's load with its memory check) called by
name. The config files' ``config.load(path)``, the catalog's ``curated.load()``
and the router's ``pool.load(entry)`` take fewer. Outside the runtime and the
engine itself, only the modules in ``ALLOWED`` may load, each with its reason:
measurements of llama.cpp at exactly the config they name, where a fit would
change what is measured.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

TREES = ("localllm", "tui", "quantize", "scripts")
OWNERS = ("localllm/runtime/", "localllm/engine/")  # the load path, and the engine whose load it calls

_MEASURES = "a benchmark of llama.cpp at exactly the config it names: a fit would change what is measured"
ALLOWED = {
    "localllm/measure/quality.py": "the KV cache types are what is measured: three engines at exactly one 256-token chunk's config",
    "quantize/evaluate.py": "a quantized file against its source at exactly the same config, every position's logits kept",
    "scripts/plan_conformance.py": "the planner against llama.cpp at exactly each config of a grid: the conformance itself",
    "scripts/plan_conformance_rpc.py": "the planner against llama.cpp over RPC placements at exactly each config: the conformance itself",
    "scripts/gpu_compare.py": "the plan per device against what llama.cpp allocates at exactly the planned config (GPU acceptance run)",
    "scripts/bench_context_shift.py": _MEASURES,
    "scripts/bench_prefix_cache.py": _MEASURES,
    "scripts/soak_chat.py": "a soak of many chat turns at exactly the small context that makes them shift",
    "scripts/bench_contention.py": _MEASURES,
    "scripts/bench_vs_lowlevel.py": "localllm's engine against llama.cpp's low-level API at exactly the same config",
    "scripts/media_runs.py": "bench_vision's and bench_audio's own side, at exactly the config they give llama-mtmd-cli",
    "scripts/bench_rpc.py": _MEASURES,
    "scripts/bench_moe.py": _MEASURES,
    "scripts/bench_speculative.py": _MEASURES,
    "scripts/bench_resume.py": _MEASURES,
    "scripts/bench_forecast.py": "the TTFT forecast against measured TTFTs at exactly the context the prompts need",
}


def model_loads(source: str) -> list[int]:
    """The lines of ``source`` that load a model (the rule in the module's docstring)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "load" and len(node.args) + len(node.keywords) >= 2:
            if not (isinstance(f.value, ast.Name) and f.value.id == "runtime"):  # ``runtime.load(planned, engine)``: the load path itself
                lines.append(node.lineno)
        elif (isinstance(f, ast.Name) and f.id == "load_checked") or (isinstance(f, ast.Attribute) and f.attr == "load_checked"):
            lines.append(node.lineno)
    return lines


def _modules() -> dict[str, Path]:
    return {p.relative_to(REPO).as_posix(): p for tree in TREES for p in sorted((REPO / tree).rglob("*.py"))}


MODULES = _modules()


def test_only_the_runtime_loads_a_model() -> None:
    bad = [f"{rel}:{line}" for rel, p in MODULES.items() if not rel.startswith(OWNERS) and rel not in ALLOWED
           for line in model_loads(p.read_text(encoding="utf-8"))]
    assert bad == [], "load through localllm.runtime (open_model, or plan then load), or add the module to ALLOWED with the reason"


def test_the_runtime_is_where_the_loads_are() -> None:
    """The check reads the trees (it cannot pass by reading nothing): the runtime loads, and the allowed modules still do."""
    assert model_loads((REPO / "localllm/runtime/loading.py").read_text(encoding="utf-8"))
    assert {"localllm/commands/run.py", "tui/app.py", "scripts/plan_conformance.py"} <= set(MODULES)
    stale = [rel for rel in ALLOWED if rel not in MODULES or not model_loads(MODULES[rel].read_text(encoding="utf-8"))]
    assert stale == [], "no longer loads a model (or is gone): take it off ALLOWED"


@pytest.mark.parametrize(("code", "loads"), [
    ("backend.load(path, fitted.config)", True),  # what chat did
    ("self.backend.load(self.path, cfg)", True),
    ("model.load(path, cfg, parallel)", True),  # serve's batch engine
    ("LlamaCppBackend().load(path=p, config=c)", True),
    ("info, check = load_checked(backend, path, cfg)", True),
    ("loaded = runtime.load(planned, engine)", False),  # the load path
    ("table = config.load(path)", False),
    ("models = curated.load()", False),
    ("await pool.load(entry)", False),
    ("data = json.load(fh)", False),
])
def test_the_rule_catches_a_command_that_loads_by_hand(code: str, loads: bool) -> None:
    """The negative control: a command that re-adds its own ``backend.load`` fails the check."""
    assert bool(model_loads(f"async def command():\n    {code}\n")) is loads

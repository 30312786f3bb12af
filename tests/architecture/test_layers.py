"""The architecture, read from every import in the product, lazy ones included.

import-linter builds its graph from the ``localllm/`` folder on disk, so it would
not see ``tui/``, ``quantize/`` and ``models/``, which install as ``localllm.tui``,
``localllm.quantize`` and ``localllm.models`` through setuptools' ``package-dir``.
This test reads all four trees with ``ast`` instead: imports at the top, inside
functions and under ``TYPE_CHECKING`` alike.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.graphs import circles
from tests.helpers.paths import REPO

TREES = {"localllm": "localllm", "tui": "localllm.tui", "quantize": "localllm.quantize", "models": "localllm.models"}

# Packages from the bottom up: each may import only packages of a lower rank (and
# itself). Top-level modules of localllm count as packages of their own.
RANKS = {
    "errors": 0, "paths": 0, "models": 0,
    "util": 1, "reasoning": 1,
    "speculation": 1,  # draftless speculation's n-gram index and controller: pure, under the engine's generation loop
    "toolcalls": 1.5,  # tool-call formats: read from a template, parsed from a reply (pure; the reasoning split under it)
    "server_tools": 1.5,  # llama-server's built-in tools (--tools): files and commands, bounded; no server framework
    "modelfile": 2,
    "vision": 2.5, "attach": 2.5,  # images and files into a prompt: decoded and bounded (Pillow, pypdf), projector headers
    "audio": 2.5,  # sound files into a prompt: WAV, MP3 and FLAC bounded before decoding, audio projector headers
    "forecast": 4.2,  # the TTFT forecast: pure, on plan's figures
    "engine_api": 3,
    "plan": 4,
    "threads": 4.5,  # the thread-count controller: on plan's core counts, under the engine that drives it
    "engine": 5, "store": 5, "chat": 5,
    "compaction": 5.2,  # a conversation's older turns summarized by its model: on chat's session, under every front end
    "runtime": 5.5,  # the one load path: resolve, fit (plan), load (engine), check; under every front end, the smoke test included
    "measure": 6, "testing": 6,
    "flags": 6.5,  # the flags and typed options the commands share (argparse): under every command-line module, quantize's and the cockpit's included
    "cockpit": 6.5,  # the cockpit's session without its screen: engine thread, load and rollback, counting, saving (no Textual)
    "quantize": 7, "serve": 7,
    "tune": 7,  # tune's search, choice and config section: on measure's figures and the planner's, under the command
    "api": 8, "router": 8, "mcp": 8,  # mcp: the tool loop reads serve's tool-call formats
    "tui": 9, "commands": 9,
    "cli": 10, "__init__": 10, "__main__": 11, "spare": 11,
}
ARGPARSE_FACING = ("localllm.cli", "localllm.flags", "localllm.commands", "localllm.tui.cli", "localllm.quantize.cli")
CLIENT_ONLY = ("textual", "starlette", "uvicorn", "argparse")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # a product module, or an outside top-level package
    line: int
    lazy: bool  # inside a function
    reason: str  # the "# lazy: ..." comment on the line or the one above, if any


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO)
    parts = list(rel.with_suffix("").parts)
    prefix = TREES[parts[0]]
    rest = parts[1:]
    if rest and rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([prefix, *rest])


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for tree in TREES for p in sorted((REPO / tree).rglob("*.py"))}


SOURCES = _sources()


def _resolve(name: str) -> str:
    """The product module ``name`` refers to (``from localllm.plan import planner``
    names ``localllm.plan.planner``), or the outside package's top-level name."""
    if not name.startswith("localllm"):
        return name.split(".")[0]
    parts = name.split(".")
    while parts and ".".join(parts) not in SOURCES:
        parts.pop()
    return ".".join(parts)


def _imports(module: str, path: Path) -> list[Import]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    is_pkg = path.name == "__init__.py"
    out: list[Import] = []

    def reason(node: ast.stmt) -> str:
        for n in (node.lineno, node.lineno - 1):
            m = re.search(r"#\s*lazy:\s*(.+)$", lines[n - 1]) if n >= 1 else None
            if m:
                return m.group(1)
        return ""

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend(Import(module, _resolve(a.name), child.lineno, lazy, reason(child)) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                    pkg = pkg[: len(pkg) - child.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                for a in child.names:
                    full = f"{base}.{a.name}"
                    target = _resolve(full) if base.startswith("localllm") else _resolve(base)
                    out.append(Import(module, target, child.lineno, lazy, reason(child)))
            visit(child, inner)

    visit(tree, False)
    return out


IMPORTS = [i for m, p in SOURCES.items() for i in _imports(m, p)]
OURS = [i for i in IMPORTS if i.target.startswith("localllm") and i.target != i.source and i.target != "localllm"]


def package(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_the_trees_are_read() -> None:
    """The check sees all four trees and the imports in them (it cannot pass by reading nothing)."""
    assert {"localllm.engine.model", "localllm.tui.app", "localllm.quantize.pipeline", "localllm.plan.planner"} <= set(SOURCES)
    assert any(i.source == "localllm.tui.app" and i.target == "textual" for i in IMPORTS)
    assert any(i.lazy for i in OURS)


def test_only_the_engine_imports_llama_cpp() -> None:
    bad = [f"{i.source}:{i.line}" for i in IMPORTS if i.target == "llama_cpp" and package(i.source) != "engine"]
    assert bad == []


def test_packages_import_only_downwards() -> None:
    """Each package imports only packages below it (``RANKS``), lazy imports included."""
    bad = []
    for i in OURS:
        a, b = package(i.source), package(i.target)
        if a != b and RANKS[b] >= RANKS[a]:
            bad.append(f"{i.source}:{i.line} -> {i.target} ({a} may not import {b})")
    assert bad == []


def test_the_core_never_imports_client_frameworks() -> None:
    """Textual, Starlette, uvicorn and argparse belong to the clients; the core
    (everything below the cockpit, the server and the CLI) never imports them or a
    module that parses flags."""
    core = [m for m in SOURCES if RANKS[package(m)] <= RANKS["measure"]]
    bad = [f"{i.source}:{i.line} -> {i.target}" for i in IMPORTS if i.source in core
           and (i.target in CLIENT_ONLY or i.target.startswith(ARGPARSE_FACING))]
    assert bad == []


@pytest.mark.parametrize("client", ["localllm.tui", "localllm.serve", "localllm.router"])
def test_the_cockpit_and_the_server_never_import_the_cli(client: str) -> None:
    bad = [f"{i.source}:{i.line} -> {i.target}" for i in OURS
           if i.source.startswith(client) and i.target.startswith(("localllm.commands", "localllm.cli"))]
    assert bad == []


def test_no_import_circles() -> None:
    """No module reaches itself through imports, lazy and type-only ones included."""
    graph: dict[str, set[str]] = {m: set() for m in SOURCES}
    for i in OURS:
        graph[i.source].add(i.target)
    assert circles(graph) == []


def test_every_lazy_import_of_our_own_says_why() -> None:
    """A function-local import hides a dependency: each one left carries a
    ``# lazy: <reason>`` comment naming the start-up cost it saves."""
    bad = [f"{i.source}:{i.line} -> {i.target}" for i in OURS if i.lazy and not i.reason]
    assert bad == []


def test_no_module_outside_the_engine_touches_its_private_members() -> None:
    engine_names = r"(?:backend|engine|eng|draft|main|tok|b|d|self\.backend|self\.tok|model\.tok)"
    pattern = re.compile(rf"\b{engine_names}\._[a-z]\w*")
    bad = [f"{m}: {hit.group(0)}" for m, p in SOURCES.items() if package(m) != "engine"
           for hit in pattern.finditer(p.read_text(encoding="utf-8"))]
    assert bad == []


def test_the_core_and_the_fake_need_no_native_build() -> None:
    """Importing the boundary, the fake engine, chat, measurements, the planner and
    the store loads neither llama.cpp nor Textual (a fresh interpreter: an import
    circle fails here too, with a partially initialised module)."""
    import subprocess
    import sys

    mods = ["localllm.testing", "localllm.chat.session", "localllm.chat.speculative", "localllm.measure.bench",
            "localllm.measure.doctor", "localllm.plan.fitting", "localllm.store.resolver", "localllm.store.hub"]
    code = f"import sys, {', '.join(mods)}; print(sorted(m for m in ('llama_cpp', 'textual', 'starlette') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_test_files_share_helpers_only_through_helpers_and_conftest() -> None:
    """A test file never imports another test file: shared code lives in
    ``tests/helpers`` or ``conftest.py``."""
    bad = []
    for p in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{p.relative_to(REPO)} -> {n}" for n in names if n.startswith("tests.") and n.split(".")[-1].startswith("test_")]
    assert bad == []


def test_test_folders_mirror_the_packages() -> None:
    """One test folder per package of the product (and none for a package that is gone)."""
    packages = {p.parent.name for p in (REPO / "localllm").glob("*/__init__.py")} | {"tui", "quantize"}
    folders = {p.name for p in (REPO / "tests").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= folders, packages - folders
    # clients: the real programs people point at serve (Claude Code, Codex, opencode), run whole: no package of ours
    assert folders - packages <= {"api", "architecture", "benchmarks", "clients", "helpers"}, folders - packages

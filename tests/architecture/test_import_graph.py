"""The import graph as import-linter and grimp see it, the cockpit included.

``tui/``, ``quantize/`` and ``models/`` install as ``localllm.tui``,
``localllm.quantize`` and ``localllm.models`` (setuptools' ``package-dir``), so
a graph built from the checkout's ``localllm/`` folder misses them. Here the
tree is laid out as the wheel lays it out (a copy of the sources, the three
folders inside ``localllm/``), and the ``[tool.importlinter]`` contracts of
pyproject.toml run on that copy. A violation planted in the copy must fail
them: the check sees the cockpit, it does not pass by reading less.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.helpers.graphs import circles
from tests.helpers.paths import REPO

MAPPED = {"tui": "tui", "quantize": "quantize", "models": "models"}  # localllm.X <- the checkout's folder


def _installed_layout(root: Path) -> Path:
    """``root`` holding ``localllm/`` as the wheel holds it, plus ``scripts/``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "localllm", root / "localllm", ignore=ignore)
    for name, folder in MAPPED.items():
        shutil.copytree(REPO / folder, root / "localllm" / name, ignore=ignore)
    shutil.copytree(REPO / "scripts", root / "scripts", ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--config", "pyproject.toml", "--no-cache"], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=300)


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _installed_layout(tmp_path_factory.mktemp("wheel-layout"))


def test_the_contracts_hold_on_the_installed_layout(layout: Path) -> None:
    r = _lint(layout)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in r.stdout, r.stdout[-2000:]


def test_a_core_module_importing_the_cockpit_breaks_them(tmp_path: Path) -> None:
    """The negative control: the engine importing the cockpit (a folder outside
    ``localllm/`` in the checkout) is seen and named."""
    root = _installed_layout(tmp_path)
    planted = root / "localllm" / "engine" / "planted.py"
    planted.write_text("from localllm.tui import app  # a layer violation, planted\n")
    r = _lint(root)
    assert r.returncode != 0 and "localllm.engine.planted -> localllm.tui.app" in r.stdout, r.stdout[-3000:]


def test_the_layers_say_what_test_layers_ranks_say() -> None:
    """One order in two notations: the contract's layers, top down, are RANKS'
    packages by falling rank (read from test_layers.py's source, not imported)."""
    tree = ast.parse((REPO / "tests" / "architecture" / "test_layers.py").read_text(encoding="utf-8"))
    ranks = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "RANKS" for t in n.targets))
    contract = next(c for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
                    if c["type"] == "layers")
    layers = [sorted(x.strip() for x in layer.split("|")) for layer in contract["layers"]]
    by_rank: dict[float, list[str]] = {}
    for name, rank in ranks.items():
        if name not in ("__init__", "__main__"):
            by_rank.setdefault(rank, []).append(name)
    assert layers == [sorted(by_rank[r]) for r in sorted(by_rank, reverse=True)]


def test_no_import_circles_scripts_included(layout: Path) -> None:
    """grimp's graph of the installed layout and scripts/: no module reaches
    itself (a package's ``__init__`` re-exporting its own modules excepted)."""
    code = (
        "import grimp, json, sys\n"
        "g = grimp.build_graph('localllm', 'scripts', exclude_type_checking_imports=False)\n"
        "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=layout, capture_output=True, text=True, env={"PYTHONPATH": str(layout)}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    graph: dict[str, list[str]] = json.loads(r.stdout)
    assert "localllm.tui.app" in graph and "scripts.bench_serve" in graph  # both trees read
    assert circles(graph) == []

"""The cockpit's session is the core's: importing any of its modules loads
neither Textual nor the cockpit's screens nor llama.cpp (a fresh interpreter, so
what the test run imported before cannot hide an import)."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.helpers.paths import REPO

PACKAGE = REPO / "localllm" / "cockpit"


def _modules() -> list[str]:
    return sorted("localllm.cockpit" + ("" if p.stem == "__init__" else f".{p.stem}") for p in PACKAGE.glob("*.py"))


def test_importing_the_session_loads_no_textual() -> None:
    mods = _modules()
    assert "localllm.cockpit.session" in mods and "localllm.cockpit.loading" in mods  # the check reads the package
    code = ("import sys\n" + "".join(f"import {m}\n" for m in mods)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich', 'llama_cpp') or m.startswith('localllm.tui')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout


def test_no_module_of_the_session_names_textual_or_the_screens() -> None:
    """Lazy imports included (a function-local ``import textual`` would pass the subprocess check until it ran)."""
    bad = []
    for p in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{p.name}: {n}" for n in names if n.split(".")[0] in ("textual", "rich") or n.startswith("localllm.tui")]
    assert bad == []

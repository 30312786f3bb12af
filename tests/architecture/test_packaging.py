"""A wheel holds the packages pyproject.toml lists, and only those: every
package of the tree must be listed (a ``pip install .`` once lacked
``localllm.plan``, ``store``, ``chat`` and six more; the editable install the
tests use hid it)."""

from __future__ import annotations

import sys

from tests.helpers.paths import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAPPED = {"tui": "localllm.tui", "quantize": "localllm.quantize", "models": "localllm.models"}


def test_every_package_of_the_tree_is_in_the_wheel() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "localllm").rglob("__init__.py")}
    for folder, name in MAPPED.items():
        tree |= {".".join((name, *p.parent.relative_to(REPO / folder).parts)) for p in (REPO / folder).rglob("__init__.py")}
    assert tree - listed == set(), "add them to [tool.setuptools] packages"
    assert listed - tree == set(), "listed, but not in the tree"

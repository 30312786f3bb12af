"""A package imported with only the submodules we use, the rest on first use.

``import llama_cpp`` and ``import gguf`` run their packages' ``__init__``, which
star-import every submodule: llama-cpp-python's high-level ``Llama`` with its chat
formats and Jinja (190 ms of 220 ms here), gguf's reader, writer, YAML metadata
and vocabulary code (80 ms of 180 ms). localllm uses the ctypes bindings of the
one and the constants of the other, and every process that reads a model paid
for the rest: ``run``, ``serve`` and each router child, the dry run's child, the
workers, a quantization.

``install`` puts the package into ``sys.modules`` with those submodules' names
bound, as its ``__init__`` would bind them. The first use of any other name runs
the package's own ``__init__`` then (PEP 562 ``__getattr__``), so a program that
imports localllm and then ``from llama_cpp import Llama`` or ``gguf.GGUFWriter``
gets what it always got. A package imported before is kept as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any


def _star(module: ModuleType) -> list[str]:
    """The names ``from module import *`` binds."""
    names = getattr(module, "__all__", None)
    return list(names) if names is not None else [n for n in vars(module) if not n.startswith("_")]


def install(name: str, eager: Sequence[str]) -> None:
    """``name`` in ``sys.modules`` with only ``eager`` submodules imported and their
    names bound; nothing when it is imported already or not installed (the plain
    import then fails with its own message)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None or spec.origin is None or spec.loader is None:
        return
    package = importlib.util.module_from_spec(spec)  # __path__, __file__, __spec__ set; __init__ not run
    sys.modules[name] = package
    try:
        for sub in eager:
            module = importlib.import_module(f"{name}.{sub}")
            for n in _star(module):
                setattr(package, n, getattr(module, n))
    except BaseException:
        del sys.modules[name]
        raise
    setattr(package, "__getattr__", _rest(package, spec))  # noqa: B010  (PEP 562: the module's own __getattr__)


def _rest(package: ModuleType, spec: Any) -> Any:
    def __getattr__(attr: str) -> Any:
        """A name the package's ``__init__`` binds: run it now (once). A submodule's
        name is left to the import system, which imports it on its own."""
        if attr == "__version__":  # read from the ``__init__``'s text: a state file's build line needs no more
            found = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", Path(spec.origin).read_text(encoding="utf-8"), re.MULTILINE)
            if found is not None:
                setattr(package, attr, found.group(1))  # noqa: B010  (read once)
                return found.group(1)
        if attr.startswith("__"):
            raise AttributeError(attr)
        if importlib.util.find_spec(f"{package.__name__}.{attr}") is not None:
            raise AttributeError(attr)
        vars(package).pop("__getattr__", None)  # once: from now on a missing name is a plain AttributeError
        spec.loader.exec_module(package)  # the package's own __init__, in its own namespace
        try:
            return vars(package)[attr]
        except KeyError:
            raise AttributeError(f"module {package.__name__!r} has no attribute {attr!r}") from None

    return __getattr__

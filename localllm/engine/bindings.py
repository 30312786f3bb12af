"""llama-cpp-python's low-level bindings without its high-level half.

``import llama_cpp`` runs the package's ``__init__``: ``from .llama_cpp import *``
(the ctypes bindings this engine calls: 30 ms here) and ``from .llama import *``
(the high-level ``Llama`` class with its chat formats and Jinja: 190 ms of the
220 ms, code this engine never calls). Every process that loads a model paid it:
``run``, ``serve`` and each router child, the dry run's child, the workers, a
quantization. So the package goes into ``sys.modules`` with the first half only,
and the second loads on first use of one of its names: a program that imports
localllm and then ``from llama_cpp import Llama`` gets it as before. A program
that imported ``llama_cpp`` first keeps its package as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from types import ModuleType
from typing import Any

_STAR = "__all__"


def _exported(module: ModuleType) -> list[str]:
    """The names ``from module import *`` binds."""
    names = getattr(module, _STAR, None)
    return list(names) if names is not None else [n for n in vars(module) if not n.startswith("_")]


def install() -> None:
    """Put ``llama_cpp`` in ``sys.modules`` with its low-level bindings bound, as its
    ``__init__`` binds them, unless it is there already (or not installed: the plain
    import then fails with its own message)."""
    if "llama_cpp" in sys.modules:
        return
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.submodule_search_locations is None or spec.origin is None:
        return
    package = importlib.util.module_from_spec(spec)  # __path__, __file__, __spec__ set; __init__ not run
    sys.modules["llama_cpp"] = package
    try:
        low = importlib.import_module("llama_cpp.llama_cpp")
    except BaseException:
        del sys.modules["llama_cpp"]
        raise
    for name in _exported(low):
        setattr(package, name, getattr(low, name))
    setattr(package, "__getattr__", _high_level(package, spec.origin))  # noqa: B010  (PEP 562: the module's own __getattr__)


def _high_level(package: ModuleType, init_file: str) -> Any:
    def __getattr__(name: str) -> Any:
        """A name the package's ``__init__`` would have bound: ``__version__``, or one of
        ``llama_cpp.llama``'s (loaded now). A submodule's name is left to the import system."""
        if name == "__version__":
            with open(init_file, encoding="utf-8") as f:
                found = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", f.read(), re.MULTILINE)
            if found is None:
                raise AttributeError(name)
            setattr(package, name, found.group(1))  # noqa: B010  (read once)
            return found.group(1)
        if name.startswith("__") or importlib.util.find_spec(f"llama_cpp.{name}") is not None:
            raise AttributeError(name)
        high = importlib.import_module("llama_cpp.llama")
        for n in _exported(high):
            if n not in vars(package):
                setattr(package, n, getattr(high, n))
        if name in vars(package):
            return vars(package)[name]
        raise AttributeError(f"module 'llama_cpp' has no attribute {name!r}")

    return __getattr__

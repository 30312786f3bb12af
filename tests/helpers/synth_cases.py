"""Synthetic GGUFs written once a test run and read by every test that asks for
the same spec, on either xdist worker.

The conformance cases (``scripts.plan_conformance.CASES``) have real shapes (a
16k vocabulary, 256-320 wide): each file took about 0.5 s to write, and the
plan, conformance, text-against-JSON and one-path tests wrote the same 30 of
them again and again (about 80 s of the suite's CPU). The files sit beside the
workers' own temporary folders, in the run's (pytest removes it with its
others), named by the spec's hash; a file is written under a lock to a
temporary name and renamed, so the other worker reads a whole file or waits.
Tests only read them: one that changes a model writes its own copy."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

import pytest

from scripts.plan_conformance import CASES
from scripts.synth_gguf import SynthSpec, write_gguf


def shared_dir(factory: pytest.TempPathFactory) -> Path:
    """The run's folder for them: the parent of the workers' temporary folders under xdist."""
    base = factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "synth-cases"
    root.mkdir(parents=True, exist_ok=True)
    return root


def case_file(root: Path, name: str, spec: SynthSpec | None = None) -> Path:
    """The GGUF of ``spec`` (default: the conformance case ``name``), written once a run."""
    spec = spec if spec is not None else CASES[name]
    if spec.split_max_tensors:
        raise ValueError("a split model is written by its test: its shards' names follow the file's")
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
    path = root / f"{name.replace('+', '-')}-{digest}.gguf"
    if path.exists():
        return path
    with open(root / f".{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            part = path.with_name(f".{path.name}.part")
            write_gguf(part, spec)
            os.replace(part, path)
    return path

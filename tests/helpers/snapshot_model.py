"""The synthetic model the cockpit's snapshots show: one fixed path, since the
screens print it, written so that two pytest-xdist workers never read it half written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from scripts.synth_gguf import SynthSpec, write_llama_gguf


def snapshot_model() -> Path:
    """``/tmp/localllm-snapshots/synth-llama.gguf``, written whole under another
    name and renamed into place (a worker writing it while another loads it
    once made a snapshot differ in CI)."""
    folder = Path(tempfile.gettempdir()) / "localllm-snapshots"
    folder.mkdir(exist_ok=True)
    path = folder / "synth-llama.gguf"
    part = folder / f".synth-llama.{os.getpid()}.gguf"
    write_llama_gguf(part, SynthSpec())
    os.replace(part, path)
    return path

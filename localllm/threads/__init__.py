"""Decode thread counts chosen while decoding (issue 50): ``controller`` picks
the count for each kind of step from measured step times; ``topology`` says
where it starts (performance cores, P-cores, physical cores). Pure Python: the
engine (``localllm.engine.threadctl``) makes the llama.cpp call."""

from __future__ import annotations

from localllm.threads.controller import KINDS, Change, ThreadController
from localllm.threads.topology import Start, start_threads

__all__ = ["KINDS", "Change", "Start", "ThreadController", "start_threads"]

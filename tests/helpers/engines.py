"""A scripted engine whose load fails on demand and which counts its closes:
the runtime's tests check that a failed load closes what it opened."""

from __future__ import annotations

from pathlib import Path

from localllm.engine_api import LoadConfig, LoadInfo
from localllm.testing import ScriptedEngine


class FailingEngine(ScriptedEngine):
    """``ScriptedEngine``; its loads raise ``fail`` while it is set; ``closed`` counts closes."""

    def __init__(self, fail: Exception | None = None) -> None:
        super().__init__()
        self.fail, self.closed = fail, 0

    def load(self, path: Path, config: LoadConfig, header: object = None) -> LoadInfo:
        if self.fail is not None:
            raise self.fail
        return super().load(path, config)

    def close(self) -> None:
        self.closed += 1
        super().close()

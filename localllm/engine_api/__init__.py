"""The one engine boundary: what the rest of localllm may use of an engine.

Pure Python (no llama.cpp): the planner, chat, measurements, the commands, the
cockpit and the server are typed against it, and run on ``localllm.testing``'s
scripted fake as well as on ``localllm.engine.LlamaCppBackend``.

- ``llama_rules`` llama.cpp's rules for cache types and flash attention, which
  every load config must satisfy
- ``config``      ``LoadConfig``: how to load a model and size its context
- ``records``     ``SamplingConfig``, ``TokenEvent``, ``LoadInfo``
- ``stats``       latency statistics from per-token timestamps (``GenerationStats``)
- ``protocol``    the ``Engine`` protocol and the ``Generation`` it hands back
- ``errors``      what an engine raises, naming settings (``n_ctx``), never CLI flags
"""

from __future__ import annotations

from localllm.engine_api.config import LoadConfig
from localllm.engine_api.errors import ContextFull, EngineError, InvalidSetting, SettingError
from localllm.engine_api.protocol import Engine, Generation, Verification
from localllm.engine_api.records import DryRun, LoadInfo, SamplingConfig, SpecStats, TokenEvent
from localllm.engine_api.stats import GenerationStats

__all__ = [
    "ContextFull", "DryRun", "Engine", "EngineError", "Generation", "GenerationStats", "InvalidSetting", "LoadConfig", "LoadInfo",
    "SamplingConfig", "SettingError", "SpecStats", "TokenEvent", "Verification",
]

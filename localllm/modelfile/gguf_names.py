"""The gguf package's constants (types, block sizes, file types) without its
reader, writer, YAML metadata and vocabulary code (``util.lean_import``: 80 ms of
the 180 ms its ``import gguf`` took here, in every process that reads a header)."""

from __future__ import annotations

from localllm.util import lean_import

lean_import.install("gguf", ("constants",))

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType  # noqa: E402

__all__ = ["GGML_QUANT_SIZES", "GGMLQuantizationType", "GGUFValueType", "LlamaFileType"]

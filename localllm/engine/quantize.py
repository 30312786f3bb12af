"""Quantization through llama.cpp's own quantizer (llama_model_quantize).

Kept in the engine because it calls llama.cpp; everything around it (choosing
types, importance matrices, evaluating the result) lives in ``localllm.quantize``.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from localllm.engine.llamalog import ROUTER
from localllm.engine.native import install_log_router
from localllm.errors import EngineError

QUANT_TYPES: dict[str, int] = {
    "F32": 0, "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "BF16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q6_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
    "Q5_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M, "Q5_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_S,
    "Q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0, "Q5_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_1,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "Q4_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "Q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
    "IQ4_NL": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL, "IQ4_XS": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS,
    "Q3_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M, "Q3_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_S,
    "Q2_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
}


def quantize_model(
    src: Path,
    dst: Path,
    qtype: str,
    *,
    n_threads: int = 0,
    allow_requantize: bool = False,
    dry_run: bool = False,
    imatrix: dict[str, object] | None = None,
) -> None:
    """llama.cpp's own quantizer (llama_model_quantize). Progress and sizes go
    to the log (``ROUTER``): one '[ i/ n] tensor ...' line per tensor, then
    'model size' and 'quant size'. ``imatrix`` maps tensor names to float32
    arrays of per-column importance."""
    install_log_router()
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = n_threads
    params.ftype = QUANT_TYPES[qtype]
    params.allow_requantize = allow_requantize
    params.dry_run = dry_run
    keep: list[object] = []  # what must outlive the call
    if imatrix:
        entries = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, values) in enumerate(imatrix.items()):
            import numpy as np

            arr = np.ascontiguousarray(values, dtype=np.float32)
            keep.append(arr)
            raw = name.encode()
            keep.append(raw)
            entries[i].name = raw
            entries[i].data = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = arr.size
        keep.append(entries)
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    mark = ROUTER.mark()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise EngineError(f"llama.cpp could not quantize {src.name}: {ROUTER.first_error_since(mark) or 'unknown reason'}")

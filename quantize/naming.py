"""Output names the way the GGUF ecosystem writes them: ``<base>-Q4_K_M.gguf``."""

from __future__ import annotations

import re
from pathlib import Path

# A trailing precision or quant tag that the new type replaces: model-F16, model.f16, model_Q8_0 ...
_TAG = re.compile(r"[-._](f32|f16|bf16|q\d(_[a-z0-9]+)*|iq\d(_[a-z0-9]+)*)$", re.IGNORECASE)


def default_output(src: Path, qtype: str) -> Path:
    """``models/smol-F16.gguf`` + Q4_K_M -> ``models/smol-Q4_K_M.gguf`` (beside the input)."""
    base = _TAG.sub("", src.stem) if src.suffix == ".gguf" else src.name
    return src.with_name(f"{base}-{qtype}.gguf")

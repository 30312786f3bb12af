"""Names for model files: the quant in a file name, a repo's short name, split parts.

Pure string work shared by the registry (naming what is on disk) and ``pull``
(choosing a file in a repo by ``--quant``). File names on the Hub follow the
convention llama.cpp's ``convert`` and the big quantizers use:
``<Model>-<QUANT>.gguf``, sometimes ``<Model>.<QUANT>.gguf`` or lower case, and
``<Model>-<QUANT>-00001-of-00003.gguf`` for split files.
"""

from __future__ import annotations

import re

# Longest alternatives first so Q4_K_M is not read as Q4_K. The trailing
# look-ahead keeps "Q4_0" from matching inside "Q4_0_4_4" only where that is a
# different (ARM repacked) type; we report it as the whole token.
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])("
    r"IQ[1-4]_(?:XXS|XS|S|M|NL)|IQ[1-4]_[0-9]|"
    r"Q[2-8]_K_(?:XL|L|M|S)|Q[2-8]_K|"
    r"Q4_0_[48]_[48]|Q[4-8]_[01]|TQ[12]_0|"
    r"BF16|F16|F32|FP16|FP32|MXFP4"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def quant_of(filename: str) -> str | None:
    """The quant type a file name states, upper case (``Q4_K_M``), or None.
    When several appear (``...-Q8_0-Q4_K_M.gguf``) the last one names the file."""
    found = _QUANT.findall(filename.rsplit("/", 1)[-1])
    if not found:
        return None
    q = found[-1].upper()
    return {"FP16": "F16", "FP32": "F32"}.get(q, q)


def split_part(filename: str) -> tuple[int, int] | None:
    """(part, of) for ``...-00002-of-00003.gguf``; None for a single file."""
    m = _SPLIT.search(filename)
    return (int(m.group(1)), int(m.group(2))) if m else None


def split_names(filename: str) -> list[str]:
    """Every part's name of a split model given its first part's (llama.cpp's
    ``PREFIX-00001-of-0000N.gguf``), in order; ``[filename]`` for a single file."""
    m = _SPLIT.search(filename)
    if m is None:
        return [filename]
    n = int(m.group(2))
    head, suffix = filename[: m.start()], filename[m.end() - len(".gguf"):]  # the suffix as written (.gguf, .GGUF)
    return [f"{head}-{k:05d}-of-{n:05d}{suffix}" for k in range(1, n + 1)]


def is_projector(filename: str) -> bool:
    """Vision projectors (``mmproj-*.gguf``) are not language models on their own:
    never listed as a model, but attached to the model beside them (``pick_projector``)."""
    return "mmproj" in filename.rsplit("/", 1)[-1].lower()


def pick_projector(model: str, candidates: list[tuple[str, int]]) -> str | None:
    """The projector for ``model`` among a repo's ``(filename, size)`` files, as
    llama-server's ``-hf`` picks one (common/arg.cpp: an ``mmproj`` GGUF in the
    model's folder): the name sharing the longest start with the model's once
    ``mmproj-`` is dropped, then F16 before other types (llama.cpp's converters
    write f16 by default), then the smallest. None when the folder has none."""
    folder = model.rsplit("/", 1)[0] if "/" in model else ""
    base = model.rsplit("/", 1)[-1].lower()

    def common(name: str) -> int:
        n = 0
        for a, b in zip(name.rsplit("/", 1)[-1].lower().replace("mmproj-", ""), base):
            if a != b:
                break
            n += 1
        return n

    here = [(n, size) for n, size in candidates if is_projector(n) and (n.rsplit("/", 1)[0] if "/" in n else "") == folder]
    if not here:
        return None
    return min(here, key=lambda c: (-common(c[0]), "f16" not in c[0].lower(), c[1], c[0]))[0]


def short_repo(repo: str) -> str:
    """``bartowski/Llama-3.2-1B-Instruct-GGUF`` -> ``llama-3.2-1b-instruct``."""
    name = repo.rsplit("/", 1)[-1].lower()
    for suffix in ("-gguf", "_gguf", ".gguf"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def model_name(repo: str, filename: str) -> str:
    """The registry name of a file in a repo: ``<short repo>:<quant>`` like
    Ollama's ``model:tag``, or ``<short repo>:<file stem>`` when the name has no quant."""
    quant = quant_of(filename)
    tag = quant.lower() if quant else file_stem(filename)
    return f"{short_repo(repo)}:{tag}"


def file_stem(filename: str) -> str:
    base = filename.rsplit("/", 1)[-1]
    if base.lower().endswith(".gguf"):
        base = base[:-5]
    return base.lower()

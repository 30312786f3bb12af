"""Every filesystem location localllm uses, in one place.

``LOCALLLM_HOME`` overrides the data directory (tests point it at ``tmp_path``).
Nothing here touches the disk at import time; directories are created on use.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """Root of localllm's own state: models it assembled, settings, logs.

    The platform's data directory (platformdirs): ``$XDG_DATA_HOME/localllm`` or
    ``~/.local/share/localllm`` on Linux, ``~/Library/Application Support/localllm``
    on macOS, ``%LOCALAPPDATA%\\localllm`` on Windows."""
    env = os.environ.get("LOCALLLM_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("localllm", appauthor=False))


def config_file() -> Path:
    """The config file: ``LOCALLLM_CONFIG``; else, with ``LOCALLLM_HOME`` set
    (tests, portable installs), the file in it; else ``config.toml`` in
    platformdirs' user config folder (``~/.config/localllm`` on Linux)."""
    env = os.environ.get("LOCALLLM_CONFIG")
    if env:
        return Path(env).expanduser()
    home = os.environ.get("LOCALLLM_HOME")
    if home:
        return Path(home).expanduser() / "config.toml"
    import platformdirs

    return Path(platformdirs.user_config_dir("localllm", appauthor=False)) / "config.toml"


def models_dir() -> Path:
    """Where model files localllm writes (assembled or downloaded) live."""
    return data_dir() / "models"


def ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """What localllm can compute again but would rather not (a model file's sha256):
    the cache folder in ``LOCALLLM_HOME`` when it is set (tests, portable installs),
    else platformdirs' user cache folder (``~/.cache/localllm`` on Linux)."""
    if os.environ.get("LOCALLLM_HOME"):
        return data_dir() / "cache"
    import platformdirs

    return Path(platformdirs.user_cache_dir("localllm", appauthor=False))


def digests_file() -> Path:
    """Model files' sha256 by path, size and mtime (``localllm.store.digest``)."""
    return cache_dir() / "digests.json"


def stubs_dir() -> Path:
    """Sparse stand-ins of models not downloaded (their header, at their full
    size) that llama.cpp's dry run reads; each is removed after use."""
    return data_dir() / "stubs"


def registry_file() -> Path:
    """localllm's own record: folders added with ``localllm add`` and the files it pulled."""
    return data_dir() / "registry.json"


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, resolved the way huggingface_hub resolves it
    (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ``$XDG_CACHE_HOME``/huggingface/hub).
    Computed here so that listing models does not import huggingface_hub."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(os.path.expandvars(env)).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(home)).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def lmstudio_models_dirs() -> list[Path]:
    """LM Studio's models folders: the folder named in ``~/.lmstudio-home-pointer``
    (LM Studio writes it when its home moves), else ``~/.lmstudio``, with ``models/``;
    and the pre-0.3 ``~/.cache/lm-studio/models``. ``LOCALLLM_LMSTUDIO_DIR`` (ours)
    names the models folder outright."""
    env = os.environ.get("LOCALLLM_LMSTUDIO_DIR")
    if env:
        return [Path(env).expanduser()]
    try:
        target = (Path.home() / ".lmstudio-home-pointer").read_text(encoding="utf-8").strip()
    except OSError:
        target = ""
    home = Path(target).expanduser() if target else Path.home() / ".lmstudio"
    return [home / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def ollama_models_dirs() -> list[Path]:
    """Ollama's store: ``$OLLAMA_MODELS``, else ``~/.ollama/models``, and the Linux
    service's ``/usr/share/ollama/.ollama/models``."""
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        return [Path(env).expanduser()]
    return [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]

"""The engine's errors in the command line's words: each setting named by its flag.

The engine names the cause (``localllm.engine_api.errors``); only here do
settings become flags, so "n_ctx must be between 1 and ..." from the library
reads "--ctx must be between 1 and ..." on the command line.
"""

from __future__ import annotations

from localllm.engine_api.errors import SettingError

FLAGS: dict[str, str] = {
    "n_ctx": "--ctx", "n_batch": "--batch", "n_ubatch": "--ubatch", "n_threads": "--threads",
    "flash_attn": "--flash-attn", "kv_type": "--kv-type", "template": "--template", "template_choice": "--template FILE|NAME", "raw": "--raw",
    "device": "--device", "n_cpu_moe": "--n-cpu-moe/--cpu-moe",
}


def cli_message(exc: BaseException) -> str:
    """``exc`` as the CLI shows it: a setting error with flags, anything else as it is."""
    if isinstance(exc, SettingError):
        return exc.worded(FLAGS)
    return str(exc)

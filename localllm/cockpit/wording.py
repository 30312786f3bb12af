"""How the cockpit words things for the screen: a name with its control characters
escaped, an exception as one line for the chat log."""

from __future__ import annotations

from localllm.engine_api.errors import SettingError
from localllm.errors import LocalLLMError


def printable(text: str) -> str:
    """Control characters escaped, so a file name cannot draw on the screen."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


# The engine's settings, named as the settings screen labels them (the CLI names
# its flags instead: localllm.commands.advice).
SETTING_LABELS = {
    "n_ctx": "context size", "n_threads": "threads", "kv_type": "the K/V cache type", "n_batch": "the batch size",
    "n_ubatch": "the micro-batch size", "flash_attn": "flash attention", "template": "the template",
    "template_choice": "a chat template", "raw": "a base model's completion mode", "n_cpu_moe": "experts in RAM",
}


def reason(exc: BaseException) -> str:
    """An exception as one line for the chat log: our own errors are worded for
    the user (a setting by its label on the settings screen); anything else is
    named by its type (a bug, not the user's fault)."""
    said = exc.worded(SETTING_LABELS) if isinstance(exc, SettingError) else str(exc)
    text = printable(" ".join(said.split())) or "no message"
    return text if isinstance(exc, LocalLLMError) else f"{type(exc).__name__}: {text}"

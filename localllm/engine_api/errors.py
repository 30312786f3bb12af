"""The errors an engine raises, naming the cause, not the CLI's flags.

A ``SettingError`` says which settings are at fault through ``{name}``
placeholders in its wording. A library user reads them as ``LoadConfig``'s
fields and the ``Engine``'s methods (``LIBRARY_NAMES``); the CLI words the same
error with its flags (``localllm.commands.advice``), so "n_ctx must be between 1
and ..." from the library is "--ctx must be between 1 and ..." on the command line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from localllm.errors import EngineError, InputError, LocalLLMError, UsageError

# How a library user names each setting the engine's errors mention.
LIBRARY_NAMES: dict[str, str] = {
    "n_ctx": "n_ctx", "n_batch": "n_batch", "n_ubatch": "n_ubatch", "n_threads": "n_threads",
    "n_outputs_max": "n_outputs_max", "flash_attn": "flash_attn", "kv_type": "type_k/type_v",
    "template": "the template", "template_choice": "use_template(FILE|NAME)", "raw": "chat=False", "device": "device",
    "n_cpu_moe": "n_cpu_moe",
}

# Only the settings above are placeholders: other braces (in a file name, say) stay as they are.
_PLACEHOLDER = re.compile(r"\{(" + "|".join(LIBRARY_NAMES) + r")\}")


class SettingError(LocalLLMError):
    """An error whose fix is a setting: ``wording`` holds ``{setting}``
    placeholders; ``settings`` lists them in order."""

    def __init__(self, wording: str) -> None:
        self.wording = wording
        self.settings = tuple(dict.fromkeys(_PLACEHOLDER.findall(wording)))
        super().__init__(self.worded(LIBRARY_NAMES))

    def worded(self, names: Mapping[str, str]) -> str:
        """The message with each setting named as ``names`` says (unknown ones as they are)."""
        return _PLACEHOLDER.sub(lambda m: names.get(m.group(1), m.group(1)), self.wording)


class InvalidSetting(SettingError, UsageError):
    """A setting llama.cpp would refuse, or one too small for what was asked."""


class ContextFull(SettingError, EngineError):
    """The context cannot make room for more tokens."""


class FileSettingError(SettingError, InputError):
    """A file named by a setting (a chat template) is unreadable or fails."""


__all__ = ["ContextFull", "EngineError", "FileSettingError", "InputError", "InvalidSetting", "LIBRARY_NAMES", "SettingError", "UsageError"]

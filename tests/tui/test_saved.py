"""How the cockpit words an error: settings by their labels, bugs by their type."""

from __future__ import annotations

from localllm.engine_api.errors import InvalidSetting
from localllm.errors import InputError
from localllm.tui.saved import reason


def test_a_setting_is_named_by_its_label() -> None:
    exc = InvalidSetting("the prompt is 900 tokens but the context holds 512: try {n_ctx} 1280")
    assert reason(exc) == "the prompt is 900 tokens but the context holds 512: try context size 1280"


def test_our_errors_read_as_they_are_and_bugs_by_type() -> None:
    assert reason(InputError("model file not found: x.gguf")) == "model file not found: x.gguf"
    assert reason(KeyError("n")) == "KeyError: 'n'"
    assert reason(InputError("bell\x07")) == "bell\\x07"

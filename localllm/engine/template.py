"""Which chat template a model is rendered with: its own (from the GGUF), a
Jinja file, or one of llama.cpp's built-in templates (``--template``).

The choice outlives a reload of the same model (the cockpit reloads on a
settings change), so it lives apart from the vocabulary it renders for.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import llama_cpp

from localllm.engine.chat_template import ChatTemplate
from localllm.engine_api.errors import InvalidSetting
from localllm.errors import InputError, UsageError
from localllm.modelfile.gguf_file import GGUFHeader


def builtin_templates() -> list[str]:
    """Names of llama.cpp's built-in chat templates (llama_chat_builtin_templates)."""
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * max(n, 1))()
    n = llama_cpp.llama_chat_builtin_templates(arr, n)
    return [arr[i].decode() for i in range(max(n, 0))]


class TemplateChoice:
    """The model's template unless ``use`` picked another; compiled on first use."""

    def __init__(self) -> None:
        self._compiled: ChatTemplate | None = None
        self._override: tuple[str, str] | None = None  # ("builtin", name) or ("jinja", source)
        self._origin = ""

    def forget_compiled(self) -> None:
        """A new model: its template is compiled again from source (an override stays)."""
        self._compiled = None

    def available(self, header: GGUFHeader | None) -> bool:
        if self._override is not None:
            return True
        return bool(header and isinstance(header.get("tokenizer.chat_template"), str))

    def use(self, spec: str) -> None:
        """``--template FILE|NAME``: a Jinja file, or one of llama.cpp's built-in
        templates by name (chatml, llama3, gemma, ...), instead of the model's."""
        p = Path(spec).expanduser()
        if p.is_file():
            if p.stat().st_size > 1024 * 1024:
                raise InputError(f"the template {p} is larger than 1 MiB")
            try:
                source = p.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise InputError(f"the template {p} is not UTF-8 text") from None
            except OSError as exc:
                raise InputError(f"cannot read the template {p}: {exc.strerror or exc}") from None
            self._compiled = ChatTemplate(source, f"the chat template {p}")  # compile now: errors before the first turn
            self._override = ("jinja", source)
            self._origin = f"the chat template {p}"
            return
        names = builtin_templates()
        if spec not in names:
            raise InvalidSetting(f"{{template}} {spec}: no such file, and not a built-in template (one of: {', '.join(names)})")
        self._override = ("builtin", spec)

    def source(self, header: GGUFHeader | None) -> str | None:
        """The Jinja text in use (None for a built-in template or none at all):
        ``serve`` reads which tool-call format it speaks from it."""
        if self._override is not None:
            return self._override[1] if self._override[0] == "jinja" else None
        source = header.get("tokenizer.chat_template") if header else None
        return source if isinstance(source, str) else None

    def render(self, header: GGUFHeader | None, messages: list[dict[str, Any]], bos_text: str, eos_text: str,
               add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None) -> str:
        if self._override and self._override[0] == "builtin":
            return _render_builtin(self._override[1], messages, add_generation_prompt)
        if self._compiled is None:
            source: object
            if self._override is not None:
                source, origin = self._override[1], self._origin
            else:
                source = header.get("tokenizer.chat_template") if header else None
                origin = f"{header.path if header else 'the model'}: the model's chat template"
            if not isinstance(source, str):
                raise InvalidSetting("this model has no chat template (a base model): use {raw}, or {template_choice}")
            self._compiled = ChatTemplate(source, origin)
        return self._compiled.render(messages, bos_token=bos_text, eos_token=eos_text, add_generation_prompt=bool(add_generation_prompt),
                                     tools=tools, extra=extra)


def _render_builtin(name: str, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    arr = (llama_cpp.llama_chat_message * max(len(messages), 1))()
    keep = []
    for i, m in enumerate(messages):
        role, content = str(m.get("role", "")).encode("utf-8", "replace"), str(m.get("content") or "").encode("utf-8", "replace")
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), add_generation_prompt, None, 0)
    if n < 0:
        raise UsageError(f"llama.cpp cannot apply the built-in template {name} to this conversation")
    buf = ctypes.create_string_buffer(n + 1)
    llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), add_generation_prompt, buf, n + 1)
    return buf.raw[:n].decode("utf-8", "replace")

"""Render a chat template (Jinja, from the model's GGUF or a file) with limits.

A chat template is code that came with a downloaded file. llama-cpp-python runs
it in Jinja's immutable sandbox, which keeps it away from ``os`` but not from
looping or multiplying strings without end. Here it runs in the same sandbox
with three more limits, so a hostile or broken template costs at most a few
seconds and a few MiB, and then fails as the model's fault:

- a time limit, checked on every line the compiled template executes (a trace
  function on the rendering thread only) and at every call and operator;
- an output limit, checked as the output is generated and before any string
  or list is repeated, concatenated or padded past it;
- powers are bounded, so ``10 ** 10 ** 10`` is refused before it is computed.

The environment matches llama-cpp-python's ``Jinja2ChatFormatter`` (trim and
lstrip blocks, loop controls, ``{% generation %}`` ignored, ``tojson`` like
Transformers, ``raise_exception`` and ``strftime_now``), so templates render
the same text.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from typing import Any

from localllm.engine_api.errors import FileSettingError

TIME_LIMIT_S = 3.0
MIN_OUTPUT_LIMIT = 4 * 1024 * 1024  # characters; more when the messages are longer
_MAX_INT_BITS = 64


class TemplateError(FileSettingError):
    """The template failed to compile or render, or went past a limit."""


class _Limit(Exception):
    """Raised inside the template when it goes past a limit."""


def _environment(limits: _Limits):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class IgnoreGenerationTags(jinja2.ext.Extension):
        """Pass-through for Hugging Face's ``{% generation %}`` tag."""

        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "+", "%"])

        def call_binop(self, context, operator, left, right):
            limits.tick()
            if operator == "**" and isinstance(left, int) and isinstance(right, int):
                if right > 0 and abs(left) > 1 and right * max(abs(left).bit_length(), 1) > _MAX_INT_BITS:
                    raise _Limit(f"the power {left} ** {right} is too large")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                        limits.size(len(seq) * max(n, 0), "repeating a string or list")
            if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                limits.size(len(left) + len(right), "a concatenation")
            if operator == "%" and isinstance(left, str):
                for width in re.findall(r"%[-+ #0]*(\d+)", left):
                    limits.size(int(width), "a format width")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805
            limits.tick()
            limits.ints(args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    env = LimitedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[IgnoreGenerationTags, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    for name, f in list(env.filters.items()):
        env.filters[name] = _bounded(f, limits)
    return env


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _bounded(f: Any, limits: _Limits) -> Any:
    @functools.wraps(f)  # keeps jinja's pass_context/pass_environment marks
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        limits.tick()
        limits.ints(args[1:], kwargs)
        out = f(*args, **kwargs)
        if isinstance(out, (str, list)):
            limits.size(len(out), "a filter's result")
        return out

    return wrapper


class _Limits:
    def __init__(self, seconds: float, max_chars: int) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.max_chars = max_chars

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Limit(f"it ran for more than {self.seconds:g} s")

    def size(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise _Limit(f"{what} would make {n:,} characters (the limit is {self.max_chars:,})")

    def ints(self, args: Any, kwargs: dict[str, Any]) -> None:
        for v in (*args, *kwargs.values()):
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > self.max_chars:
                raise _Limit(f"an argument of {v} is past the output limit")


class ChatTemplate:
    """A compiled template, rendered under limits. ``origin`` names where it came
    from in error messages ("the model's chat template", "the template FILE")."""

    def __init__(self, source: str, origin: str, *, seconds: float = TIME_LIMIT_S) -> None:
        self.origin = origin
        self.seconds = seconds
        self._limits = _Limits(seconds, MIN_OUTPUT_LIMIT)
        self._env = _environment(self._limits)
        try:
            self._template = self._env.from_string(source)
        except Exception as exc:  # a syntax error, or anything Jinja raises while compiling
            raise TemplateError(f"{origin} failed: {_reason(exc)}; use {{raw}} or {{template_choice}}") from None

    def render(self, messages: list[dict[str, Any]], *, bos_token: str, eos_token: str, add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None) -> str:
        """``tools``: OpenAI's tool objects, given to the template as Transformers'
        ``apply_chat_template(tools=...)`` gives them (None: no tools)."""
        chars = sum(len(m.get("content") or "") for m in messages) + len(json.dumps(tools or []))
        self._limits.deadline = time.monotonic() + self.seconds
        self._limits.max_chars = max(MIN_OUTPUT_LIMIT, 8 * chars)
        ctx = {
            "messages": messages,
            "bos_token": bos_token,
            "eos_token": eos_token,
            "add_generation_prompt": add_generation_prompt,
            "raise_exception": _raise_exception,
            "strftime_now": _strftime_now,
            "tools": tools,
            "functions": None,
        }
        pieces: list[str] = []
        total = 0
        previous = sys.gettrace()
        sys.settrace(self._tracer())
        try:
            for piece in self._template.generate(**ctx):
                total += len(piece)
                self._limits.size(total, "the rendered prompt")
                self._limits.tick()
                pieces.append(piece)
        except _Limit as exc:
            raise TemplateError(f"{self.origin} failed: {exc}; use {{raw}} or {{template_choice}}") from None
        except Exception as exc:  # whatever the template raises is the template's fault
            raise TemplateError(f"{self.origin} failed: {_reason(exc)}; use {{raw}} or {{template_choice}}") from None
        finally:
            sys.settrace(previous)
        return "".join(pieces)

    def _tracer(self):
        limits = self._limits

        def local(frame, event, arg):
            limits.tick()
            return local

        def trace(frame, event, arg):
            # Only the template's own compiled code is traced line by line.
            return local if frame.f_code.co_filename == "<template>" else None

        return trace


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _strftime_now(f: str) -> str:
    from datetime import datetime

    return datetime.now().strftime(f)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    name = type(exc).__name__
    return f"{name}: {first[:200]}" if first else name

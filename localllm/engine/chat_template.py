"""Render a chat template (Jinja, from the model's GGUF or a file) with limits.

A chat template is code that came with a downloaded file. llama-cpp-python runs
it in Jinja's immutable sandbox, which keeps it away from ``os`` but not from
looping, multiplying strings or building lists without end. Here it runs in the
same sandbox under the limits of ``template_bounds``, so a hostile or broken
template costs at most a few seconds and some tens of MiB, and then fails as
the model's fault:

- a time limit, checked on every line the compiled template (and Jinja's
  filters) execute, through a trace function on the rendering thread only, and
  at every call and operator;
- size limits, checked before any string or list is repeated, concatenated
  (``+`` and ``~``), padded, formatted, replaced or joined past them, and on
  what each call and filter returns;
- a memory limit on the process's growth while rendering.

The environment matches llama-cpp-python's ``Jinja2ChatFormatter`` (trim and
lstrip blocks, loop controls, ``{% generation %}`` ignored, ``tojson`` like
Transformers, ``raise_exception`` and ``strftime_now``), so templates render
the same text. Where that sandbox refuses what llama.cpp's own Jinja engine
(common/jinja) runs, the templates llama.cpp tests render here as there:
``list.append`` and ``list.pop`` (Kimi K2 queues its call ids; the template
gets its own copy of the messages and tools, so the caller's are never
changed), ``tojson`` of a ``map`` (DeepSeek R1's), and text ``+`` none or an
undefined value, which is the text (llama.cpp's ``workaround_concat_null_with_str``:
Command R+ with a parameter that has no description, FireFunction's ``functions``).
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import sys
from typing import Any

from localllm.engine.template_bounds import MIN_MEMORY_BYTES, Limit, Limits
from localllm.engine_api.errors import FileSettingError
from localllm.engine_api.protocol import TEMPLATE_RESERVED

TIME_LIMIT_S = 3.0
MIN_OUTPUT_LIMIT = 4 * 1024 * 1024  # characters; more when the messages are longer


class TemplateError(FileSettingError):
    """The template failed to compile or render, or went past a limit."""


def _environment(limits: Limits):
    import jinja2
    import jinja2.ext
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

    class IgnoreGenerationTags(jinja2.ext.Extension):
        """Pass-through for Hugging Face's ``{% generation %}`` tag."""

        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "+", "%"])

        def is_safe_attribute(self, obj, attr, value):
            if isinstance(obj, list) and attr in _LIST_CHANGES:  # llama.cpp's Jinja has them; the inputs are the template's copies
                return SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
            return super().is_safe_attribute(obj, attr, value)

        def call_binop(self, context, operator, left, right):
            limits.tick()
            if operator == "+" and (isinstance(left, str) and _nothing(right) or isinstance(right, str) and _nothing(left)):
                left, right = ("" if _nothing(left) else left), ("" if _nothing(right) else right)  # llama.cpp's concat workaround
            limits.binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805
            limits.tick()
            limits.ints(args, kwargs)
            limits.call(__obj, args, kwargs)
            out = super().call(__context, __obj, *args, **kwargs)
            limits.result(out, "a call's result")
            return out

    class LimitedCodeGenerator(CodeGenerator):
        """Jinja's ``~`` joins its operands in one step: through ``limits.concat``."""

        def visit_Concat(self, node, frame) -> None:
            self.write("environment.limited_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    LimitedEnvironment.code_generator_class = LimitedCodeGenerator
    LimitedEnvironment.limited_concat = staticmethod(limits.concat)  # type: ignore[attr-defined]

    env = LimitedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[IgnoreGenerationTags, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    for name, f in list(env.filters.items()):
        env.filters[name] = _bounded(name, f, limits)
    return env


_LIST_CHANGES = frozenset({"append", "pop"})


def _nothing(x: Any) -> bool:
    import jinja2

    return x is None or isinstance(x, jinja2.Undefined)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys, default=_listed)


def _listed(x: Any) -> list[Any]:
    """A ``map``/``select`` filter's generator as the list llama.cpp's Jinja makes of it (for ``tojson``), bounded."""
    import types

    if not isinstance(x, (types.GeneratorType, map, filter, itertools.islice)):
        raise TypeError(f"Object of type {type(x).__name__} is not JSON serializable")
    items = list(itertools.islice(x, _MAX_LISTED + 1))
    if len(items) > _MAX_LISTED:
        raise TypeError(f"a sequence of more than {_MAX_LISTED:,} items given to tojson")
    return items


_MAX_LISTED = 100_000


def _fresh(value: Any) -> Any:
    """``value`` with every dict and list in it copied (other values shared): a
    template's ``list.append`` changes its own copy, never the caller's messages.
    Walked without recursion (a call's arguments may nest deep)."""
    root = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        v = parent[key]
        if isinstance(v, dict):
            parent[key] = d = dict(v)
            stack.extend((d, k) for k in d)
        elif isinstance(v, list):
            parent[key] = items = list(v)
            stack.extend((items, i) for i in range(len(items)))
    return root[0]


def _bounded(name: str, f: Any, limits: Limits) -> Any:
    # A filter marked pass_context/pass_environment/pass_eval_context takes that first.
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(f)  # keeps jinja's pass_context/pass_environment marks
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        limits.tick()
        limits.ints(args[skip + 1:], kwargs)
        if len(args) > skip:
            limits.filter(name, args[skip], args[skip + 1:], kwargs)
        out = f(*args, **kwargs)
        limits.result(out, f"the filter {name}")
        return out

    return wrapper


class ChatTemplate:
    """A compiled template, rendered under limits. ``origin`` names where it came
    from in error messages ("the model's chat template", "the template FILE")."""

    def __init__(self, source: str, origin: str, *, seconds: float = TIME_LIMIT_S) -> None:
        self.origin = origin
        self.seconds = seconds
        self._limits = Limits(seconds, MIN_OUTPUT_LIMIT)
        self._env = _environment(self._limits)
        # FireFunction v2 joins ``functions`` (the tools' JSON) to its system prompt, as llama.cpp's
        # firefunction handler gave it; other templates get llama-cpp-python's None
        self._functions_text = bool(re.search(r"[+~]\s*functions\b", source))
        try:
            self._template = self._env.from_string(source)
        except Exception as exc:  # a syntax error, or anything Jinja raises while compiling
            raise TemplateError(f"{origin} failed: {_reason(exc)}; use {{raw}} or {{template_choice}}") from None

    def render(self, messages: list[dict[str, Any]], *, bos_token: str, eos_token: str, add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None, extra: dict[str, Any] | None = None) -> str:
        """``tools``: OpenAI's tool objects, given to the template as Transformers'
        ``apply_chat_template(tools=...)`` gives them (None: no tools). ``extra``:
        more variables (``enable_thinking``, a request's ``chat_template_kwargs``),
        set over llama.cpp's extra context as common/chat.cpp sets them; the
        names the template's own machinery uses are not among them (TEMPLATE_RESERVED)."""
        chars = sum(len(m.get("content") or "") for m in messages) + len(json.dumps(tools or [])) + len(json.dumps(extra or {}))
        # the messages' own text, a few copies of it in UCS-4, is allowed on top
        self._limits.start(self.seconds, max(MIN_OUTPUT_LIMIT, 8 * chars), MIN_MEMORY_BYTES + 16 * chars)
        ctx = {
            "messages": _fresh(messages),
            "bos_token": bos_token,
            "eos_token": eos_token,
            "add_generation_prompt": add_generation_prompt,
            "raise_exception": _raise_exception,
            "strftime_now": _strftime_now,
            # what llama.cpp adds to every template's context (common/chat.cpp,
            # common_chat_extra_context): Llama 3.1/3.3 templates read date_string
            # and fall back to "26 Jul 2024" without it
            **_extra_context(),
            "tools": _fresh(tools),
            "functions": (json.dumps(tools, ensure_ascii=False, indent=2) if tools else "") if self._functions_text else None,
        }
        ctx.update({k: v for k, v in (extra or {}).items() if k not in TEMPLATE_RESERVED})
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
        except Limit as exc:
            raise TemplateError(f"{self.origin} failed: {exc}; use {{raw}} or {{template_choice}}") from None
        except Exception as exc:  # whatever the template raises is the template's fault
            raise TemplateError(f"{self.origin} failed: {_reason(exc)}; use {{raw}} or {{template_choice}}") from None
        finally:
            sys.settrace(previous)
        return "".join(pieces)

    def _tracer(self):
        import jinja2.filters

        limits = self._limits
        filters_file = jinja2.filters.__file__

        def local(frame, event, arg):
            limits.tick()
            return local

        def trace(frame, event, arg):
            # Only the template's own compiled code, and Jinja's filters (generators
            # a template drains with ``list``), are traced line by line.
            name = frame.f_code.co_filename
            return local if name == "<template>" or name == filters_file else None

        return trace


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _extra_context() -> dict[str, str]:
    from datetime import datetime

    now = datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


def _strftime_now(f: str) -> str:
    from datetime import datetime

    return datetime.now().strftime(f)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    name = type(exc).__name__
    return f"{name}: {first[:200]}" if first else name

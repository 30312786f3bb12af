"""What a request may tell the chat template: llama-server's ``chat_template_kwargs``,
OpenAI's ``reasoning_effort`` and Ollama's ``think``, over serve's defaults
(``--chat-template-kwargs``, ``--reasoning on|off|auto``); and how long it may
think (``budget``: ``--reasoning-budget`` and the requests' budgets).

The rules are llama-server's (tools/server/server-common.cpp,
oaicompat_chat_params_parse; common/chat.cpp puts them into the template's
context): the template always sees ``enable_thinking``, true where the template
has a thinking format (``localllm.reasoning``) unless ``--reasoning off``;
``chat_template_kwargs`` are set over it (``enable_thinking`` there must be a
boolean); ``reasoning_effort: "none"`` turns thinking off, any other word is
handed to the template as ``reasoning_effort`` (gpt-oss reads it).

Unlike llama-server, the names the renderer itself gives a template
(``messages``, ``tools``, ``raise_exception``: engine_api's TEMPLATE_RESERVED)
cannot be replaced, and the values are bounded: they reach the prompt as the
template writes them, so their special-token text is refused as a message's
would be (engine/tokenizer.chat_tokens).
"""

from __future__ import annotations

import json
import re
from typing import Any

from localllm.engine_api.protocol import TEMPLATE_RESERVED as RESERVED  # refused here by name; the renderer drops them too
from localllm.errors import InputError
from localllm.reasoning.budget import EFFORT_BUDGETS

MAX_BYTES = 16 * 1024  # the kwargs' JSON: a few flags and words, never a document
MAX_KEYS = 64
KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")  # a Jinja variable's name
EFFORT = re.compile(r"^[a-z]{1,16}$")  # none, minimal, low, medium, high, ... (the template decides what each means)


class KwargsError(InputError):
    """A bad template argument: the field and why (a 400 naming the field)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"'{field}' {why}")
        self.field, self.why = field, why


def parse_kwargs(value: object, field: str = "chat_template_kwargs") -> dict[str, Any]:
    """A JSON object of template variables, checked: names, size, ``enable_thinking``'s type."""
    if not isinstance(value, dict):
        raise KwargsError(field, "must be a JSON object of template variables")
    if len(value) > MAX_KEYS or len(json.dumps(value, ensure_ascii=False)) > MAX_BYTES:
        raise KwargsError(field, f"is too large (at most {MAX_KEYS} names and {MAX_BYTES // 1024} KiB of JSON)")
    for key in value:
        if not isinstance(key, str) or not KEY.match(key):
            raise KwargsError(field, f"has a name that is not a template variable: {str(key)[:40]!r}")
        if key in RESERVED:
            raise KwargsError(f"{field}.{key}", "is set by the server itself and cannot be replaced")
    if "enable_thinking" in value and not isinstance(value["enable_thinking"], bool):
        raise KwargsError(f"{field}.enable_thinking", "must be true or false")  # llama-server: "invalid type for enable_thinking"
    return dict(value)


def from_request(body: dict, *, think_field: str | None = None) -> dict[str, Any] | None:
    """The template variables a request sets (None: none): ``chat_template_kwargs``,
    then ``reasoning_effort`` over them, then Ollama's ``think`` (``think_field``)."""
    out: dict[str, Any] = {}
    raw = body.get("chat_template_kwargs")
    if raw is not None:
        out.update(parse_kwargs(raw))
    effort = body.get("reasoning_effort")
    if effort is not None:
        _effort(out, effort, "reasoning_effort")
    if think_field is not None and body.get(think_field) is not None:
        think = body[think_field]
        if isinstance(think, bool):
            out["enable_thinking"] = think
        else:  # Ollama: "low", "medium", "high" for gpt-oss
            _effort(out, think, think_field)
    return out or None


def _effort(out: dict[str, Any], value: object, field: str) -> None:
    if not isinstance(value, str) or not EFFORT.match(value):
        raise KwargsError(field, "must be a word such as none, low, medium or high")
    if value == "none":
        out["enable_thinking"] = False
        out.pop("reasoning_effort", None)
    else:
        out["reasoning_effort"] = value


def defaults(reasoning: str, has_thinking: bool, kwargs: str | None) -> dict[str, Any]:
    """serve's own template variables: ``--reasoning`` (on, off, auto: whether the
    template has a thinking format) and ``--chat-template-kwargs`` JSON text."""
    out: dict[str, Any] = {"enable_thinking": reasoning == "on" or (reasoning == "auto" and has_thinking)}
    if kwargs:
        try:
            parsed = json.loads(kwargs)
        except ValueError as exc:
            raise KwargsError("--chat-template-kwargs", f"is not JSON ({exc})") from None
        out.update(parse_kwargs(parsed, "--chat-template-kwargs"))
    if reasoning in ("on", "off"):
        out["enable_thinking"] = reasoning == "on"  # llama-server: --reasoning sets the default template argument
    return out


def merged(server: dict[str, Any], request: dict[str, Any] | None) -> dict[str, Any]:
    return {**server, **(request or {})}


MAX_BUDGET = 1 << 30  # tokens: past any context


def budget(body: dict, default: int) -> int:
    """A request's thinking budget in tokens (``SamplingConfig.reasoning_budget``):
    llama-server's ``reasoning_budget_tokens`` (or ``thinking_budget_tokens``; -1:
    the server's ``--reasoning-budget``), else ``reasoning_effort`` as a budget
    (``reasoning.budget.EFFORT_BUDGETS``; ``none``: 0, the thinking closed at
    once, for a template that opens it whatever it is told), else ``default``.
    Anthropic's ``thinking.budget_tokens``, Responses' ``reasoning.effort`` and
    Ollama's ``think`` words reach here as these fields."""
    for field in ("reasoning_budget_tokens", "thinking_budget_tokens"):
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= MAX_BUDGET:
            raise KwargsError(field, "must be a whole number of tokens (-1: the server's --reasoning-budget, 0: no thinking)")
        if value != -1:
            return value
        return default
    effort = body.get("reasoning_effort")
    if isinstance(effort, str):  # checked as a word by from_request
        if effort == "none":
            return 0
        if effort in EFFORT_BUDGETS:
            return EFFORT_BUDGETS[effort]
    return default

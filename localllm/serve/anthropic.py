"""Anthropic's Messages API over the same engine: ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``, so that Claude Code (``ANTHROPIC_BASE_URL``)
and Anthropic's SDKs can use ``localllm serve``.

A request is translated into the OpenAI chat body ``protocol.parse_gen``
checks, as Ollama's is (serve/ollama.py): the same limits, grammar, tool calls
(serve/tools.py), scheduler, prompt cache and metrics as chat completions, and
no second way to generate. Replies and streams are shaped by ``MessagesShaper``
in Anthropic's shapes (its SSE events with ``event:`` lines); errors are
Anthropic's ``{"type": "error", "error": {"type", "message"}}``.

Choices where Anthropic's API says nothing for a local server (llama-server's
``server_chat_convert_anthropic_to_oai`` is followed where it decides):

- ``thinking`` blocks a client sends back become the assistant turn's
  ``reasoning_content``, as llama-server converts them: a template that shows
  a tool-calling turn's thinking (Qwen3's, after the last user message) shows
  it, and ``count_tokens`` counts it; their signatures are not checked (a local
  model signs nothing). ``redacted_thinking`` blocks are dropped: there is no
  text to show. The ``thinking`` request field turns a
  thinking model's thinking on (``enabled``) or off (``disabled``) through its
  template's ``enable_thinking``, and ``output_config.effort`` is the template's
  ``reasoning_effort`` (serve/thinking.py); ``budget_tokens`` is the thinking
  budget: after that many tokens the end of thinking is forced (``--reasoning-budget``).
- ``usage.input_tokens`` counts the prompt tokens not read from the prompt cache
  and ``cache_read_input_tokens`` the ones that were, as Anthropic (and
  llama-server) count them; ``count_tokens`` gives the whole prompt.
- Text blocks in one message (and ``system`` blocks) are joined with a blank line.
  A ``system`` message inside ``messages`` (Claude Code sends one) joins the
  system prompt, after ``system`` and earlier ones; a tool with
  ``defer_loading`` (Anthropic's tool search) is not shown to the model.
- A ``tool_result`` must answer a ``tool_use`` of an earlier assistant turn
  (a 400 otherwise: a template would render an answer to nothing); at most
  ``MAX_BLOCKS`` content blocks in all, so a body of tiny blocks is refused
  before it costs a template render.
- Anthropic's server tools (a ``tools`` entry with a ``type`` such as
  ``web_search_20250305``) and documents are refused by name. ``image`` blocks
  with a ``base64`` source go to a vision model (serve ``--mmproj``) at their
  place among the turn's text; a ``url`` source is a 400 (this tool is offline).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm.serve import prompt_count
from localllm.serve.protocol import DEFAULTS, MAX_STOP, Dialect, Finished, GenParams, RequestError, Shaper, parse_gen
from localllm.serve.tools import GENERIC, Format

MAX_BLOCKS = 4096  # content blocks in one request, all messages together
PATHS = ("/v1/messages", "/v1/messages/count_tokens")
# the status of an error -> Anthropic's error type (docs.anthropic.com: errors)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}
HONOURED = frozenset({"model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "stream",
                      "tools", "tool_choice", "metadata", "output_config", "thinking"})
_BILLING_CCH = re.compile(r"(cch=)[0-9a-fA-F]{5};")


def error_body(status: int, message: str) -> dict:
    """Anthropic's error object for an HTTP status."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _error(exc: RequestError) -> dict:
    return error_body(exc.status, exc.message)


def _bad(field: str, why: str) -> RequestError:
    return RequestError(400, f"'{field}' {why}", param=field)


def _system(raw: object, field: str = "system") -> str:
    """``system`` (or a system message's ``content``) as one text. Claude Code
    opens it with a billing header whose ``cch=`` stamp changes on every
    request; it is pinned (as llama-server pins it) so the prompt cache reaches past it."""
    if raw is None or raw == "":
        return ""
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list):
        texts = []
        for j, b in enumerate(raw):
            if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
                raise _bad(f"{field}[{j}]", 'must be a text block {"type": "text", "text": ...}')
            texts.append(b["text"])
    else:
        raise _bad(field, "must be a string or a list of text blocks")
    texts = [_BILLING_CCH.sub(r"\1fffff;", t, count=1) if t.startswith("x-anthropic-billing-header:") else t for t in texts]
    return "\n\n".join(t for t in texts if t)


def _result_text(raw: object, where: str) -> tuple[str, list[dict]]:
    """A ``tool_result``'s text, and its ``image`` blocks as OpenAI image parts: a
    tool message holds text only in chat templates, so the images follow the
    results in a user turn of their own (a text-only model then answers the
    400 naming --mmproj, as for any image)."""
    if raw is None:
        return "", []
    if isinstance(raw, str):
        return raw, []
    if isinstance(raw, list):
        parts, images = [], []
        for k, b in enumerate(raw):
            if isinstance(b, dict) and b.get("type") == "image":
                images.append(_image(b, f"{where}.content[{k}]", "user"))
                continue
            if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
                raise _bad(f"{where}.content[{k}]", "may hold only text and image blocks")
            parts.append(b["text"])
        return "\n\n".join(parts), images
    raise _bad(f"{where}.content", "must be a string or a list of text and image blocks")


def _messages(raw: object, system: list[str]) -> list[dict]:
    """Anthropic's messages as OpenAI's: an assistant turn's ``tool_use`` blocks
    as its ``tool_calls``, a user turn's ``tool_result`` blocks as ``tool``
    messages (before the turn's text, the order Anthropic requires of them).

    A ``system`` message among them (Claude Code sends its agent list as
    ``messages[1]``, and Anthropic's API takes it) is added to ``system``, the
    texts of the system prompt, in its order: most chat templates take a system
    message only first, or fold it into the first user turn, so the one place
    every template allows is the system prompt."""
    if not isinstance(raw, list) or not raw:
        raise _bad("messages", "must be a non-empty list")
    out: list[dict] = []
    called: set[str] = set()
    blocks = 0
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}]", "must be an object")
        role = m.get("role")
        if role == "system":
            text = _system(m.get("content"), f"messages[{i}].content")
            blocks += 1 if isinstance(m.get("content"), str) else len(m["content"] or ())
            if text:
                system.append(text)
            continue
        if role not in ("user", "assistant"):
            raise _bad(f"messages[{i}].role", 'must be "user", "assistant" or "system"')
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            blocks += 1
            continue
        if not isinstance(content, list):
            raise _bad(f"messages[{i}].content", "must be a string or a list of content blocks")
        blocks += len(content)
        if blocks > MAX_BLOCKS:
            raise RequestError(400, f"'messages' hold more than {MAX_BLOCKS} content blocks in all", param="messages")
        texts: list[str] = []
        calls: list[dict] = []
        results: list[dict] = []
        images: list[dict] = []
        order: list[dict] = []  # OpenAI's parts: the text blocks and the images, in the turn's order
        thoughts: list[str] = []  # the turn's thinking blocks' text: its reasoning_content
        for j, b in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = b.get("type") if isinstance(b, dict) else None
            if not isinstance(b, dict) or not isinstance(kind, str):
                raise _bad(where, "must be a content block with a 'type'")
            if kind == "text":
                if not isinstance(b.get("text"), str):
                    raise _bad(f"{where}.text", "must be a string")
                if order and order[-1]["type"] == "text":
                    order.append({"type": "text", "text": "\n\n"})  # text blocks joined as without images
                texts.append(b["text"])
                order.append({"type": "text", "text": b["text"]})
            elif kind == "image":
                images.append(_image(b, where, role))
                order.append(images[-1])
            elif kind == "thinking" and role == "assistant" and isinstance(b.get("thinking"), str):
                thoughts.append(b["thinking"])  # see the module's docstring
            elif kind in ("thinking", "redacted_thinking"):
                continue  # accepted and dropped: see the module's docstring
            elif kind == "tool_use":
                if role != "assistant":
                    raise _bad(where, "is a tool_use block: only an assistant turn calls tools")
                cid, name, args = b.get("id"), b.get("name"), b.get("input", {})
                if not isinstance(cid, str) or not cid or not isinstance(name, str) or not isinstance(args, dict):
                    raise _bad(where, 'must be {"type": "tool_use", "id": ..., "name": ..., "input": {...}}')
                if cid in called:  # a result could not tell which of the two it answers
                    raise _bad(f"{where}.id", f"({cid[:64]!r}) repeats the id of an earlier tool_use")
                called.add(cid)
                calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
            elif kind == "tool_result":
                if role != "user":
                    raise _bad(where, "is a tool_result block: only a user turn answers a tool call")
                cid = b.get("tool_use_id")
                if not isinstance(cid, str) or cid not in called:
                    raise _bad(f"{where}.tool_use_id", f"({str(cid)[:64]!r}) answers no tool_use of an earlier assistant turn")
                text_of, shown = _result_text(b.get("content"), where)
                results.append({"role": "tool", "tool_call_id": cid, "content": text_of})
                if shown:  # the result's images, in a user turn after the results
                    order.extend([{"type": "text", "text": f"(the images {cid[:64]} returned)"}, *shown])
                    images.extend(shown)
            elif kind == "document":
                raise _bad(where, "is a document block: not supported (send its text as a text block)")
            else:
                raise _bad(f"{where}.type", f"{kind[:40]!r} is not a content block this server takes (text, tool_use, tool_result, thinking)")
        text = "\n\n".join(texts)
        if role == "user":
            out.extend(results)
            if images:
                out.append({"role": "user", "content": order})
            elif texts or not results:
                out.append({"role": "user", "content": text})
        elif texts or calls or thoughts or not content:
            out.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {}),
                        **({"reasoning_content": "\n\n".join(thoughts)} if thoughts else {})})
    if not out:
        raise _bad("messages", "must hold a user or assistant message (system messages alone leave nothing to answer)")
    return out


IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")  # what Anthropic's API takes


def _image(b: dict, where: str, role: str) -> dict:
    """An ``image`` block as OpenAI's ``image_url`` part (a data URI), for a vision model."""
    if role != "user":
        raise _bad(where, "is an image block: only a user turn takes images")
    src = b.get("source")
    kind = src.get("type") if isinstance(src, dict) else None
    if kind == "url":
        raise _bad(f"{where}.source", "is a URL: this server is offline and fetches no URLs; send the picture itself "
                   '({"type": "base64", "media_type": "image/png", "data": ...})')
    if not isinstance(src, dict) or kind != "base64" or not isinstance(src.get("data"), str) or not src["data"]:
        raise _bad(f"{where}.source", 'must be {"type": "base64", "media_type": "image/png", "data": ...}')
    if src.get("media_type") not in IMAGE_TYPES:
        raise _bad(f"{where}.source.media_type", f"must be one of {', '.join(IMAGE_TYPES)}")
    return {"type": "image_url", "image_url": {"url": f"data:{src['media_type']};base64,{src['data']}"}, "_where": where}


def _tools(raw: object) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise _bad("tools", "must be a list of tools")
    out = []
    for k, t in enumerate(raw):
        if not isinstance(t, dict):
            raise _bad(f"tools[{k}]", "must be an object")
        if t.get("defer_loading") is True:
            continue  # Anthropic's tool search: not shown to the model until a search loads it (Claude Code's placeholder)
        if t.get("type") not in (None, "custom"):
            raise _bad(f"tools[{k}].type", f"{str(t['type'])[:40]!r} is one of Anthropic's server tools: this server runs only "
                       "the client's own tools (name, description, input_schema)")
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise _bad(f"tools[{k}].input_schema", "must be a JSON schema object")
        fn = {"name": t.get("name"), "parameters": schema}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(raw: object, out: dict) -> None:
    if raw is None:
        return
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise _bad("tool_choice", 'must be {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": ...} or {"type": "none"}')
    assert isinstance(raw, dict)
    if kind == "tool":
        if not isinstance(raw.get("name"), str):
            raise _bad("tool_choice.name", "must name one of 'tools'")
        out["tool_choice"] = {"type": "function", "function": {"name": raw["name"]}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    parallel = raw.get("disable_parallel_tool_use")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise _bad("tool_choice.disable_parallel_tool_use", "must be true or false")
        out["parallel_tool_calls"] = not parallel


def translate(body: dict, *, require_max: bool = True) -> tuple[dict, list[str]]:
    """(the OpenAI chat body, the fields ignored) for a Messages body."""
    out: dict = {"model": body.get("model")}
    max_tokens = body.get("max_tokens")
    if max_tokens is None and require_max:
        raise _bad("max_tokens", "is required (as Anthropic's API requires it)")
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _bad("max_tokens", "must be a whole number of at least 1")
        out["max_tokens"] = max_tokens
    system = [_system(body.get("system"))]
    messages = _messages(body.get("messages"), system)
    text = "\n\n".join(t for t in system if t)
    out["messages"] = ([{"role": "system", "content": text}] if text else []) + messages
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(isinstance(s, str) for s in stops):
            raise _bad("stop_sequences", f"must be a list of at most {MAX_STOP} strings")
        out["stop"] = stops
    tools = _tools(body.get("tools"))
    if tools is not None:
        out["tools"] = tools
    _tool_choice(body.get("tool_choice"), out)
    for key in ("temperature", "top_p", "top_k", "stream"):
        if body.get(key) is not None:
            out[key] = body[key]
    ignored = [k[:40] for k in body if k not in HONOURED] + _output_config(body.get("output_config"), out) + _thinking(body.get("thinking"), out)
    return out, sorted(ignored)


def _thinking(raw: object, out: dict) -> list[str]:
    """``thinking``: ``enabled``/``disabled`` as the template's ``enable_thinking`` (``adaptive``: the
    server's default); ``enabled``'s ``budget_tokens`` is the thinking budget (llama-server's
    ``reasoning_budget_tokens``: the end of thinking forced after that many tokens). Other keys
    are returned, to be named as ignored."""
    if raw is None:
        return []
    if not isinstance(raw, dict) or raw.get("type") not in ("enabled", "disabled", "adaptive"):
        raise _bad("thinking", 'must be {"type": "enabled", "budget_tokens": N}, {"type": "disabled"} or {"type": "adaptive"}')
    if raw["type"] != "adaptive":
        out["chat_template_kwargs"] = {"enable_thinking": raw["type"] == "enabled"}
    budget = raw.get("budget_tokens")
    if raw["type"] == "enabled" and budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise _bad("thinking.budget_tokens", "must be a whole number of tokens")
        out["reasoning_budget_tokens"] = budget
    return [f"thinking.{k}"[:40] for k in raw if k not in ("type", "budget_tokens")]


def _output_config(raw: object, out: dict) -> list[str]:
    """``output_config.format`` (structured outputs: a JSON schema) as chat completions'
    ``response_format``, held by the grammar; its other keys (``effort``) are returned, to be named as ignored."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise _bad("output_config", "must be an object")
    fmt = raw.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise _bad("output_config.format", 'must be {"type": "json_schema", "schema": {...}}')
        out["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}
    if raw.get("effort") is not None:
        out["reasoning_effort"] = raw["effort"]  # checked by parse_gen (serve/thinking.py), renamed back in its error
    return [f"output_config.{k}"[:40] for k in raw if k not in ("format", "effort")]


def parse(body: dict, *, chat: bool = True, n_vocab: int, defaults=DEFAULTS, tool_format: Format = GENERIC, max_n: int = 1,
          require_max: bool = True) -> GenParams:
    """A Messages body as the chat completions one parse_gen checks (one reply: Anthropic has no ``n``)."""
    out, ignored = translate(body, require_max=require_max)
    try:
        params = parse_gen(out, chat=True, n_vocab=n_vocab, defaults=defaults, tool_format=tool_format)
    except RequestError as exc:  # parse_gen names OpenAI's fields: say Anthropic's
        exc.message = _renamed(exc.message).replace("'stop'", "'stop_sequences'")
        exc.param = "stop_sequences" if exc.param == "stop" else exc.param and _renamed(exc.param)
        if exc.param and f"'{exc.param}'" not in exc.message:  # say which field, e.g. a schema the grammar converter refused
            exc.message = f"'{exc.param}': {exc.message}"
        raise
    return dataclasses.replace(params, ignored=tuple(ignored))


def _renamed(text: str) -> str:
    """A chat completions field path as the Messages API names it."""
    return (text.replace(".function.parameters", ".input_schema").replace(".function.name", ".name")
            .replace("response_format", "output_config.format").replace("reasoning_effort", "output_config.effort")
            .replace("chat_template_kwargs.enable_thinking", "thinking.type"))


def _tool_id(call_id: str) -> str:
    """Anthropic's ``toolu_`` id for one of serve's call ids (a Mistral template's 9 characters stay as they are: its template checks them)."""
    return "toolu_" + call_id[len("call_"):] if call_id.startswith("call_") else call_id


def stop_reason(job: Finished) -> tuple[str, str | None]:
    """(``stop_reason``, ``stop_sequence``) of a finished reply."""
    if job.finish_reason == "tool_calls":
        return "tool_use", None
    if job.finish_reason == "length":
        return "max_tokens", None
    if job.stop_word:
        return "stop_sequence", job.stop_word
    return "end_turn", None


def _tool_use(call: dict) -> dict:
    try:
        args = json.loads(call["function"]["arguments"])
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": _tool_id(call["id"]), "name": call["function"]["name"], "input": args if isinstance(args, dict) else {}}


class MessagesShaper(Shaper):
    """Anthropic's reply and its stream: ``message_start`` (sent with the first
    text, call or end, once the prompt is read and its usage known), each block
    as ``content_block_start``/``_delta``/``_stop`` (a call's input whole, as one
    ``input_json_delta``), then ``message_delta`` and ``message_stop``."""

    def __init__(self, chat: bool, model: str, params: GenParams) -> None:
        super().__init__(chat, model)
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self._started = False
        self._block = -1  # the index of the last block opened
        self._text_open = False
        self._thinking_open = False

    def frame(self, obj: dict | str) -> bytes:
        assert isinstance(obj, dict)  # every event is an object named by its type
        return f"event: {obj['type']}\ndata: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()

    @staticmethod
    def usage(job: Finished) -> dict:
        out = {"input_tokens": len(job.tokens) - job.n_cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": job.n_cached,
               "output_tokens": job.n_gen}
        t = job.timings()
        if "images" in t:  # the prompt held images: how many, how many the vision encoder ran on, its time (null: none ran)
            out.update(image_count=t["images"], image_encode_count=t["encode_n"], image_encode_ms=t["encode_ms"])
        return out

    def full(self, text: str, job: Finished, calls: list[dict] | None = None, *, index: int = 0, logprobs: dict | None = None) -> dict:
        text = text.strip() if calls else text
        content = ([{"type": "text", "text": text}] if text else []) + [_tool_use(c) for c in calls or ()]
        if self.reasoning.get(index):  # the thinking first, with the empty signature a local model gives (llama-server's)
            content.insert(0, {"type": "thinking", "thinking": self.reasoning[index], "signature": ""})
        reason, sequence = stop_reason(job)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": self.usage(job)}

    def _open(self, job: Finished) -> list[dict | str]:
        if self._started:
            return []
        self._started = True
        message: dict = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [], "stop_reason": None,
                   "stop_sequence": None, "usage": {**self.usage(job), "output_tokens": 0}}
        return [{"type": "message_start", "message": message}]

    def _close_text(self) -> list[dict | str]:
        out = self._close_thinking()
        if not self._text_open:
            return out
        self._text_open = False
        return [*out, {"type": "content_block_stop", "index": self._block}]

    def _close_thinking(self) -> list[dict | str]:
        """A thinking block ends with a ``signature_delta`` (Anthropic's clients expect one): empty, as llama-server's."""
        if not self._thinking_open:
            return []
        self._thinking_open = False
        return [{"type": "content_block_delta", "index": self._block, "delta": {"type": "signature_delta", "signature": ""}},
                {"type": "content_block_stop", "index": self._block}]

    def thinking(self, text: str, job: Finished, *, index: int = 0) -> list[dict | str]:
        out = self._open(job)
        if not self._thinking_open:
            self._block += 1
            self._thinking_open = True
            out.append({"type": "content_block_start", "index": self._block, "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
        out.append({"type": "content_block_delta", "index": self._block, "delta": {"type": "thinking_delta", "thinking": text}})
        return out

    def head(self, n: int = 1) -> list[dict | str]:
        return []

    def piece(self, text: str, job: Finished, *, index: int = 0, logprobs: dict | None = None) -> list[dict | str]:
        out = self._open(job) + self._close_thinking()
        if not self._text_open:
            self._block += 1
            self._text_open = True
            out.append({"type": "content_block_start", "index": self._block, "content_block": {"type": "text", "text": ""}})
        out.append({"type": "content_block_delta", "index": self._block, "delta": {"type": "text_delta", "text": text}})
        return out

    def calls(self, calls: list[dict], job: Finished, *, index: int = 0) -> list[dict | str]:
        out = self._open(job) + self._close_text()
        for c in calls:
            self._block += 1
            block = _tool_use(c)
            out += [{"type": "content_block_start", "index": self._block, "content_block": {**block, "input": {}}},
                    {"type": "content_block_delta", "index": self._block,
                     "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}},
                    {"type": "content_block_stop", "index": self._block}]
        return out

    def tail(self, job: Finished, include_usage: bool, *, index: int = 0, logprobs: dict | None = None, usage: dict | None = None) -> list[dict | str]:
        reason, sequence = stop_reason(job)
        return [*self._open(job), *self._close_text(),
                {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": self.usage(job)},
                {"type": "message_stop"}]

    def failure(self, message: str) -> list[dict | str]:
        return [error_body(500, message)]

    def progress(self, report: dict) -> list[dict | str]:
        return []  # Anthropic's stream has no such event


def routes(state, generate: Callable[..., Awaitable[Response]], read_json: Callable[[Request], Awaitable[dict]]) -> list[Route]:
    """The routes, over ``state`` (``app.ServeState``) and the app's ``generate``."""
    dialect = Dialect(parse, MessagesShaper, _error)

    async def messages(request: Request) -> Response:
        try:
            body = await read_json(request)
        except RequestError as exc:
            return JSONResponse(_error(exc), status_code=exc.status)
        return await generate(request, True, dialect, body=body)

    async def count_tokens(request: Request) -> Response:
        """The prompt's tokens under the chat template, tools rendered as ``/v1/messages`` renders them; ``max_tokens`` is not needed."""
        try:
            body = await read_json(request)
            params = parse(body, n_vocab=state.n_vocab, defaults=state.defaults, tool_format=state.tool_format, require_max=False)
            n = await prompt_count.count(state, params)
        except RequestError as exc:
            return JSONResponse(_error(exc), status_code=exc.status)
        return JSONResponse({"input_tokens": n})

    return [Route(PATHS[0], messages, methods=["POST"]), Route(PATHS[1], count_tokens, methods=["POST"])]

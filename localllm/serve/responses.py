"""OpenAI's Responses API over the same engine, stateless as llama-server's:
``POST /v1/responses`` and ``POST /v1/responses/input_tokens``, for Codex
(``wire_api = "responses"``) and the OpenAI Agents SDK.

A request is translated into the chat completions body ``protocol.parse_gen``
checks (serve/ollama.py does the same for Ollama's API): the same sampler,
grammar (``text.format`` ``json_schema`` is ``response_format``'s), tool calls
(serve/tools.py), scheduler, prompt cache and metrics, and no second way to
generate. ``ResponsesShaper`` shapes the reply and the stream (each event an SSE
``event:`` line and its ``data:``, numbered by ``sequence_number``).

Nothing is stored: ``previous_response_id``, ``store: true``, ``background``,
``conversation``, ``prompt`` and ``item_reference`` items are refused by name
(``store: false``, which clients send, is accepted). Tools other than
functions (``web_search``, ``local_shell``, ...) are skipped and named in
``X-Ignored-Fields``, as llama-server skips them: Codex offers some of them
with its functions. ``reasoning`` items a client sends back are dropped (this
server writes none). Where OpenAI's docs leave a choice, llama-server's
``server_chat_convert_responses_to_chatcmpl`` is followed.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm.serve import prompt_count
from localllm.serve.protocol import DEFAULTS, Dialect, Finished, GenParams, RequestError, Shaper, parse_gen
from localllm.serve.tools import GENERIC, Format

PATHS = ("/v1/responses", "/v1/responses/input_tokens")
MAX_ITEMS = 4096  # input items and their content parts, all together: a body of tiny items is refused before a template render
HONOURED = frozenset({"model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p", "text", "stream",
                      "parallel_tool_calls", "store", "metadata",
                      "seed", "top_k", "min_p", "repeat_penalty", "chat_template_kwargs",  # llama-server's, which it passes through
                      "return_progress", "timings_per_token", "reasoning"})
NO_EFFECT = frozenset({"metadata", "user", "safety_identifier", "prompt_cache_key", "service_tier", "store", "truncation"})
REFUSED = {"previous_response_id": "is not supported: this server stores no responses (send the whole conversation in 'input')",
           "conversation": "is not supported: this server stores no conversations (send the whole conversation in 'input')",
           "background": "is not supported: responses are made while the request waits",
           "prompt": "(a stored prompt template) is not supported: this server stores no prompts"}
PASSED = ("temperature", "top_p", "stream", "parallel_tool_calls", "seed", "top_k", "min_p", "repeat_penalty", "chat_template_kwargs",
          "return_progress", "timings_per_token")


@dataclass(frozen=True)
class ResponsesParams(GenParams):
    """``GenParams`` with what the reply echoes of the request (``instructions``, ``tools``, ``tool_choice``, ``text``...)."""

    echo: dict = field(default_factory=dict)


def _bad(field_: str, why: str) -> RequestError:
    return RequestError(400, f"'{field_}' {why}", param=field_)


def _text(content: object, where: str, kinds: tuple[str, ...]) -> str:
    """A message's content, a string or parts of ``kinds``, as one text."""
    out = _content(content, where, kinds, images=False)
    assert isinstance(out, str)  # no images asked for
    return out


def _content(content: object, where: str, kinds: tuple[str, ...], *, images: bool) -> str | list[dict]:
    """A message's content as one text; with ``images`` (a user's message), one holding
    ``input_image`` parts is OpenAI's list of text and ``image_url`` parts instead."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content", "must be a string or a list of content parts")
    parts: list[dict] = []
    for k, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "input_image" and images:
            assert isinstance(p, dict)
            if p.get("file_id") is not None:
                raise _bad(f"{where}.content[{k}].file_id", "is not supported: this server stores no files (send image_url as a data URI)")
            parts.append({"type": "image_url", "image_url": {"url": p.get("image_url")}, "_where": f"{where}.content[{k}]"})
            continue
        if kind == "input_audio" and images:  # a sound file (serve/media.py's audio parts), as chat completions takes it
            assert isinstance(p, dict)
            parts.append({"type": "input_audio", "input_audio": p.get("input_audio"), "_where": f"{where}.content[{k}]"})
            continue
        if kind in ("input_image", "input_file", "input_audio"):
            why = {"input_image": "only a user's message takes images", "input_audio": "only a user's message takes audio"}.get(kind, "not supported")
            raise _bad(f"{where}.content[{k}]", f"is {kind}: {why}")
        if kind == "refusal" and isinstance(p.get("refusal"), str):
            parts.append({"type": "text", "text": p["refusal"]})
            continue
        if kind not in kinds or not isinstance(p.get("text"), str):
            raise _bad(f"{where}.content[{k}]", f"must be a text part (type {' or '.join(kinds)}, with its text)")
        parts.append({"type": "text", "text": p["text"]})
    if any(q["type"] in ("image_url", "input_audio") for q in parts):
        return parts
    return "".join(q["text"] for q in parts)


def _input(raw: object, instructions: object) -> list[dict]:
    """``instructions`` and ``input`` as chat messages: consecutive ``function_call``
    items join the assistant turn before them, as llama-server joins them."""
    out: list[dict] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad("instructions", "must be a string")
        out.append({"role": "system", "content": instructions})
    if isinstance(raw, str):
        return [*out, {"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise _bad("input", "must be a string or a non-empty list of items")
    parts = sum(1 + (len(it["content"]) if isinstance(it, dict) and isinstance(it.get("content"), list) else 0) for it in raw)
    if parts > MAX_ITEMS:
        raise _bad("input", f"holds more than {MAX_ITEMS} items and content parts in all")
    called: set[str] = set()  # the call_ids of earlier function_call items: an output answers one of them, as Messages requires
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, "must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role in ("user", "system", "developer"):
                out.append({"role": "system" if role == "developer" else role,
                            "content": _content(item.get("content"), where, ("input_text",), images=role == "user")})
            elif role == "assistant":
                text = _text(item.get("content"), where, ("output_text", "input_text"))
                if out and out[-1]["role"] == "assistant":
                    out[-1]["content"] += text
                else:
                    out.append({"role": "assistant", "content": text})
            else:
                raise _bad(f"{where}.role", "must be one of user, system, developer, assistant")
        elif kind == "function_call":
            cid, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if not isinstance(cid, str) or not isinstance(name, str) or not isinstance(args, str):
                raise _bad(where, 'must be {"type": "function_call", "call_id": ..., "name": ..., "arguments": "JSON text"}')
            if cid in called:
                raise _bad(f"{where}.call_id", f"({cid[:64]!r}) repeats the call_id of an earlier function_call")
            called.add(cid)
            call = {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            cid, output = item.get("call_id"), item.get("output")
            if not isinstance(cid, str) or cid not in called:
                raise _bad(f"{where}.call_id", f"({str(cid)[:64]!r}) answers no function_call of an earlier item")
            out.append({"role": "tool", "tool_call_id": cid,
                        "content": output if isinstance(output, str) else _text(output, f"{where}.output", ("input_text", "output_text"))})
        elif kind == "reasoning":
            continue  # accepted and dropped: this server writes no reasoning items, and templates take none
        elif kind == "item_reference":
            raise _bad(where, "is an item_reference: not supported, this server stores no items (send the item itself)")
        else:
            raise _bad(f"{where}.type", f"{str(kind)[:40]!r} is not an item this server takes (message, function_call, function_call_output)")
    return out


def _tools(raw: object, ignored: list[str]) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise _bad("tools", "must be a list of tools")
    out = []
    for k, t in enumerate(raw):
        if not isinstance(t, dict):
            raise _bad(f"tools[{k}]", "must be an object")
        if t.get("type") != "function":
            ignored.append(f"tools[{k}].type={str(t.get('type'))[:20]}")  # skipped, as llama-server skips them, but named
            continue
        fn = {"name": t.get("name"), "parameters": t.get("parameters")}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(raw: object) -> object:
    if raw is None or raw in ("auto", "none", "required"):
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("name"), str):
        return {"type": "function", "function": {"name": raw["name"]}}
    raise _bad("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "name": ...}')


def _format(text: object) -> dict | None:
    """``text.format`` as chat completions' ``response_format``."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise _bad("text", "must be an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        if not isinstance(fmt.get("schema"), dict):
            raise _bad("text.format.schema", "must be a JSON schema object")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt["schema"]}}
    raise _bad("text.format.type", "must be one of text, json_object, json_schema")


def translate(body: dict) -> tuple[dict, list[str]]:
    """(the chat completions body, the fields ignored) for a Responses body."""
    for key, why in REFUSED.items():
        if body.get(key) not in (None, "", False):
            raise _bad(key, why)
    if body.get("store") not in (None, False):
        raise _bad("store", "must be false (or left out): this server stores no responses")
    if "input" not in body:
        raise _bad("input", "is required")
    ignored: list[str] = [k[:40] for k in body if k not in HONOURED and k not in NO_EFFECT]
    out: dict = {"model": body.get("model"), "messages": _input(body["input"], body.get("instructions"))}
    tools = _tools(body.get("tools"), ignored)
    if tools:
        out["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None and (tools or choice != "auto"):
        out["tool_choice"] = choice
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise _bad("max_output_tokens", "must be a whole number of at least 1")
        out["max_tokens"] = limit
    fmt = _format(body.get("text"))
    if fmt is not None:
        out["response_format"] = fmt
    reasoning = body.get("reasoning")
    if reasoning is not None:  # only its effort does anything, as llama-server's (server-chat.cpp); summary: none is written
        if not isinstance(reasoning, dict):
            raise _bad("reasoning", "must be an object such as {\"effort\": \"low\"}")
        if reasoning.get("effort") is not None:
            out["reasoning_effort"] = reasoning["effort"]
        ignored += [f"reasoning.{k}"[:40] for k in reasoning if k != "effort" and reasoning[k] is not None]
    for key in PASSED:
        if body.get(key) is not None:
            out[key] = body[key]
    return out, sorted(ignored)


def parse(body: dict, *, chat: bool = True, n_vocab: int, defaults=DEFAULTS, tool_format: Format = GENERIC, max_n: int = 1) -> ResponsesParams:
    """A Responses body as the chat completions one parse_gen checks (one reply: the Responses API has no ``n``)."""
    out, ignored = translate(body)
    try:
        params = parse_gen(out, chat=True, n_vocab=n_vocab, defaults=defaults, tool_format=tool_format)
    except RequestError as exc:  # parse_gen names chat completions' fields: say the Responses API's
        exc.message = exc.message.replace(".function.", ".").replace("'response_format", "'text.format").replace("'max_tokens'", "'max_output_tokens'")
        exc.message = exc.message.replace("'reasoning_effort'", "'reasoning.effort'")
        exc.param = exc.param and exc.param.replace("response_format", "text.format").replace(".function.", ".").replace("reasoning_effort", "reasoning.effort")
        if exc.param and f"'{exc.param}'" not in exc.message:  # say which field, e.g. a schema the grammar converter refused
            exc.message = f"'{exc.param}': {exc.message}"
        raise
    echo = {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "tools": [t for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") == "function"],
            "tool_choice": body.get("tool_choice") or "auto", "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "text": body.get("text") or {"format": {"type": "text"}}, "metadata": body.get("metadata") or {},
            "temperature": params.temperature, "top_p": params.top_p,
            "reasoning": {"effort": body["reasoning"].get("effort") if isinstance(body.get("reasoning"), dict) else None, "summary": None}}
    values = {f.name: getattr(params, f.name) for f in dataclasses.fields(GenParams)}
    return ResponsesParams(**{**values, "ignored": tuple(ignored)}, echo=echo)


def _usage(job: Finished) -> dict:
    return {"input_tokens": len(job.tokens), "input_tokens_details": {"cached_tokens": job.n_cached, "cache_write_tokens": 0},
            "output_tokens": job.n_gen, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": len(job.tokens) + job.n_gen}


def _reasoning_item(item_id: str, text: str, status: str) -> dict:
    """A reasoning output item with its text, as llama-server writes it (no summary, no encrypted content)."""
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}] if text else [],
            "encrypted_content": "", "status": status}


def _call_item(call: dict, status: str) -> dict:
    cid = call["id"]
    return {"type": "function_call", "id": "fc_" + cid.removeprefix("call_"), "call_id": cid, "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


class ResponsesShaper(Shaper):
    """The Responses API's reply and its stream: ``response.created`` and
    ``.in_progress``; a message item (``output_item.added``,
    ``content_part.added``, ``output_text.delta`` per piece, then ``.done``s);
    each call an item with its arguments whole (one
    ``function_call_arguments.delta``, then ``.done``); then
    ``response.completed`` (``response.incomplete`` when cut by the limit)."""

    def __init__(self, chat: bool, model: str, params: GenParams) -> None:
        super().__init__(chat, model, per_token=bool(params and params.timings_per_token))  # llama-server's: each delta carries its timings
        self.id = "resp_" + uuid.uuid4().hex
        self.echo = params.echo if isinstance(params, ResponsesParams) else {}
        self.seq = 0
        self.items: list[dict] = []  # output items done
        self.message: dict | None = None  # the message item being streamed
        self.text: list[str] = []
        self.thought: dict | None = None  # the reasoning item being streamed
        self.thought_text: list[str] = []

    def frame(self, obj: dict | str) -> bytes:
        assert isinstance(obj, dict)  # every event is an object named by its type
        obj["sequence_number"] = self.seq
        self.seq += 1
        return f"event: {obj['type']}\ndata: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()

    def _response(self, status: str, output: list[dict], job: Finished | None) -> dict:
        done = job is not None and status != "in_progress"
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": int(time.time()) if done else None, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": self.echo.get("instructions"), "max_output_tokens": self.echo.get("max_output_tokens"), "model": self.model,
                "output": output, "parallel_tool_calls": self.echo.get("parallel_tool_calls", True), "previous_response_id": None,
                "reasoning": self.echo.get("reasoning", {"effort": None, "summary": None}), "store": False, "temperature": self.echo.get("temperature"),
                "text": self.echo.get("text", {"format": {"type": "text"}}), "tool_choice": self.echo.get("tool_choice", "auto"),
                "tools": self.echo.get("tools", []), "top_p": self.echo.get("top_p"), "truncation": "disabled",
                "usage": _usage(job) if done and job is not None else None, "metadata": self.echo.get("metadata", {})}

    @staticmethod
    def _status(job: Finished) -> str:
        return "incomplete" if job.finish_reason == "length" else "completed"

    def full(self, text: str, job: Finished, calls: list[dict] | None = None, *, index: int = 0, logprobs: dict | None = None) -> dict:
        text = text.strip() if calls else text
        output = [self._message_item(text, "completed")] if text or not calls else []
        output += [_call_item(c, "completed") for c in calls or ()]
        if self.reasoning.get(index):
            output.insert(0, _reasoning_item("rs_" + uuid.uuid4().hex, self.reasoning[index], "completed"))
        return self._response(self._status(job), output, job)

    def thinking(self, text: str, job: Finished, *, index: int = 0) -> list[dict | str]:
        """A reasoning item, as llama-server streams it: ``output_item.added``, then ``response.reasoning_text.delta``s."""
        out: list[dict | str] = []
        if self.thought is None:
            self.thought = _reasoning_item("rs_" + uuid.uuid4().hex, "", "in_progress")
            out.append({"type": "response.output_item.added", "output_index": len(self.items), "item": self.thought})
        self.thought_text.append(text)
        out.append({"type": "response.reasoning_text.delta", "item_id": self.thought["id"], "output_index": len(self.items),
                    "content_index": 0, "delta": text})
        return out

    def _close_thought(self) -> list[dict | str]:
        if self.thought is None:
            return []
        text, at = "".join(self.thought_text), len(self.items)
        item = _reasoning_item(self.thought["id"], text, "completed")
        self.thought, self.thought_text = None, []
        self.items.append(item)
        return [{"type": "response.reasoning_text.done", "item_id": item["id"], "output_index": at, "content_index": 0, "text": text},
                {"type": "response.output_item.done", "output_index": at, "item": item}]

    def _message_item(self, text: str, status: str) -> dict:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
        return {"type": "message", "id": self.message["id"] if self.message else "msg_" + uuid.uuid4().hex, "status": status,
                "role": "assistant", "content": content}

    def head(self, n: int = 1) -> list[dict | str]:
        return [{"type": t, "response": self._response("in_progress", [], None)} for t in ("response.created", "response.in_progress")]

    def piece(self, text: str, job: Finished, *, index: int = 0, logprobs: dict | None = None) -> list[dict | str]:
        out: list[dict | str] = self._close_thought()
        if self.message is None:
            self.message = self._message_item("", "in_progress")
            out += [{"type": "response.output_item.added", "output_index": len(self.items), "item": self.message},
                    {"type": "response.content_part.added", "item_id": self.message["id"], "output_index": len(self.items), "content_index": 0,
                     "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}]
        self.text.append(text)
        out.append({"type": "response.output_text.delta", "item_id": self.message["id"], "output_index": len(self.items), "content_index": 0,
                    "delta": text, "logprobs": [], **({"timings": job.timings()} if self.per_token else {})})
        return out

    def _close_message(self) -> list[dict | str]:
        if self.message is None:
            return []
        text, at, item_id = "".join(self.text), len(self.items), self.message["id"]
        item = self._message_item(text, "completed")
        self.message = None
        self.items.append(item)
        return [{"type": "response.output_text.done", "item_id": item_id, "output_index": at, "content_index": 0, "text": text, "logprobs": []},
                {"type": "response.content_part.done", "item_id": item_id, "output_index": at, "content_index": 0, "part": item["content"][0]},
                {"type": "response.output_item.done", "output_index": at, "item": item}]

    def calls(self, calls: list[dict], job: Finished, *, index: int = 0) -> list[dict | str]:
        out = self._close_thought() + self._close_message()
        for c in calls:
            item, at = _call_item(c, "completed"), len(self.items)
            out += [{"type": "response.output_item.added", "output_index": at, "item": {**item, "arguments": "", "status": "in_progress"}},
                    {"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": at, "delta": item["arguments"]},
                    {"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": at, "arguments": item["arguments"]},
                    {"type": "response.output_item.done", "output_index": at, "item": item}]
            self.items.append(item)
        return out

    def tail(self, job: Finished, include_usage: bool, *, index: int = 0, logprobs: dict | None = None, usage: dict | None = None) -> list[dict | str]:
        out = self._close_thought() + self._close_message()
        status = self._status(job)
        # with llama-server's timings on the last event, as on chat completions' last chunk
        return [*out, {"type": f"response.{status}", "response": self._response(status, self.items, job), "timings": job.timings()}]

    def failure(self, message: str) -> list[dict | str]:
        return [{"type": "error", "code": "server_error", "message": message, "param": None}]

    def progress(self, report: dict) -> list[dict | str]:
        """llama-server's: ``response.in_progress`` carrying ``prompt_progress``."""
        return [{"type": "response.in_progress", "response": self._response("in_progress", self.items, None), "prompt_progress": report}]


def routes(state, generate: Callable[..., Awaitable[Response]], read_json: Callable[[Request], Awaitable[dict]]) -> list[Route]:
    """The routes, over ``state`` (``app.ServeState``) and the app's ``generate``."""
    dialect = Dialect(parse, ResponsesShaper)

    async def create(request: Request) -> Response:
        try:
            body = await read_json(request)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        return await generate(request, True, dialect, body=body)

    async def input_tokens(request: Request) -> Response:
        """The prompt's tokens under the chat template, as ``/v1/responses`` would read it (llama-server's shape)."""
        try:
            body = await read_json(request)
            params = parse(body, n_vocab=state.n_vocab, defaults=state.defaults, tool_format=state.tool_format)
            n = await prompt_count.count(state, params)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": n})

    # with llama-server's unprefixed aliases
    return [Route(PATHS[0], create, methods=["POST"]), Route(PATHS[1], input_tokens, methods=["POST"]),
            Route(PATHS[0].removeprefix("/v1"), create, methods=["POST"]), Route(PATHS[1].removeprefix("/v1"), input_tokens, methods=["POST"])]

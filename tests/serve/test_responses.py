"""OpenAI's Responses API on ``localllm serve`` (issue 47, item 2), driven by the
official ``openai`` client's ``responses`` on SmolLM2: plain and streamed text,
a function call forced by ``tool_choice`` (the grammar makes it well-formed),
its output sent back, then the final text; ``text.format`` held by the
grammar; ``input_tokens`` against the prompt the reply read; shapes and greedy
text key for key with llama-server's recorded answers
(``llama_server_agent_answers.json``); what is refused by name (nothing is
stored) as OpenAI's 4xx, with the server still up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.server import KEY, serving

LLAMA = json.loads((Path(__file__).parent / "llama_server_agent_answers.json").read_text())
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}},
                          "required": ["city", "unit"]}}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    yield from serving(tmp_path_factory, "--parallel", "1", "--ctx", "1024")


def _client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0, timeout=120)


def _http(server):
    import httpx2

    return httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


@pytest.mark.slow
def test_text_plain_and_streamed_match_llama_server(server) -> None:
    client = _client(server)
    r = client.responses.create(model="smollm2", input="Hi", max_output_tokens=4, temperature=0, store=False)
    ref = LLAMA["responses"]
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "smollm2"
    assert r.output[0].type == "message" and r.output[0].id.startswith("msg_") and r.output[0].content[0].type == "output_text"
    assert r.output_text == ref["output"][0]["content"][0]["text"]  # greedy on the same model: llama-server's text
    # cut by the limit: incomplete, as OpenAI says it (llama-server says completed)
    assert r.status == "incomplete" and r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"
    raw = r.model_dump()
    assert set(ref) <= set(raw) and set(ref["usage"]) <= set(raw["usage"]) and set(ref["output"][0]) <= set(raw["output"][0])
    assert r.usage is not None and r.usage.input_tokens == LLAMA["responses_input_tokens"]["input_tokens"] and r.usage.output_tokens == 4
    assert r.usage.total_tokens == r.usage.input_tokens + 4 and r.usage.output_tokens_details.reasoning_tokens == 0
    events = list(client.responses.create(model="smollm2", input="Hi", max_output_tokens=4, temperature=0, stream=True))
    kinds = [e.type for e in events]
    theirs = LLAMA["responses_stream_events"]
    assert kinds[:-1] == theirs[:-1] and kinds[-1] == "response.incomplete" and theirs[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert text == r.output_text and last.type == "response.incomplete" and last.response.output_text == text
    msg_id = events[2].item.id
    assert all(e.item_id == msg_id for e in events if hasattr(e, "item_id"))
    for ours, want in zip(events, LLAMA["responses_stream"]):
        assert set(want) <= set(ours.model_dump()), (ours.type, set(want) - set(ours.model_dump()))
    # the event names on their own event: lines; a reply that ends by itself is completed
    with _http(server) as c:
        r2 = c.post("/v1/responses", json={"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
                                           "instructions": "Reply with one word.", "max_output_tokens": 40, "temperature": 0, "stream": True})
    blocks = [b.splitlines() for b in r2.text.strip().split("\n\n")]
    assert all(b[0] == f"event: {json.loads(b[1][6:])['type']}" for b in blocks)
    assert json.loads(blocks[-1][1][6:])["type"] == "response.completed"


@pytest.mark.slow
def test_function_call_out_output_in_then_text(server) -> None:
    client = _client(server)
    r = client.responses.create(model="smollm2", input=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_output_tokens=100)
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
    call = r.output[0]
    assert call.id.startswith("fc_") and call.call_id.startswith("call_") and call.name == "get_weather"
    args = json.loads(call.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("C", "F")
    events = list(client.responses.create(model="smollm2", input=ASK, tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
                                          temperature=0, max_output_tokens=100, stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert events[4].arguments == call.arguments and events[-1].response.output[0].arguments == call.arguments
    # the call and its output go back (stateless: the whole conversation), and the model answers in text
    history = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
    done = client.responses.create(model="smollm2", input=history, tools=[WEATHER], tool_choice="none", temperature=0, max_output_tokens=12)
    assert [o.type for o in done.output] == ["message"] and done.output_text
    counted = client.responses.input_tokens.count(model="smollm2", input=history, tools=[WEATHER], tool_choice="none")
    assert counted.object == "response.input_tokens" and done.usage is not None and counted.input_tokens == done.usage.input_tokens
    with_tools = client.responses.input_tokens.count(model="smollm2", input=ASK, tools=[WEATHER]).input_tokens
    assert with_tools > client.responses.input_tokens.count(model="smollm2", input=ASK).input_tokens
    assert client.responses.input_tokens.count(model="smollm2", input="Hi").model_dump() == LLAMA["responses_input_tokens"]


@pytest.mark.slow
def test_text_format_json_schema_is_held_by_the_grammar(server) -> None:
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"], "additionalProperties": False}
    r = _client(server).responses.create(model="smollm2", input="Give a person.", temperature=0, max_output_tokens=30,
                                         text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    assert r.status == "completed" and isinstance(json.loads(r.output_text)["age"], int)


@pytest.mark.slow
def test_refused_and_bad_input_are_4xx_and_the_server_stays_up(server) -> None:
    import openai

    client = _client(server)
    cases = [
        ({"previous_response_id": LLAMA["responses"]["id"]}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"$ref": "https://example.com/x"}}}}, "text.format"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "offline"),  # a remote URL
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,aGk="}]}]}, "--mmproj"),  # text only
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ]
    for extra, param in cases:
        body = {"model": "smollm2", "input": "Hi", "max_output_tokens": 2, **extra}
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(**body)
        err = info.value.body
        assert isinstance(err, dict) and err["type"] == "invalid_request_error" and param in err["message"], err
    with _http(server) as c:
        r = c.post("/v1/responses", json={"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}]}] * 10_000})
        assert r.status_code == 400 and "4096" in r.json()["error"]["message"]
        # tools that are not functions are skipped, and named
        r = c.post("/v1/responses", json={"model": "m", "input": "Hi", "max_output_tokens": 2, "tools": [{"type": "web_search"}],
                                          "reasoning": {"summary": "auto"}})  # its effort is the template's reasoning_effort; no summary is written
        assert r.status_code == 200 and r.headers["x-ignored-fields"] == "reasoning.summary, tools[0].type=web_search"
        r = c.post("/v1/responses/input_tokens", json={"model": "m", "input": 5})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    assert "Traceback" not in server.log


class _Job:
    """What a shaper reads of a finished request (``protocol.Finished``)."""

    def __init__(self, finish_reason: str = "stop") -> None:
        self.finish_reason, self.stop_word = finish_reason, None
        self.tokens, self.n_cached, self.n_gen = [1] * 10, 4, 3

    def timings(self) -> dict:
        return {"predicted_n": self.n_gen}


@pytest.mark.slow  # importing the openai client's types takes about a second
def test_stream_shapes_text_then_a_call_and_a_failure() -> None:
    """The exact events of a reply with text and then a call (the message item done
    before the call's item is added, output indexes in order), and of a failure."""
    from openai.types import responses as types

    from localllm.serve.responses import ResponsesShaper

    s = ResponsesShaper(True, "m", None)  # type: ignore[arg-type]
    job = _Job("tool_calls")
    call = {"id": "call_ab", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    raw = b"".join(s.frame(o) for o in [*s.head(), *s.piece("Hi", job), *s.calls([call], job), *s.tail(job, False)]).decode()
    events = [json.loads(b.splitlines()[1][6:]) for b in raw.strip().split("\n\n")]
    kinds = {"response.created": types.ResponseCreatedEvent, "response.in_progress": types.ResponseInProgressEvent,
             "response.output_item.added": types.ResponseOutputItemAddedEvent, "response.content_part.added": types.ResponseContentPartAddedEvent,
             "response.output_text.delta": types.ResponseTextDeltaEvent, "response.output_text.done": types.ResponseTextDoneEvent,
             "response.content_part.done": types.ResponseContentPartDoneEvent, "response.output_item.done": types.ResponseOutputItemDoneEvent,
             "response.function_call_arguments.delta": types.ResponseFunctionCallArgumentsDeltaEvent,
             "response.function_call_arguments.done": types.ResponseFunctionCallArgumentsDoneEvent,
             "response.completed": types.ResponseCompletedEvent, "error": types.ResponseErrorEvent}
    for e in events:  # every field the openai client's own type of each event requires (validating them all builds pydantic's schemas: seconds)
        assert _required(kinds[e["type"]]) <= set(e), e["type"]
    assert _required(types.Response) <= set(events[-1]["response"]) and _required(types.ResponseFunctionToolCall) <= set(events[-2]["item"])
    assert _required(types.ResponseOutputMessage) <= set(events[7]["item"]) and _required(types.ResponseUsage) <= set(events[-1]["response"]["usage"])
    assert [(e["type"], e.get("output_index")) for e in events] == [
        ("response.created", None), ("response.in_progress", None), ("response.output_item.added", 0), ("response.content_part.added", 0),
        ("response.output_text.delta", 0), ("response.output_text.done", 0), ("response.content_part.done", 0), ("response.output_item.done", 0),
        ("response.output_item.added", 1), ("response.function_call_arguments.delta", 1), ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1), ("response.completed", None)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = events[-1]["response"]
    assert [o["type"] for o in done["output"]] == ["message", "function_call"] and done["output"][0]["content"][0]["text"] == "Hi"
    assert done["output"][1]["id"] == "fc_ab" and done["output"][1]["call_id"] == "call_ab" and done["usage"]["input_tokens_details"]["cached_tokens"] == 4
    assert events[2]["item"]["status"] == "in_progress" and events[8]["item"]["arguments"] == ""
    s = ResponsesShaper(True, "m", None)  # type: ignore[arg-type]
    (failed,) = s.failure("the engine failed: boom")
    assert isinstance(failed, dict) and _required(kinds["error"]) <= {*failed, "sequence_number"} and failed["message"] == "the engine failed: boom"


def _required(model) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items() if f.is_required()}

"""Anthropic's Messages API on ``localllm serve`` (issue 47, item 1), driven by
the official ``anthropic`` client on SmolLM2: plain and streamed text, a tool
call forced by ``tool_choice`` (the grammar makes it well-formed), its result
sent back, then the final text; ``count_tokens`` against the prompt the reply
read; shapes and greedy text key for key with llama-server's recorded answers
(``llama_server_agent_answers.json``); bad input as Anthropic's 4xx errors,
with the server still up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.server import KEY, serving

LLAMA = json.loads((Path(__file__).parent / "llama_server_agent_answers.json").read_text())
GREEDY = {"temperature": 0}  # the SDK has no temperature argument any more; the API still takes it
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}},
                            "required": ["city", "unit"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    yield from serving(tmp_path_factory, "--parallel", "1", "--ctx", "1024")


def _client(server):
    import anthropic

    return anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0, timeout=120)  # the key as x-api-key


def _http(server):
    import httpx2

    return httpx2.Client(base_url=server.base, headers={"x-api-key": KEY}, timeout=120)


def _events(raw: str) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event."""
    out = []
    for block in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


@pytest.mark.slow
def test_text_plain_and_streamed_match_llama_server(server) -> None:
    client = _client(server)
    m = client.messages.create(model="smollm2", max_tokens=4, messages=HI, extra_body=GREEDY)
    ref = LLAMA["anthropic"]
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == "smollm2"
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None and m.usage.output_tokens == 4
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == ref["content"][0]["text"]  # greedy, the same model: its text
    raw = m.model_dump()
    assert set(ref) <= set(raw) and set(ref["usage"]) <= set(raw["usage"])
    # llama-server's count: the prompt not read from the cache, and what was
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == LLAMA["anthropic_count_tokens"]["input_tokens"]
    with client.messages.stream(model="smollm2", max_tokens=4, messages=HI, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text and final.stop_reason == "max_tokens" and final.usage.output_tokens == 4
    # the events as llama-server sends them, each named on its own event: line
    with _http(server) as c:
        r = c.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": HI, "stream": True, **GREEDY})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert [name for name, _ in events] == LLAMA["anthropic_stream_events"] and all(name == d["type"] for name, d in events)
    for (_, ours), theirs in zip(events, LLAMA["anthropic_stream"]):
        assert set(theirs) <= set(ours)
    # a stop sequence ends the reply and is named; the system prompt is read
    m = client.messages.create(model="smollm2", max_tokens=8, messages=HI, stop_sequences=["!"], extra_body=GREEDY, system="Be brief.",
                               metadata={"user_id": "u1"})
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "!" and "!" not in m.content[0].text


@pytest.mark.slow
def test_tool_use_out_result_in_then_text(server) -> None:
    client = _client(server)
    m = client.messages.create(model="smollm2", max_tokens=100, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"}, extra_body=GREEDY)
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    call = m.content[0]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    assert set(call.input) == {"city", "unit"} and call.input["unit"] in ("C", "F")
    # streamed: the call as a tool_use block whose input comes as input_json_delta
    with client.messages.stream(model="smollm2", max_tokens=100, messages=ASK, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use" and final.content[0].input == call.input
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"] and "input_json" in kinds
    # the result goes back, and the model answers in text
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "sunny, 21 C"}]}]}]
    done = client.messages.create(model="smollm2", max_tokens=12, messages=history, tools=[WEATHER], tool_choice={"type": "none"}, extra_body=GREEDY)
    assert done.stop_reason in ("end_turn", "max_tokens") and [b.type for b in done.content] == ["text"] and done.content[0].text
    # count_tokens: the prompt that reply read, tools rendered as they were
    counted = client.messages.count_tokens(model="smollm2", messages=history, tools=[WEATHER], tool_choice={"type": "none"})
    assert counted.input_tokens == done.usage.input_tokens + done.usage.cache_read_input_tokens
    with_tools = client.messages.count_tokens(model="smollm2", messages=ASK, tools=[WEATHER]).input_tokens
    assert with_tools > client.messages.count_tokens(model="smollm2", messages=ASK).input_tokens
    assert client.messages.count_tokens(model="smollm2", messages=HI).input_tokens == LLAMA["anthropic_count_tokens"]["input_tokens"]


@pytest.mark.slow
def test_output_config_format_is_held_by_the_grammar(server) -> None:
    """Structured outputs (``output_config.format``) as chat completions' ``response_format``: the grammar holds the reply to the schema."""
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"], "additionalProperties": False}
    m = _client(server).messages.create(model="smollm2", max_tokens=30, messages=[{"role": "user", "content": "Give a person."}],
                                        output_config={"format": {"type": "json_schema", "schema": schema}}, extra_body=GREEDY)
    assert m.stop_reason == "end_turn" and isinstance(json.loads(m.content[0].text)["age"], int)


@pytest.mark.slow
def test_bad_input_is_anthropics_4xx_and_the_server_stays_up(server) -> None:
    import anthropic

    client = _client(server)
    called = [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]}]
    cases = [
        ({"messages": [*called, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "x"}]}],
          "tools": [WEATHER]}, "tool_use_id"),  # answers a call never made
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 10_000}]}, "content blocks"),
        ({"messages": ASK, "tools": [{**WEATHER, "input_schema": {"$ref": "https://example.com/x"}}]}, "tools[0].input_schema"),
        ({"messages": ASK, "output_config": {"format": {"type": "json_schema", "schema": {"$ref": "https://example.com/x"}}}}, "output_config.format"),
        ({"messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}, "offline"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}]}]},
         "--mmproj"),  # a text-only server
        ({"messages": [{"role": "system", "content": "x"}]}, "must hold a user or assistant message"),
        ({"messages": ASK, "tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
    ]
    for extra, words in cases:
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model="smollm2", max_tokens=4, **extra)
        assert info.value.status_code == 400 and words in info.value.message, info.value.message
        body = info.value.body
        assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    with _http(server) as c:
        r = c.post("/v1/messages", json={"model": "m", "messages": HI})  # max_tokens is required, as Anthropic requires it
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"] and r.json()["type"] == "error"
        r = c.post("/v1/messages", content=b"{", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = c.post("/v1/messages/count_tokens", json={"model": "m", "messages": "x"})
        assert r.status_code == 400 and r.json()["type"] == "error"
    with pytest.raises(anthropic.AuthenticationError) as auth:  # the key is checked, and the answer has Anthropic's shape
        anthropic.Anthropic(base_url=server.base, api_key="wrong", max_retries=0).messages.create(model="m", max_tokens=2, messages=HI)
    assert isinstance(auth.value.body, dict) and auth.value.body["error"]["type"] == "authentication_error"
    # a thinking block sent back is accepted and dropped (this server writes none); the server is up
    back = [*HI, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""}, {"type": "text", "text": "Hello"}]},
            {"role": "user", "content": "Bye"}]
    m = client.messages.create(model="smollm2", max_tokens=2, messages=back, extra_body=GREEDY)
    assert m.usage.output_tokens == 2
    assert "Traceback" not in server.log


class _Job:
    """What a shaper reads of a finished request (``protocol.Finished``)."""

    def __init__(self, finish_reason: str = "stop", stop_word: str | None = None) -> None:
        self.finish_reason, self.stop_word = finish_reason, stop_word
        self.tokens, self.n_cached, self.n_gen = [1] * 10, 4, 3

    def timings(self) -> dict:
        return {"predicted_n": self.n_gen}


def _frames(shaper, objs) -> list[tuple[str, dict]]:
    return _events(b"".join(shaper.frame(o) for o in objs).decode())


def test_stream_shapes_text_then_calls_and_a_failure() -> None:
    """The exact events of a reply with text and then two calls (the text block closed
    before the first tool_use block opens, each block its own index), and of a failure."""
    from localllm.serve.anthropic import MessagesShaper

    s = MessagesShaper(True, "m", None)  # type: ignore[arg-type]
    job = _Job("tool_calls")
    calls = [{"id": "call_ab", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
             {"id": "Xy12345Zz", "type": "function", "function": {"name": "g", "arguments": "{}"}}]
    out = _frames(s, [*s.head(), *s.piece("Hi", job), *s.piece("!", job), *s.calls(calls, job), *s.tail(job, False)])
    assert [(n, d.get("index")) for n, d in out] == [
        ("message_start", None), ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2), ("message_delta", None), ("message_stop", None)]
    assert out[0][1]["message"]["usage"] == {"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4, "output_tokens": 0}
    assert out[5][1]["content_block"] == {"type": "tool_use", "id": "toolu_ab", "name": "f", "input": {}}
    assert out[6][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"x": 1}'}
    assert out[8][1]["content_block"]["id"] == "Xy12345Zz"  # a Mistral template's id stays as its template checks it
    assert out[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None} and out[-2][1]["usage"]["output_tokens"] == 3
    # the whole reply, and a stop sequence
    full = MessagesShaper(True, "m", None).full(" ", _Job("stop", "##"))  # type: ignore[arg-type]
    assert full["stop_reason"] == "stop_sequence" and full["stop_sequence"] == "##" and full["content"] == [{"type": "text", "text": " "}]
    # a failure mid-stream is Anthropic's error event
    s = MessagesShaper(True, "m", None)  # type: ignore[arg-type]
    (name, data), = _frames(s, s.failure("the engine failed: boom"))
    assert name == "error" and data == {"type": "error", "error": {"type": "api_error", "message": "the engine failed: boom"}}

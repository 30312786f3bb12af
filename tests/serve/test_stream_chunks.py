"""A streamed token's chunk (protocol.Shaper.piece) is written from a template
made once per reply: it must be, byte for byte, what serializing the chunk's
object gives, for completions and chat, at any choice index, for any text."""

from __future__ import annotations

import json

import pytest

from localllm.serve.protocol import Shaper, sse

TEXTS = ["hi", "", ' "quoted" \\ back\nslash\ttab', "é中文🙂", "\x00\x1f\u2028", "}]}", "<|im_end|>"]


class _Job:
    def timings(self) -> dict:
        return {"predicted_n": 1}


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("model", ["SmolLM2", 'a "model" \\ named\n"choices":[{"index":0,'])
def test_a_tokens_chunk_is_the_serialized_object(chat: bool, model: str) -> None:
    shaper = Shaper(chat, model)
    for index in (0, 3):
        for text in TEXTS:
            (fast,) = shaper.piece(text, _Job(), index=index)
            want = sse(shaper.chunk(text, index=index))
            assert sse(fast) == want
            obj = json.loads(sse(fast)[len(b"data: "):])
            assert (obj["choices"][0]["delta"]["content"] if chat else obj["choices"][0]["text"]) == text
            assert obj["choices"][0]["index"] == index and obj["model"] == model


def test_logprobs_and_timings_per_token_keep_the_full_object() -> None:
    shaper = Shaper(False, "m", per_token=True)
    (out,) = shaper.piece("x", _Job())
    assert isinstance(out, dict) and out["timings"] == {"predicted_n": 1}
    (out,) = Shaper(True, "m").piece("x", _Job(), logprobs={"content": []})
    assert isinstance(out, dict) and out["choices"][0]["logprobs"] == {"content": []}

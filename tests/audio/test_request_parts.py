"""OpenAI's input_audio parts read from a request (serve/protocol.py, serve/media.py, serve/responses.py), pure Python."""

from __future__ import annotations

import pytest

from localllm.serve import responses
from localllm.serve.protocol import RequestError, parse_gen


def _chat(part: dict, role: str = "user"):
    return parse_gen({"messages": [{"role": role, "content": [{"type": "text", "text": "hi"}, part]}]}, chat=True, n_vocab=100)


def _audio(**fields: object) -> dict:
    return {"type": "input_audio", "input_audio": fields}


def test_an_input_audio_part_is_marked_where_it_was() -> None:
    p = _chat(_audio(data="UklGRg==", format="wav"))
    (part,) = p.images
    assert part.audio == "wav" and part.data == "UklGRg==" and part.where == "messages[0].content[1]"
    assert p.messages is not None and p.messages[0]["content"] == "hi" + part.mark
    assert _chat(_audio(data="data:audio/mpeg;base64,SUQz")).images[0].data == "SUQz"  # a data URI, no format: the bytes decide
    assert _chat(_audio(data="SUQz")).images[0].audio == "auto"


@pytest.mark.parametrize("part,role,words", [
    (_audio(data="UklGRg==", format="ogg"), "user", "format 'ogg': this server reads wav, mp3, flac"),
    (_audio(data="https://example.com/a.wav"), "user", "remote URL"),
    (_audio(format="wav"), "user", "as base64 in 'input_audio.data'"),
    ({"type": "input_audio", "input_audio": "x"}, "user", "must hold 'input_audio'"),
    (_audio(data="UklGRg==", format="wav"), "assistant", "only a user's message takes audio"),
])
def test_bad_parts_are_a_400_naming_them(part: dict, role: str, words: str) -> None:
    with pytest.raises(RequestError) as exc:
        _chat(part, role)
    assert exc.value.status == 400 and words in exc.value.message and "messages[0].content[1]" in exc.value.message


def test_the_responses_api_takes_input_audio_in_a_users_message() -> None:
    body = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                                   {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]}
    p = responses.parse(body, n_vocab=100)
    assert p.images[0].audio == "wav" and p.images[0].where == "input[0].content[1]"
    with pytest.raises(RequestError, match="only a user's message takes audio"):
        responses.parse({"input": [{"role": "system", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]}]}, n_vocab=100)

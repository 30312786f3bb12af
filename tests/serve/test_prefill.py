"""A last assistant message is continued, not closed (llama-server's default
--prefill-assistant, Anthropic's prefill, vLLM's ``continue_final_message``), as
its tools/server/tests/unit/test_chat_completion.py states it; both
``add_generation_prompt`` and ``continue_final_message`` true is a 400."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.server import KEY, http_client, serving

pytestmark = pytest.mark.slow
LLAMA31 = Path(__file__).parent / "templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja"
ASK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
TURN = "<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    yield from serving(tmp_path_factory, "--chat-template-file", str(LLAMA31), "--ctx", "1024")


def test_the_last_assistant_message_is_continued(server) -> None:
    with http_client(server) as http:
        def prompt(body: dict) -> str:
            r = http.post("/apply-template", json=body)
            assert r.status_code == 200, r.text
            return r.json()["prompt"]

        assert prompt({"messages": ASK}).endswith(TURN)
        assert prompt({"messages": [*ASK, {"role": "assistant", "content": "Whill"}]}).endswith(TURN + "Whill")
        explicit = {"messages": [*ASK, {"role": "assistant", "content": "Whill"}], "add_generation_prompt": False, "continue_final_message": True}
        assert prompt(explicit).endswith(TURN + "Whill")
        closed = prompt({"messages": [*ASK, {"role": "assistant", "content": "Whill"}], "continue_final_message": False})
        assert closed.endswith("Whill<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")  # asked not to: a turn of its own
        for bad in ({"add_generation_prompt": True, "continue_final_message": True},
                    {"messages": [*ASK, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]},
                    {"messages": ASK, "add_generation_prompt": False, "continue_final_message": True}):
            r = http.post("/v1/chat/completions", json={"messages": [*ASK, {"role": "assistant", "content": "Hi"}], "max_tokens": 1, **bad})
            assert r.status_code == 400, (bad, r.text)


def test_a_prefilled_reply_reads_the_prefill_as_its_start(server) -> None:
    """The prompt holds the prefill and no end of turn: one token more than the
    bare turn's tokens plus the prefill's, never the template's closing tokens."""
    with http_client(server) as http:
        bare = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
        prefill = http.post("/tokenize", json={"content": "Whill"}).json()["tokens"]
        r = http.post("/v1/messages", headers={"x-api-key": KEY}, json={
            "model": "m", "max_tokens": 4, "system": "Book",
            "messages": [{"role": "user", "content": "What is the best book"}, {"role": "assistant", "content": "Whill"}]})
        assert r.status_code == 200, r.text
        read = r.json()["usage"]["input_tokens"] + r.json()["usage"].get("cache_read_input_tokens", 0)
    assert read == bare + len(prefill)


def test_verbose_replies_carry_the_prompt_the_model_read(server) -> None:
    """llama-server's ``verbose``: the reply's ``__verbose`` is its /completion
    fields with the prompt as templated (its test_chat_completion.py reads the
    prefill there); asked not to, or not asked (serve without --verbose), none."""
    with http_client(server) as http:
        body = {"messages": [*ASK, {"role": "assistant", "content": "Whill"}], "max_tokens": 2}
        r = http.post("/v1/chat/completions", json={**body, "verbose": True})
        assert r.status_code == 200, r.text
        verbose = r.json()["__verbose"]
        assert verbose["prompt"].endswith(TURN + "Whill") and verbose["tokens_evaluated"] == r.json()["usage"]["prompt_tokens"]
        assert verbose["content"] == r.json()["choices"][0]["message"]["content"] and "generation_settings" in verbose
        for quiet in ({**body, "verbose": False}, body):
            assert "__verbose" not in http.post("/v1/chat/completions", json=quiet).json()
        assert http.post("/v1/chat/completions", json={**body, "verbose": "yes"}).status_code == 400


def test_a_continued_message_in_parts_reads_them_a_blank_line_apart(server) -> None:
    """llama.cpp renders the message it continues with its text parts joined by a blank line (common/chat.cpp)."""
    with http_client(server) as http:
        parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
        r = http.post("/v1/chat/completions", json={"messages": [*ASK, {"role": "assistant", "content": parts}], "max_tokens": 1,
                                                    "verbose": True})
        assert r.status_code == 200, r.text
        assert r.json()["__verbose"]["prompt"].endswith(TURN + "Wh\n\nill")

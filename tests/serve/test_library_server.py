"""``localllm.serve.Server`` from a program: a model loaded with the runtime,
served in-process on a free port, answered by the official ``openai`` and
``anthropic`` clients, then stopped with the model still the caller's."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import anthropic
import openai
import pytest

from localllm import runtime
from localllm.errors import UsageError
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.serve import ServeOptions, Server

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)

pytestmark = pytest.mark.slow


def _request(model: Path, **kw: object) -> runtime.LoadRequest:
    return runtime.LoadRequest(model=model, options=fitting.LoadOptions(n_ctx=2 * 512, threads=1, n_gpu_layers=0), hardware=ROOMY,
                               serving=True, parallel=2, **kw)  # type: ignore[arg-type]


def test_a_loaded_model_is_served_in_process_and_stays_the_callers(smollm2: Path) -> None:
    lines: list[str] = []
    with runtime.open_model(_request(smollm2)) as loaded:
        with Server(loaded, ServeOptions(port=0, name="mine", api_key="k1"), say=lines.append).start() as server:
            assert server.url.startswith("http://127.0.0.1:") and server.port != 0
            client = openai.OpenAI(base_url=server.url, api_key="k1")
            reply = client.chat.completions.create(model="mine", messages=[{"role": "user", "content": "Say hi"}],
                                                   max_tokens=4, temperature=0)
            assert reply.choices[0].message.content and reply.usage is not None and reply.usage.completion_tokens >= 1
            assert [m.id for m in client.models.list().data] == ["mine"]
            with urllib.request.urlopen(urllib.request.Request(f"{server.url}/models", headers={"Authorization": "Bearer k1"})) as r:
                listing = json.load(r)
            assert listing["data"][0]["meta"]["n_ctx"] == 512 and listing["models"][0]["capabilities"] == ["completion"]
            msg = anthropic.Anthropic(base_url=server.url.removesuffix("/v1"), api_key="k1").messages.create(
                model="mine", max_tokens=4, messages=[{"role": "user", "content": "Say hi"}])
            assert msg.usage.output_tokens >= 1
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=server.url, api_key="wrong").models.list()
        assert server.requests >= 4
        # stopped: the port is closed, the model is still loaded and the caller's
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=2)
        assert loaded.engine.tok.tokenize("Paris", add_special=False)
    assert any(line.startswith("serving mine on http://127.0.0.1:") and "2 parallel, 512 tokens per request" in line for line in lines), lines


def test_a_planned_model_loads_while_the_socket_answers_and_is_freed_after(smollm2: Path) -> None:
    planned = runtime.plan(_request(smollm2))
    lines: list[str] = []
    server = Server(planned, ServeOptions(port=0), say=lines.append)
    with server.start():
        assert lines[0].startswith("listening on") and "loading smollm2" in lines[0].lower()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as r:
            assert r.status == 200
        reply = openai.OpenAI(base_url=server.url, api_key="none").completions.create(model=server.name, prompt="The capital of France is",
                                                                                      max_tokens=3, temperature=0)
        assert reply.choices[0].text
    assert server.loaded is not None and server.loaded.engine.model is None  # the server loaded it, so it freed it


def test_options_that_cannot_work_are_one_line_before_anything_listens(smollm2: Path) -> None:
    planned = runtime.plan(_request(smollm2))
    with pytest.raises(UsageError, match="--api-key is empty"):
        Server(planned, ServeOptions(port=0, api_key=" "))
    with pytest.raises(UsageError, match="--chat-template-kwargs"):
        Server(planned, ServeOptions(port=0, chat_template_kwargs="{not json"))


def test_aliases_and_tags_are_listed_as_llama_server_lists_them(smollm2: Path) -> None:
    """llama-server's --alias a,b,c and --tags: /v1/models lists them all, and its id is the first alias in order."""
    with runtime.open_model(_request(smollm2)) as loaded:
        options = ServeOptions(port=0, aliases=("tinyllama-2", "fim", "code"), tags=("chat", "fim", "small"))
        with Server(loaded, options, say=lambda _: None).start() as server:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/models") as r:
                model = json.load(r)["data"][0]
    assert model["id"] == "code" and set(model["aliases"]) == {"tinyllama-2", "fim", "code"}
    assert set(model["tags"]) == {"chat", "fim", "small"}

"""``localllm serve`` takes llama-server's spelling: the flags they share parse
to serve's options, and a llama-server flag serve cannot honour is refused by
name (exit 2), never ignored."""

from __future__ import annotations

import pytest

from localllm.cli import build_parser
from localllm.commands.serve_flags import UNSUPPORTED
from tests.helpers.cli import cli

LLAMA_SERVER_LINE = ("-m", "model.gguf", "-c", "2048", "-np", "4", "-t", "2", "--host", "127.0.0.1", "--port", "8081", "--api-key", "k",
                     "--temp", "0.2", "--seed", "7", "-n", "128", "--jinja", "--chat-template", "chatml", "--metrics", "--slots",
                     "--cors", "http://a.example", "--cors", "*", "--cors-origins", "localhost,http://b.example", "--embeddings",
                     "--pooling", "mean")


def test_llama_server_command_line_parses() -> None:
    a = build_parser().parse_args(["serve", *LLAMA_SERVER_LINE])
    assert (a.model_flag, a.ctx, a.parallel, a.threads, a.host, a.port, a.api_key) == ("model.gguf", 2048, 4, 2, ["127.0.0.1"], 8081, "k")
    assert (a.temp, a.seed, a.n_predict, a.jinja, a.template, a.metrics, a.slots) == (0.2, 7, 128, True, "chatml", True, True)
    assert a.cors == ["http://a.example", "*", "localhost,http://b.example"] and a.embeddings and a.pooling == "mean"
    a = build_parser().parse_args(["serve", "--host", "127.0.0.1,::1", "--host", "10.0.0.1", "--chat-template-file", "t.jinja"])
    assert a.host == ["127.0.0.1,::1", "10.0.0.1"] and a.template == "t.jinja" and not a.metrics and not a.slots and a.cors is None


@pytest.mark.parametrize("flag", [f for flags in UNSUPPORTED for f in flags])
def test_a_flag_serve_cannot_honour_is_refused_by_name(flag: str) -> None:
    r = cli("serve", flag, "x")
    assert r.returncode == 2 and f"serve does not support llama-server's {flag}:" in r.stderr


def test_empty_api_key_and_host_are_usage_errors() -> None:
    r = cli("serve", "--api-key", "", "--parallel", "300")  # were the key let through, --parallel would stop it, not a server
    assert r.returncode == 2 and "--api-key is empty" in r.stderr
    r = cli("serve", "--api-key", "k", "--host", "127.0.0.1,", "--parallel", "300")
    assert r.returncode == 2 and "--host has an empty address" in r.stderr


def test_bad_template_arguments_are_said_before_a_model_loads() -> None:
    for value, said in (("{bad", "--chat-template-kwargs' is not JSON"), ('{"messages": []}', "'--chat-template-kwargs.messages' is set by the server"),
                        ('["x"]', "'--chat-template-kwargs' must be a JSON object")):
        r = cli("serve", "smollm2", "--chat-template-kwargs", value)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = cli("serve", "smollm2", "--reasoning", "sometimes")
    assert r.returncode == 2 and "--reasoning: invalid choice" in r.stderr


def test_server_side_defaults_fill_what_a_request_omits() -> None:
    from localllm.engine_api import SamplingConfig
    from localllm.serve.protocol import parse_gen

    d = SamplingConfig(temperature=0.3, seed=7, max_tokens=5, top_k=3)
    msgs = {"messages": [{"role": "user", "content": "hi"}]}
    p = parse_gen(msgs, chat=True, n_vocab=100, defaults=d)
    assert (p.temperature, p.seed, p.max_tokens, p.top_k) == (0.3, 7, 5, 3)
    p = parse_gen({**msgs, "temperature": 1.0, "seed": 1, "max_tokens": 9, "top_k": 0}, chat=True, n_vocab=100, defaults=d)
    assert (p.temperature, p.seed, p.max_tokens, p.top_k) == (1.0, 1, 9, 0)  # the request's own fields win
    assert parse_gen({"prompt": "x"}, chat=False, n_vocab=100).max_tokens == 16  # no -n: OpenAI's default for completions

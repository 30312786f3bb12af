"""``serve`` with no MODEL is the router: its options, its usage errors, and the
command line each model's process gets (the per-model options given, as
``--flag=value``; never the router's own: host, port, key, CORS)."""

from __future__ import annotations

import argparse

import pytest

from localllm.cli import build_parser, subparsers
from localllm.commands.serve import child_options
from tests.helpers.cli import cli


def parsed(*argv: str) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(["serve", *argv])
    args.subparsers = subparsers(parser)
    return args


def test_only_the_per_model_options_given_reach_each_child() -> None:
    args = parsed("--host", "0.0.0.0", "--port", "9000", "--api-key", "secret", "--cors", "*", "--models-max", "2", "--keep-alive", "1m",
                  "-c", "2048", "-np", "2", "-t", "1", "--temp", "0.2", "-n", "-1", "--seed", "7", "--kv-type", "q8_0", "--vram", "4GiB",
                  "--metrics", "--slots", "--json", "--cpu-moe", "--cache-ram", "0", "--max-queue", "8")
    opts = child_options(args)
    assert set(opts) >= {"--ctx=2048", "--parallel=2", "--threads=1", "--temp=0.2", "--seed=7", "--kv-type=q8_0",
                         f"--vram={4 * 2**30}B", "--metrics", "--slots", "--json", "--cpu-moe", "--cache-ram=0", "--max-queue=8"}
    assert not any(o.startswith(("--host", "--port", "--api-key", "--cors", "--models", "--keep-alive", "--alias")) for o in opts)
    assert "secret" not in " ".join(opts)
    assert child_options(parsed()) == []  # nothing given, nothing passed


def test_the_options_a_child_gets_parse_back_to_the_same_values() -> None:
    args = parsed("-c", "512", "--n-predict", "-1", "--top-p", "0.9", "--vram", "1.5GiB", "--n-cpu-moe", "3", "--flash-attn", "on",
                  "--chat-template", "chatml", "--no-dry-run")
    again = parsed(*child_options(args))
    for dest in ("ctx", "n_predict", "top_p", "vram", "n_cpu_moe", "flash_attn", "template", "no_dry_run"):
        assert getattr(again, dest) == getattr(args, dest), dest


@pytest.mark.parametrize(("argv", "message"), [
    (("smollm2", "--models", "all"), "give --models or a MODEL"),
    (("--alias", "x"), "--alias names the one model"),
    (("--keep-alive", "soon"), "--keep-alive: 'soon' is not a duration"),
    (("--models", "smollm2,,x"), "--models has an empty name"),
    (("--models", "nope"), "'nope' not found: localllm list"),
    (("--parallel", "300"), "--parallel can be at most 256"),
    (("--ui-mcp-proxy",), "--ui-mcp-proxy goes with serve MODEL"),
    (("smollm2", "--batch", "2", "--parallel", "4"), "--batch 2 cannot hold one token of each of --parallel 4"),
])
def test_router_usage_errors_are_one_line(argv: tuple[str, ...], message: str) -> None:
    r = cli("serve", *argv, "--port", "0")
    assert r.returncode in (1, 2) and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_keep_alive_and_sleep_idle_seconds_are_one_setting() -> None:
    r = cli("serve", "--keep-alive", "5m", "--sleep-idle-seconds", "60")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr


@pytest.mark.parametrize("flag", ["--models-dir"])
def test_later_router_flags_are_refused_by_name(flag: str) -> None:
    r = cli("serve", flag, "x")
    assert r.returncode == 2 and f"serve does not support llama-server's {flag}:" in r.stderr


def test_the_idle_time_comes_from_the_flags_then_ollamas_variable_then_5_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    from localllm.commands.serve import _keep_alive
    from localllm.router import durations

    monkeypatch.delenv("OLLAMA_KEEP_ALIVE", raising=False)
    assert _keep_alive(parsed(), durations) == 300.0
    monkeypatch.setenv("OLLAMA_KEEP_ALIVE", "30s")
    assert _keep_alive(parsed(), durations) == 30.0
    assert _keep_alive(parsed("--keep-alive", "-1"), durations) is None
    assert _keep_alive(parsed("--keep-alive", "0"), durations) == 0.0
    assert _keep_alive(parsed("--sleep-idle-seconds", "90"), durations) == 90.0
    assert _keep_alive(parsed("--sleep-idle-seconds", "-1"), durations) is None
    monkeypatch.setenv("OLLAMA_KEEP_ALIVE", "later")
    with pytest.raises(Exception, match="OLLAMA_KEEP_ALIVE: 'later' is not a duration"):
        _keep_alive(parsed(), durations)

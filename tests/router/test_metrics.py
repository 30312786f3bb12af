"""The router's /metrics: each child's Prometheus text merged with a model label
(``router.metrics.merge``, pure), and one real router with two models loaded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localllm.router import metrics
from localllm.serve.prometheus import ServerMetrics
from tests.helpers import router as rt
from tests.helpers.server import http_client

SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? \S+$')


def child_text(requests: int) -> str:
    m = ServerMetrics()
    for _ in range(requests):
        m.request_done("/v1/chat/completions", 200)
    m.first_token(0.03)
    return m.render()


def test_every_sample_gets_its_model_and_each_family_its_help_once() -> None:
    text = metrics.merge([("smollm2", child_text(2)), ("gemma3-270m", child_text(3))], metrics.router_lines(2, 5))
    lines = text.splitlines()
    samples = [ln for ln in lines if not ln.startswith("#")]
    assert samples and all(SAMPLE.match(ln) for ln in samples), [ln for ln in samples if not SAMPLE.match(ln)]
    child = [ln for ln in samples if not ln.startswith("localllm_router_")]
    assert all(re.search(r'\{model="(smollm2|gemma3-270m)"', ln) for ln in child)
    assert 'localllm_requests_total{model="smollm2",endpoint="/v1/chat/completions",status="200"} 2' in lines
    assert 'localllm_requests_total{model="gemma3-270m",endpoint="/v1/chat/completions",status="200"} 3' in lines
    assert 'localllm_generated_tokens_total{model="smollm2"} 0' in lines
    assert 'localllm_time_to_first_token_seconds_bucket{model="gemma3-270m",le="0.05"} 1' in lines
    assert "localllm_router_models_loaded 2" in lines and "localllm_router_loads_total 5" in lines
    for kind in ("HELP", "TYPE"):
        names = [ln.split()[2] for ln in lines if ln.startswith(f"# {kind} ")]
        assert len(names) == len(set(names)) and "localllm_time_to_first_token_seconds" in names
    # a family's samples follow its TYPE line, the two models' together
    at = lines.index("# TYPE localllm_requests_total counter")
    assert lines[at + 1].startswith('localllm_requests_total{model="smollm2"')
    assert lines[at + 2].startswith('localllm_requests_total{model="gemma3-270m"')


def test_labels_are_escaped_and_empty_input_gives_only_the_router_lines() -> None:
    assert metrics.labelled('x{a="1"} 2', 'we"ird\\') == 'x{model="we\\"ird\\\\",a="1"} 2'
    assert metrics.labelled("x 2", "m") == 'x{model="m"} 2'
    assert metrics.labelled("x{} 2", "m") == 'x{model="m"} 2'
    assert metrics.merge([], metrics.router_lines(0, 0)).splitlines()[2] == "localllm_router_models_loaded 0"


@pytest.mark.slow
def test_a_real_router_labels_two_loaded_models(tmp_path: Path, smollm2: Path) -> None:
    env = rt.isolated_env(tmp_path)
    plain = rt.start(env)
    try:
        with http_client(plain) as http:
            assert http.get("/metrics").status_code == 501  # as the single server answers without --metrics
    finally:
        plain.stop()
    router = rt.start(env, "--metrics")
    try:
        with http_client(router) as http:
            for name in ("smollm2", "gemma3-270m"):
                r = http.post("/v1/completions", json={"model": name, "prompt": "Hi", "max_tokens": 2}, timeout=120)
                assert r.status_code == 200, r.text
            r = http.get("/metrics")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            lines = r.text.splitlines()
            for name in ("smollm2", "gemma3-270m"):
                assert f'localllm_requests_total{{model="{name}",endpoint="/v1/completions",status="200"}} 1' in lines, r.text
                assert any(ln.startswith(f'localllm_generated_tokens_total{{model="{name}"}} ') for ln in lines)
            assert "localllm_router_models_loaded 2" in lines and "localllm_router_loads_total 2" in lines
            assert len([ln for ln in lines if ln.startswith("# TYPE localllm_requests_total ")]) == 1
    finally:
        router.stop()

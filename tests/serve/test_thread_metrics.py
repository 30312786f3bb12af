"""/metrics exports the decode thread counts per kind of step (issue 50), and
nothing for them before the engine chose any (absent, not 0)."""

from __future__ import annotations

from localllm.serve.prometheus import ServerMetrics


def test_thread_gauges() -> None:
    m = ServerMetrics()
    assert "localllm_threads" not in m.render()
    m.set_threads({"token": 1, "multi": 2}, 3, False)
    text = m.render()
    assert 'localllm_threads{kind="token",mode="adaptive"} 1' in text
    assert 'localllm_threads{kind="multi",mode="adaptive"} 2' in text
    assert "localllm_thread_changes_total 3" in text and "# TYPE localllm_threads gauge" in text

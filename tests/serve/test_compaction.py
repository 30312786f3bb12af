"""serve --compact-at: a chat request past the threshold has its older turns replaced
by a summary the served model writes, the system prompt and the last turns kept; the
next request of the same conversation reuses the summary (and the slot's prefix); a
request under the threshold is read as it came. SmolLM2 served in-process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from localllm import runtime
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.serve import ServeOptions, Server

pytestmark = pytest.mark.slow
GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)
H = {"Authorization": "Bearer k"}
FILLER = "Tell me a short fact about the sea, in one sentence, please. " * 4


def _conversation(turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "My locker code is 4817."},
            {"role": "assistant", "content": "Noted: your locker code is 4817."}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"{FILLER} ({i})"}, {"role": "assistant", "content": "The sea covers most of the Earth. " * 3}]
    return msgs


@pytest.fixture(scope="module")
def base(smollm2: Path) -> Iterator[str]:
    request = runtime.LoadRequest(model=smollm2, options=fitting.LoadOptions(n_ctx=512, threads=1, n_gpu_layers=0), hardware=ROOMY,
                                  serving=True, parallel=1)
    with runtime.open_model(request) as loaded, Server(loaded, ServeOptions(port=0, api_key="k", compact_at=0.5),
                                                       say=lambda _: None).start() as s:
        yield f"http://127.0.0.1:{s.port}"


def _ask(base: str, messages: list[dict[str, str]]) -> httpx.Response:
    r = httpx.post(f"{base}/v1/chat/completions", headers=H, timeout=600,
                   json={"messages": messages + [{"role": "user", "content": "What is my locker code?"}], "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return r


def test_a_long_conversation_is_compacted_and_its_summary_reused(base: str) -> None:
    long = _conversation(4)  # about 400 tokens of a 512-token slot: past half
    first = _ask(base, long)
    header = first.headers["X-Compacted"]
    before, after = (int(x) for x in header.split(" tokens")[0].split(" -> "))
    assert after < before and first.json()["usage"]["prompt_tokens"] == after and "summary written" in header
    again = _ask(base, long)  # the same conversation: the same older turns, the same summary
    assert "summary reused" in again.headers["X-Compacted"] and again.json()["usage"]["prompt_tokens"] == after
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > after // 2  # the compacted prompt's prefix is in the slot


def test_a_short_conversation_is_read_as_it_came(base: str) -> None:
    r = _ask(base, _conversation(1))
    assert "X-Compacted" not in r.headers

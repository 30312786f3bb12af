"""Images on an M-RoPE model (Qwen2-VL's positions) in ``serve`` (issue 49).

The scheduler places each cell at its position (``serve.media.Media.pos``): an
image of 16 cells takes 4 positions, so the text after it, the reply and the
prefix a later turn reuses all sit at positions other than their cell index.

The referee is the in-process engine, whose positions tests/vision/test_mrope.py
checks against libmtmd's own helper: serve's first-step log-probability equals
the log-softmax of the engine's logits for the same chat, and the greedy reply
is the same. A second turn that reuses the first turn's cells (the image among
them) from the slot gives what the same conversation read whole
(``cache_prompt: false``) gives. The pair's weights are large enough for sharp
attention: a text placed at its cell index instead of its position moved the
first log-probability by 0.23 here, while a batch split of another size moves
it by at most 0.003; the bound is 0.01. (llama-server is no referee here: on
this synthetic model it reads one more prompt token than either, text-only too.)
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.vision.image import decode_image
from tests.helpers.server import Server, http_client

ASK = "\nwhat is this?"  # after the image's marker, as the engine puts a picture before the typed text


def _png(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from scripts.make_vision_model import write_vision_model

    return write_vision_model(tmp_path_factory.mktemp("qwen2vl-serve"), size="qwen2vl")


@pytest.fixture(scope="module")
def server(pair: tuple[Path, Path]) -> Iterator[Server]:
    s = Server(str(pair[0]), "-np", "1", "-c", "512", "-t", "1", env={"LOCALLLM_HOME": str(pair[0].parent / "home")})
    yield s
    s.stop()


def _engine_turn(pair: tuple[Path, Path], seed: int, n: int) -> tuple[str, float]:
    """The engine's greedy reply of ``n`` tokens to the picture and ``ASK``, and its first step's log-probability."""
    b = LlamaCppBackend()
    try:
        b.load(pair[0], LoadConfig(n_ctx=512, n_threads=1))
        b.load_projector(pair[1])
        picture = decode_image(_png(seed), name=f"{seed}.png")
        with b.stream_images(ASK.lstrip("\n"), [picture], SamplingConfig(temperature=0, max_tokens=1), chat=True) as gen:
            list(gen)
        logits = b.last_logits().astype(np.float64)
        first = float(logits.max() - (logits.max() + np.log(np.exp(logits - logits.max()).sum())))
        with b.stream_images(ASK.lstrip("\n"), [picture], SamplingConfig(temperature=0, max_tokens=n), chat=True) as gen:
            text = "".join(e.text for e in gen)
        return text, first
    finally:
        b.close()


def _ask(client, messages: list[dict], **extra) -> dict:
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0, "logprobs": True,
                                                   "top_logprobs": 1, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _turn(seed: int) -> list[dict]:
    uri = "data:image/png;base64," + base64.b64encode(_png(seed)).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": ASK}]}]


def test_serve_reads_an_image_at_the_engines_positions_and_reuses_it(server: Server, pair: tuple[Path, Path]) -> None:
    replies = []
    with http_client(server) as c:
        assert c.post("/apply-template", json={"messages": _turn(1)}).json()["prompt"].startswith("<|im_start|>user\n<__media__>\nwhat")
        for seed in (1, 2):
            body = _ask(c, _turn(seed))
            text, lp = body["choices"][0]["message"]["content"], body["choices"][0]["logprobs"]["content"][0]["logprob"]
            want_text, want_lp = _engine_turn(pair, seed, 4)
            assert text == want_text and lp == pytest.approx(want_lp, abs=1e-2), (seed, text, want_text, lp, want_lp)
            replies.append(text)
            turn = _turn(seed) + [{"role": "assistant", "content": text}, {"role": "user", "content": "and its colours?"}]
            again = _ask(c, turn)
            t = again["timings"]
            assert t["cache_n"] >= body["usage"]["prompt_tokens"] and t["encode_n"] == 0  # turn 1's cells, its image among them
            whole = _ask(c, turn, cache_prompt=False)
            assert whole["timings"]["cache_n"] == 0
            got, want = (r["choices"][0] for r in (again, whole))
            assert got["message"]["content"] == want["message"]["content"]
            assert [x["logprob"] for x in got["logprobs"]["content"]] == pytest.approx([x["logprob"] for x in want["logprobs"]["content"]], abs=1e-2)
    assert replies[0] != replies[1]  # another picture, another reply: the image reached the model

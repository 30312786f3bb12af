"""Images in ``localllm serve`` (issue 49, item 2's serve part; item 4's timings).

A real serve process on the synthetic vision model (scripts/make_vision_model.py:
a text GGUF of n_embd 64 and its gemma3-type projector of 4 tokens an image,
found beside it), asked through the official ``openai``, ``ollama`` and
``anthropic`` clients. The pictures are chosen so that the model's greedy reply
differs between them (black, white and blue give other first tokens here), so
a test fails if the image never reaches the model. The scheduler's handling of
an image's positions is also checked on a fake model (no llama.cpp).
"""

from __future__ import annotations

import base64
import io
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from localllm.engine_api import SamplingConfig
from localllm.serve.media import Media, MediaTokens, fillers
from localllm.serve.prometheus import ServerMetrics
from localllm.serve.scheduler import Job, Scheduler
from tests.helpers.paths import REPO
from tests.helpers.server import KEY, Server, http_client, openai_client


def _png(color: tuple[int, int, int] | None = None, seed: int = 0) -> bytes:
    """A 32 x 32 PNG: one colour, or random pixels from ``seed``."""
    import numpy as np
    from PIL import Image

    a = np.full((32, 32, 3), color, np.uint8) if color is not None else np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


BLACK, WHITE, BLUE = _png((0, 0, 0)), _png((255, 255, 255)), _png((0, 0, 255))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _uri(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{_b64(data)}"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _png_claiming(w: int, h: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims ``w`` x ``h`` pixels (a decompression bomb's shape)."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b"")


def _gif_of_frames(n: int) -> bytes:
    """A 1 x 1 GIF of ``n`` frames (the classic one-pixel LZW block each)."""
    head = b"GIF89a" + struct.pack("<HH", 1, 1) + b"\x80\x00\x00" + b"\x00\x00\x00\xff\xff\xff"
    frame = b"\x21\xf9\x04\x00\x01\x00\x00\x00" + b"\x2c" + struct.pack("<HHHH", 0, 0, 1, 1) + b"\x00" + b"\x02\x02\x44\x01\x00"
    return head + frame * n + b"\x3b"


def _serve(folder: Path, *args: str) -> Server:
    return Server(str(folder / "model.gguf"), "--threads", "1", "--ctx", "512", "--parallel", "2", "--template", "chatml", *args,
                  env={"LOCALLLM_HOME": str(folder / "home")})


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scripts.make_vision_model import write_vision_model

    d = tmp_path_factory.mktemp("vision-serve")
    write_vision_model(d)  # model.gguf and mmproj-model.gguf, side by side
    return d


@pytest.fixture(scope="module")
def server(folder: Path):
    s = _serve(folder, "--api-key", KEY)  # the projector beside the model is found, as run finds it
    yield s
    s.stop()


@pytest.fixture(scope="module")
def text_only(folder: Path):
    s = _serve(folder, "--no-mmproj")
    yield s
    s.stop()


def _ask(client, picture: bytes, text: str = "what is this?", **kw):
    content = [{"type": "image_url", "image_url": {"url": _uri(picture)}}, {"type": "text", "text": text}]
    return client.chat.completions.create(model="model", messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0,
                                          logprobs=True, top_logprobs=2, **kw)


@pytest.mark.slow
def test_the_openai_client_sends_images_that_reach_the_model(server: Server) -> None:
    assert "vision: projector mmproj-model.gguf (gemma3" in server.log and "images through mmproj-model.gguf" in server.log
    client = openai_client(server)
    black, white, black2 = _ask(client, BLACK), _ask(client, WHITE), _ask(client, BLACK)

    def seen(r) -> tuple[str, list[float]]:
        return r.choices[0].message.content, [c.logprob for c in r.choices[0].logprobs.content]

    (text_a, lp_a), (text_b, lp_b) = seen(black), seen(black2)
    # the same picture, the same reply and log-probabilities: equal to float noise (the second reads a cached prefix,
    # in another batch split: one logprob once differed in its 8th digit under a loaded suite)
    assert text_a == text_b and lp_a == pytest.approx(lp_b, abs=1e-4)
    assert seen(black)[0] != seen(white)[0]  # another picture, another reply: the image went through the model
    t = black.model_extra["timings"]
    assert t["images"] == 1 and black.usage.prompt_tokens > 4  # the image's 4 tokens count in the prompt
    assert black2.model_extra["timings"]["encode_n"] == 0 and black2.model_extra["timings"]["encode_ms"] is None  # kept, never 0 ms
    streamed = _ask(client, WHITE, stream=True, stream_options={"include_usage": True})
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == seen(white)[0]
    with http_client(server) as h:
        assert h.get("/props").json()["modalities"] == {"vision": True, "video": False, "audio": False}
        assert h.get("/v1/models").json()["data"][0]["capabilities"] == ["completion", "multimodal"]
        assert "vision" in h.post("/api/show", json={"model": "model"}).json()["capabilities"]
        r = h.post("/apply-template", json={"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _uri(BLUE)}},
                                                                                      {"type": "text", "text": "hi"}]}]})
        assert r.json()["prompt"] == "<|im_start|>user\n<__media__>hi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.slow
def test_the_second_turn_reuses_the_image_in_the_cache(server: Server) -> None:
    client = openai_client(server)
    picture = _png(seed=41)  # one no other test sends: its first request encodes it
    turn = [{"role": "user", "content": [{"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": _uri(picture)}},
                                         {"type": "text", "text": " what is it?"}]}]
    first = client.chat.completions.create(model="model", messages=turn, max_tokens=3, temperature=0)
    t1 = first.model_extra["timings"]
    assert t1["images"] == 1 and t1["encode_n"] == 1 and t1["encode_ms"] > 0 and t1["encode_per_second"] > 0
    turn += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "and the colours?"}]
    second = client.chat.completions.create(model="model", messages=turn, max_tokens=3, temperature=0)
    t2, u2 = second.model_extra["timings"], second.usage
    assert t2["images"] == 1 and t2["encode_n"] == 0 and t2["encode_ms"] is None and t2["encode_per_second"] is None  # nothing encoded
    assert t2["cache_n"] >= first.usage.prompt_tokens  # turn 1's prompt, its image included, came from the cache
    assert t2["prompt_n"] == u2.prompt_tokens - t2["cache_n"] < first.usage.prompt_tokens  # only the new tokens were read
    assert u2.prompt_tokens_details.cached_tokens == t2["cache_n"]


@pytest.mark.slow
def test_the_prompt_cache_in_ram_carries_the_image(server: Server) -> None:
    """--cache-ram (on by default): an idle conversation with an image moves to RAM when
    another request starts, and comes back for its next turn, image included."""
    with http_client(server) as h:
        def chat(messages: list, **kw) -> dict:
            r = h.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0, "logprobs": True, **kw})
            assert r.status_code == 200, r.text
            return r.json()

        turn = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _uri(_png(seed=43))}}, {"type": "text", "text": "what?"}]}]
        first = chat(turn)
        # a prompt that shares nothing with it takes the other slot, least recently used: this one's cells go to RAM
        assert h.post("/v1/completions", json={"prompt": "zzz", "max_tokens": 2}).status_code == 200
        turn += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]}, {"role": "user", "content": "and?"}]
        back = chat(turn)
        assert back["timings"]["cache_n"] >= first["usage"]["prompt_tokens"] and back["timings"]["encode_n"] == 0
        fresh = chat(turn, cache_prompt=False)  # the whole conversation read again, for comparison
        assert fresh["timings"]["cache_n"] == 0 and back["choices"][0]["message"]["content"] == fresh["choices"][0]["message"]["content"]
        got = [c["logprob"] for c in back["choices"][0]["logprobs"]["content"]]
        assert got == pytest.approx([c["logprob"] for c in fresh["choices"][0]["logprobs"]["content"]], abs=2e-3)


@pytest.mark.slow
def test_the_ollama_client_sends_images(server: Server) -> None:
    import ollama

    client = ollama.Client(host=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    opts = {"temperature": 0, "num_predict": 4}

    def chat(picture: bytes) -> str:
        return client.chat(model="model", messages=[{"role": "user", "content": "what is this?", "images": [picture]}], options=opts).message.content

    black, white = chat(BLACK), chat(WHITE)
    assert black == chat(BLACK) and black != white
    gen = [client.generate(model="model", prompt="what is this?", images=[p], options=opts).response for p in (BLACK, WHITE)]
    assert gen[0] != gen[1]
    with http_client(server) as h:
        fresh = _b64(_png(seed=42))
        r = h.post("/api/chat", json={"model": "model", "stream": False, "options": opts,
                                      "messages": [{"role": "user", "content": "what is this?", "images": [fresh]}]}).json()
        assert r["image_count"] == 1 and r["image_encode_count"] == 1 and r["image_encode_duration"] > 0
        r = h.post("/api/generate", json={"model": "model", "stream": False, "options": opts, "prompt": "what is this?", "images": [fresh]}).json()
        assert r["image_count"] == 1 and r["image_encode_count"] == 0 and r["image_encode_duration"] is None  # kept from the chat's encode
        r = h.post("/api/generate", json={"model": "model", "stream": False, "prompt": "hi", "options": opts}).json()
        assert "image_count" not in r  # no images: no image fields
        r = h.post("/api/generate", json={"model": "model", "prompt": "hi", "raw": True, "images": [fresh]})
        assert r.status_code == 400 and "raw" in r.json()["error"]


@pytest.mark.slow
def test_the_anthropic_client_sends_image_blocks(server: Server) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0, timeout=120)

    def ask(picture: bytes):
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(picture)}}
        turn: Any = {"role": "user", "content": [block, {"type": "text", "text": "what is this?"}]}
        return client.messages.create(model="model", max_tokens=4, extra_body={"temperature": 0}, messages=[turn])

    black, white, black2 = ask(BLACK), ask(WHITE), ask(BLACK)
    assert black.content[0].text == black2.content[0].text != white.content[0].text
    assert black.usage.model_extra["image_count"] == 1 and black2.usage.model_extra["image_encode_ms"] is None
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="model", max_tokens=4,
                               messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])
    assert "offline" in info.value.message
    n = client.messages.count_tokens(model="model", messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(BLUE)}}, {"type": "text", "text": "hi"}]}])
    assert n.input_tokens > 4  # the image's tokens are counted


@pytest.mark.slow
def test_an_anthropic_tool_result_carries_its_images(server: Server, text_only: Server) -> None:
    """An image block inside a tool_result (a screenshot tool's answer) reaches a
    vision model after the results; a text-only one answers the 400 naming --mmproj
    (llama-server answers a 500 there)."""
    import anthropic

    def turns(picture: bytes) -> Any:
        shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(picture)}}
        return [{"role": "user", "content": "what is on the screen?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                              "content": [{"type": "text", "text": "screen.png"}, shot]}]}]

    client = anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0, timeout=120)
    black, white = (client.messages.create(model="model", max_tokens=4, extra_body={"temperature": 0}, messages=turns(p)) for p in (BLACK, WHITE))
    assert black.usage.model_extra["image_count"] == 1 and black.content[0].text != white.content[0].text  # the picture was read
    text_client = anthropic.Anthropic(base_url=text_only.base, api_key=KEY, max_retries=0, timeout=120)
    with pytest.raises(anthropic.BadRequestError) as info:
        text_client.messages.create(model="model", max_tokens=4, messages=turns(BLACK))
    assert "--mmproj" in info.value.message


@pytest.mark.slow
def test_responses_take_input_image(server: Server) -> None:
    client = openai_client(server)

    def ask(picture: bytes):
        return client.responses.create(model="model", max_output_tokens=4, temperature=0, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": _uri(picture)}, {"type": "input_text", "text": "what is this?"}]}])

    assert ask(BLACK).output_text == ask(BLACK).output_text != ask(WHITE).output_text


@pytest.mark.slow
def test_bad_images_and_remote_urls_are_400s_naming_the_part(server: Server) -> None:
    with http_client(server) as h:
        def chat(url: str, status: int = 400) -> str:
            content = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]
            r = h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"},
                                                                  {"role": "user", "content": content}], "max_tokens": 2})
            assert r.status_code == status, r.text
            return r.json()["error"]["message"] if status == 400 else ""

        t0 = time.perf_counter()
        for data, said in ((BLACK[: len(BLACK) // 2], "is truncated or damaged"),
                           (_png_claiming(30000, 30000), "claims more pixels than Pillow allows"),
                           (_png_claiming(9000, 9000), "over the 50 MP limit"),
                           (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "is an SVG"),
                           (b"not a picture at all", "is not a picture this tool reads")):
            msg = chat(_uri(data))
            assert msg.startswith("image messages[2].content[1] ") and said in msg and "\n" not in msg, msg
        assert time.perf_counter() - t0 < 10  # refused from their headers: nothing 30000 x 30000 was decoded
        chat(_uri(_gif_of_frames(10_000), "gif"), 200)  # its first frame only (vision.image): answered, bounded
        assert "remote URL" in chat("https://example.com/cat.png") and "offline" in chat("http://example.com/cat.png")
        assert "data URI" in chat("/tmp/cat.png") and "not valid base64" in chat("data:image/png;base64,%%%")
        r = h.post("/v1/chat/completions", json={"messages": [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": _uri(BLACK)}}]}]})
        assert r.status_code == 400 and "only a user's message takes images" in r.json()["error"]["message"]
        r = h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _uri(BLACK)}}]}],
                                                 "max_tokens": 2})
        assert r.status_code == 200  # the chat template's generation prompt comes after the image
        r = h.post("/api/chat", json={"model": "m", "messages": [{"role": "user", "content": "x", "images": [_b64(b"<svg></svg>")]}]})
        assert r.status_code == 400 and r.json()["error"].startswith("image messages[0].images[0] is an SVG")
        r = h.post("/v1/messages", headers={"x-api-key": KEY}, json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(BLACK[:60])}}]}]})
        assert r.status_code == 400 and "image messages[0].content[0] is truncated" in r.json()["error"]["message"]
        assert h.get("/health").status_code == 200


@pytest.mark.slow
def test_a_text_only_server_refuses_images_naming_mmproj(text_only: Server) -> None:
    assert "images through" not in text_only.log and "vision:" not in text_only.log  # --no-mmproj: the projector beside it is not loaded
    with http_client(text_only) as h:
        r = h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _uri(BLACK)}}]}]})
        assert r.status_code == 400 and "'messages[0].content[0]' is an image" in r.json()["error"]["message"]
        assert "--mmproj" in r.json()["error"]["message"]
        r = h.post("/api/chat", json={"model": "m", "messages": [{"role": "user", "content": "x", "images": [_b64(BLACK)]}]})
        assert r.status_code == 400 and "--mmproj" in r.json()["error"]
        assert h.get("/props").json()["modalities"]["vision"] is False
        assert h.get("/v1/models").json()["data"][0]["capabilities"] == ["completion"]
        assert h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).status_code == 200


@pytest.mark.slow
def test_a_mismatched_projector_is_one_line_before_listening(folder: Path) -> None:
    from scripts.make_vision_model import ProjectorSpec, write_projector

    wrong = write_projector(folder / "other-projector.gguf", ProjectorSpec(n_embd_text=32))  # "mmproj" not in its name: never found beside
    r = subprocess.run([sys.executable, "-m", "localllm", "serve", str(folder / "model.gguf"), "--mmproj", str(wrong), "--port", "0"],
                       capture_output=True, text=True, cwd=REPO, env={**os.environ, "LOCALLLM_HOME": str(folder / "home")}, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert "other-projector.gguf does not fit model model.gguf" in lines[0] and "listening" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "localllm", "serve", "--mmproj-url", "https://x/mmproj.gguf"], capture_output=True, text=True, cwd=REPO,
                       timeout=60)
    assert r.returncode == 2 and "offline" in r.stderr


# -- the scheduler, on a fake model --------------------------------------------------------------------------------


class _Fake:
    """A model that records what each decode and image decode got; every token it draws is 7."""

    def __init__(self) -> None:
        self.decodes: list[list[tuple[int, int, int, bool]]] = []
        self.images: list[tuple[int, int, str]] = []
        self.cells: dict[int, int] = {}

    def seq_rm(self, seq, p0=0, p1=-1):
        self.cells[seq] = p0 if p1 == -1 else self.cells.get(seq, 0)
        return True

    def seq_cp(self, src, dst, n):
        self.cells[dst] = n

    def new_sampler(self, sampling, prompt=()):
        assert all(t >= 0 for t in prompt)  # an image's filler ids never reach a sampler
        return object()

    def free_sampler(self, sampler):
        pass

    def decode(self, entries):
        assert entries and all(t >= 0 for t, *_ in entries)  # nor llama_decode
        self.decodes.append(list(entries))

    def decode_image(self, seq, pos, piece):
        self.images.append((seq, pos, piece))
        return (1_000_000 if piece != "kept" else None), 500_000

    def sample_all(self, picks):
        return [7 for _ in picks]

    def is_eog(self, tok):
        return False

    def piece(self, tok):
        return b"x"


def _media_job(text_a: int, n_image: int, text_b: int, key: str = "pic:0", piece: str = "chunk") -> Job:
    from localllm.serve.media import ImageSpan

    ids = list(range(1, text_a + 1)) + fillers(key, n_image) + list(range(100, 100 + text_b))
    media = Media((ImageSpan(text_a, n_image, piece),), images=1)
    return Job(tokens=MediaTokens(ids, media), sampling=SamplingConfig(temperature=0), max_tokens=2, emit=lambda k, p: None, media=media)


def _run(sched: Scheduler, job: Job) -> None:
    sched.submit(job)
    for _ in range(100):
        sched._step()
        if job.ended:
            return
    raise AssertionError("the job did not end")


def test_an_image_is_read_whole_and_never_cut_by_the_prefill_chunk() -> None:
    model = _Fake()
    sched = Scheduler(model, n_seq=2, n_ctx_seq=512, n_batch=64, prefix_reuse=True, max_queue=4, prefill_chunk=2, metrics=ServerMetrics())
    busy = Job(tokens=[1, 2], sampling=SamplingConfig(temperature=0), max_tokens=30, emit=lambda k, p: None)
    sched.submit(busy)
    sched._step()  # another request generates meanwhile: prompts are read 2 tokens a step
    job = _media_job(3, 16, 3)
    _run(sched, job)
    assert model.images == [(job.slot, 3, "chunk")]  # all 16 positions in one call, right after the 3 text tokens
    for entries in model.decodes:
        mine = [p for _, p, s, _ in entries if s == job.slot]
        assert not any(3 <= p < 19 for p in mine) and len(mine) <= 2  # no filler in a batch; text in chunks of 2
    assert job.images_read == job.images_encoded == 1 and job.timings()["encode_ms"] == 1.0 and job.timings()["images"] == 1


def test_a_cached_prefix_keeps_the_same_picture_and_never_half_of_one() -> None:
    model = _Fake()
    sched = Scheduler(model, n_seq=1, n_ctx_seq=512, n_batch=64, prefix_reuse=True, max_queue=4, prefill_chunk=64, metrics=ServerMetrics())
    _run(sched, _media_job(3, 8, 4))
    again = _media_job(3, 8, 6, piece="kept")  # the same picture, a longer text after it
    _run(sched, again)
    assert again.n_cached == 3 + 8 + 4 and again.images_read == 0 and len(model.images) == 1  # nothing encoded or decoded again
    assert again.timings()["encode_n"] == 0 and again.timings()["encode_ms"] is None
    other = _media_job(3, 8, 4, key="another:0")  # another picture in the same place: only the text before it is reused
    _run(sched, other)
    assert other.n_cached == 3 and other.images_read == 1
    media = other.media
    assert media is not None and media.snap(5) == 3 and media.snap(11) == 11 and media.snap(2) == 2
    assert fillers("a:0", 3) != fillers("b:0", 3) and fillers("a:0", 3)[0] != fillers("b:0", 3)[0] and all(t < 0 for t in fillers("a:0", 9))
    assert "images" not in Job(tokens=[1], sampling=SamplingConfig(), max_tokens=1, emit=lambda k, p: None).timings()  # text only: no image fields

"""serve with an audio projector: OpenAI's input_audio parts (chat completions, Responses), /props, and
/v1/audio/transcriptions, through the real ``openai`` client; hostile audio a 400 in bounded time, never
stalling another client. SmolLM2 with the synthetic audio projector, served in-process."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from localllm import runtime
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.serve import ServeOptions, Server
from tests.audio.conftest import tone, wav_bytes

pytestmark = pytest.mark.slow

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)


def _serve(model: Path, projector: Path | None) -> Iterator[str]:
    request = runtime.LoadRequest(model=model, options=fitting.LoadOptions(n_ctx=2 * 1024, threads=2, n_gpu_layers=0), hardware=ROOMY,
                                  serving=True, parallel=2, projector=projector)
    with runtime.open_model(request) as loaded, Server(loaded, ServeOptions(port=0), say=lambda _: None).start() as s:
        yield f"http://127.0.0.1:{s.port}"


@pytest.fixture(scope="module")
def base(smollm2: Path, audio_projector: Path) -> Iterator[str]:
    yield from _serve(smollm2, audio_projector)


@pytest.fixture(scope="module")
def client(base: str):
    import openai

    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_props_and_models_say_audio(base: str) -> None:
    props = httpx.get(f"{base}/props", timeout=30).json()
    assert props["modalities"] == {"vision": False, "video": False, "audio": True}
    assert "multimodal" in httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["capabilities"]


def test_chat_with_input_audio_through_the_openai_client(client, speech_wav: Path) -> None:
    part = {"type": "input_audio", "input_audio": {"data": _b64(speech_wav), "format": "wav"}}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What did you hear?"}, part]}]
    first = client.chat.completions.create(model="m", messages=msgs, max_tokens=4, temperature=0)
    assert first.choices[0].message.content and first.usage.prompt_tokens > 125  # the clip's 125 tokens are in the prompt
    again = client.chat.completions.create(model="m", messages=msgs, max_tokens=4, temperature=0)
    assert again.choices[0].message.content == first.choices[0].message.content  # the same sound, the same greedy reply
    assert again.usage.prompt_tokens_details.cached_tokens >= 125  # the audio's cells came from the cache: not encoded again


def test_responses_take_input_audio(client, speech_wav: Path) -> None:
    r = client.responses.create(model="m", max_output_tokens=4, temperature=0, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What did you hear?"},
        {"type": "input_audio", "input_audio": {"data": _b64(speech_wav), "format": "wav"}}]}])
    assert r.output_text and r.usage.input_tokens > 125


def test_transcriptions_in_three_formats(client, speech_wav: Path) -> None:
    with speech_wav.open("rb") as f:
        t = client.audio.transcriptions.create(model="m", file=f, language="en", extra_body={"max_tokens": 6, "temperature": 0})
    assert isinstance(t.text, str) and t.text
    with speech_wav.open("rb") as f:
        text = client.audio.transcriptions.create(model="m", file=f, response_format="text", extra_body={"max_tokens": 6, "temperature": 0})
    assert isinstance(text, str) and text.strip() == t.text.strip()
    with speech_wav.open("rb") as f:
        v = client.audio.transcriptions.create(model="m", file=f, response_format="verbose_json", language="en",
                                               extra_body={"max_tokens": 6, "temperature": 0})
    assert v.text == t.text and 1 < v.duration < 6 and v.language == "en" and v.segments and v.segments[0].end == v.duration


def test_transcription_refusals(base: str) -> None:
    wav = wav_bytes(tone(0.5, 16000), 16000)
    for data, fields, words in (
        (wav, {"response_format": "srt"}, "'response_format' 'srt' is not supported"),
        (wav, {"stream": "true"}, "'stream' is not supported"),
        (b"", {}, "'file' is empty"),
    ):
        r = httpx.post(f"{base}/v1/audio/transcriptions", files={"file": ("a.wav", data)}, data={"model": "m", **fields}, timeout=60)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    r = httpx.post(f"{base}/v1/audio/transcriptions", json={"model": "m"}, timeout=60)
    assert r.status_code == 400 and "multipart/form-data" in r.text


HOSTILE = {
    "lying header": wav_bytes(tone(0.5, 16000), 16000, data_size=0x7FFFFFF0),
    "cut short": wav_bytes(tone(2.0, 16000), 16000)[:20000],
    "zero rate": wav_bytes(tone(0.5, 16000), 16000)[:24] + bytes(4) + wav_bytes(tone(0.5, 16000), 16000)[28:],
    "ten hours": wav_bytes(tone(0.5, 16000), 16000, data_size=10 * 3600 * 16000 * 2),
    "mp3 bomb": b"\xff\xfb\x90\x00" + bytes(32) + b"Xing" + (1).to_bytes(4, "big") + (0xFFFFFFF0).to_bytes(4, "big") + bytes(369),
    "not audio": b"hello world" * 50,
}


def test_hostile_audio_is_a_400_in_bounded_time_and_never_stalls_another_client(base: str, client) -> None:
    stalls: list[float] = []
    done = threading.Event()

    def other() -> None:  # another client's short chats all along
        while not done.is_set():
            t0 = time.perf_counter()
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0)
            assert r.choices[0].message.content is not None
            stalls.append(time.perf_counter() - t0)

    worker = threading.Thread(target=other)
    worker.start()
    try:
        for name, data in HOSTILE.items():
            part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}
            t0 = time.perf_counter()
            r = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
                "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]})
            took = time.perf_counter() - t0
            assert r.status_code == 400, (name, r.text)
            msg = r.json()["error"]["message"]
            assert "\n" not in msg and "messages[0].content[1]" in msg and took < 10, (name, msg, took)
            tr = httpx.post(f"{base}/v1/audio/transcriptions", files={"file": ("x.wav", data)}, data={"model": "m"}, timeout=60)
            assert tr.status_code == 400 and "file" in tr.json()["error"]["message"], (name, tr.text)
    finally:
        done.set()
        worker.join(timeout=120)
    assert stalls and max(stalls) < 30  # the other client was answered all along


def test_a_text_only_model_answers_audio_with_a_400_naming_mmproj(smollm2: Path, speech_wav: Path) -> None:
    for url in _serve(smollm2, None):
        part = {"type": "input_audio", "input_audio": {"data": _b64(speech_wav), "format": "wav"}}
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]})
        assert r.status_code == 400 and "--mmproj" in r.json()["error"]["message"] and "is audio" in r.json()["error"]["message"]
        assert httpx.get(f"{url}/props", timeout=30).json()["modalities"]["audio"] is False
        t = httpx.post(f"{url}/v1/audio/transcriptions", files={"file": ("a.wav", speech_wav.read_bytes())}, data={"model": "m"}, timeout=60)
        assert t.status_code == 400 and "--mmproj" in t.json()["error"]["message"]

"""Audio through libmtmd into SmolLM2's KV cache (engine.mtmd), with the synthetic audio projector and espeak-ng's speech."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from localllm.audio.read import decode_audio, load_audio
from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.errors import InputError, UsageError
from localllm.vision.image import RGBImage
from tests.audio.conftest import speak, tone, wav_bytes

pytestmark = pytest.mark.slow  # loads SmolLM2 in llama.cpp

GREEDY = SamplingConfig(temperature=0, max_tokens=1)
TOKENS = 125  # the synthetic Ultravox projector's tokens for one 30 s chunk


@pytest.fixture(scope="module")
def backend(smollm2: Path, audio_projector: Path):
    b = LlamaCppBackend()
    b.load(smollm2, LoadConfig(n_ctx=1024, n_threads=2))
    info = b.load_projector(audio_projector)
    assert info.has_audio and not info.has_vision
    yield b
    b.close()


def _logits(backend, clip, encoded: int):
    with backend.stream_images("What did you hear?", [clip], GREEDY) as gen:
        list(gen)
    assert gen.stats is not None and gen.stats.images == encoded
    return gen.stats, backend.last_logits()


def test_the_projector_says_what_it_takes(backend) -> None:
    p = backend.projector
    assert p.audio and not p.vision and p.sample_rate == 16000
    assert p.audio_info is not None and p.audio_info.tokens_per_chunk == TOKENS and p.audio_info.n_embd_out == 576
    assert p.audio_info.tokens(10.0) == TOKENS and p.audio_info.tokens(31.0) == 2 * TOKENS


def test_speech_reaches_the_model_and_is_encoded_once(backend, speech_wav: Path) -> None:
    speech = load_audio(speech_wav)
    other = decode_audio(wav_bytes(tone(2.0, 16000), 16000), name="tone.wav")
    s1, la = _logits(backend, speech, encoded=1)
    _, lb = _logits(backend, other, encoded=1)
    s3, la2 = _logits(backend, speech, encoded=0)  # its embeddings were kept: decoded again, not encoded again
    assert np.array_equal(la, la2)
    assert np.abs(la - lb).max() > 1e-4  # another sound moves the logits: the audio went through the model
    assert s1.encode_ms is not None and s1.encode_ms > 0 and s3.encode_ms is None
    assert s1.prompt_tokens > TOKENS and s1.prompt_tokens == backend.context_used  # the chunk's cells counted with the text


def test_mp3_and_flac_decode_as_their_wav(backend, tmp_path: Path) -> None:
    words = "Seven silver swans swam south."  # not the fixture's sentence: that one's encoding is kept
    wav = load_audio(speak(words, tmp_path / "s.wav"))
    flac = load_audio(speak(words, tmp_path / "s.flac", fmt="flac"))
    _, lw = _logits(backend, wav, encoded=1)
    _, lf = _logits(backend, flac, encoded=1)
    assert np.abs(lw - lf).max() < 0.05  # the same samples, lossless: the same sound to the model (up to resampling)


def test_a_clip_that_decodes_longer_than_it_said_is_refused(backend) -> None:
    real = decode_audio(wav_bytes(tone(3.0, 16000), 16000), name="long.wav")
    liar = dataclasses.replace(real, n_frames=16000, name="liar.wav")  # says 1 s, holds 3
    with pytest.raises(InputError, match=r"liar.wav decoded to 3.00 s where its wav header said 1.00 s"):
        _logits(backend, liar, encoded=0)
    _logits(backend, real, encoded=1)  # the engine is still whole


def test_pictures_are_refused_by_an_audio_projector(backend) -> None:
    pic = RGBImage(name="p.png", width=8, height=8, rgb=bytes(192), file_bytes=1, sha256="p")
    with pytest.raises(InputError, match=r"p.png: projector .* has no vision encoder .*projector \(mmproj\)"):
        _logits(backend, pic, encoded=0)


def test_a_text_model_without_a_projector_names_mmproj(smollm2: Path) -> None:
    b = LlamaCppBackend()
    try:
        b.load(smollm2, LoadConfig(n_ctx=256, n_threads=1))
        clip = decode_audio(wav_bytes(tone(0.5, 16000), 16000), name="t.wav")
        with pytest.raises(UsageError, match=r"audio needs an audio model.s projector \(mmproj\)"):
            b.stream_images("hi", [clip], GREEDY)
    finally:
        b.close()

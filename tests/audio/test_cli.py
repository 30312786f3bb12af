"""``run --audio`` end to end: SmolLM2 with the synthetic audio projector, espeak-ng's speech, and one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.audio.conftest import tone, wav_bytes
from tests.helpers.cli import cli

pytestmark = pytest.mark.slow


def _run(model: Path, *extra: str):
    return cli("run", str(model), "-p", "What did you hear?", "-n", "2", "--temp", "0", "--ctx", "1024", "--threads", "2", *extra)


def test_run_audio_prints_the_encode_as_its_own_phase(smollm2: Path, audio_projector: Path, speech_wav: Path) -> None:
    r = _run(smollm2, "--mmproj", str(audio_projector), "--audio", str(speech_wav))
    assert r.returncode == 0, r.stderr
    assert "audio: projector mmproj-audio.gguf (ultravox, audio only)" in r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("audio encode:"))
    assert "1 clip(s), " in line and " s of audio/s)" in line and "n/a" not in line
    out = json.loads(_run(smollm2, "--mmproj", str(audio_projector), "--audio", str(speech_wav), "--json").stdout)
    a = out["audio"]
    assert a["clips"][0]["name"] == "fox.wav" and a["clips"][0]["sample_rate"] == 22050 and a["seconds"] > 1
    assert a["encode_ms"] > 0 and a["audio_seconds_per_s"] > 0 and out["prompt_tokens"] > 125  # the chunk's 125 tokens counted
    plain = json.loads(_run(smollm2, "--json").stdout)
    assert plain["audio"] is None


def test_bad_audio_and_missing_encoders_are_one_line(smollm2: Path, audio_projector: Path, tmp_path: Path) -> None:
    liar = tmp_path / "liar.wav"
    liar.write_bytes(wav_bytes(tone(0.5, 16000), 16000, data_size=1 << 31))
    r = _run(smollm2, "--mmproj", str(audio_projector), "--audio", str(liar))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "lies about its size" in r.stderr
    good = tmp_path / "t.wav"
    good.write_bytes(wav_bytes(tone(0.5, 16000), 16000))
    r = _run(smollm2, "--audio", str(good))  # SmolLM2 alone: no projector beside it
    assert r.returncode == 2 and "--audio needs an audio model" in r.stderr and "--mmproj" in r.stderr
    from localllm.commands import audio_cli
    from localllm.errors import UsageError
    from scripts.make_vision_model import ProjectorSpec, write_projector

    vision = write_projector(tmp_path / "v.gguf", ProjectorSpec(n_embd_text=576))  # a gemma3 one: check_pair refuses it for SmolLM2 first
    with pytest.raises(UsageError, match="v.gguf has no audio encoder"):
        audio_cli.check([object()], [], vision, smollm2)  # type: ignore[list-item]
    with pytest.raises(UsageError, match="--image needs a vision projector"):
        audio_cli.check([object()], [object()], audio_projector, smollm2)  # type: ignore[list-item]


def test_chat_audio_then_a_follow_up_encodes_nothing_again(smollm2: Path, audio_projector: Path, speech_wav: Path) -> None:
    script = f"/audio {speech_wav}\nwhat did you hear?\nand then?\n/audio /nowhere.wav\n/image {speech_wav}\nstill there?\n"
    r = cli("chat", str(smollm2), "--mmproj", str(audio_projector), "-n", "2", "--temp", "0", "--ctx", "1024", "--threads", "2",
            "--json", "--no-save", stdin=script)
    assert r.returncode == 0, r.stderr
    turns = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [t["images"] for t in turns] == [1, 0, 0]  # one 30 s chunk encoded, then kept in the cache
    assert turns[0]["encode_ms"] > 0 and turns[1]["encode_ms"] is None
    assert turns[0]["prompt_tokens"] > 125 and turns[1]["prompt_tokens"] < turns[0]["context_used"] < turns[1]["context_used"]
    assert "attached fox.wav (0:0" in r.stderr and "125 audio tokens" in r.stderr
    assert "localllm: error: audio /nowhere.wav: no such file" in r.stderr  # one line, and the chat went on
    plain = cli("chat", str(smollm2), "-n", "1", "--ctx", "512", "--threads", "2", "--no-save", stdin=f"/audio {speech_wav}\nhi\n")
    assert plain.returncode == 0 and "/audio needs an audio model" in plain.stderr and "--mmproj" in plain.stderr


def test_chat_summary_gives_the_audio_encode_in_seconds_of_audio_a_second() -> None:
    from types import SimpleNamespace

    from localllm.audio.sound import AudioClip
    from localllm.commands.chat import _encode

    clip = AudioClip("a.wav", "wav", b"", 16000, 1, 16000 * 5, 10, "0" * 64)
    s = SimpleNamespace(images=1, encode_ms=500.0)
    assert _encode(s, [clip]) == " (audio encode 500.00 ms, 10.0 s of audio/s)"  # type: ignore[arg-type]
    assert _encode(s, []) == " (image encode 500.00 ms)"  # type: ignore[arg-type]

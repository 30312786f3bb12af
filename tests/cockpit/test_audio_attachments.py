"""Sound files as the cockpit's attachments, without Textual: the chip (length
and tokens), the count and its 30 s chunks for the forecast, the saved
session's path and sha256, read again and checked on reopen."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from localllm.audio.projector import AudioInfo
from localllm.chat import sessions
from localllm.cockpit.attachments import count, is_audio, read, restore_images, shown_saved
from localllm.util import fmt
from localllm.vision.marker import with_images
from tests.audio.conftest import tone, wav_bytes

ULTRAVOX = AudioInfo("ultravox", 128, 64, 2, 128, 8, 576, 125)  # the synthetic projector's figures: 125 tokens a 30 s chunk


def _wav(path: Path, seconds: float, hz: float = 440.0) -> Path:
    path.write_bytes(wav_bytes(tone(seconds, 16000, hz), 16000))
    return path


def test_a_sound_file_is_a_chip_with_its_length_and_tokens(tmp_path: Path) -> None:
    clip = _wav(tmp_path / "note.wav", 2.5)
    odd = tmp_path / "recording.bin"  # told by its bytes, not its name
    odd.write_bytes(clip.read_bytes())
    assert is_audio(clip) and is_audio(odd) and not is_audio(tmp_path)
    p = read(clip, tokens_per_image=4, audio=ULTRAVOX)
    assert p.kind == "audio" and p.media is p.audio and p.image is None and p.tokens == 125
    assert p.chip() == f"note.wav · {fmt.size(clip.stat().st_size)} · 0:02.5 · 125 audio tokens"
    assert read(odd, tokens_per_image=None).chip().endswith("0:02.5 · audio tokens n/a")  # no audio encoder known: n/a, not 0
    long = read(_wav(tmp_path / "long.wav", 45.0), tokens_per_image=None, audio=ULTRAVOX)
    assert long.tokens == 250 and long.chip().split(" · ")[2] == "0:45.0"  # two 30 s chunks


def test_the_count_adds_the_clips_tokens_and_their_chunks_for_the_forecast(tmp_path: Path) -> None:
    engine = SimpleNamespace(tokenize=lambda text, add_special, parse_special: text.split())
    chat = SimpleNamespace(backend=engine, context_used=0, completion=True, messages=[], images=[], n_ctx=4096)
    clip = read(_wav(tmp_path / "a.wav", 1.0), tokens_per_image=None, audio=ULTRAVOX)
    msg = {"role": "user", "content": "what is this"}
    c = count(chat, (), msg, [clip], tokens_per_image=None, reply=64, max_ctx_by_kv_type=None, trained_ctx=None, audio=ULTRAVOX)
    assert c.new_tokens == 3 + 125 and c.images == 0 and c.audio_chunks == 1 and c.image_tokens_known
    chat.images = [clip.audio]  # nothing cached: the history's clip is read (and encoded) again
    c = count(chat, (), msg, [], tokens_per_image=None, reply=64, max_ctx_by_kv_type=None, trained_ctx=None, audio=ULTRAVOX)
    assert c.new_tokens == 3 + 125 and c.audio_chunks == 1
    c = count(chat, (), msg, [clip], tokens_per_image=None, reply=64, max_ctx_by_kv_type=None, trained_ctx=None, audio=None)
    assert not c.image_tokens_known  # a clip's tokens not known: said, never counted as 0


def test_a_saved_clip_keeps_its_path_and_sha256_and_is_checked_on_reopen(tmp_path: Path) -> None:
    path = _wav(tmp_path / "voice memo.wav", 1.0)
    ref = read(path, tokens_per_image=None, audio=ULTRAVOX).ref()
    assert ref["kind"] == "audio" and ref["path"] == str(path.resolve()) and ref["seconds"] == 1.0 and len(ref["sha256"]) == 64
    s = sessions.SavedSession.new("m.gguf", None, {})
    s.messages = [{"role": "user", "content": with_images("what is it?", 1)}, {"role": "assistant", "content": "a tone"}]
    s.images = [ref]
    back = sessions.from_dict(json.loads(json.dumps(s.__dict__)), tmp_path / "x.json")
    assert back.images == [ref] and "[audio: voice memo.wav]\nwhat is it?" in sessions.to_markdown(back)
    assert sessions.image_refs([{**ref, "seconds": "long"}, {"kind": "audio"}]) == [{"kind": "audio", "name": "voice memo.wav"},
                                                                                     {"kind": "audio", "name": "audio"}]
    same, media, notes = restore_images(s.messages, [ref], can_see=True, can_hear=True)
    assert same == s.messages and [m.sha256 for m in media] == [ref["sha256"]] and notes == []
    _, media, notes = restore_images(s.messages, [ref], can_see=True, can_hear=False)  # a vision projector now: no ears
    assert media == [] and notes == ["audio voice memo.wav is not in the chat again: the projector loaded has no audio encoder"]
    _wav(path, 1.0, hz=880.0)  # changed on disk since: not the sound the chat heard
    changed, media, notes = restore_images(s.messages, [ref], can_see=True, can_hear=True)
    assert media == [] and changed[0]["content"] == "[audio voice memo.wav: not available]\nwhat is it?" and "has changed since" in notes[0]
    assert shown_saved(s.messages[0]["content"], False, ["voice memo.wav"], ["audio"]) == "what is it?\n↳ audio voice memo.wav"


def test_a_clip_without_a_known_path_is_saved_as_audio_by_name(tmp_path: Path) -> None:
    from localllm.cockpit.session import CockpitSession

    clip = read(_wav(tmp_path / "x.wav", 0.5), tokens_per_image=None).audio
    assert clip is not None
    core = CockpitSession.__new__(CockpitSession)
    core.image_refs = {}
    assert core.refs([clip]) == [{"name": "x.wav", "kind": "audio"}]

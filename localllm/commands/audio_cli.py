"""An audio model on the command line: ``run --audio FILE`` beside ``--image``.

Every sound file is read and bounded (``audio.read``) and the projector is
checked for an audio encoder before the model loads, each failure one line.
The clips then travel with the images (the engine's media list), and the stats
block gives the audio encoder its own phase: the chunks encoded, the time, and
seconds of audio encoded per second, so a slow encoder shows apart from prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localllm.audio.sound import AudioClip
from localllm.commands._common import say
from localllm.errors import LocalLLMError, UsageError
from localllm.util import fmt


def load_clips(paths: Sequence[str]) -> list[AudioClip]:
    """``--audio``'s files, read and bounded (one line for the first bad one)."""
    if not paths:
        return []
    from localllm.audio.read import load_audio  # lazy: the decoders (WAV, FLAC, MP3: 4.5 ms measured), every run and plan imports this module

    return [load_audio(p) for p in paths]


def check(clips: Sequence[AudioClip], images: Sequence[object], projector: Path | None, model: Path) -> None:
    """The projector takes what was given: sound needs an audio encoder, pictures a vision one."""
    if not clips:
        return
    if projector is None:
        raise UsageError(f"--audio needs an audio model: no projector beside {model.name}; pass --mmproj FILE (an audio projector)")
    from localllm.vision.projector import read_projector  # lazy: the GGUF reader, only with --audio

    info = read_projector(projector)
    if not info.has_audio:
        raise UsageError(f"--audio needs an audio projector, and {projector.name} has no audio encoder (a vision one): pass --mmproj FILE")
    if images and not info.has_vision:
        raise UsageError(f"--image needs a vision projector, and {projector.name} takes audio only")


def audio_command(arg: str, backend: Any, attached: list[Any]) -> None:
    """chat's ``/audio FILE``: the sound file, read and bounded now, goes with the next
    message, as ``/image``'s picture does. A bad file or a projector without an audio
    encoder is one line on stderr; the chat goes on."""
    if not arg:
        say("usage: /audio FILE (a WAV, MP3 or FLAC, sent with your next message)")
        return
    proj = backend.projector
    if proj is None or not proj.audio:
        say("error: /audio needs an audio model: start chat with --mmproj FILE (an audio projector)")
        return
    from localllm.audio.read import load_audio  # lazy: as in load_clips

    try:
        clip = load_audio(arg)
    except LocalLLMError as exc:
        say(f"error: {exc}")
        return
    attached.append(clip)
    n = proj.audio_info.tokens(clip.seconds) if proj.audio_info is not None else None
    say(f"attached {clip.label}, {clip.file_bytes / 1024:.0f} KiB, {n if n is not None else 'n/a'} audio tokens: sent with your next message")


def clips_of(media: Sequence[object]) -> list[AudioClip]:
    return [m for m in media if isinstance(m, AudioClip)]


def encode_row(s: Any, media: Sequence[object]) -> tuple[str, str] | None:
    """The stats block's encode phase for a prompt with sound (None without): what
    was encoded, in how long, and seconds of audio a second (n/a when all was kept)."""
    clips = clips_of(media)
    if not clips:
        return None
    seconds = sum(c.seconds for c in clips)
    pictures = len(media) - len(clips)
    what = f"{len(clips)} clip(s), {seconds:.1f} s of audio" + (f" and {pictures} image(s)" if pictures else "")
    rate = seconds / (s.encode_ms / 1000) if s.encode_ms and not pictures else None
    return ("audio encode" if not pictures else "media encode",
            f"{what}, {fmt.ms(s.encode_ms)} ({f'{rate:.1f}' if rate is not None else 'n/a'} s of audio/s)")


def json_block(s: Any, media: Sequence[object]) -> dict[str, Any] | None:
    """``run --json``'s ``audio``: the clips and the encode phase; figures not measured are null."""
    clips = clips_of(media)
    if not clips:
        return None
    seconds = sum(c.seconds for c in clips)
    alone = len(clips) == len(media)
    return {
        "clips": [{"name": c.name, "format": c.format, "seconds": round(c.seconds, 3), "sample_rate": c.sample_rate,
                   "channels": c.channels, "file_bytes": c.file_bytes, "sha256": c.sha256} for c in clips],
        "seconds": round(seconds, 3),
        "encode_ms": s.encode_ms if alone else None,  # with pictures the phase is theirs too: not the audio's alone
        "audio_seconds_per_s": seconds / (s.encode_ms / 1000) if alone and s.encode_ms else None,
    }

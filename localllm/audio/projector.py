"""What an audio projector (mmproj) GGUF says about its encoder, and the tokens a clip makes.

The figures follow ``$V/tools/mtmd/clip.cpp``: ``load_hparams`` reads the
``clip.audio.*`` keys and sets the whisper preprocessing (16 kHz, 30 s chunks
of 3000 mel frames) for the whisper-style types; ``clip_n_output_tokens`` gives
a chunk's tokens (the frames halved by the second convolution, stacked by
``stack_factor`` for Ultravox and Voxtral, halved again by the average pool of
Qwen2-Audio and Voxtral); ``clip_n_mmproj_embd`` reads the width handed to the
text model off the last projection's ``ne[1]``. ``$V/tools/mtmd/mtmd-audio.cpp``
pads every clip with 30 s of silence and keeps only whole chunks, so a clip of
``s`` seconds makes ``(s * 100 + 3001) // 3000`` chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

from localllm.modelfile.gguf_file import GGUFHeader

SAMPLE_RATE = 16000  # the whisper types' (clip.cpp load_hparams)
CHUNK_FRAMES = 3000  # mel frames of one 30 s chunk (mtmd-audio.cpp)
_WHISPER = {"ultravox", "qwen2a", "voxtral", "musicflamingo", "glma", "meralion"}
_STACKED = {"ultravox", "voxtral", "meralion"}  # clip_model::audio_has_stack_frames
_POOLED = {"qwen2a", "voxtral", "musicflamingo"}  # clip_model::audio_has_avgpool
_OUT = {"ultravox": "mm.a.mlp.2.weight", "voxtral": "mm.a.mlp.2.weight", "musicflamingo": "mm.a.mlp.2.weight",
        "qwen2a": "mm.a.fc.weight", "meralion": "mm.a.mlp.3.weight"}


@dataclass(frozen=True)
class AudioInfo:
    projector_type: str
    n_mel: int | None
    n_embd: int | None  # the encoder's width
    n_block: int | None
    n_ff: int | None
    stack: int | None  # frames stacked before the projection (Ultravox)
    n_embd_out: int | None  # handed to the text model: must equal its n_embd
    tokens_per_chunk: int | None  # one 30 s chunk's; None for a type whose count is not worked out here

    def chunks(self, seconds: float) -> int:
        """The 30 s chunks libmtmd makes of a clip of ``seconds`` (whisper types)."""
        return (int(seconds * SAMPLE_RATE) // 160 + CHUNK_FRAMES + 1) // CHUNK_FRAMES

    def tokens(self, seconds: float) -> int | None:
        """The tokens a clip of ``seconds`` takes in the context; None when not known before encoding."""
        return None if self.tokens_per_chunk is None else self.chunks(seconds) * self.tokens_per_chunk

    def compute_estimate(self) -> int | None:
        """clip.cpp's compute buffer for this encoder, estimated from its graph
        (``build_whisper_enc``) on the warm-up's one 30 s chunk, as the ViT's is
        (``vision.memory.compute_estimate``): the widest of its phases, each the
        live tensors' bytes. The first convolution: the f32 mel input (3000
        frames) beside its im2col (3 taps a bin, in f16: ``ggml_conv_1d``); the
        second: the first's f32 output beside its own f16 im2col at 1500 frames;
        a layer: at 1500 positions, the feed-forward's hidden width and three of
        the residual stream's, in f32 (flash attention on keeps no
        positions-by-positions matrix). Within 3% of the logged buffer on the
        synthetic projectors (tests/audio). None where the header lacks a width."""
        if self.projector_type not in _WHISPER or not self.n_mel or not self.n_embd or not self.n_ff:
            return None
        frames = CHUNK_FRAMES
        return max(frames * self.n_mel * (4 + 3 * 2), frames * self.n_embd * 4 + frames // 2 * 3 * self.n_embd * 2,
                   frames // 2 * (self.n_ff + 3 * self.n_embd) * 4)

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def audio_type(header: GGUFHeader) -> str:
    """The audio encoder's projector type (a mixed projector names it apart; Qwen2.5-Omni's is qwen2a)."""
    t = str(header.get("clip.audio.projector_type") or header.get("clip.projector_type") or "unknown")
    return "qwen2a" if t == "qwen2.5o" else t


def describe_audio(header: GGUFHeader) -> AudioInfo | None:
    """The audio figures of a clip header; None when it has no audio encoder."""
    if not header.get("clip.has_audio_encoder", False):
        return None

    def num(key: str) -> int | None:
        v = header.get(key)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    ptype = audio_type(header)
    stack = num("clip.audio.projector.stack_factor") if ptype in _STACKED else None
    tokens: int | None = None
    if ptype in _WHISPER and ptype != "glma" and (ptype not in _STACKED or stack):
        n = CHUNK_FRAMES
        if stack:
            n = -(-n // stack) * stack // stack
        n //= 2
        if ptype in _POOLED:
            n //= 2
        tokens = n
    out = next((t for t in header.tensors if t.name == _OUT.get(ptype)), None)
    n_out = int(out.shape[1]) if out is not None and len(out.shape) >= 2 else num("clip.audio.projection_dim")
    return AudioInfo(ptype, num("clip.audio.num_mel_bins"), num("clip.audio.embedding_length"), num("clip.audio.block_count"),
                     num("clip.audio.feed_forward_length"), stack, n_out, tokens)


def capabilities(header: GGUFHeader) -> tuple[bool, bool]:
    """(vision, audio) of a projector's header."""
    return bool(header.get("clip.has_vision_encoder", False)), bool(header.get("clip.has_audio_encoder", False))

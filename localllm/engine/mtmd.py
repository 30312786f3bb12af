"""libmtmd, driven by hand: images into the KV cache that the text already uses.

Every ``llama_cpp.mtmd_cpp`` call of localllm is in this module. llama-cpp-python's
``MTMDChatHandler`` clears the KV cache on every call, so each turn of a chat
would encode every image again; here the prompt is split by ``mtmd_tokenize``
(``$V/tools/mtmd/mtmd.h``: text chunks and image chunks, an image where the
media marker stands) and each chunk is evaluated after what the cache holds:

- a text chunk through the model's own decode path (``ModelHandle.decode``,
  timed like any prompt);
- an image chunk by ``mtmd_encode_chunk`` (the vision encoder: the *encode*
  phase, timed on its own), then ``mtmd_helper_decode_image_chunk``
  (``$V/tools/mtmd/mtmd-helper.cpp``: the embeddings into the KV cache, with
  non-causal attention where the projector wants it, as Gemma 3 does).

The cache's token mirror (``KVCache``) gets ``IMAGE_FILLER`` for each of an
image's positions, so its length stays the cache's length and a later turn
appends after the image: nothing is encoded twice while the cache holds it.

``serve``'s batch engine (``engine.batch``) drives the same projector on its
own context: ``decode_piece`` puts an image into any sequence at any position
(llama-server's ``mtmd_helper_eval_chunk_single`` with the slot's seq id).

Audio goes the same way: a clip (``audio.sound.AudioClip``, bounded by
``audio.read``) is decoded by libmtmd's miniaudio to mono at the encoder's
rate, cut by ``mtmd_tokenize`` into 30 s chunks, and each chunk is encoded,
kept and decoded as an image's would be (an audio chunk is a ``Piece`` too).
"""

from __future__ import annotations

import collections
import ctypes
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import llama_cpp
from llama_cpp import mtmd_cpp as mtmd

from localllm.audio.projector import AudioInfo, describe_audio
from localllm.audio.sound import AudioClip
from localllm.engine.kvcache import KVCache
from localllm.engine.llamalog import ROUTER
from localllm.engine.model import ModelHandle
from localllm.engine.native import gpu_offload_supported, install_log_router
from localllm.engine_api.errors import InvalidSetting
from localllm.engine_api.stats import ShiftRecord
from localllm.errors import EngineError, InputError, UsageError
from localllm.modelfile.gguf_file import GGUFHeader, read_header
from localllm.vision.image import RGBImage
from localllm.vision.marker import MARKER
from localllm.vision.memory import LoggedMemory, ProjectorMemory, parse_log, planned
from localllm.vision.projector import ProjectorInfo, check_pair, read_projector

KEEP_BYTES = 256 * 1024 * 1024  # encoded images kept in RAM for reuse (Projector._keep)
_TEXT, _IMAGE, _AUDIO = 0, 1, 2  # enum mtmd_input_chunk_type (mtmd.h)
_log_cb = llama_cpp.llama_log_callback(ROUTER)  # keep a reference: C holds the pointer


@dataclass
class Piece:
    """One chunk of a tokenized prompt: text tokens, or an image or 30 s of audio (a chunk owned by its
    ``MediaPrompt``). An audio chunk goes wherever an image does: the KV cache, the kept embeddings and
    serve's spans treat both as media (``is_image``), and ``audio`` tells them apart where it matters."""

    tokens: list[int] = field(default_factory=list)
    chunk: object = None  # mtmd_input_chunk_p of an image
    n_tokens: int = 0  # KV cells it takes
    n_pos: int = 0  # positions it takes (equal to n_tokens unless M-RoPE)
    image_id: str = ""
    key: str = ""  # the image's id and which of its chunks this is: the encoded-embeddings store's key
    audio: bool = False  # a chunk of audio (its id the sound file's sha256)

    @property
    def is_image(self) -> bool:
        return self.chunk is not None


@dataclass
class MediaPrefill:
    """What evaluating a prompt's pieces took (all but the last text piece, which the generator decodes)."""

    prefill_ns: int = 0  # text and image-embedding decodes
    encode_ns: int = 0  # the vision encoder alone
    images: int = 0
    tokens: int = 0  # KV cells filled, images included


class MediaPrompt:
    """A prompt split by ``mtmd_tokenize``; owns its chunks (``close`` frees them)."""

    def __init__(self, chunks: object, pieces: list[Piece]) -> None:
        # freed on close, or when dropped unused (a generation never started): never twice
        self._free = weakref.finalize(self, mtmd.mtmd_input_chunks_free, chunks)
        self.pieces = pieces

    @property
    def n_tokens(self) -> int:
        return sum(p.n_tokens for p in self.pieces)

    @property
    def images(self) -> int:
        return sum(1 for p in self.pieces if p.is_image)

    def close(self) -> None:
        self._free()
        self.pieces = []

    def __enter__(self) -> MediaPrompt:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Host(Protocol):
    """What a projector reads of the model it feeds: ``ModelHandle`` (run, chat), or
    the batch engine's context (``engine.batch``, serve)."""

    @property
    def model(self) -> object: ...
    @property
    def ctx(self) -> object: ...
    @property
    def header(self) -> GGUFHeader: ...
    @property
    def n_batch(self) -> int: ...
    def require(self) -> None: ...


class Projector:
    """A projector loaded for one text model (``mtmd_init_from_file``); ``close`` frees it."""

    def __init__(self, handle: Host, path: Path, *, use_gpu: bool | None = None) -> None:
        handle.require()
        info = read_projector(path)
        check_pair(handle.header, info)  # one line naming both files, before libmtmd prints its own
        install_log_router()
        mtmd.mtmd_helper_log_set(_log_cb, None)  # libmtmd's and clip's lines into the router, off the terminal
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = gpu_offload_supported() if use_gpu is None else use_gpu
        params.print_timings = False
        params.n_threads = int(llama_cpp.llama_n_threads_batch(handle.ctx))
        mark = ROUTER.mark()
        t0 = time.perf_counter_ns()
        ctx = mtmd.mtmd_init_from_file(str(path).encode(), handle.model, params)
        self.load_ms = (time.perf_counter_ns() - t0) / 1e6
        self.load_log = ROUTER.lines_since(mark)
        if not ctx:
            raise EngineError(f"libmtmd could not load the projector {path}: {ROUTER.first_error_since(mark) or 'no reason given'}")
        vision, audio = bool(mtmd.mtmd_support_vision(ctx)), bool(mtmd.mtmd_support_audio(ctx))
        if not vision and not audio:
            mtmd.mtmd_free(ctx)
            raise InputError(f"projector {path} has neither a vision nor an audio encoder: nothing can go through it")
        self.vision, self.audio = vision, audio
        # the rate miniaudio resamples every clip to (16 kHz for the whisper types); None: no audio encoder
        self.sample_rate: int | None = int(mtmd.mtmd_get_audio_sample_rate(ctx)) if audio else None
        self.audio_info: AudioInfo | None = describe_audio(read_header(path)) if audio else None
        self._ctx = ctx
        self._handle = handle
        self.info: ProjectorInfo = info
        self.path = Path(path)
        self.encoded = 0  # media chunks the encoders ran on, over this projector's life (a cached one is not counted again)
        self.use_gpu = bool(params.use_gpu)
        self._kept: collections.OrderedDict[str, ctypes.Array] = collections.OrderedDict()  # encoded embeddings by picture (_keep)
        self._kept_bytes = 0

    @property
    def planned_memory(self) -> ProjectorMemory:
        """What clip.cpp allocates by its rules (vision.memory): weights derived, compute estimated."""
        audio = self.audio_info.compute_estimate() if self.audio_info is not None else None
        return planned(self.info, gpu=self.use_gpu and gpu_offload_supported(), audio_compute=audio)

    @property
    def logged_memory(self) -> LoggedMemory:
        """What clip.cpp said it allocated, from this load's log lines."""
        return parse_log([line for _, line in self.load_log])

    def close(self) -> None:
        if self._ctx:
            mtmd.mtmd_free(self._ctx)
            self._ctx = None

    def forget(self) -> None:
        """Drop the kept encodings, so that the next prompt's images are encoded
        again (``bench --image`` times the encoder on each repetition)."""
        self._kept.clear()
        self._kept_bytes = 0

    def _require(self) -> object:
        if not self._ctx or not self._handle.ctx:
            raise EngineError("the projector is not loaded")
        return self._ctx

    def tokenize(self, text: str, images: Sequence[RGBImage | AudioClip], *, add_special: bool, parse_special: bool) -> MediaPrompt:
        """Split ``text`` (one ``MARKER`` for each of ``images``, in order: pictures or sound) into pieces."""
        ctx = self._require()
        if text.count(MARKER) != len(images):
            raise UsageError(f"{len(images)} image(s) or clip(s) but {text.count(MARKER)} place(s) for them in the prompt")
        bitmaps = []
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            for im in images:
                if isinstance(im, AudioClip):
                    bitmaps.append(self._audio_bitmap(ctx, im))
                    continue
                if not self.vision:
                    raise InputError(f"image {im.name}: projector {self.path.name} has no vision encoder (audio only): "
                                     f"give a vision model's projector (mmproj) for pictures")
                if len(im.rgb) != im.width * im.height * 3:  # mtmd_bitmap_init reads exactly this many bytes
                    raise InputError(f"image {im.name}: {len(im.rgb)} bytes are not {im.width}x{im.height} RGB")
                # a pointer into the bytes, not a copy (a 48 MP photo is 144 MB): libmtmd copies them itself
                buf = ctypes.cast(ctypes.c_char_p(im.rgb), ctypes.POINTER(ctypes.c_uint8))
                bm = mtmd.mtmd_bitmap_init(im.width, im.height, buf)
                if not bm:
                    raise EngineError(f"libmtmd could not take the image {im.name}")
                mtmd.mtmd_bitmap_set_id(bm, im.sha256.encode())
                bitmaps.append(bm)
            raw = text.encode()
            inp = mtmd.mtmd_input_text()
            inp.text, inp.text_len, inp.add_special, inp.parse_special = raw, len(raw), add_special, parse_special
            arr = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            mark = ROUTER.mark()
            rc = mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                why = {1: "the media and their places in the prompt do not match", 2: "an image or a clip could not be preprocessed"}.get(rc, f"error {rc}")
                raise InputError(f"libmtmd could not read the prompt's media: {why} {ROUTER.first_error_since(mark)}".rstrip())
            pieces = [self._piece(mtmd.mtmd_input_chunks_get(chunks, i)) for i in range(mtmd.mtmd_input_chunks_size(chunks))]
            seen: dict[str, int] = {}
            for piece in pieces:  # every occurrence of a picture makes the same chunks, in the same order
                if piece.is_image and piece.image_id:
                    k = seen.get(piece.image_id, 0)
                    seen[piece.image_id] = k + 1
                    piece.key = f"{piece.image_id}:{k}"
        except BaseException:
            mtmd.mtmd_input_chunks_free(chunks)
            raise
        finally:
            for bm in bitmaps:
                mtmd.mtmd_bitmap_free(bm)
        return MediaPrompt(chunks, pieces)

    def _piece(self, chunk: object) -> Piece:
        kind = mtmd.mtmd_input_chunk_get_type(chunk)
        if kind == _TEXT:
            n = ctypes.c_size_t(0)
            arr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            return Piece(tokens=[int(arr[i]) for i in range(n.value)], n_tokens=n.value, n_pos=n.value)
        if kind not in (_IMAGE, _AUDIO):
            raise EngineError(f"libmtmd gave a chunk of unknown type {kind}")
        n_tok = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        cid = mtmd.mtmd_input_chunk_get_id(chunk)
        return Piece(chunk=chunk, n_tokens=n_tok, n_pos=int(mtmd.mtmd_input_chunk_get_n_pos(chunk)),
                     image_id=cid.decode(errors="replace") if cid else "", audio=kind == _AUDIO)

    def _audio_bitmap(self, ctx: Any, clip: AudioClip) -> Any:
        """``clip`` decoded by libmtmd's miniaudio to mono at the encoder's rate. ``audio.read``
        bounded the clip's length before (miniaudio sizes its buffer by the header), and the
        decoded length is checked against it here: a file that decodes to more is refused."""
        rate = self.sample_rate
        if rate is None or rate <= 0:
            raise InputError(f"audio {clip.name}: projector {self.path.name} has no audio encoder: give an audio model's projector (mmproj)")
        buf: Any = ctypes.cast(ctypes.c_char_p(clip.data), ctypes.POINTER(ctypes.c_uint8))  # no copy: miniaudio reads the bytes in place
        mark = ROUTER.mark()
        bm = mtmd.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(clip.data), False, None)
        if not bm:
            raise InputError(f"audio {clip.name} could not be decoded ({clip.format}): {ROUTER.first_error_since(mark) or 'damaged'}")
        n = int(mtmd.mtmd_bitmap_get_n_bytes(bm)) // 4
        if n < 2 or n > clip.seconds * rate * 1.02 + rate // 4:
            mtmd.mtmd_bitmap_free(bm)
            raise InputError(f"audio {clip.name} decoded to {n / rate:.2f} s where its {clip.format} header said {clip.seconds:.2f} s (damaged)")
        mtmd.mtmd_bitmap_set_id(bm, clip.sha256.encode())
        return bm

    def evaluate(self, cache: KVCache, pieces: Sequence[Piece], n_keep: int, shifts: list[ShiftRecord]) -> MediaPrefill:
        """Evaluate ``pieces`` into ``cache`` after what it holds (a context shift makes room first)."""
        out = MediaPrefill()
        for piece in pieces:
            cache.make_room(piece.n_tokens, n_keep, shifts)
            if piece.is_image:
                enc, dec = self._eval_image(cache, piece)
                if enc is not None:  # None: its embeddings were kept from an earlier encode
                    out.encode_ns += enc
                    out.images += 1
                out.prefill_ns += dec
            elif piece.tokens:
                out.prefill_ns += cache.append(piece.tokens)
            out.tokens += piece.n_tokens
        return out

    def _eval_image(self, cache: KVCache, piece: Piece) -> tuple[int | None, int]:
        n_ubatch = self.too_large(piece)
        if n_ubatch is not None:
            raise InvalidSetting(f"an image here is {piece.n_tokens} tokens, decoded whole, but {{n_ubatch}} is {n_ubatch}: "
                                 f"raise it (and {{n_batch}}) to at least {piece.n_tokens}")
        out = self.decode_piece(piece, 0, cache.pos())
        cache.record_image(piece.n_tokens, piece.n_pos)
        return out

    def too_large(self, piece: Piece) -> int | None:
        """The context's n_ubatch when ``piece`` is an image whose tokens attend to each
        other both ways (Gemma 3's) and do not fit one ubatch (mtmd-helper.cpp decodes
        such an image in one: llama.cpp would refuse it); None when it can be decoded."""
        ctx = self._require()
        n_ubatch = int(llama_cpp.llama_n_ubatch(self._handle.ctx))
        if piece.is_image and mtmd.mtmd_decode_use_non_causal(ctx, piece.chunk) and piece.n_tokens > n_ubatch:
            return n_ubatch
        return None

    def decode_piece(self, piece: Piece, seq_id: int, n_past: int) -> tuple[int | None, int]:
        """Image ``piece`` into sequence ``seq_id`` at positions ``n_past`` on: encoded
        (unless its embeddings were kept), then decoded, whole where it attends both ways.
        Returns (encode ns, or None when kept; decode ns)."""
        ctx, handle = self._require(), self._handle
        mark = ROUTER.mark()
        embd = self._kept.get(piece.key) if piece.key else None
        enc_ns: int | None = None
        t1 = time.perf_counter_ns()
        if embd is not None:
            self._kept.move_to_end(piece.key)
        else:
            t0 = time.perf_counter_ns()
            if mtmd.mtmd_encode_chunk(ctx, piece.chunk) != 0:
                what = "audio" if piece.audio else "image"
                raise EngineError(f"libmtmd could not encode the {what}: {ROUTER.first_error_since(mark) or 'no reason given'}")
            embd = self._keep(piece, mtmd.mtmd_get_output_embd(ctx))
            t1 = time.perf_counter_ns()
            enc_ns = t1 - t0
            self.encoded += 1
        new_n_past = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_decode_image_chunk(ctx, handle.ctx, piece.chunk, embd, n_past, seq_id, handle.n_batch,
                                                 ctypes.byref(new_n_past), mtmd.mtmd_helper_post_decode_callback(), None)
        llama_cpp.llama_synchronize(handle.ctx)
        t2 = time.perf_counter_ns()
        if rc != 0:
            raise EngineError(f"the image's embeddings could not be decoded ({rc}): {ROUTER.first_error_since(mark) or 'no reason given'}")
        return enc_ns, t2 - t1

    def _keep(self, piece: Piece, out: Any) -> ctypes.Array:
        """A copy of the encoder's output for ``piece`` (libmtmd overwrites its own at the next
        encode), kept by the picture's key, so a conversation read again (a template that
        re-renders a reply differently, a rewind past a shift) decodes it without encoding it
        again. The oldest go past ``KEEP_BYTES`` (Gemma 3's 256 tokens x 2560 are 2.6 MB)."""
        if not out:
            raise EngineError("libmtmd gave no embeddings for the image")
        n = piece.n_tokens * int(llama_cpp.llama_model_n_embd_inp(self._handle.model))
        arr = (ctypes.c_float * n)()
        ctypes.memmove(arr, out, n * 4)
        if piece.key:
            self._kept[piece.key] = arr
            self._kept_bytes += n * 4
            while self._kept_bytes > KEEP_BYTES and len(self._kept) > 1:
                _, old = self._kept.popitem(last=False)
                self._kept_bytes -= ctypes.sizeof(old)
        return arr


def last_logits(handle: ModelHandle):
    """The logits of the last evaluated position (float32 [n_vocab] copy): what a
    prompt, its images included, made the model expect next. Tests compare them
    across images."""
    import numpy as np  # lazy: only the tests' comparison needs it

    handle.require()
    ptr = llama_cpp.llama_get_logits_ith(handle.ctx, -1)
    if not ptr:
        raise EngineError("no logits: nothing was evaluated")
    return np.ctypeslib.as_array(ptr, shape=(handle.n_vocab,)).copy()

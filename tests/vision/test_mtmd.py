"""Images through libmtmd into the KV cache (engine.mtmd), on the synthetic vision model and the vendored photo."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.errors import InputError
from localllm.vision.image import decode_image, load_image
from tests.vision.conftest import noise_png

# Not marked slow: the synthetic vision model (a few KB) runs in the fast tests (issue 49), all of
# this file in about half a second.

GREEDY = SamplingConfig(temperature=0, max_tokens=1)


@pytest.fixture(scope="module")
def backend(vision_model):
    model, proj = vision_model
    b = LlamaCppBackend()
    b.load(model, LoadConfig(n_ctx=256, n_threads=1))
    b.load_projector(proj)
    yield b
    b.close()


def _logits_after(backend, image, encoded: int) -> np.ndarray:
    with backend.stream_images("what is this?", [image], GREEDY, chat=False) as gen:
        list(gen)
    assert gen.stats is not None and gen.stats.images == encoded
    return backend.last_logits()


def test_the_image_reaches_the_model(backend) -> None:
    a, b = decode_image(noise_png(1), name="a.png"), decode_image(noise_png(2), name="b.png")
    la, lb = _logits_after(backend, a, encoded=1), _logits_after(backend, b, encoded=1)
    la2 = _logits_after(backend, a, encoded=0)  # its embeddings were kept: decoded again, not encoded again
    assert np.array_equal(la, la2)  # the same picture, the same logits
    assert np.abs(la - lb).max() > 1e-4  # another picture moves them: the image went through the model


def test_the_encoder_is_deterministic(vision_model) -> None:
    """A fresh projector (nothing kept) encodes the same picture to the same logits."""
    model, proj = vision_model
    out = []
    for _ in range(2):
        b = LlamaCppBackend()
        try:
            b.load(model, LoadConfig(n_ctx=256, n_threads=1))
            b.load_projector(proj)
            out.append(_logits_after(b, decode_image(noise_png(1)), encoded=1))
        finally:
            b.close()
    assert np.array_equal(out[0], out[1])


def test_stats_split_encode_from_prefill(backend) -> None:
    before = backend.projector.encoded
    with backend.stream_images("hi", [decode_image(noise_png(3))], GREEDY, chat=False) as gen:
        list(gen)
    s = gen.stats
    assert s.images == 1 and s.encode_ms is not None and s.encode_ms > 0 and s.images_per_s is not None
    assert s.prefill_ms > 0 and s.ttft_ms is not None and s.ttft_ms >= s.encode_ms + s.prefill_ms * 0.99
    assert s.prompt_tokens == backend.context_used  # the image's 4 cells counted with the text
    assert backend.projector.encoded == before + 1
    with backend.stream("hi", GREEDY, chat=False) as gen:
        list(gen)
    assert gen.stats.images == 0 and gen.stats.encode_ms is None and gen.stats.images_per_s is None  # n/a, not 0


def test_the_vendored_photo_encodes(backend) -> None:
    from scripts import llama_tools

    photo = llama_tools.require_source("tools/mtmd/test-1.jpeg")  # scripts/install.sh --test fetches the source: missing is a failure
    im = load_image(photo)
    assert im.width > 100 and im.height > 100
    with backend.stream_images("describe", [im], GREEDY, chat=False) as gen:
        list(gen)
    assert gen.stats.images == 1 and gen.stats.encode_ms > 0


def test_marker_count_and_missing_projector(vision_model) -> None:
    model, _ = vision_model
    b = LlamaCppBackend()
    try:
        b.load(model, LoadConfig(n_ctx=128, n_threads=1))
        from localllm.errors import UsageError

        with pytest.raises(UsageError, match="projector, and none is loaded"):
            b.stream_images("x", [decode_image(noise_png(1))], GREEDY, chat=False)
    finally:
        b.close()


def test_a_mismatched_projector_is_refused_before_libmtmd(vision_model, tmp_path: Path) -> None:
    from scripts.make_vision_model import ProjectorSpec, write_projector

    model, _ = vision_model
    wrong = write_projector(tmp_path / "mmproj-wrong.gguf", ProjectorSpec(n_embd_text=32))
    b = LlamaCppBackend()
    try:
        b.load(model, LoadConfig(n_ctx=128, n_threads=1))
        with pytest.raises(InputError, match="mmproj-wrong.gguf does not fit model model.gguf"):
            b.load_projector(wrong)
    finally:
        b.close()


def _two_turns(backend, picture: bytes) -> tuple[list, np.ndarray, int]:
    from localllm.chat.session import ChatSession

    session = ChatSession(backend, sampling=SamplingConfig(temperature=0, max_tokens=2))
    with session.send("what is it?", images=[decode_image(picture)]) as g:
        list(g)
    encoded = backend.projector.encoded
    with session.send("and now?") as g:
        list(g)
    assert backend.projector.encoded == encoded  # turn 2 encoded nothing
    return [t.stats for t in session.turns], backend.last_logits(), len(session.images)


def test_chat_keeps_the_image_in_the_cache(backend) -> None:
    backend.use_template("chatml")
    stats_a, logits_a, n_images = _two_turns(backend, noise_png(5))
    assert n_images == 1
    assert stats_a[0].images == 1 and stats_a[1].images == 0 and stats_a[1].encode_ms is None
    assert stats_a[1].prompt_tokens < stats_a[0].context_used  # only turn 2's own tokens were read
    stats_b, logits_b, _ = _two_turns(backend, noise_png(6))
    # turn 2 read no image, yet its logits depend on turn 1's: the image stayed in the cached prefix
    assert np.abs(logits_a - logits_b).max() > 1e-4
    _, logits_a2, _ = _two_turns(backend, noise_png(5))
    assert np.array_equal(logits_a, logits_a2)


def test_rewind_takes_the_turns_images_back(backend) -> None:
    from localllm.chat.session import ChatSession

    backend.use_template("chatml")
    session = ChatSession(backend, sampling=SamplingConfig(temperature=0, max_tokens=2))
    with session.send("first", images=[decode_image(noise_png(7))]) as g:
        list(g)
    with session.send("second, with another", images=[decode_image(noise_png(8))]) as g:
        list(g)
    assert len(session.images) == 2
    text = session.rewind()
    assert text is not None and text.endswith("second, with another") and len(session.images) == 1
    before = backend.projector.encoded
    with session.send("second, with a third", images=[decode_image(noise_png(9))]) as g:
        list(g)
    assert backend.projector.encoded == before + 1  # only the new picture: the first stayed in the cache
    assert len(session.images) == 2 and session.turns[-1].stats.images == 1
    session.clear()
    assert session.images == []


def test_a_conversation_read_again_decodes_kept_images_without_encoding(backend, vision_model) -> None:
    """When the cache no longer stands for the conversation (here: emptied; in life, a template that
    renders a reply differently), the session reads it all again: its images' embeddings were kept,
    and they are what a fresh encode gives."""
    from localllm.chat.session import ChatSession

    backend.use_template("chatml")
    picture = decode_image(noise_png(11))
    session = ChatSession(backend, sampling=SamplingConfig(temperature=0, max_tokens=2))
    with session.send("what is it?", images=[picture]) as g:
        list(g)
    encoded = backend.projector.encoded
    backend.reset()
    with session.send("and now?") as g:
        list(g)
    stats = session.turns[-1].stats
    assert backend.projector.encoded == encoded and stats.images == 0 and stats.encode_ms is None
    assert stats.prompt_tokens == stats.context_used - 1  # all of it read again (the reply's last token is not in the cache)
    kept = backend.last_logits()
    # the same conversation on a fresh projector, which must encode the picture
    with _another_engine(vision_model) as fresh:
        other = ChatSession(fresh, sampling=SamplingConfig(temperature=0, max_tokens=2), messages=list(session.messages[:2]), images=[picture])
        with other.send("and now?") as g:
            list(g)
        assert fresh.projector.encoded == 1 and other.turns[-1].stats.images == 1
        assert np.array_equal(kept, fresh.last_logits())


@contextmanager
def _another_engine(vision_model) -> Iterator[LlamaCppBackend]:
    """The synthetic vision model loaded again (another process's engine, as far as its caches go)."""
    model, proj = vision_model
    fresh = LlamaCppBackend()
    try:
        fresh.load(model, LoadConfig(n_ctx=256, n_threads=1))
        fresh.load_projector(proj)
        fresh.use_template("chatml")
        yield fresh
    finally:
        fresh.close()


def test_a_kept_cache_resumes_the_conversation_as_reading_it_again_would(backend, vision_model, tmp_path: Path) -> None:
    """chat.resume: the state kept after a reply, loaded into another process's engine with the
    conversation, gives the next turn the logits the first engine gave, and encodes nothing; a state
    kept for another text, other images or a damaged file is not used; a conversation without images is
    kept too (issue 61), with no image in its mark."""
    from localllm.chat import resume
    from localllm.chat.session import ChatSession

    backend.use_template("chatml")
    picture = decode_image(noise_png(12))
    session = ChatSession(backend, sampling=SamplingConfig(temperature=0, max_tokens=2))
    with session.send("what is it?", images=[picture]) as g:
        list(g)
    state = tmp_path / "chat.state"
    mark = resume.keep(session, state)
    assert mark is not None and mark["cells"] == session.context_used and state.stat().st_size > 0
    turn_one = list(session.messages)
    with session.send("and now?") as g:
        list(g)
    expected = backend.last_logits()
    with _another_engine(vision_model) as fresh:

        def reopened(messages: list) -> ChatSession:
            fresh.reset()
            return ChatSession(fresh, sampling=SamplingConfig(temperature=0, max_tokens=2), messages=list(messages), images=[picture])

        other = reopened(turn_one)
        assert resume.resume(other, state, mark) is None and other.context_used == mark["cells"]
        with other.send("and now?") as g:
            list(g)
        assert fresh.projector.encoded == 0 and other.turns[-1].stats.images == 0
        assert np.array_equal(expected, fresh.last_logits())
        edited = [*turn_one[:-1], {**turn_one[-1], "content": turn_one[-1]["content"] + "!"}]
        assert resume.resume(reopened(edited), state, mark) == "it was saved for another text of the conversation"
        other_picture = reopened(turn_one)
        other_picture.images = [decode_image(noise_png(13))]
        assert resume.resume(other_picture, state, mark) == "it was saved with other images"
        damaged = tmp_path / "damaged.state"
        damaged.write_bytes(state.read_bytes()[:-100])
        why = resume.resume(reopened(turn_one), damaged, mark)
        assert why is not None and why.startswith("its state file was ") and fresh.context_used == 0
        assert resume.resume(reopened(turn_one), tmp_path / "gone.state", mark) == "its state file is gone"
        text_only = ChatSession(fresh, sampling=SamplingConfig(temperature=0, max_tokens=2))
        with text_only.send("hello") as g:
            list(g)
        text_mark = resume.keep(text_only, tmp_path / "text.state")
        assert text_mark is not None and text_mark["images"] == [] and (tmp_path / "text.state").stat().st_size > 0


def test_a_kept_cache_mark_from_a_session_file_is_checked() -> None:
    from localllm.chat import resume

    good: dict[str, object] = {"text_sha256": "ab" * 32, "cells": 12, "images": ["cd" * 32]}
    assert resume.mark_of({**good, "extra": 1}) == good
    changes: tuple[dict[str, object], ...] = ({"text_sha256": "AB" * 32}, {"text_sha256": "ab" * 31}, {"cells": 0}, {"cells": True}, {"cells": "12"},
                   {"images": "cd" * 32}, {"images": ["cd" * 32, 5]}, {"images": None})
    for change in changes:
        assert resume.mark_of({**good, **change}) is None, change
    assert resume.mark_of(None) is None and resume.mark_of([good]) is None
    assert resume.mark_of({**good, "images": []}) == {**good, "images": []}  # a text conversation's (issue 61)

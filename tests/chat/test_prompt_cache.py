"""A damaged prompt cache is deleted and rebuilt, never trusted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import chat_once


@pytest.mark.slow
def test_damaged_prompt_cache_is_deleted_and_rebuilt(smollm2: Path) -> None:
    """A damaged state file aborted chat on every start, and one with tampered
    numbers loaded as a hit and gave empty replies. Now each is deleted and
    rebuilt with a one-line notice, and the reply is the same as before."""
    from localllm.chat.session import prompt_cache_path

    system = "You are a terse assistant. Answer in one word."
    first = chat_once(smollm2, system)
    assert first.returncode == 0, first.stderr[-2000:]
    cache = prompt_cache_path(smollm2, system, "f16", "f16", False)
    assert cache.exists()
    assert json.loads(chat_once(smollm2, system).stdout)["prompt_cache_hit"] is True

    def tamper(raw: bytes) -> bytes:
        start = raw.index(b'"tokens":[') + 10
        return raw[:start] + b"9" + raw[start + 1 :]

    damages = {
        "truncated": lambda raw: raw[: len(raw) // 3],
        "a flipped byte": lambda raw: raw[: len(raw) // 2] + bytes([raw[len(raw) // 2] ^ 0xFF]) + raw[len(raw) // 2 + 1 :],
        "tampered token numbers": tamper,
        "llama.cpp's own format (what localllm wrote before)": lambda raw: b"GGSQ" + raw[4:],
    }
    for what, damage in damages.items():
        cache.write_bytes(damage(cache.read_bytes()))
        proc = chat_once(smollm2, system)
        assert proc.returncode == 0, (what, proc.stderr[-2000:])
        turn = json.loads(proc.stdout)
        assert turn["prompt_cache_hit"] is False and turn["reply"] == json.loads(first.stdout)["reply"], what
        notes = [line for line in proc.stderr.splitlines() if "prompt cache" in line]
        assert len(notes) == 1 and "deleted, rebuilding it" in notes[0], (what, proc.stderr)
    assert json.loads(chat_once(smollm2, system).stdout)["prompt_cache_hit"] is True  # rebuilt, and good again

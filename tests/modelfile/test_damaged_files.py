"""Damaged model files: header values bounded before any per-layer work, each problem naming the file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scripts.fuzz_gguf import ARR, STR, U32, _replace_kv, _with_tensor, enc, enc_array
from tests.helpers.cli import cli, one_line
from tests.helpers.damaged_gguf import mutated


@pytest.mark.slow
def test_zero_layers_is_one_line_everywhere(synth_model: Path, tmp_path: Path) -> None:
    """block_count 0 aborted llama.cpp (GGML_ASSERT(n_layer_all > 0))."""
    f = mutated(synth_model, tmp_path, "zero.gguf", lambda m: _replace_kv(m, "block_count", U32, enc(U32, 0)))
    for cmd in (["inspect"], ["plan"], ["run", "--raw", "-p", "hi"]):
        one_line(cli(cmd[0], str(f), *cmd[1:], timeout=60), 1, str(f), "at least one layer")


@pytest.mark.slow
def test_absurd_layer_count_is_refused_at_once(synth_model: Path, tmp_path: Path) -> None:
    """2^31 layers in a small header made plan build per-layer lists for hours."""
    f = mutated(synth_model, tmp_path, "huge.gguf", lambda m: _replace_kv(m, "block_count", U32, enc(U32, 1 << 31)))
    t0 = time.perf_counter()
    one_line(cli("plan", str(f), timeout=60), 1, str(f), "block_count")
    assert time.perf_counter() - t0 < 30


@pytest.mark.parametrize(
    "name, change, needle",
    [
        ("short-array", lambda m: _replace_kv(m, "attention.head_count_kv", ARR, enc_array(U32, [2])), "has 1 entries for 2 layers"),
        ("bad-tensor-name", lambda m: _with_tensor(m, 1, name=b"blk.x.attn_q.weight"), "no layer number"),
        ("experts", lambda m: _replace_kv(m, "expert_used_count", U32, enc(U32, 2), add=True), "expert_used_count"),
        ("rope", lambda m: _replace_kv(m, "rope.scaling.type", STR, enc(STR, "bogus"), add=True), "rope.scaling.type"),
        ("wrong-type", lambda m: _replace_kv(m, "embedding_length", STR, enc(STR, "sixty-four")), "embedding_length is a string"),
    ],
)
@pytest.mark.slow
def test_model_file_problems_name_the_file(synth_model: Path, tmp_path: Path, name: str, change, needle: str) -> None:  # type: ignore[no-untyped-def]
    """These were an internal error (IndexError, ValueError) or a llama.cpp abort."""
    f = mutated(synth_model, tmp_path, f"{name}.gguf", change)
    for cmd in (["plan"], ["run", "--raw", "-p", "hi", "-n", "2"]):
        one_line(cli(cmd[0], str(f), *cmd[1:], timeout=60), 1, str(f), needle)
    proc = cli("list", env={"LOCALLLM_LMSTUDIO_DIR": str(tmp_path)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert any(f"{name}" in row and "unreadable" in row for row in proc.stdout.splitlines()), proc.stdout

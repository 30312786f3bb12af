"""Errors belong to their cause and nothing is printed raw: names, paths and metadata escaped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.fuzz_gguf import STR, _replace_kv, _with_tensor, enc, parse, serialize
from tests.helpers.cli import cli, one_line
from tests.helpers.damaged_gguf import mutated
from tests.helpers.paths import REPO


@pytest.mark.slow
def test_invalid_utf8_on_stdin_does_not_end_thechat_once(smollm2: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "localllm", "chat", str(smollm2), "-n", "3", "--temp", "0", "--json", "--ctx", "512"],
                          input=b"caf\xe9 \xff\xfe ok\nsecond line\n", capture_output=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    turns = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [t["user"] for t in turns] == ["caf\ufffd \ufffd\ufffd ok", "second line"]


@pytest.mark.slow
def test_names_paths_and_metadata_are_printed_escaped(synth_model: Path, tmp_path: Path) -> None:
    evil = "evil\x1b[2J\nlocalllm: forged line"
    folder = tmp_path / "models"
    folder.mkdir()
    f = folder / f"{evil}.gguf"
    f.write_bytes(serialize(_replace_kv(parse(synth_model), "general.name", STR, enc(STR, evil.encode()))))
    for args in (["inspect", str(f)], ["add", str(folder)], ["list"]):
        proc = cli(*args)
        assert proc.returncode == 0, proc.stderr
        for out in (proc.stdout, proc.stderr):
            assert "\x1b" not in out and "\nlocalllm: forged line" not in out, (args, out)
        assert "evil\\x1b[2J\\nlocalllm: forged line" in proc.stdout + proc.stderr, args
    # an error that names the path: still one line
    one_line(cli("inspect", str(tmp_path / f"{evil}-missing.gguf")), 1, "evil\\x1b[2J\\n")
    proc = cli("inspect", str(f), "--json")
    assert json.loads(proc.stdout)["name"] == evil  # JSON escapes on its own


@pytest.mark.slow
def test_a_huge_name_from_a_damaged_length_stays_one_short_line(synth_model: Path, tmp_path: Path) -> None:
    """A damaged length field made a tensor "name" of megabytes, which the error
    message quoted whole (74 MB for SmolLM2: inspect took minutes)."""
    f = mutated(synth_model, tmp_path, "long.gguf", lambda m: _with_tensor(m, 1, name=b"blk.0." + b"\x01" * 8_000_000))
    line = one_line(cli("inspect", str(f), timeout=60), 1, str(f), "longer than 63 bytes")
    assert len(line) < 600  # the path, the first 60 characters of the name, the reason

"""Where quantize writes: only a new path or a regular file (never through a
device, a FIFO or a link, --force or not); a dry run names the path it would
write; a short disk says what it needs, margin included."""

from __future__ import annotations

import json
import os
import stat
from collections import namedtuple
from pathlib import Path

import pytest

from localllm.errors import InputError
from localllm.quantize import pipeline
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli, one_line


@pytest.fixture
def f16(tmp_path: Path) -> Path:
    return write_llama_gguf(tmp_path / "tiny-F16.gguf", SynthSpec(dtype="f16"))


def _targets(tmp_path: Path) -> list[tuple[Path, str]]:
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    real = tmp_path / "real.gguf"
    real.write_bytes(b"keep me")
    link = tmp_path / "link.gguf"
    link.symlink_to(real)
    out = [(fifo, "a FIFO"), (link, "a symbolic link"), (tmp_path, "a directory")]
    if os.geteuid() == 0:  # a /dev/null of our own (char device 1:3), inside tmp_path
        dev = tmp_path / "null.gguf"
        os.mknod(dev, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        out.append((dev, "a device"))
    return out


@pytest.mark.slow
def test_output_onto_anything_but_a_regular_file_is_refused(f16: Path, tmp_path: Path) -> None:
    for target, kind in _targets(tmp_path):
        before = target.lstat()
        r = cli("quantize", str(f16), str(target), "--type", "Q8_0", "--force")
        assert r.returncode == 2 and f"is {kind}, not a regular file" in r.stderr, (target, r.stderr)
        after = target.lstat()
        assert (stat.S_IFMT(after.st_mode), after.st_ino) == (stat.S_IFMT(before.st_mode), before.st_ino), target
    assert (tmp_path / "real.gguf").read_bytes() == b"keep me"


@pytest.mark.slow
def test_a_regular_file_is_replaced_with_force(f16: Path, tmp_path: Path) -> None:
    out = tmp_path / "old.gguf"
    out.write_bytes(b"old")
    assert cli("quantize", str(f16), str(out), "--type", "Q8_0").returncode == 2  # exists: --force needed
    r = cli("quantize", str(f16), str(out), "--type", "Q8_0", "--force", "--json")
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size == json.loads(r.stdout)["output_bytes"] > 3


@pytest.mark.slow
def test_a_dry_run_names_the_path_it_would_write(f16: Path, tmp_path: Path) -> None:
    out = tmp_path / "would-Q8_0.gguf"
    text = cli("quantize", str(f16), str(out), "--type", "Q8_0", "--dry-run")
    assert text.returncode == 0 and f"output  {out} (dry run: would write)" in text.stdout
    d = json.loads(cli("quantize", str(f16), str(out), "--type", "Q8_0", "--dry-run", "--json").stdout)
    assert d["output"] == str(out) and d["dry_run"] is True and not out.exists()


def test_a_short_disk_says_what_it_needs_margin_included(f16: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(pipeline.shutil, "disk_usage", lambda _p: usage(1 << 30, 1 << 30, 1024))
    with pytest.raises(InputError) as info:
        list(pipeline.run(pipeline.Job(f16, tmp_path / "out.gguf", "Q8_0")))
    msg = str(info.value)
    assert "margin" in msg and "only 0.00 GiB" in msg and not (tmp_path / "out.gguf").exists()


@pytest.mark.slow
def test_quantize_takes_a_name_and_writes_into_localllms_own_folder(f16: Path) -> None:
    """A model found by name lives in another store (here: a folder given to
    ``add``; the Hugging Face cache, a package): the default output goes into
    localllm's own models folder, where ``list`` shows it, never beside the source."""
    assert cli("add", str(f16)).returncode == 0
    d = json.loads(cli("quantize", "tiny-F16", "--type", "Q8_0", "--dry-run", "--json").stdout)
    own = Path(os.environ["LOCALLLM_HOME"]) / "models"
    assert d["output"] == str(own / "tiny-Q8_0.gguf") and d["input"] == str(f16)
    r = cli("quantize", "tiny-F16", "--type", "Q8_0", "--json")
    assert r.returncode == 0, r.stderr
    assert (own / "tiny-Q8_0.gguf").is_file() and not (f16.parent / "tiny-Q8_0.gguf").exists()
    assert "tiny-Q8_0" in cli("list").stdout
    # a path still writes beside it, as before
    assert json.loads(cli("quantize", str(f16), "--type", "Q8_0", "--dry-run", "--json").stdout)["output"] == str(f16.parent / "tiny-Q8_0.gguf")


def test_a_folder_that_cannot_be_written_is_one_line_naming_it(f16: Path, tmp_path: Path) -> None:
    """Issue 45 item 9: llama.cpp said "basic_ios::clear: iostream error" after reading
    the whole source. A folder this user cannot write to (root writes through
    permission bits, so as root /proc: no file can be made there)."""
    if os.geteuid() == 0:
        folder = Path("/proc")
    else:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        line = one_line(cli("quantize", str(f16), str(folder / "out-Q8_0.gguf"), "--type", "Q8_0"), 1, f"cannot write to {folder}: ",
                        "name an output file in a folder you can write to")
        assert "basic_ios" not in line
    finally:
        if folder != Path("/proc"):
            folder.chmod(stat.S_IRWXU)
    one_line(cli("quantize", str(f16), str(f16 / "out-Q8_0.gguf"), "--type", "Q8_0"), 2, f"the output directory {f16} is not a directory")

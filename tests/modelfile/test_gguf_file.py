"""The fast header reader agrees with gguf.GGUFReader and rejects bad files in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import pytest

from localllm.errors import InputError
from localllm.modelfile.gguf_file import ArrayInfo, read_header


def _reader_fields(path: Path) -> dict:
    r = gguf.GGUFReader(str(path))
    out = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = f.contents() if len(f.types) == 1 or len(f.data) <= 4096 else ("array", len(f.data))
    return out, r


@pytest.mark.slow
@pytest.mark.parametrize("which", ["synth_model", "smollm2"])
def test_header_matches_gguf_reader(which: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(which)
    h = read_header(path)
    fields, reader = _reader_fields(path)
    assert set(h.fields) == set(fields)
    for key, expected in fields.items():
        got = h.fields[key]
        if isinstance(expected, tuple):
            assert isinstance(got, ArrayInfo) and got.length == expected[1], key
        elif isinstance(expected, float):
            assert got == pytest.approx(expected), key
        else:
            assert got == expected, key
    assert [t.name for t in h.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(h.tensors, reader.tensors):
        assert mine.type == theirs.tensor_type
        assert mine.n_elements == theirs.n_elements
        assert mine.n_bytes == theirs.n_bytes
        assert mine.offset == theirs.data_offset
        assert mine.shape == tuple(int(x) for x in theirs.shape)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        read_header(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        read_header(tmp_path)


def test_not_gguf(tmp_path: Path) -> None:
    p = tmp_path / "notes.gguf"
    p.write_text("this is a text file, not a model\n" * 10)
    with pytest.raises(InputError, match="not a GGUF file"):
        read_header(p)


def test_bad_version(tmp_path: Path, synth_model: Path) -> None:
    p = tmp_path / "v9.gguf"
    data = bytearray(synth_model.read_bytes())
    data[4:8] = (9).to_bytes(4, "little")
    p.write_bytes(bytes(data))
    with pytest.raises(InputError, match="version 9"):
        read_header(p)


@pytest.mark.parametrize("keep", [0.01, 0.5, 0.999])
def test_truncated(tmp_path: Path, synth_model: Path, keep: float) -> None:
    data = synth_model.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: max(24, int(len(data) * keep))])
    with pytest.raises(InputError, match="truncated"):
        read_header(p)


def test_intact_copy_is_fine(tmp_path: Path, synth_model: Path) -> None:
    p = tmp_path / "copy.gguf"
    shutil.copy(synth_model, p)
    assert len(read_header(p).tensors) == len(read_header(synth_model).tensors)

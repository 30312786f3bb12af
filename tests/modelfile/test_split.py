"""Split GGUFs (``PREFIX-00001-of-0000N.gguf``, as gguf-py and llama-gguf-split
write them): the header of the first part stands for the model with every
part's tensors and size, llama.cpp loads it from the first part, a missing part
or a later part given is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.errors import InputError
from localllm.modelfile.gguf_file import read_header
from localllm.store.modelname import split_names
from scripts.synth_gguf import SynthSpec, write_gguf
from tests.helpers.cli import cli


@pytest.fixture
def split(tmp_path: Path) -> tuple[Path, Path]:
    """The same model written whole (in its own folder) and split in three."""
    (tmp_path / "whole").mkdir()
    whole = write_gguf(tmp_path / "whole" / "m.gguf", SynthSpec())
    first = write_gguf(tmp_path / "m.gguf", SynthSpec(split_max_tensors=8))
    return whole, first


def test_the_first_part_stands_for_the_whole_model(split: tuple[Path, Path]) -> None:
    whole, first = split
    assert first.name == "m-00001-of-00003.gguf" and [p.name for p in sorted(first.parent.glob("m-*.gguf"))] == split_names(first.name)
    h, w = read_header(first), read_header(whole)
    assert sorted(t.name for t in h.tensors) == sorted(t.name for t in w.tensors)
    assert sum(t.n_bytes for t in h.tensors) == sum(t.n_bytes for t in w.tensors)
    assert h.size_bytes == sum(p.stat().st_size for p in first.parent.glob("m-*.gguf"))
    assert {t.part for t in h.tensors} == {0, 1, 2}


def test_a_missing_or_later_part_is_one_line(split: tuple[Path, Path]) -> None:
    _, first = split
    with pytest.raises(InputError, match="is part 2 of a model split in 3: give the first part"):
        read_header(first.with_name("m-00002-of-00003.gguf"))
    first.with_name("m-00003-of-00003.gguf").unlink()
    with pytest.raises(InputError, match="split in 3 parts and part 3 is missing"):
        read_header(first)


@pytest.mark.slow
def test_llama_cpp_loads_it_from_the_first_part_as_planned(split: tuple[Path, Path]) -> None:
    whole, first = split
    r = cli("run", str(first), "--raw", "-p", "The capital", "-n", "3", "--temp", "0", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["memory_check"]["ok"] is True
    same = json.loads(cli("run", str(whole), "--raw", "-p", "The capital", "-n", "3", "--temp", "0", "--json").stdout)
    assert d["text"] == same["text"]  # the same weights, whichever way they are stored
    p1 = json.loads(cli("plan", str(first), "--json", "--no-dry-run").stdout)
    p2 = json.loads(cli("plan", str(whole), "--json", "--no-dry-run").stdout)
    assert p1["weights_cpu_bytes"] == p2["weights_cpu_bytes"]

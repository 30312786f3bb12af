"""The store layer: registry.json is versioned and read tolerantly; one atomic
writer serves every file written whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localllm.store import registry
from localllm.util import atomic
from tests.helpers.cli import cli
from tests.helpers.paths import REPO

# -- registry.json: versioned, tolerant -------------------------------------------------


def _reg(home: Path) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    return home / "registry.json"


@pytest.mark.slow
def test_unknown_fields_are_kept_and_missing_ones_defaulted(synth_model: Path, _isolated_home: Path) -> None:
    reg = _reg(_isolated_home)
    reg.write_text(json.dumps({
        "version": 1, "favourites": ["x"],
        "added": [],
        "pulled": [{"repo_id": "a/b", "filename": "b-Q4_K_M.gguf", "signature": {"by": "future"}}],  # no revision, commit, etag, size...
    }))
    rec = registry.load_record()
    p = rec.pulled[0]
    assert (p["revision"], p["commit"], p["etag"], p["size"], p["stored"], p["pulled_at"]) == ("main", "", "", 0, True, 0.0)
    assert p["signature"] == {"by": "future"} and rec.extra == {"favourites": ["x"]}
    r = cli("add", str(synth_model))
    assert r.returncode == 0 and "malformed" not in r.stderr and "skipped" not in r.stderr, r.stderr  # unknown is not malformed
    data = json.loads(reg.read_text())
    assert data["version"] == registry.RECORD_VERSION and data["favourites"] == ["x"]
    assert data["pulled"][0]["signature"] == {"by": "future"} and data["added"] == [str(synth_model.resolve())]


@pytest.mark.slow
def test_a_record_without_version_or_lists_loads(_isolated_home: Path) -> None:
    _reg(_isolated_home).write_text("{}")
    rec = registry.load_record()
    assert (rec.added, rec.pulled, rec.version) == ([], [], registry.RECORD_VERSION)
    assert cli("list", "--json").returncode == 0


def test_a_newer_version_is_read_and_kept(synth_model: Path, _isolated_home: Path) -> None:
    reg = _reg(_isolated_home)
    reg.write_text(json.dumps({"version": 99, "added": [], "pulled": [], "tags": {"a": 1}}))
    r = cli("add", str(synth_model))
    assert r.returncode == 0 and "written by a newer localllm (version 99)" in r.stderr, r.stderr
    data = json.loads(reg.read_text())
    assert data["version"] == 99 and data["tags"] == {"a": 1} and len(data["added"]) == 1


@pytest.mark.parametrize("version", ["2", -1, True, None])
def test_a_bad_version_is_named_not_fatal(version: object) -> None:
    rec = registry.parse_record({"version": version, "added": ["/x.gguf"]}, "reg")
    assert rec.version == registry.RECORD_VERSION and rec.added == ["/x.gguf"]


# -- one atomic writer ------------------------------------------------------------------


def test_replacing_swaps_in_only_a_finished_file(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic.replacing(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
    with atomic.replacing(target, tmp_name=".out.bin.partial-1") as tmp:
        assert tmp.name == ".out.bin.partial-1" and not tmp.exists()
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_commit_and_write_text(tmp_path: Path) -> None:
    part = tmp_path / "blob.incomplete"
    part.write_bytes(b"data")
    atomic.commit(part, tmp_path / "blob")
    assert not part.exists() and (tmp_path / "blob").read_bytes() == b"data"
    atomic.write_text(tmp_path / "refs" / "main", "abc")
    assert (tmp_path / "refs" / "main").read_text() == "abc" and os.listdir(tmp_path / "refs") == ["main"]


def test_no_other_module_renames_files_into_place() -> None:
    """``os.replace``/``os.rename`` appear in the atomic helper and nowhere else in
    the product, except hf_cache's move of a verified blob where links fail."""
    allowed = {REPO / "localllm" / "util" / "atomic.py"}
    hits = []
    for folder in ("localllm", "quantize", "tui", "models"):
        for f in (REPO / folder).rglob("*.py"):
            if f in allowed:
                continue
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                if ("os.replace(" in line or "os.rename(" in line) and not line.lstrip().startswith("#"):
                    hits.append(f"{f.relative_to(REPO)}:{n}")
    assert len(hits) == 1 and hits[0].startswith("localllm/store/hf_cache.py:"), hits

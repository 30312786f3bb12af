"""``rm`` removes exactly one model: NAME forgets that model only (a file of an
added folder is hidden, its siblings stay, and adding the folder again does not
bring it back unless the file itself is added); FOLDER forgets the whole folder.
The files themselves are never touched: localllm did not store them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from localllm.store import registry
from tests.helpers.cli import cli


def _names() -> set[str]:
    r = cli("list", "--json")
    assert r.returncode == 0, r.stderr
    return {m["name"] for m in json.loads(r.stdout) if m["source"] == "added"}


@pytest.fixture
def folder(synth_model: Path, tmp_path: Path) -> Path:
    d = tmp_path / "mymodels"
    d.mkdir()
    for name in ("alpha-Q8_0.gguf", "beta-Q8_0.gguf", "gamma-Q8_0.gguf"):
        shutil.copy(synth_model, d / name)
    return d


@pytest.mark.slow
def test_rm_name_forgets_that_model_only(folder: Path) -> None:
    assert cli("add", str(folder)).returncode == 0
    assert _names() == {"alpha-q8_0", "beta-q8_0", "gamma-q8_0"}
    r = cli("rm", "beta-q8_0", "--yes")
    assert r.returncode == 0, r.stderr
    assert _names() == {"alpha-q8_0", "gamma-q8_0"} and (folder / "beta-Q8_0.gguf").exists()
    # adding the folder again keeps it hidden, and says so
    again = cli("add", str(folder))
    assert again.returncode == 0 and "1 model(s) removed with rm stay hidden" in again.stderr
    assert _names() == {"alpha-q8_0", "gamma-q8_0"}
    # adding the file itself brings it back
    assert cli("add", str(folder / "beta-Q8_0.gguf")).returncode == 0
    assert _names() == {"alpha-q8_0", "beta-q8_0", "gamma-q8_0"}


@pytest.mark.slow
def test_rm_folder_forgets_the_folder(folder: Path) -> None:
    assert cli("add", str(folder)).returncode == 0
    cli("rm", "alpha-q8_0", "--yes")
    r = cli("rm", str(folder), "--yes", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["action"] == "forget" and sorted(out["forgot"]) == ["beta-q8_0", "gamma-q8_0"] and out["deleted"] == []
    assert _names() == set() and len(list(folder.iterdir())) == 3
    rec = registry.load_record()
    assert rec.added == [] and rec.hidden == []  # nothing of the folder is left behind


@pytest.mark.slow
def test_rm_of_a_file_added_by_itself_forgets_it(synth_model: Path, tmp_path: Path) -> None:
    one = tmp_path / "solo-Q8_0.gguf"
    shutil.copy(synth_model, one)
    assert cli("add", str(one)).returncode == 0
    assert cli("rm", "solo-q8_0", "--yes").returncode == 0
    assert _names() == set() and registry.load_record().added == [] and one.exists()


def test_a_hidden_list_of_the_wrong_shape_is_ignored_with_a_notice() -> None:
    rec = registry.parse_record({"version": 1, "added": [], "pulled": [], "hidden": "oops"}, "test.json")
    assert rec.hidden == [] and "hidden" not in rec.to_dict()
    rec = registry.parse_record({"version": 1, "added": ["/a"], "pulled": [], "hidden": ["/a/x.gguf", 3]}, "test.json")
    assert rec.hidden == ["/a/x.gguf"] and rec.to_dict()["hidden"] == ["/a/x.gguf"]


def test_forgetting_a_folder_keeps_what_another_added_folder_hid(folder: Path) -> None:
    """Issue 45 item 6: ``add /tmp/x; rm base --yes; add /; rm / --yes`` emptied the
    hidden list, so ``base``, removed from the still-added /tmp/x, was listed again."""
    assert cli("add", str(folder)).returncode == 0
    assert cli("rm", "beta-q8_0", "--yes").returncode == 0
    parent = folder.parent
    assert cli("add", str(parent)).returncode == 0
    assert cli("rm", str(parent), "--yes").returncode == 0
    assert _names() == {"alpha-q8_0", "gamma-q8_0"}  # the folder still added still hides beta
    assert cli("rm", str(folder), "--yes").returncode == 0
    assert registry.load_record().hidden == []  # forgetting the last folder that listed it forgets it

"""registry.json of the wrong shape, and concurrent adds that lose nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import cli, one_line
from tests.helpers.paths import REPO


@pytest.mark.slow
def test_registry_of_the_wrong_shape(tmp_path: Path, synth_model: Path, _isolated_home: Path) -> None:
    reg = _isolated_home / "registry.json"
    reg.parent.mkdir(parents=True, exist_ok=True)
    reg.write_text("[1, 2, 3]")
    one_line(cli("add", str(synth_model)), 1, "not a localllm registry")
    assert reg.read_text() == "[1, 2, 3]"  # add wrote nothing before failing
    reg.write_text(json.dumps({"added": ["/nowhere.gguf", 7, None], "pulled": [{"repo_id": "a/b"}, "junk", {"repo_id": "a/b", "filename": "x.gguf"}]}))
    proc = cli("add", str(synth_model), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "skipped 4 malformed entries" in proc.stderr and "Traceback" not in proc.stderr
    data = json.loads(reg.read_text())
    assert data["added"] == ["/nowhere.gguf", str(synth_model.resolve())]
    assert [p["filename"] for p in data["pulled"]] == ["x.gguf"] and data["pulled"][0]["stored"] is True
    assert cli("list").returncode == 0


@pytest.mark.slow
def test_eight_adds_at_once_lose_nothing(tmp_path: Path, synth_model: Path, _isolated_home: Path) -> None:
    files = []
    for i in range(8):
        f = tmp_path / f"model-{i}.gguf"
        f.write_bytes(synth_model.read_bytes())
        files.append(f)
    procs = [subprocess.Popen([sys.executable, "-m", "localllm", "add", str(f)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for f in files]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    data = json.loads((_isolated_home / "registry.json").read_text())
    assert sorted(data["added"]) == sorted(str(f.resolve()) for f in files)
    assert not list(_isolated_home.glob(".registry.json.tmp-*"))

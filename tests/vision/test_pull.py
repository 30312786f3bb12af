"""``pull`` of a vision repo fetches the model's projector too, and ``run`` finds it beside the model."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from localllm.store.modelname import pick_projector
from tests.helpers.cli import cli
from tests.helpers.fake_hub import FakeHub
from tests.vision.conftest import noise_png

REPO_ID = "acme/SynthVision-GGUF"


def test_pick_projector_as_hf_picks_it() -> None:
    files = [("mmproj-model-f32.gguf", 200), ("mmproj-model-f16.gguf", 100), ("sub/mmproj-x.gguf", 1), ("model-Q4_0.gguf", 5)]
    assert pick_projector("model-Q4_0.gguf", files) == "mmproj-model-f16.gguf"
    assert pick_projector("sub/model.gguf", files) == "sub/mmproj-x.gguf"  # the model's own folder only
    assert pick_projector("other/model.gguf", files) is None
    assert pick_projector("model.gguf", [("model.gguf", 1)]) is None


@pytest.fixture
def hub(vision_model, monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]):
    model, proj = vision_model
    h = FakeHub().start()
    h.add(REPO_ID, "SynthVision-F32.gguf", model)
    h.add(REPO_ID, "mmproj-SynthVision-F32.gguf", proj)
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    hf_hub_env()
    yield h
    h.stop()


@pytest.mark.slow
def test_pull_brings_the_projector_and_run_uses_it(hub: FakeHub, vision_model, tmp_path: Path) -> None:
    _, proj = vision_model
    r = cli("pull", f"{REPO_ID}:F32", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["projector"] is not None and Path(out["projector"]).read_bytes() == proj.read_bytes()
    assert Path(out["projector"]).parent == Path(out["path"]).parent  # the same snapshot
    listed = json.loads(cli("list", "--json").stdout)
    names = [m["name"] for m in listed]
    assert not any("mmproj" in n for n in names)  # a projector is never listed as a model
    pic = tmp_path / "p.png"
    pic.write_bytes(noise_png(1))
    run = cli("run", out["name"], "-p", "hi", "-n", "1", "--temp", "0", "--ctx", "256", "--threads", "1", "--image", str(pic), "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["images"] == 1
    listed_vision = [m for m in json.loads(cli("list", "--json").stdout) if m["name"] == out["name"]]
    assert listed_vision and listed_vision[0]["projector"] is not None
    assert f"{out['name']} (vision)" in cli("list").stdout

"""``pull`` of an audio repo fetches the model's audio projector too, ``run --audio``
finds it beside the model, and ``list`` says the model takes audio."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.cli import cli
from tests.helpers.fake_hub import FakeHub

REPO_ID = "acme/SynthUltravox-GGUF"


@pytest.fixture
def hub(smollm2: Path, audio_projector: Path, monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]):
    h = FakeHub().start()
    h.add(REPO_ID, "SynthUltravox-Q4_1.gguf", smollm2)
    h.add(REPO_ID, "mmproj-SynthUltravox-f16.gguf", audio_projector)
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    hf_hub_env()
    yield h
    h.stop()


@pytest.mark.slow
def test_pull_brings_the_audio_projector_and_run_uses_it(hub: FakeHub, audio_projector: Path, speech_wav: Path) -> None:
    r = cli("pull", f"{REPO_ID}:Q4_1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["projector"] is not None and Path(out["projector"]).read_bytes() == audio_projector.read_bytes()
    assert Path(out["projector"]).parent == Path(out["path"]).parent  # the same snapshot
    run = cli("run", out["name"], "-p", "What did you hear?", "-n", "1", "--temp", "0", "--ctx", "1024", "--threads", "1",
              "--audio", str(speech_wav), "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["audio"]["clips"][0]["name"] == speech_wav.name
    assert f"{out['name']} (audio)" in cli("list").stdout

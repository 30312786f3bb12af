"""A hostile Hub cannot write or delete outside the Hugging Face cache.

The server's commit id, file names and sizes, its redirects and whatever sits in
the cache already are untrusted. Each case runs ``localllm pull`` for real
against a loopback hub that lies, and checks that the command fails with one
line (exit 1, no traceback, no raw control characters) and that nothing was
written outside the cache folder, nor any link made that points outside it.

Each pull runs in this process (``cli``); the ``hf_hub_env`` fixture points
huggingface_hub, which reads its endpoint and cache settings when first
imported, at the hub of each test. What a hostile hub can make last is bounded
by the command itself (redirects, retries, time-outs), as for a user.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli
from tests.helpers.fake_hub import FakeHub

REPO_ID = "acme/Synth-GGUF"
GOOD = "0123456789abcdef0123456789abcdef01234567"

# every test: what reaches the Hub in-process goes to this test's endpoint, never elsewhere
pytestmark = pytest.mark.usefixtures("hf_hub_env")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("hostile") / "Synth-Q8_0.gguf", SynthSpec(n_layer=1, n_embd=64, n_ff=128))


@pytest.fixture
def hub(model_file: Path, monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]):
    h = FakeHub().start()
    h.add(REPO_ID, "Synth-Q8_0.gguf", model_file)
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    hf_hub_env()
    yield h
    h.stop()


def cache() -> Path:
    return Path(os.environ["HF_HOME"]) / "hub"


def scratch() -> Path:
    """The test's tmp folder: the cache, localllm's home and an 'outside' live here."""
    return Path(os.environ["HF_HOME"]).parent


def links_leaving(root: Path) -> list[Path]:
    """Every symlink under ``scratch()`` whose target resolves outside ``root``."""
    out = []
    for p in scratch().rglob("*"):
        if p.is_symlink() and not p.resolve().is_relative_to(root.resolve()):
            out.append(p)
    return out


def files_outside() -> list[Path]:
    """What a pull may have written outside the cache and localllm's home."""
    keep = (cache(), Path(os.environ["LOCALLLM_HOME"]))
    return [p for p in scratch().rglob("*") if (p.is_file() or p.is_symlink()) and not any(p.is_relative_to(k) for k in keep) and p.name != "marker"]


def one_line_failure(r, *words: str) -> None:
    err = r.stderr
    assert r.returncode == 1, (r.returncode, err)
    assert "Traceback" not in err and "internal error" not in err, err
    assert "\x1b" not in err and "\x07" not in err, repr(err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) <= 2, err  # the failure, and at most a 'skipped' notice before it
    for w in words:
        assert w in lines[-1], err


@pytest.mark.parametrize(
    "commit",
    [
        "../../../../outside",
        "../" * 6 + "a" * 20,
        "0123456789abcdef0123456789abcdef0123456/",
        "ABCDEF0123456789abcdef0123456789abcdef01",
        "\x1b[31m" + "0" * 35,
    ],
)
@pytest.mark.slow
def test_a_commit_id_that_is_not_40_hex_digits_writes_nothing(hub: FakeHub, commit: str) -> None:
    hub.commit = commit
    r = cli("pull", REPO_ID, "--file", "Synth-Q8_0.gguf")
    one_line_failure(r, "invalid commit id")
    assert not any(cache().rglob("*.gguf")) and not list(cache().rglob("blobs/*"))
    assert files_outside() == [] and links_leaving(cache()) == []
    assert not [rq for rq in hub.requests if rq[1].startswith("/cdn/")]  # refused before downloading


HOSTILE_NAMES = [
    "../../../../outside/evil-Q4_K_M.gguf",
    "/tmp/evil-Q4_K_M.gguf",
    "sub/../../../evil-Q4_K_M.gguf",
    "..\\..\\evil-Q4_K_M.gguf",
    "\x1b[2J\x1b[31mevil-Q4_K_M.gguf",
    "forged\nlocalllm: all good-Q4_K_M.gguf",
]


@pytest.mark.slow
def test_unsafe_names_in_the_listing_are_never_picked(hub: FakeHub, model_file: Path) -> None:
    size = model_file.stat().st_size
    hub.extra_tree = [{"type": "file", "path": n, "size": size, "oid": "0" * 40} for n in HOSTILE_NAMES]
    r = cli("pull", f"{REPO_ID}:Q4_K_M")
    one_line_failure(r, "has no Q4_K_M file")
    assert "skipped 6 file(s)" in r.stderr
    # only the safe file is offered, and only a safe one is downloaded by --vram
    r2 = cli("pull", REPO_ID, "--vram", "64GiB", "--json")
    assert r2.returncode == 0, r2.stderr
    assert '"filename": "Synth-Q8_0.gguf"' in r2.stdout
    requested = [rq[1] for rq in hub.requests]
    assert not [p for p in requested if "evil" in p or "forged" in p]
    assert files_outside() == [] and links_leaving(cache()) == []


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["x\x1b[31m.gguf", "a\nb.gguf", "~/x.gguf", "a/./b.gguf"])
def test_a_user_file_name_with_control_characters_is_a_usage_error(hub: FakeHub, bad: str) -> None:
    r = cli("pull", REPO_ID, "--file", bad)
    assert r.returncode == 2 and "\x1b" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, repr(r.stderr)
    assert hub.requests == []


@pytest.mark.slow
@pytest.mark.parametrize("delta", [-1000, +1000])
def test_a_wrong_size_keeps_nothing(hub: FakeHub, delta: int) -> None:
    hub.size_delta = delta
    r = cli("pull", REPO_ID, "--file", "Synth-Q8_0.gguf")
    one_line_failure(r)
    if delta < 0:
        assert "more than the" in r.stderr
        assert not list(cache().rglob("blobs/*"))  # the oversized partial is gone
    assert not any(cache().rglob("*.gguf"))
    assert files_outside() == [] and links_leaving(cache()) == []


@pytest.mark.slow
@pytest.mark.parametrize("where", ["cdn", "resolve"])
def test_a_redirect_loop_is_one_line_not_a_hang(hub: FakeHub, where: str) -> None:
    hub.redirect_loop = where
    r = cli("pull", REPO_ID, "--file", "Synth-Q8_0.gguf")
    one_line_failure(r)
    assert "redirect" in r.stderr
    assert not any(cache().rglob("*.gguf"))


@pytest.mark.slow
def test_a_link_planted_in_the_cache_cannot_redirect_the_write(hub: FakeHub) -> None:
    outside = scratch() / "outside"
    outside.mkdir()
    (outside / "marker").write_text("the user's file")
    snaps = cache() / "models--acme--Synth-GGUF" / "snapshots"
    snaps.mkdir(parents=True)
    (snaps / GOOD).symlink_to(outside, target_is_directory=True)
    r = cli("pull", REPO_ID, "--file", "Synth-Q8_0.gguf")
    one_line_failure(r, "resolves outside")
    assert [p.name for p in outside.iterdir()] == ["marker"]
    assert (outside / "marker").read_text() == "the user's file"


@pytest.mark.slow
def test_a_planted_partial_link_is_not_appended_to(hub: FakeHub, model_file: Path) -> None:
    import hashlib

    victim = scratch() / "marker"
    victim.write_text("the user's file")
    sha = hashlib.sha256(model_file.read_bytes()).hexdigest()
    blobs = cache() / "models--acme--Synth-GGUF" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha}.incomplete").symlink_to(victim)
    r = cli("pull", REPO_ID, "--file", "Synth-Q8_0.gguf")
    one_line_failure(r, "is a link or resolves outside")
    assert victim.read_text() == "the user's file"


@pytest.mark.slow
def test_a_good_pull_still_works_after_the_checks(hub: FakeHub, model_file: Path) -> None:
    r = cli("pull", REPO_ID, "--file", "Synth-Q8_0.gguf", "--json")
    assert r.returncode == 0, r.stderr
    dest = cache() / "models--acme--Synth-GGUF" / "snapshots" / GOOD / "Synth-Q8_0.gguf"
    assert dest.is_symlink() and dest.read_bytes() == model_file.read_bytes()
    assert links_leaving(cache()) == []

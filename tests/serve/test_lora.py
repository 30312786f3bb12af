"""LoRA adapters on ``serve`` (issue 47, item 5): ``GET``/``POST /lora-adapters``
and the per-request ``lora`` field, side by side with the real llama-server on
the same synthetic model and adapters (scripts/synth_gguf.py ``write_lora_gguf``):
the same lists, the same answers to POST, the same greedy text under each
adapter set. Two concurrent requests with different adapters each get their own
adapter's text (the scheduler decodes one adapter set per step, as llama-server
batches only slots with equal lora). Bad input is a 400 with the server up."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest

from localllm.engine_api import SamplingConfig
from localllm.serve.prometheus import ServerMetrics
from localllm.serve.scheduler import Job, Scheduler
from scripts import llama_tools
from scripts.synth_gguf import SynthSpec, write_llama_gguf, write_lora_gguf
from tests.helpers.cli import cli
from tests.helpers.server import KEY, Server, http_client
from tests.helpers.workers import free_port

FLAGS = ("-np", "2", "-c", "512", "-t", "1")
PROMPT = "the cat sat on the"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("lora-serve")
    return {"model": write_llama_gguf(d / "base.gguf", SynthSpec()), "a": write_lora_gguf(d / "a.gguf"),
            "b": write_lora_gguf(d / "b.gguf", seed=2, targets=("attn_k", "ffn_up", "ffn_down")),
            "embd32": write_lora_gguf(d / "embd32.gguf", SynthSpec(n_embd=32))}


@pytest.fixture(scope="module")
def servers(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    """Ours and llama-server, each with adapter a (id 0) at 1 and b (id 1) at 0.5."""
    lora = ("--lora", str(files["a"]), "--lora-scaled", f"{files['b']}:0.5")
    port = free_port()
    theirs = subprocess.Popen([str(llama_tools.require("llama-server")), "-m", str(files["model"]), *lora, *FLAGS, "--no-warmup",
                               "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ours = None
    try:
        ours = Server(str(files["model"]), *lora, *FLAGS, "--api-key", KEY, env={"LOCALLLM_HOME": str(tmp_path_factory.mktemp("home"))})
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert theirs.poll() is None, "llama-server exited"
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(base + "/health", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.05)
        yield ours, base
    finally:
        theirs.kill()
        theirs.wait()
        if ours is not None:
            ours.stop()


def _text(client: httpx2.Client, lora: list[dict] | None = None, n: int = 12) -> str:
    """Greedy text with ``lora``. No prompt cache: llama-server reuses a slot's cells
    made under another adapter set when a request has no ``lora`` of its own (its
    launch_slot_with_task clears them only for a request's own list), and a prompt
    read in a batch of other length may round differently at a near tie."""
    body = {"prompt": PROMPT, "n_predict": n, "temperature": 0, "cache_prompt": False, **({"lora": lora} if lora is not None else {})}
    r = client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()["content"]


def test_lora_adapters_routes_and_per_request_lora_as_llama_server(servers: tuple[Server, str]) -> None:
    ours, base = servers
    with http_client(ours) as mine, httpx2.Client(base_url=base, timeout=120) as theirs:
        listed = mine.get("/lora-adapters").json()
        assert listed == theirs.get("/lora-adapters").json()  # id, path, scale, task_name, prompt_prefix
        assert [(x["id"], x["scale"]) for x in listed] == [(0, 1.0), (1, 0.5)]
        configs: list[list[dict] | None] = [None, [{"id": 0, "scale": 0}], [{"id": 1, "scale": 1.0}],
                                            [{"id": 0, "scale": 0.5}, {"id": 1, "scale": 0.5}], []]
        got = [_text(mine, c) for c in configs]
        assert got == [_text(theirs, c) for c in configs]
        assert len(set(got[:4])) == 4 and got[4] == got[0]  # each set its own text; [] is the server's scales
        try:
            # POST: the listed ids at their scales, the others at 0; a request's own lora still wins
            for c in (mine, theirs):
                r = c.post("/lora-adapters", json=[{"id": 1, "scale": 1.0}])
                assert (r.status_code, r.json()) == (200, {"success": True})
            assert mine.get("/lora-adapters").json() == theirs.get("/lora-adapters").json()
            assert [x["scale"] for x in mine.get("/lora-adapters").json()] == [0.0, 1.0]
            assert _text(mine) == _text(theirs) == got[2]
            assert _text(mine, [{"id": 0, "scale": 0}]) == got[1]
        finally:
            for c in (mine, theirs):
                c.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])


def test_concurrent_requests_with_different_adapters_each_get_their_own(servers: tuple[Server, str]) -> None:
    ours, _ = servers
    sets = [[{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 1.0}], [{"id": 0, "scale": 0.0}]]  # -np 2: two at once, one waits
    with http_client(ours) as c:
        alone = [_text(c, s, n=24) for s in sets]
        assert len(set(alone)) == 3
        with ThreadPoolExecutor(len(sets)) as pool:
            together = list(pool.map(lambda s: _text(c, s, n=24), sets))
    # A step of two sequences runs other kernels than a step of one, so greedy
    # text may part from the lone run's after a near tie (once, in a loaded
    # run); another adapter's delta would change it from the first tokens. Each
    # reply shares a longer start with its own adapter's lone reply than with any other.
    for i, text in enumerate(together):
        own = _common(text, alone[i])
        assert own >= 8 and all(own > _common(text, other) for j, other in enumerate(alone) if j != i), (i, together, alone)


def _common(a: str, b: str) -> int:
    """The length of the start ``a`` and ``b`` share."""
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_bad_lora_input_is_a_400_and_the_server_stays_up(servers: tuple[Server, str]) -> None:
    ours, _ = servers
    with http_client(ours) as c:
        bad = {
            "path": [{"path": "/etc/passwd", "scale": 1}],
            "no adapter has id 7": [{"id": 7, "scale": 1}],
            "'lora' must be a list": {"id": 0},
            "lora[0].scale": [{"id": 0, "scale": "x"}],
            "lora[0].id": [{"id": -1, "scale": 1}],
        }
        for words, lora in bad.items():
            r = c.post("/completion", json={"prompt": PROMPT, "n_predict": 2, "lora": lora})
            assert r.status_code == 400 and words in r.json()["error"]["message"], (words, r.text)
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "lora": [{"id": 0, "scale": float("1e9")}]})
        assert r.status_code == 400
        for body, words in (([{"id": 9, "scale": 1}], "no adapter has id 9"), ({"id": 0}, "must be an array"), ("[", "not valid JSON")):
            r = c.post("/lora-adapters", content=body if isinstance(body, str) else None, json=None if isinstance(body, str) else body)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        assert c.post("/lora-adapters", content=b"[" + b"1," * 40000 + b"1]").status_code == 413
        assert c.get("/health").status_code == 200
        assert [x["scale"] for x in c.get("/lora-adapters").json()] == [1.0, 0.5]  # nothing changed


def test_serve_refuses_a_wrong_adapter_before_listening_and_lora_in_router_mode(files: dict[str, Path]) -> None:
    r = cli("serve", str(files["model"]), "--lora", str(files["embd32"]), "--port", "0")
    assert r.returncode == 1 and "embedding size of 32" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    r = cli("serve", "--lora", str(files["a"]), "--port", "0")
    assert r.returncode == 2 and "give serve a MODEL" in r.stderr, r.stderr


class _Model:
    """The scheduler's seam, recording each decode's sequences and the adapter scales set for it."""

    def __init__(self) -> None:
        self.scales: tuple[float, ...] = ()
        self.steps: list[tuple[tuple[float, ...], set[int]]] = []

    def set_lora(self, scales) -> None:
        self.scales = tuple(scales)

    def seq_rm(self, seq, p0=0, p1=-1):
        return True

    def seq_cp(self, src, dst, n):
        pass

    def new_sampler(self, sampling, prompt=()):
        return object()

    def free_sampler(self, sampler):
        pass

    def decode(self, entries):
        self.steps.append((self.scales, {seq for _, _, seq, _ in entries}))

    def sample_all(self, picks):
        return [5 for _ in picks]

    def is_eog(self, tok):
        return False

    def piece(self, tok):
        return b"x"


def test_scheduler_decodes_one_adapter_set_per_step_and_reuses_prefixes_only_under_it() -> None:
    model = _Model()
    sched = Scheduler(model, n_seq=3, n_ctx_seq=64, n_batch=32, prefix_reuse=True, max_queue=8, prefill_chunk=32,  # type: ignore[arg-type]
                      metrics=ServerMetrics(), adapters=[("a.gguf", 1.0), ("b.gguf", 0.0)])

    def job(lora: dict[int, float] | None, tokens: tuple[int, ...] = (1, 2, 3, 4)) -> Job:
        j = Job(tokens=list(tokens), sampling=SamplingConfig(temperature=0, max_tokens=4), max_tokens=4, emit=lambda k, p: None, lora=lora)
        assert sched.submit(j)
        return j

    jobs = [job(None), job({1: 1.0}), job({0: 1.0})]  # None: the server's (1, 0), the same set as {0: 1}
    for _ in range(40):
        sched._step()
    assert all(j.ended for j in jobs)
    assert [j.lora_scales for j in jobs] == [(1.0, 0.0), (0.0, 1.0), (1.0, 0.0)]
    slots = {j.slot: j.lora_scales for j in jobs}
    for scales, seqs in model.steps:
        assert {slots[s] for s in seqs} == {scales}  # one set per decode, the one set on the context
    assert {scales for scales, _ in model.steps} == {(1.0, 0.0), (0.0, 1.0)}
    assert max(len(seqs) for _, seqs in model.steps) == 2  # the two requests with the same set shared steps
    again = job({1: 1.0}, (1, 2, 3, 4, 9))
    other = job({1: 0.5}, (1, 2, 3, 4, 9))
    for _ in range(40):
        sched._step()
    assert again.n_cached == 4 and other.n_cached == 0  # cells made under another set are not reused
    errors: list[object] = []
    bad = Job(tokens=[1], sampling=SamplingConfig(), max_tokens=1, emit=lambda k, p: errors.append((k, p)), lora={5: 1.0})
    sched.submit(bad)
    sched._step()
    assert errors and errors[0][0] == "error" and "no adapter has id 5" in str(errors[0][1])

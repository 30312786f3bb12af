"""``POST /infill`` (issue 47, item 3): the prompt built from the model's FIM tokens
token for token as llama-server builds it (``format_prompt_infill``), checked
against the real llama-server on the same synthetic vocabularies: llama-server's
prompt tokens are read back from its slot file (``/slots/0?action=save`` writes
them first), ours from ``serve.infill.build_prompt`` and from the route's answer
(its count, its text, and its greedy continuation, which our ``/completion``
repeats from llama-server's tokens)."""

from __future__ import annotations

import contextlib
import json
import struct
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import pytest

from localllm.engine.fim import FimTokens, fim_tokens
from localllm.engine.tokenizer import Tokenizer
from localllm.serve.infill import MAX_EXTRA_CHUNKS, build_prompt, parse
from scripts import llama_tools
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.server import KEY, Server, http_client
from tests.helpers.workers import free_port

ALL = ("pre", "suf", "mid", "rep", "sep", "pad")
# a context and a batch small enough that the budgets cut: the prefix keeps 48 tokens, the suffix 16 less
# the prompt and two, the extra context 512 - 64 - 2*64 = 320 (-n 64: llama-server's params.n_predict, serve's -n)
SIZES = ("-c", "512", "-b", "64", "-np", "1", "-n", "64", "-t", "1")
LONG = "".join(f"line {i}: the cat sat on the mat\n" for i in range(40))
BODIES: dict[str, dict[str, Any]] = {
    "plain": {"input_prefix": "def hello():\n    ", "input_suffix": "\n    return x\n", "prompt": "pri"},
    "extra": {"input_prefix": "import os\n", "input_suffix": "", "prompt": "",
              "input_extra": [{"filename": "a.py", "text": "x = 1\n"}, {"text": "héllo ✓ <|fim_pad|>\n"}, {"filename": "", "text": ""}]},
    "long": {"input_prefix": LONG, "input_suffix": LONG, "prompt": "the<|fim_pad|>",  # special text: parsed in the prompt only
             "input_extra": [{"filename": f"f{i}.txt", "text": LONG} for i in range(3)]},
    "mixed": {"input_prefix": ["def f", 42, "():"], "input_suffix": [7, "\n"], "input_extra": []},
}


def _slot_tokens(path: Path) -> list[int]:
    """The tokens of a llama-server slot file: llama_state_seq_save_file's header (magic,
    version, count) then the server's packed tokens (server_tokens::serialize: -1, its
    version 1, the count, the ids)."""
    raw = path.read_bytes()
    _, _, n = struct.unpack("<III", raw[:12])
    words = struct.unpack(f"<{n}i", raw[12:12 + 4 * n])
    assert words[:2] == (-1, 1), words[:4]
    return list(words[3:3 + words[2]])


class LlamaServer:
    def __init__(self, model: Path, slots: Path, *extra: str) -> None:
        self.port, self.slots = free_port(), slots
        slots.mkdir()
        self.proc = subprocess.Popen([str(llama_tools.require("llama-server")), "-m", str(model), *SIZES, "--no-warmup", "--port", str(self.port),
                                      "--host", "127.0.0.1", "--slot-save-path", str(slots), *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.base = f"http://127.0.0.1:{self.port}"

    def wait(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(self.base + "/health", timeout=5).status_code == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError("llama-server did not start")

    def infill(self, body: dict) -> tuple[dict, list[int]]:
        """Its answer to ``body`` (one token, greedy) and the prompt tokens it evaluated."""
        r = httpx2.post(self.base + "/infill", json={**body, "n_predict": 1, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        name = f"s{time.monotonic_ns()}.bin"
        saved = httpx2.post(self.base + "/slots/0?action=save", json={"filename": name}, timeout=60)
        assert saved.status_code == 200, saved.text
        return r.json(), _slot_tokens(self.slots / name)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fim")
    return {"all": write_llama_gguf(d / "fim.gguf", SynthSpec(fim=ALL)),  # Qwen2.5-Coder's six: the repository-level layout
            "three": write_llama_gguf(d / "fim3.gguf", SynthSpec(fim=("pre", "suf", "mid"))),  # no FIM_SEP: "--- snippet ---"
            "none": write_llama_gguf(d / "plain.gguf", SynthSpec())}


@pytest.fixture(scope="module")
def llama(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LlamaServer]]:
    d = tmp_path_factory.mktemp("llama-slots")
    servers = {"psm": LlamaServer(models["all"], d / "psm"), "spm": LlamaServer(models["all"], d / "spm", "--spm-infill"),
               "three": LlamaServer(models["three"], d / "three")}
    try:
        for s in servers.values():
            s.wait()
        yield servers
    finally:
        for s in servers.values():
            s.stop()


@pytest.fixture(scope="module")
def ours(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """serve on the six-token vocabulary with --spm-infill, and on one with no FIM tokens, started side by side."""
    def start(model: Path, *extra: str) -> Server:
        home = str(tmp_path_factory.mktemp("serve-home"))
        return Server(str(model), *SIZES, "--temp", "0", "--api-key", KEY, *extra, env={"LOCALLLM_HOME": home})

    with ThreadPoolExecutor(2) as pool:
        spm, plain = pool.submit(start, models["all"], "--spm-infill"), pool.submit(start, models["none"])
        servers = {"spm": spm.result(), "none": plain.result()}
    yield servers
    for s in servers.values():
        s.stop()


@contextlib.contextmanager
def _vocab(path: Path) -> Iterator[Tokenizer]:
    """``path``'s vocabulary alone (llama.cpp's vocab_only), in this process."""
    from tests.helpers.vocab import vocab_only

    with vocab_only(path) as vocab:
        yield Tokenizer(vocab, None)


def _build(tok: Tokenizer, body: dict, *, spm: bool) -> list[int]:
    req = parse(body, tok.n_vocab)
    return build_prompt(fim_tokens(tok), lambda t, add, special: tok.tokenize(t, add_special=add, parse_special=special), req,
                        n_batch=64, n_ctx=512, n_predict=64, spm=spm)


@pytest.mark.slow
def test_prompt_is_llama_servers_token_for_token(models, llama) -> None:
    """Every body on the three llama-servers (prefix-suffix-middle, --spm-infill, no FIM_SEP):
    our builder's tokens are the ones llama-server evaluated, truncations included."""
    for kind, model, spm in (("psm", "all", False), ("spm", "all", True), ("three", "three", False)):
        with _vocab(models[model]) as tok:
            fim = fim_tokens(tok)
            for name, body in BODIES.items():
                answer, theirs = llama[kind].infill(body)
                assert _build(tok, body, spm=spm) == theirs, (kind, name)
                assert answer["tokens_evaluated"] == len(theirs)
                assert theirs[-1] == fim.mid and fim.pre in theirs and fim.suf in theirs
                if name == "long":  # cut: the extra context's start (FIM_REP or the first snippet line) is gone
                    assert theirs[0] not in (fim.rep, fim.bos) and len(theirs) < 512, kind
    assert fim == FimTokens(pre=358, suf=359, mid=360, bos=1)  # the last read: fim3.gguf, no rep/sep/pad


@pytest.mark.slow
def test_route_answers_as_llama_server(llama, ours) -> None:
    """serve --spm-infill's /infill against llama-server --spm-infill: the same prompt (its
    count and text; greedy, the continuation our /completion gives llama-server's tokens),
    llama-server's /completion keys, streamed as /completion streams."""
    with http_client(ours["spm"]) as c:
        for name in ("long", "plain"):  # plain last: its answer is the streamed one's reference
            body = BODIES[name]
            theirs, tokens = llama["spm"].infill(body)
            mine = c.post("/infill", json={**body, "n_predict": 4, "temperature": 0, "cache_prompt": False})
            assert mine.status_code == 200, mine.text
            a = mine.json()
            assert set(theirs) <= set(a), set(theirs) - set(a)
            assert a["tokens_evaluated"] == len(tokens) and a["prompt"] == theirs["prompt"] and a["tokens_predicted"] == 4
            again = c.post("/completion", json={"prompt": tokens, "n_predict": 4, "temperature": 0, "cache_prompt": False}).json()
            assert a["content"] == again["content"], name
            assert "x-ignored-fields" not in mine.headers  # /infill's own fields are not reported as ignored
        r = c.post("/infill", json={**BODIES["plain"], "n_predict": 3, "stream": True})
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        assert r.status_code == 200 and chunks[-1]["tokens_evaluated"] == a["tokens_evaluated"]
        assert chunks[-1]["stop"] is True and chunks[-1]["tokens_predicted"] == 3 and all(not ch["stop"] for ch in chunks[:-1])


@pytest.mark.slow
def test_bad_input_is_a_400_naming_the_cause(ours) -> None:
    good = BODIES["plain"]
    with http_client(ours["none"]) as c:
        r = c.post("/infill", json=good)
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"]
        assert "Infill is not supported by this model" in msg and "prefix token is missing" in msg and "middle token is missing" in msg
    with http_client(ours["spm"]) as c:
        for body, param in (
            ({**good, "input_extra": {"filename": "a", "text": "b"}}, "input_extra"),
            ({**good, "input_extra": [{"filename": "a"}]}, "input_extra[0].text"),
            ({**good, "input_extra": ["text"]}, "input_extra[0].text"),
            ({**good, "input_extra": [{"text": "a", "filename": 3}]}, "input_extra[0].filename"),
            ({**good, "input_extra": [{"text": "x"}] * 10_000}, "input_extra"),
            ({**good, "input_prefix": 12}, "input_prefix"),
            ({**good, "input_prefix": None}, "input_prefix"),
            ({**good, "input_suffix": [1, 10**9]}, "input_suffix"),
            ({**good, "input_suffix": [True]}, "input_suffix"),
            ({"input_prefix": "a"}, "input_suffix"),
            ({**good, "prompt": ["a"]}, "prompt"),
            ({**good, "n_predict": 0}, "n_predict"),  # /completion's own checks, as there
        ):
            r = c.post("/infill", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (param, r.text)
        too_many = c.post("/infill", json={**good, "input_extra": [{"text": "x"}] * (MAX_EXTRA_CHUNKS + 1)}).json()["error"]["message"]
        assert f"{MAX_EXTRA_CHUNKS + 1} chunks: at most {MAX_EXTRA_CHUNKS}" in too_many
        assert c.post("/infill", content=b"{nope").status_code == 400
        # still up; and what llama.vim sends (its stop rules honoured, its sampler list and response_fields named as ignored)
        vim = {**good, "id_slot": 0, "n_predict": 2, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.9, "samplers": ["top_k", "top_p", "infill"],
               "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "response_fields": ["content"]}
        r = c.post("/infill", json=vim)
        assert r.status_code == 200 and r.headers["x-ignored-fields"] == "response_fields, samplers, t_max_prompt_ms", r.text


@pytest.mark.slow
def test_fim_tokens_of_smollm2_are_none(smollm2) -> None:
    """The shipped SmolLM2 has no FIM tokens: llama_vocab_fim_pre/suf/mid are -1."""
    with _vocab(smollm2) as tok:
        fim = fim_tokens(tok)
    assert fim.pre is fim.suf is fim.mid is None and fim.missing() == ["prefix token is missing", "suffix token is missing",
                                                                       "middle token is missing"]


def test_spm_infill_is_a_serve_flag_and_the_router_forwards_infill() -> None:
    from localllm.commands import serve_flags
    from localllm.router.proxy import PROXIED

    assert "--spm-infill" not in serve_flags.refused() and "/infill" in PROXIED


# -- llama-server's stop rules that its editors send to /infill: n_indent, t_max_predict_ms (the scheduler alone) --


class _Script:
    """A stand-in model (no llama.cpp): token t is followed by t+1 and reads as PIECES[t]."""

    PIECES = ["", "x = 1", "\n", "    ", "y", "\n", "  ", "z", "\n", "w"]

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.rows: dict[int, int] = {}

    def seq_rm(self, seq, p0=0, p1=-1):
        return True

    def seq_cp(self, src, dst, n):
        pass

    def new_sampler(self, sampling, prompt=()):
        return object()

    def free_sampler(self, sampler):
        pass

    def decode(self, entries):
        time.sleep(self.delay_s)
        self.rows = {i: tok for i, (tok, _, _, want) in enumerate(entries) if want}

    def sample(self, sampler, i):
        return self.rows[i] + 1

    def sample_all(self, picks):
        return [self.sample(sampler, i) for sampler, i in picks]

    def is_eog(self, tok):
        return tok >= len(self.PIECES)

    def piece(self, tok):
        return self.PIECES[tok].encode()


def _reply(model: _Script, **stops: int) -> tuple[str, str]:
    """The text the scheduler sends for the prompt [0] and how the reply ended."""
    from localllm.engine_api import SamplingConfig
    from localllm.serve.prometheus import ServerMetrics
    from localllm.serve.scheduler import Job, Scheduler

    sched = Scheduler(model, n_seq=1, n_ctx_seq=64, n_batch=32, prefix_reuse=True, max_queue=4, prefill_chunk=4, metrics=ServerMetrics())
    events: list[tuple[str, object]] = []
    job = Job(tokens=[0], sampling=SamplingConfig(temperature=0, max_tokens=20), max_tokens=20,
              emit=lambda kind, payload: events.append((kind, payload)), **stops)
    sched.submit(job)
    for _ in range(100):
        sched._step()  # noqa: SLF001 - one step at a time, on this thread
        if not sched.pending and not any(s.job for s in sched.slots):
            break
    return "".join(str(p) for k, p in events if k == "text"), str(events[-1][1])


def test_n_indent_ends_the_reply_at_a_line_indented_less() -> None:
    """As llama-server's process_token: the first line is free; a later line with fewer
    spaces than n_indent ends the reply before its text (never sent), as a limit."""
    assert _reply(_Script()) == ("x = 1\n    y\n  z\nw", "stop")
    assert _reply(_Script(), n_indent=4) == ("x = 1\n    y\n  ", "length")
    assert _reply(_Script(), n_indent=2) == ("x = 1\n    y\n  z\n", "length")  # "w" is not indented
    assert _reply(_Script(), n_indent=5) == ("x = 1\n    ", "length")


def test_t_max_predict_ms_ends_the_reply_at_a_new_line_past_the_time() -> None:
    assert _reply(_Script(delay_s=0.01), t_max_predict_ms=5) == ("x = 1\n", "length")
    assert _reply(_Script(delay_s=0.01), t_max_predict_ms=60_000)[1] == "stop"


def test_the_editor_fields_are_read_on_completion_and_infill() -> None:
    from localllm.serve.llama_routes import parse_completion
    from localllm.serve.protocol import RequestError

    p = parse_completion({"prompt": "x", "n_indent": 4, "t_max_predict_ms": 250}, chat=False, n_vocab=10)
    assert (p.n_indent, p.t_max_predict_ms, p.ignored) == (4, 250, ())
    assert parse_completion({"prompt": "x", "n_indent": -1}, chat=False, n_vocab=10).n_indent == 0  # off, as llama-server
    with pytest.raises(RequestError, match="'n_indent' must be a whole number"):
        parse_completion({"prompt": "x", "n_indent": "4"}, chat=False, n_vocab=10)

"""Idle prompts in RAM (serve/prompt_cache.py, ``--cache-ram``): the store's
limits, the scheduler moving idle slots out of the KV cache when a request
starts, and a stored prompt put back into llama.cpp giving the same reply."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.serve.prometheus import ServerMetrics
from localllm.serve.prompt_cache import PromptCache
from localllm.serve.scheduler import Job, Scheduler

# -- the store ------------------------------------------------------------------------


def test_best_is_the_longest_shared_prefix_and_take_removes_it() -> None:
    c = PromptCache(max_bytes=None, max_tokens=100)
    c.put([1, 2, 3, 4], b"a")
    c.put([1, 2, 9], b"b")
    entry, n = c.best([1, 2, 3, 7])
    assert entry is not None and entry.state == b"a" and n == 3
    assert c.best([5, 6]) == (None, 0)
    c.take(entry)
    assert len(c) == 1 and c.n_tokens == 3 and c.n_bytes == 1


def test_limits_evict_the_oldest_first() -> None:
    c = PromptCache(max_bytes=10, max_tokens=6)
    assert c.put([1, 2], b"xxxx") and c.put([3, 4], b"yyyy")
    assert c.put([5, 6], b"zzzz")  # 12 bytes would be over 10: [1, 2] goes
    assert c.best([1, 2])[1] == 0 and c.best([3, 4])[1] == 2 and c.n_bytes == 8
    assert c.put([7, 8, 9], b"w")  # 7 tokens would be over 6: [3, 4] goes
    assert c.best([3, 4])[1] == 0 and c.n_tokens == 5
    assert not c.put(list(range(7)), b"v")  # alone over the token limit
    assert not c.put([1], b"x" * 11)  # alone over the byte limit
    assert not c.put([9], b"")  # a state llama.cpp could not save
    assert len(c) == 2


def test_a_prefix_of_a_stored_prompt_is_not_stored_and_a_longer_one_replaces_it() -> None:
    c = PromptCache(max_bytes=None, max_tokens=100)
    c.put([1, 2, 3], b"a")
    assert not c.put([1, 2], b"b")  # [1, 2, 3] serves it as well
    assert c.put([1, 2, 3, 4], b"c")  # serves all [1, 2, 3] did
    assert len(c) == 1 and c.best([1, 2, 3])[0].state == b"c"  # type: ignore[union-attr]


# -- the scheduler, on a stand-in model ------------------------------------------------


class _StateModel:
    """Token t predicts t + 1; the "KV cache" is each sequence's token list, so a
    saved state is exactly what the sequence held."""

    def __init__(self) -> None:
        self.kv: dict[int, list[int]] = {}
        self.saved: list[int] = []
        self.loaded: list[int] = []

    def seq_rm(self, seq, p0=0, p1=-1):
        self.kv[seq] = self.kv.get(seq, [])[:p0] if p1 == -1 else self.kv.get(seq, [])
        return True

    def seq_cp(self, src, dst, n):
        self.kv[dst] = self.kv.get(src, [])[:n]

    def seq_save(self, seq):
        self.saved.append(seq)
        return bytes(self.kv.get(seq, []))

    def seq_load(self, seq, data):
        self.loaded.append(seq)
        self.kv[seq] = list(data)
        return True

    def new_sampler(self, sampling, prompt=()):
        return object()

    def free_sampler(self, sampler):
        pass

    def decode(self, entries):
        for tok, pos, seq, _ in entries:
            assert len(self.kv.setdefault(seq, [])) == pos, (seq, pos, self.kv[seq])
            self.kv[seq].append(tok)
        self.rows = {i: tok for i, (tok, _, _, want) in enumerate(entries) if want}

    def sample(self, sampler, i):
        return self.rows[i] + 1

    def sample_all(self, picks):
        return [self.sample(sampler, i) for sampler, i in picks]

    def is_eog(self, tok):
        return False

    def piece(self, tok):
        return b"x"


def _run(sched: Scheduler, tokens: list[int], n: int = 3) -> Job:
    job = Job(tokens=tokens, sampling=SamplingConfig(temperature=0, max_tokens=n), max_tokens=n, emit=lambda k, p: None)
    sched.submit(job)
    for _ in range(50):
        sched._step()
        if job.ended:
            return job
    raise AssertionError("the job did not end")


def test_idle_slots_move_to_ram_when_a_request_starts_and_come_back_on_a_match() -> None:
    model = _StateModel()
    cache = PromptCache(max_bytes=None, max_tokens=256)
    sched = Scheduler(model, n_seq=2, n_ctx_seq=64, n_batch=32, prefix_reuse=True, max_queue=4, prefill_chunk=32,
                      metrics=ServerMetrics(), prompt_cache=cache)
    a = _run(sched, [10, 11, 12, 13])
    held = list(model.kv[a.slot])  # the prompt and the evaluated reply tokens
    b = _run(sched, [50, 51, 52])  # another conversation: a's cells go to RAM
    assert model.saved and len(cache) == 1 and not model.kv[a.slot] if a.slot != b.slot else len(cache) == 1
    again = _run(sched, held + [99])  # a's next turn: its state is put back, only the rest is read
    assert model.loaded and again.n_cached == len(held)
    assert model.kv[again.slot][: len(held)] == held
    assert sum(1 for s in sched.slots if s.job is None and s.cache and s is not sched.slots[again.slot]) == 0


def test_without_a_store_idle_prompts_stay_in_the_kv_cache() -> None:
    model = _StateModel()
    sched = Scheduler(model, n_seq=2, n_ctx_seq=64, n_batch=32, prefix_reuse=True, max_queue=4, prefill_chunk=32, metrics=ServerMetrics())
    a = _run(sched, [10, 11, 12, 13])
    _run(sched, [50, 51, 52])
    assert not model.saved and sched.slots[a.slot].cache


# -- llama.cpp ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_restored_prompt_gives_the_same_reply_and_idle_cells_leave_the_kv_cache(smollm2: Path) -> None:
    import llama_cpp

    from localllm.engine.batch import BatchModel

    m = BatchModel()
    try:
        # flash attention off: llama.cpp's CPU flash attention sums V in f16, so a restored prompt whose cells sit
        # elsewhere in the cache reads a slightly different first token (log p -0.4837 vs -0.4749 here); without it
        # the restored cells give llama.cpp's figures bit for bit
        info = m.load(smollm2, LoadConfig(n_ctx=1024, n_threads=1, flash_attn="off"), 4)
        cache = PromptCache(max_bytes=None, max_tokens=info.n_ctx)
        sched = Scheduler(m, n_seq=4, n_ctx_seq=256, n_batch=info.n_batch, prefix_reuse=True, max_queue=8, prefill_chunk=64,
                          metrics=ServerMetrics(), prompt_cache=cache)
        sched.start()

        def ask(text: str) -> tuple[Job, str, float]:
            out: list[str] = []
            first: list[float] = []
            done = threading.Event()

            def emit(kind: str, payload: object) -> None:
                if kind == "text":
                    out.append(str(payload))
                elif kind == "logprob" and not first:
                    first.append(payload[2])  # type: ignore[index]
                elif kind in ("done", "error"):
                    done.set()

            job = Job(tokens=m.tok.tokenize(text), sampling=SamplingConfig(temperature=0, max_tokens=24), max_tokens=24, emit=emit,
                      logprobs=0)
            assert sched.submit(job)
            assert done.wait(120)
            return job, "".join(out), first[0]

        prompt = "The capital of France is Paris. The capital of Italy is"
        first, reply, lp = ask(prompt)
        for other in ("Once upon a time there was a dragon who", "def fibonacci(n):", "Roses are red, violets are"):
            ask(other)
        assert len(cache) >= 3  # the finished conversations went to RAM
        again, reply2, lp2 = ask(prompt)
        sched.stop()
        assert again.n_cached == len(first.tokens) - 1  # the whole prompt came back from RAM but its last token
        assert lp2 == lp and reply2 == reply  # the restored cells are the ones the prompt made
        busy = again.slot
        for s in range(4):  # only the last request's sequence holds cells
            if s != busy:
                assert llama_cpp.llama_memory_seq_pos_max(m.mem, s) == -1, s
    finally:
        m.close()


@pytest.mark.slow
@pytest.mark.parametrize("cache_ram", ["8192", "0"])
def test_serve_puts_a_conversation_back_after_others_took_every_slot(cache_ram: str, tmp_path: Path) -> None:
    """Two slots, three conversations: the first one's next turn reads only its new
    tokens with the store (--cache-ram, the default), all of them without it."""
    import httpx2

    from tests.helpers.server import Server

    s = Server("smollm2", "--parallel", "2", "--ctx", "256", "--threads", "1", "--cache-ram", cache_ram,
               env={"LOCALLLM_HOME": str(tmp_path)})
    try:
        assert ("idle prompts to RAM (up to 8192 MiB, 512 tokens)" in s.log) == (cache_ram != "0")
        with httpx2.Client(base_url=s.base, timeout=120) as c:
            def ask(prompt: str) -> dict:
                r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4, "temperature": 0})
                assert r.status_code == 200, r.text
                return r.json()

            first = "The capital of France is Paris. The capital of Italy is"
            ask(first)
            ask("Roses are red, violets are blue,")
            ask("def fibonacci(n):")
            again = ask(first)["usage"]
        want = again["prompt_tokens"] - 1 if cache_ram != "0" else 0
        assert again["prompt_tokens_details"]["cached_tokens"] == want
    finally:
        s.stop()

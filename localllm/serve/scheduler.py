"""Continuous batching: one engine thread, one ``llama_decode`` per step.

Each step's batch carries the next token of every generating sequence plus a
bounded chunk of the prompts still being read (chunked prefill: a long prompt
adds at most ``prefill_chunk`` tokens to a step while others are generating,
so it does not stall their inter-token latency). A request takes a free slot
(a llama.cpp sequence id) as soon as one is free; a finished request's slot is
free at once, a cancelled one (client gone) also drops its cells.

Prefix reuse, as llama-server's slots do: a finished sequence's tokens stay in
its slot's cache; a new request takes the free slot whose cache shares the
longest prefix with its prompt and computes only the rest. When another slot
(busy or not) holds a longer prefix, its cells are shared with
``llama_memory_seq_cp`` (no copy in a unified cache) instead. With a prompt
cache (serve/prompt_cache.py, ``--cache-ram``), the other idle slots' cells
then move to RAM, so that only running sequences widen each decode's
attention; a later prompt that shares more with a stored one than with the KV
cache gets its state put back.

A prompt with images (``serve/media.py``: a vision model, ``--mmproj``) holds
filler ids at each image's positions, so prefix reuse and the prompt cache
match the same picture and not another. When a sequence's prompt reaches an
image, the image is read whole at the start of the step, into that sequence
(``BatchModel.decode_image``: encoded by the projector unless its embeddings
were kept, then decoded in one ubatch where its tokens attend both ways, as
Gemma 3's do), never cut by ``prefill_chunk``; the text after it goes into the
step's batch. A reused prefix never ends inside an image (``Media.snap``).

Other llama.cpp work of the process (the embedding context's decodes) runs on
the engine thread too, between two steps (``Scheduler.run``): libgomp gives
each thread that starts a parallel region a team of its own, and once the
process has more OpenMP threads than CPUs, every team spins only 100 times at
a barrier before sleeping (``GOMP_SPINCOUNT`` in libgomp's manual). With
``--threads`` at the machine's cores, one embeddings request from a worker
thread made chat decode sleep at every op's barrier for as long as that thread
lived: with an embeddings request before each level of 8 clients on 2 threads,
40-56 voluntary context switches a generated token against 0.3-0.5, and 0.76x
the tokens/s of chat with every decode on the engine thread (8 pairs).

Pure Python: the model is any object with ``batch_engine.BatchModel``'s methods.
"""

from __future__ import annotations

import codecs
import collections
import concurrent.futures
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from localllm.engine_api import SamplingConfig
from localllm.engine_api.stats import percentile
from localllm.errors import EngineError
from localllm.serve.media import ImageSpan, Media
from localllm.serve.prometheus import ServerMetrics
from localllm.serve.prompt_cache import PromptCache, common_prefix
from localllm.speculation import Drafting, Replies, verify


class Refused(str):
    """An ("error", message) payload that is the request's own fault (a 400, not the engine's 500)."""


@dataclass(eq=False)
class Job:
    """One generation request. ``emit(kind, payload)`` is called from the engine
    thread: ("text", str) (with ("logprob", ...) before a token's text when asked),
    then ("done", finish_reason) or ("error", message)."""

    tokens: list[int]
    sampling: SamplingConfig
    max_tokens: int
    emit: Callable[[str, object], None]
    stop: tuple[str, ...] = ()
    cancelled: bool = False
    submit_ns: int = field(default_factory=time.perf_counter_ns)
    start_ns: int = 0  # when a slot took it: its prompt is read from then on
    slot: int = -1  # the slot (llama.cpp sequence) that took it
    stop_word: str | None = None  # the stop string that ended it, if one did
    token_ns: list[int] = field(default_factory=list)
    n_cached: int = 0
    n_gen: int = 0
    finish_reason: str | None = None
    logprobs: int | None = None  # emit ("logprob", (id, bytes, logprob, [(id, bytes, logprob)] * this many)) per token; None: off
    cache_prompt: bool = True  # False: read the whole prompt, no prefix reuse (llama-server's cache_prompt)
    id_slot: int = -1  # the slot it must run in (llama-server's id_slot), waiting while it is busy; -1: any
    post_sampling: bool = False  # the ("logprob", ...) values are probabilities after the samplers (llama-server's post_sampling_probs)
    progress: bool = False  # emit ("progress", {total, cache, processed, time_ms}) as its prompt is read (llama-server's return_progress)
    n_indent: int = 0  # >0: a line after the first indented less ends the reply, that line's text dropped (llama-server's)
    t_max_predict_ms: int = 0  # >0: a new line past this long after the first token ends the reply (llama-server's)
    # n > 1: a sibling waits until this job has read the shared prompt, then shares its cells (seq_cp)
    after: Job | None = None
    # llama-server's per-request ``lora``: scale by adapter id, the others at 0, for this request only;
    # None: the server's scales when a slot takes it (POST /lora-adapters, serve --lora)
    lora: dict[int, float] | None = None
    lora_scales: tuple[float, ...] = ()  # what it runs with, set when a slot takes it
    ended: bool = False  # released by the scheduler (done, failed or dropped)
    media: Media | None = None  # the prompt's images (serve/media.py); None: text only
    images_read: int = 0  # image chunks decoded into its sequence (not reused from a cached prefix)
    images_encoded: int = 0  # of those, the ones the vision encoder ran on (the others' embeddings were kept)
    encode_ns: int = 0  # the vision encoder's time for them
    draft_n: int = 0  # draftless speculation: tokens drafted and verified for it (llama-server's timings.draft_n)
    draft_n_accepted: int = 0  # of those, kept
    drafted: bool = False  # speculation ran for it (its timings then carry the counts)

    @property
    def prompt_read(self) -> bool:
        """Whether the prompt is in the cache (a first token drawn) or never will be (ended)."""
        return bool(self.token_ns) or self.finish_reason is not None or self.cancelled or self.ended

    @property
    def ttft_ms(self) -> float | None:
        return (self.token_ns[0] - self.submit_ns) / 1e6 if self.token_ns else None

    @property
    def itl_p50_ms(self) -> float | None:
        gaps = [(b - a) / 1e6 for a, b in zip(self.token_ns, self.token_ns[1:])]
        return percentile(gaps, 50) if gaps else None

    def usage(self) -> dict:
        return {
            "prompt_tokens": len(self.tokens),
            "completion_tokens": self.n_gen,
            "total_tokens": len(self.tokens) + self.n_gen,
            "prompt_tokens_details": {"cached_tokens": self.n_cached},
        }

    def timings(self) -> dict:
        """llama-server's ``timings``, measured here: the prompt from a slot taking
        the request to its first token, generation from the first token to the
        last (its gaps); a span not measured (no token, one token) is null."""
        prompt_n = len(self.tokens) - self.n_cached
        prompt_ms = (self.token_ns[0] - self.start_ns - self.encode_ns) / 1e6 if self.token_ns and self.start_ns else None
        gen_ms = (self.token_ns[-1] - self.token_ns[0]) / 1e6 if len(self.token_ns) > 1 else None
        gaps = len(self.token_ns) - 1
        if self.media is not None:  # a third phase: the vision encoder (prompt_ms is then the rest: the prefill)
            enc = self.encode_ns / 1e6 if self.images_encoded else None
            images = {"images": self.media.images, "encode_n": self.images_encoded, "encode_ms": enc,
                      "encode_per_second": 1e3 * self.images_encoded / enc if enc else None}
        else:
            images = {}
        return {
            "cache_n": self.n_cached,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_ms is not None and prompt_n else None,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else None,
            "predicted_n": self.n_gen,
            "predicted_ms": gen_ms,
            "predicted_per_token_ms": gen_ms / gaps if gen_ms is not None else None,
            "predicted_per_second": 1e3 * gaps / gen_ms if gen_ms else None,
            **images,
            **({"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted} if self.drafted else {}),
        }


@dataclass(eq=False)
class Slot:
    id: int
    cache: list[int] = field(default_factory=list)  # what the KV cache holds for this sequence
    job: Job | None = None
    sampler: object = None
    last: int | None = None  # sampled, not yet evaluated; None while reading the prompt
    chunk: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    utf8: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))
    used_at: int = 0
    lora: tuple[float, ...] = ()  # the adapter scales its cells were computed with: a prefix is reused only under the same
    drafting: Drafting | None = None  # its request's draftless speculation (None: none)


class Handoff(Protocol):
    """How the engine thread's emits reach the HTTP side (serve/handoff.py): held
    on the engine thread and let go just before each decode and when it idles."""

    def engine_thread(self, on: bool) -> None: ...
    def flush(self) -> None: ...


class BatchModel(Protocol):
    """The scheduler's seam to llama.cpp (localllm.engine.batch.BatchModel, or
    a fake in tests): sequences in one unified KV cache, one sampler each."""

    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> bool: ...
    def seq_cp(self, src: int, dst: int, n: int) -> None: ...
    def seq_pos_min(self, seq: int) -> int: ...
    def seq_save(self, seq: int) -> bytes | bytearray: ...
    def seq_load(self, seq: int, data: bytes | bytearray) -> bool: ...
    def logprobs(self, i: int, token: int, n_top: int) -> tuple[float, list[tuple[int, float]]]: ...
    def post_probs(self, i: int, token: int, n_top: int, sampling: SamplingConfig) -> tuple[float, list[tuple[int, float]]]: ...
    def new_sampler(self, sampling: SamplingConfig, prompt: Sequence[int] = ()) -> Any: ...
    def free_sampler(self, sampler: Any) -> None: ...
    def sample(self, sampler: Any, i: int) -> int: ...
    def sample_all(self, picks: Sequence[tuple[Any, int]]) -> list[int]:
        """One token a pick; -1 where that request's sampler failed (its ``.failed`` says why: the request's fault, a 400)."""
    def is_eog(self, token: int) -> bool: ...
    def piece(self, token: int) -> bytes: ...
    def decode(self, entries: Sequence[tuple[int, int, int, bool]]) -> None: ...
    def decode_image(self, seq: int, pos: int, piece: Any) -> tuple[int | None, int]:
        """An image chunk (``ImageSpan.piece``) into ``seq`` at ``pos`` on, whole: (encode ns or None when kept, decode ns)."""
    def set_lora(self, scales: Sequence[float]) -> None:
        """The LoRA adapters' scales for the next decode (only called when the server loaded adapters)."""


def _job(s: Slot) -> Job:
    """The slot's request: only called on running slots, which always hold one."""
    assert s.job is not None
    return s.job


def _pos(job: Job, n: int) -> int:
    """The position of the ``n``-th cell of ``job``'s sequence: ``n``, unless an
    M-RoPE image before it takes fewer positions than cells (serve.media)."""
    return n if job.media is None else job.media.pos(n)


def indent_cut(text: str, emitted: int, n_indent: int) -> tuple[int | None, int]:
    """llama-server's ``n_indent`` (server-context.cpp, ``process_token``): each line
    after the first must begin with at least ``n_indent`` spaces or tabs; the first that
    does not (an empty line included: its newline is not a space) ends the reply, cut
    before its first other character. Returns (that cut, or None; where to hold the
    text back to meanwhile: the start of a last line that is blank so far, whose
    indentation is not known yet). Lines before ``emitted`` passed already: the scan
    starts at the line it ends in."""
    nl = text.rfind("\n", 0, emitted)
    if nl < 0:
        nl = text.find("\n")
    while nl >= 0:
        pos = start = nl + 1
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos == len(text):
            return None, start
        if pos - start < n_indent:
            return pos, len(text)
        nl = text.find("\n", start)
    return None, len(text)


def _submitted(s: Slot) -> int:
    return _job(s).submit_ns


class Scheduler:
    def __init__(self, model: BatchModel, *, n_seq: int, n_ctx_seq: int, n_batch: int, prefix_reuse: bool,
                 max_queue: int, prefill_chunk: int, metrics: ServerMetrics, prompt_cache: PromptCache | None = None,
                 handoff: Handoff | None = None, adapters: Sequence[tuple[str, float]] = (), n_swa: int = 0,
                 speculate: str = "none", k_max: int = 0) -> None:
        self.model = model
        # draftless speculation (localllm.speculation): its mode, and the longest draft a step's rows allow a sequence
        self.speculate, self.k_max = (speculate, k_max) if k_max >= 1 else ("none", 0)
        self.replies = Replies()  # the slots' replies so far, one pool as llama.cpp's ngram-mod keeps
        self.n_swa = n_swa  # a sliding-window cache's window (0: none): see _kept
        # LoRA adapters (serve --lora): their paths by id, and the server's scales (POST /lora-adapters sets them)
        self.adapters: tuple[str, ...] = tuple(p for p, _ in adapters)
        self.lora_scales: tuple[float, ...] = tuple(float(x) for _, x in adapters)
        self._lora_turn = 0
        self.handoff = handoff
        self.prompt_cache = prompt_cache if prefix_reuse else None
        self.n_ctx_seq = n_ctx_seq
        self.n_batch = n_batch
        self.prefix_reuse = prefix_reuse
        self.max_queue = max_queue
        self.prefill_chunk = max(1, min(prefill_chunk, n_batch))
        self.metrics = metrics
        self.slots = [Slot(i) for i in range(n_seq)]
        self.pending: collections.deque[Job] = collections.deque()
        self._calls: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future]] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._clock = 0
        self._thread = threading.Thread(target=self._run, name="localllm-engine", daemon=True)

    # -- the HTTP side ----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Cancel what is left (the HTTP server has drained by now) and wait for
        the engine thread: at most the step in flight, so that the model can be
        freed safely afterwards."""
        with self._cv:
            self._stop = True
            for job in self.pending:
                job.cancelled = True
            for s in self.slots:
                if s.job:
                    s.job.cancelled = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join()
        with self._cv:
            self._fail_calls("the server is stopping")

    def _fail_calls(self, reason: str) -> None:
        """End the calls not begun with ``reason`` (the caller holds the lock)."""
        while self._calls:
            self._calls.popleft()[1].set_exception(EngineError(reason))

    def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the engine thread, between two steps, and its result (or its
        exception) here: the process's other llama.cpp calls (the module's docstring).
        Blocks the calling thread; never call it from the engine thread."""
        return self.call(fn).result()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """``run`` without the wait: the Future the engine thread completes with
        ``fn()``'s result (the event loop awaits it with ``asyncio.wrap_future``, and
        saves a worker thread's two wake-ups, which on a loaded machine each wait for
        a CPU: rerank's slices, serve/rerank.py)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._stop:
                raise EngineError("the server is stopping")
            self._calls.append((fn, fut))
            self._cv.notify()
        return fut

    def submit(self, job: Job) -> bool:
        """Queue ``job``; False when the queue is full (the caller answers 429)."""
        with self._cv:
            if self._stop or len(self.pending) >= self.max_queue:
                return False
            self.pending.append(job)
            self.metrics.queued = len(self.pending)
            self._cv.notify()
        return True

    def cancel(self, job: Job) -> None:
        """The client is gone: the engine frees the sequence at its next step."""
        with self._cv:
            job.cancelled = True
            self._cv.notify()

    def abort(self, reason: str) -> int:
        """The server stops now: end every waiting and running request with an
        error event saying ``reason`` (the engine frees their sequences at its next
        step); the number ended."""
        with self._cv:
            jobs = [j for j in (*self.pending, *(s.job for s in self.slots)) if j is not None and not j.cancelled]
            for job in jobs:
                job.cancelled = True
                job.emit("error", reason)
            self._fail_calls(reason)  # not begun: their callers get the reason too
            self._cv.notify()
        return len(jobs)

    # -- the engine thread ------------------------------------------------------------
    def _run(self) -> None:
        if self.handoff is not None:
            self.handoff.engine_thread(True)
        try:
            self._loop()
        finally:
            if self.handoff is not None:
                self.handoff.engine_thread(False)
                self.handoff.flush()

    def _loop(self) -> None:
        while True:
            with self._cv:
                if self.handoff is not None and not self._stop and not self.pending and not any(s.job for s in self.slots):
                    self.handoff.flush()  # going idle: what the last step emitted goes out now
                while not self._stop and not self.pending and not self._calls and not any(s.job for s in self.slots):
                    self._cv.wait()
                if self._stop and not any(s.job for s in self.slots):
                    break
                calls = list(self._calls) if self._calls else ()  # nothing made on the steps' path when none came
                self._calls.clear()
            for fn, fut in calls:
                try:
                    fut.set_result(fn())
                except BaseException as exc:  # the caller's to handle, in its own thread
                    fut.set_exception(exc)
            try:
                self._step()
            except Exception as exc:  # an engine failure ends the running requests, not the server
                print(f"localllm: engine error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                for s in self.slots:
                    if s.job:
                        self._release(s, error=str(exc))

    def _reap(self) -> None:
        for s in self.slots:
            if s.job and s.job.cancelled:
                self._release(s, drop=True)

    def _admit(self) -> None:
        while True:
            with self._cv:
                free = [s for s in self.slots if s.job is None]
                # a sibling of an n > 1 request waits for the shared prompt to be read (prefix reuse copies it then)
                ready = next((j for j in self.pending if not (self.prefix_reuse and j.after and not j.after.prompt_read)
                              and (j.id_slot < 0 or self.slots[j.id_slot].job is None)), None)
                if not free or ready is None:
                    self.metrics.queued = len(self.pending)
                    return
                self.pending.remove(ready)
                job = ready
                self.metrics.queued = len(self.pending)
            if job.cancelled:
                continue
            scales = self._scales(job)
            if isinstance(scales, Refused):
                job.ended = True
                job.emit("error", scales)
                continue
            job.lora_scales = scales
            self._assign(job, free if job.id_slot < 0 else [self.slots[job.id_slot]])

    def _scales(self, job: Job) -> tuple[float, ...] | Refused:
        """The adapter scales ``job`` runs with, as llama-server's construct_lora_list
        (server-context.cpp): the ids it lists at their scales, the others at 0; without
        ``lora``, the server's scales now. An id no adapter has is the request's fault."""
        if job.lora is None:
            return self.lora_scales
        n = len(self.adapters)
        bad = sorted(i for i in job.lora if not 0 <= i < n)
        if bad:
            have = f"ids 0..{n - 1} (GET /lora-adapters lists them)" if n else "none: start serve with --lora FNAME"
            return Refused(f"lora: no adapter has id {bad[0]}; the server's adapters are {have}")
        return tuple(job.lora.get(i, 0.0) for i in range(n))

    def _assign(self, job: Job, free: list[Slot]) -> None:
        toks = job.tokens
        limit = len(toks) - 1  # the last prompt token is always evaluated: its logits start the reply
        if self.prefix_reuse and job.cache_prompt:
            lora = job.lora_scales

            def shared(s: Slot) -> int:  # cells computed under other adapter scales are not this request's
                return common_prefix(s.cache, toks) if s.lora == lora else 0

            own = {s.id: shared(s) for s in free}
            target = max(free, key=lambda s: (own[s.id], -s.used_at))
            src = max(self.slots, key=shared)
            best = shared(src)
            stored, m = self.prompt_cache.best(toks) if self.prompt_cache else (None, 0)
            snap = job.media.snap if job.media is not None else (lambda k: k)  # never half an image
            if stored is not None and m > max(best, own[target.id]):
                target = min(free, key=lambda s: (bool(s.cache), s.used_at))  # an empty slot, else the least recently used
                if target.cache:
                    self._stash(target)
                n = 0
                if self.model.seq_load(target.id, stored.state):
                    assert self.prompt_cache is not None
                    self.prompt_cache.take(stored)
                    n = self._kept(target.id, job, snap(min(m, limit)))
                    if not self.model.seq_rm(target.id, _pos(job, n), -1):
                        self.model.seq_rm(target.id)
                        n = 0
            elif best > own[target.id] and src is not target:
                n = self._kept(src.id, job, snap(min(best, limit)))
                self.model.seq_rm(target.id)
                if n:
                    self.model.seq_cp(src.id, target.id, _pos(job, n))
            else:
                n = self._kept(target.id, job, snap(min(own[target.id], limit)))
                if not self.model.seq_rm(target.id, _pos(job, n), -1):
                    self.model.seq_rm(target.id)
                    n = 0
        else:
            target = min(free, key=lambda s: s.used_at)
            self.model.seq_rm(target.id)
            n = 0
        target.cache = toks[:n]
        target.lora = job.lora_scales
        target.job = job
        # penalties see the prompt, as in llama-server (its text: an image's filler ids are no tokens)
        prompt = job.tokens if job.media is None else [t for t in job.tokens if t >= 0]
        target.sampler = self.model.new_sampler(job.sampling, prompt)
        target.drafting = Drafting(prompt, self.speculate, self.k_max, self.replies) if self.speculate != "none" else None
        target.last = None
        target.text, target.emitted = "", 0
        target.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        job.n_cached = n
        job.start_ns = time.perf_counter_ns()
        job.slot = target.id
        if job.progress:  # llama-server's first report: before any token is read, the cached ones counted as processed
            job.emit("progress", {"total": len(job.tokens), "cache": n, "processed": n, "time_ms": 0.0})
        self.metrics.prompt(len(toks), n)
        self.metrics.running = sum(1 for s in self.slots if s.job)
        if self.prompt_cache is not None:  # as llama-server: idle slots go to RAM when a task starts
            for s in self.slots:
                if s.job is None and s.cache:
                    self._stash(s)

    def _kept(self, seq: int, job: Job, n: int) -> int:
        """``n``, the prefix of ``seq``'s cells the job would keep, or 0 where a
        sliding-window cache no longer holds the window before it. llama-server's
        rule (tools/server/server-context.cpp, ``pos_min_thold``): the prefix is
        usable while ``seq``'s smallest position is below its end less the window
        (or is 0: nothing was let go). Without it a reply would attend to cells
        that are gone, and read a prompt it never saw."""
        if not self.n_swa or n == 0:
            return n
        pos_min = self.model.seq_pos_min(seq)
        return n if pos_min == 0 or 0 <= pos_min < _pos(job, n) - self.n_swa else 0

    def _stash(self, s: Slot) -> None:
        """Move idle ``s``'s cells to the prompt cache (or drop them where it has
        no room) and free them in the KV cache."""
        assert self.prompt_cache is not None
        self.prompt_cache.put(s.cache, self.model.seq_save(s.id))
        self.model.seq_rm(s.id)
        s.cache = []

    def _step(self) -> None:
        self._reap()
        self._admit()
        active = [s for s in self.slots if s.job]
        if not active:
            return
        if self.adapters:
            active = self._lora_group(active)
        entries: list[tuple[int, int, int, bool]] = []
        outputs: list[tuple[Slot, int]] = []
        drafts: list[tuple[Slot, int, list[int]]] = []  # a sequence's verify rows: (slot, its first row, the draft)
        decoding = sum(1 for s in active if s.last is not None)
        for s in active:
            if s.last is not None:
                at = _pos(_job(s), len(s.cache))
                draft = self._draft(s, self.n_batch - len(entries) - decoding) if s.drafting is not None else []
                decoding -= 1
                if draft:
                    drafts.append((s, len(entries), draft))
                    entries.append((s.last, at, s.id, True))
                    entries.extend((d, at + 1 + k, s.id, True) for k, d in enumerate(draft))
                    continue
                outputs.append((s, len(entries)))
                entries.append((s.last, at, s.id, True))
        room = self.n_batch - len(entries)
        cap = min(room, self.prefill_chunk if entries else self.n_batch)
        for s in sorted((s for s in active if s.last is None), key=_submitted):
            if cap <= 0:
                break
            job = _job(s)
            end = len(job.tokens)
            if job.media is not None:
                cap = self._images(s, job.media, cap)  # the images that start here, each whole
                if s.job is None or cap <= 0:  # failed (released), or the images took the step's share
                    continue
                end = job.media.text_end(len(s.cache), end)
            pos = len(s.cache)
            s.chunk = job.tokens[pos:min(end, pos + cap)]
            at = _pos(job, pos)
            entries.extend((t, at + k, s.id, False) for k, t in enumerate(s.chunk))
            if pos + len(s.chunk) == len(job.tokens):
                entries[-1] = (entries[-1][0], entries[-1][1], s.id, True)
                outputs.append((s, len(entries) - 1))
            cap -= len(s.chunk)
        if not entries:  # only images were read this step
            return
        t0 = time.perf_counter_ns()
        try:
            self._decode(entries, active)
        except Exception as exc:
            for s in active:
                s.chunk = []
                self._release(s, drop=True, error=str(exc))
            return
        for s in active:
            if s.last is not None:
                s.cache.append(s.last)
            elif s.chunk:
                s.cache.extend(s.chunk)
                s.chunk = []
                job = _job(s)
                if job.progress:
                    job.emit("progress", {"total": len(job.tokens), "cache": job.n_cached, "processed": len(s.cache),
                                          "time_ms": (time.perf_counter_ns() - job.start_ns) / 1e6})
        took = time.perf_counter_ns() - t0
        alone = len(active) == 1  # a step's time is one sequence's only when it decodes alone (the controller's cost figure)
        single = alone and len(entries) == 1  # one token of one sequence: a one-token decode's time
        # one call for the step's rows (the greedy ones are one argmax: BatchModel.sample_all)
        toks = self.model.sample_all([(s.sampler, i) for s, i in outputs])
        now = time.perf_counter_ns()
        for (s, i), tok in zip(outputs, toks):
            if single and s.drafting is not None:
                s.drafting.ctl.single(took)
            self._on_token(s, tok, now, i)
            if s.job is not None and s.drafting is not None:
                s.drafting.seen(tok)
        for s, row, draft in drafts:
            self._verified(s, row, draft, took if alone else None)
        self.metrics.step(len(active), len(entries), sum(len(s.cache) for s in self.slots))
        ctl = getattr(self.model, "threads", None)  # the engine's thread counts (a fake model has none)
        if ctl is not None:
            self.metrics.set_threads(ctl.current(), len(ctl.changes), ctl.fixed)

    def _draft(self, s: Slot, room: int) -> list[int]:
        """The tokens to verify with ``s.last`` this step (none: decode it alone): within
        the step's rows (``room``), the reply's length and the sequence's cells, never
        while a thinking budget forces its end (those tokens are known)."""
        job, d = _job(s), s.drafting
        assert d is not None
        forced = getattr(getattr(s.sampler, "budget", None), "forced", None)
        if forced is not None and forced() is not None:
            return []
        limit = min(room, job.max_tokens - job.n_gen - 1, self.n_ctx_seq - len(s.cache) - 2)
        return d.draft(limit) if limit > 0 else []

    def _verified(self, s: Slot, row: int, draft: list[int], took: int | None) -> None:
        """A draft's rows sampled in order (``speculation.verify``): the kept tokens are in
        the cache already, the rejected ones' cells dropped, each token given as one step's."""
        job, d = _job(s), s.drafting
        assert d is not None
        given = verify(draft, lambda r: self.model.sample(s.sampler, row + r))
        kept = len(given) - 1
        s.cache.extend(draft[:kept])
        if kept < len(draft):
            self.model.seq_rm(s.id, _pos(job, len(s.cache)), -1)
        d.ctl.verified(len(draft), kept, took)
        job.drafted = True
        job.draft_n += len(draft)
        job.draft_n_accepted += kept
        self.metrics.drafts(len(draft), kept)
        now = time.perf_counter_ns()
        for r, tok in enumerate(given):
            self._on_token(s, tok, now, row + r)
            if s.job is not job or s.last is None:
                return  # it ended here (a stop, its length, an error)
            d.seen(tok)
            if r < kept:
                s.last = None  # a kept draft token is in the cache: only the last one given waits to be evaluated
        # the last token given is s.last: evaluated (with the next draft) at the next step

    def _images(self, s: Slot, media: Media, cap: int) -> int:
        """Read the images that start where ``s``'s cache ends, each whole (before the
        step's batch: the text before them is in the cache already); ``cap`` less their
        tokens. A failure ends this request alone."""
        span = media.at(len(s.cache))
        while span is not None and cap > 0:
            try:
                self._read_image(s, span)
            except Exception as exc:
                self._release(s, drop=True, error=str(exc))
                return cap
            cap -= span.n_tokens
            span = media.at(len(s.cache))
        return cap

    def _read_image(self, s: Slot, span: ImageSpan) -> None:
        job = _job(s)
        pos = len(s.cache)
        if self.handoff is not None:
            self.handoff.flush()  # what others' streams have waiting goes out before the encoder holds the step
        try:
            enc, _ = self.model.decode_image(s.id, _pos(job, pos), span.piece)
        except Exception:
            # no room for it: drop the prefixes idle slots keep for reuse and try once more (as _decode)
            idle = [x for x in self.slots if x.job is None and x.cache]
            if not idle:
                raise
            for x in idle:
                self.model.seq_rm(x.id)
                x.cache = []
            self.model.seq_rm(s.id, _pos(job, pos), -1)
            enc, _ = self.model.decode_image(s.id, _pos(job, pos), span.piece)
        s.cache.extend(job.tokens[pos:span.end])
        job.images_read += 1
        if enc is not None:
            job.images_encoded += 1
            job.encode_ns += enc

    def _lora_group(self, active: list[Slot]) -> list[Slot]:
        """The slots this step decodes, all under one set of adapter scales: one
        decode runs with one set (llama-server's ``can_batch_with`` compares the
        slots' lora, server-context.cpp). The sets take turns, oldest request's
        first, so no set waits for another's requests to end; the adapters are
        set on the context for it."""
        groups: dict[tuple[float, ...], list[Slot]] = {}
        for s in sorted(active, key=_submitted):
            groups.setdefault(_job(s).lora_scales, []).append(s)
        keys = list(groups)
        key = keys[self._lora_turn % len(keys)]
        self._lora_turn = self._lora_turn + 1 if len(keys) > 1 else 0
        self.model.set_lora(key)
        chosen = groups[key]
        return [s for s in active if s in chosen]

    def _decode(self, entries: list[tuple[int, int, int, bool]], active: list[Slot]) -> None:
        if self.handoff is not None:
            self.handoff.flush()  # the event loop takes the GIL while llama_decode runs without it, not in the gap before
        try:
            self.model.decode(entries)
        except Exception:
            # No room for the batch (llama.cpp restores the cache state): drop the
            # prefixes idle slots keep for reuse and try once more.
            idle = [s for s in self.slots if s.job is None and s.cache]
            if not idle:
                raise
            for s in idle:
                self.model.seq_rm(s.id)
                s.cache = []
            self.model.decode(entries)

    def _on_token(self, s: Slot, tok: int, now: int, i: int) -> None:
        job = s.job
        assert job is not None
        if tok < 0:  # its grammar took too long at this token: this request ends, the others go on
            self._release(s, error=Refused(getattr(s.sampler, "failed", "") or "the sampler picked no token"))
            return
        if not job.sampling.ignore_eos and self.model.is_eog(tok):
            self._finish(s, "stop")
            return
        if job.logprobs is not None:
            lp, top = (self.model.post_probs(i, tok, job.logprobs, job.sampling) if job.post_sampling
                       else self.model.logprobs(i, tok, job.logprobs))
            job.emit("logprob", (tok, self.model.piece(tok), lp, [(t, self.model.piece(t), v) for t, v in top]))
        prev = job.token_ns[-1] if job.token_ns else None
        job.token_ns.append(now)
        job.n_gen += 1
        if prev is None:
            self.metrics.first_token((now - job.submit_ns) / 1e9)
            self.metrics.tokens_out(None)
        else:
            self.metrics.tokens_out((now - prev) / 1e9)
        new = s.utf8.decode(self.model.piece(tok))
        s.text += new
        if self._flush_text(s, final=False):
            return
        if job.t_max_predict_ms and "\n" in new and (now - job.token_ns[0]) / 1e6 > job.t_max_predict_ms:
            self._finish(s, "length")  # llama-server's "stopped by time limit" (server-context.cpp, process_token)
            return
        if job.n_gen >= job.max_tokens or len(s.cache) + 1 >= self.n_ctx_seq:
            self._finish(s, "length")
            return
        s.last = tok

    def _flush_text(self, s: Slot, *, final: bool) -> bool:
        """Send what is safe to send; True when a stop string ended the reply."""
        job = _job(s)
        end = len(s.text)
        if job.stop:
            longest = max(len(x) for x in job.stop)
            start = max(0, s.emitted - longest + 1)
            hits = [i for i in (s.text.find(x, start) for x in job.stop) if i >= 0]
            if hits:
                cut = min(hits)
                job.stop_word = next(x for x in job.stop if s.text.find(x, start) == cut)
                if cut > s.emitted:
                    job.emit("text", s.text[s.emitted:cut])
                s.emitted = cut
                self._finish(s, "stop", flush=False)
                return True
            if not final:  # hold back a tail that may begin a stop string
                for k in range(min(longest - 1, end - s.emitted), 0, -1):
                    if any(x.startswith(s.text[end - k:]) for x in job.stop):
                        end -= k
                        break
        if job.n_indent:
            line_cut, hold = indent_cut(s.text, s.emitted, job.n_indent)
            if line_cut is not None:
                if line_cut > s.emitted:
                    job.emit("text", s.text[s.emitted:line_cut])
                s.emitted = line_cut
                self._finish(s, "length", flush=False)
                return True
            if not final:
                end = min(end, hold)
        if end > s.emitted:
            job.emit("text", s.text[s.emitted:end])
            s.emitted = end
        return False

    def _finish(self, s: Slot, reason: str, *, flush: bool = True) -> None:
        if flush:
            tail = s.utf8.decode(b"", final=True)
            s.text += tail
            if self._flush_text(s, final=True):
                return
        _job(s).finish_reason = reason
        self._release(s)

    def _release(self, s: Slot, *, drop: bool = False, error: str | None = None) -> None:
        job = s.job
        if s.sampler is not None:
            self.model.free_sampler(s.sampler)
            s.sampler = None
        if drop:
            self.model.seq_rm(s.id)
            s.cache = []
        if s.drafting is not None:
            s.drafting.finish()
            s.drafting = None
        s.job, s.last, s.chunk = None, None, []
        self._clock += 1
        s.used_at = self._clock
        self.metrics.running = sum(1 for x in self.slots if x.job)
        if job is not None:
            job.ended = True
        if job is None or job.cancelled:
            return
        if error is not None:
            job.emit("error", error)
        else:
            t = job.timings()
            self.metrics.job_done(t["prompt_n"], None if t["prompt_ms"] is None else t["prompt_ms"] / 1e3, job.n_gen,
                                  None if t["predicted_ms"] is None else t["predicted_ms"] / 1e3, len(job.tokens) + job.n_gen)
            job.emit("done", job.finish_reason)

"""Server metrics in the Prometheus text exposition format (version 0.0.4).

Written by hand rather than with prometheus_client: a few counters, gauges and
two histograms do not justify a dependency. The engine thread records, the
/metrics route renders; a lock keeps a histogram's buckets and sum consistent.

Two families: serve's own (``localllm_*``: histograms of TTFT and ITL, the
batch, the KV cells, the thread counts) and llama-server's (``llamacpp:*``,
with its names, help lines and counting rules from tools/server/server-task.cpp
``to_metrics``), so a dashboard made for llama-server reads serve unchanged:
prompt tokens count those processed (the cached ones apart), the generation
time runs from the first token to the last, and the two throughput gauges are
over the window since the previous scrape (llama-server's buckets), 0 when
nothing ran in it.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Sequence

# Seconds. TTFT spans prefill (tens of ms to seconds); ITL is one decode step.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, acc = [], 0
        for bound, c in zip(self.bounds, self.counts):
            acc += c
            out.append(f'{name}_bucket{{le="{bound:g}"}} {acc}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        out.append(f"{name}_sum {self.total:.6f}")
        out.append(f"{name}_count {self.n}")
        return out


class ServerMetrics:
    def __init__(self) -> None:
        self.started = time.time()  # the server's start, as llama-server's Process-Start-Time-Unix header says it
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.generated_tokens = 0
        self.steps = 0
        self.draft_tokens = 0  # draftless speculation: tokens drafted and verified, kept, verify batches
        self.draft_accepted = 0
        self.draft_batches = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.batch_sequences = 0
        self.batch_tokens = 0
        self.kv_cells_used = 0
        self.kv_cells_total = 0
        self.running = 0
        self.queued = 0
        self.threads: dict[str, int] = {}  # decode threads per kind of step now (localllm.threads); empty: none chosen yet
        self.thread_changes = 0
        self.threads_fixed = False
        # llama-server's counters (llamacpp:*), from each request's own timings at its end
        self.prompt_processed = 0
        self.prompt_seconds = 0.0
        self.predicted = 0
        self.predicted_seconds = 0.0
        self.busy_slots = 0  # summed over decode steps: / steps is llama-server's n_busy_slots_per_decode
        self.n_tokens_max = 0
        self._window = [0, 0.0, 0, 0.0]  # since the last scrape: prompt tokens, seconds, predicted tokens, seconds

    def job_done(self, prompt_n: int, prompt_s: float | None, predicted_n: int, predicted_s: float | None, n_tokens: int) -> None:
        """One request's timings at its end (``scheduler.Job.timings``): its processed
        prompt tokens and their time, its generated tokens and their time."""
        with self._lock:
            self.prompt_processed += prompt_n
            self.predicted += predicted_n
            self.prompt_seconds += prompt_s or 0.0
            self.predicted_seconds += predicted_s or 0.0
            self.n_tokens_max = max(self.n_tokens_max, n_tokens)
            w = self._window
            w[0] += prompt_n
            w[1] += prompt_s or 0.0
            w[2] += max(predicted_n - 1, 0) if predicted_s else 0  # the first token costs no decode step of its own
            w[3] += predicted_s or 0.0

    def embedded(self, n_tokens: int, decodes: int, seconds: float) -> None:
        """An embedding request: its prompt tokens read and their time, its decodes (llama-server counts them, none predicted)."""
        with self._lock:
            self.prompt_processed += n_tokens
            self.prompt_seconds += seconds
            self.steps += decodes
            self._window[0] += n_tokens
            self._window[1] += seconds

    def request_done(self, endpoint: str, status: int) -> None:
        with self._lock:
            key = (endpoint, status)
            self.requests[key] = self.requests.get(key, 0) + 1

    def step(self, sequences: int, tokens: int, kv_used: int) -> None:
        with self._lock:
            self.steps += 1
            self.busy_slots += sequences
            self.batch_sequences, self.batch_tokens, self.kv_cells_used = sequences, tokens, kv_used

    def drafts(self, drafted: int, kept: int) -> None:
        """A draft of ``drafted`` tokens verified, ``kept`` of them kept (the engine thread)."""
        with self._lock:
            self.draft_tokens += drafted
            self.draft_accepted += kept
            self.draft_batches += 1

    def set_threads(self, counts: dict[str, int], changes: int, fixed: bool) -> None:
        """The thread counts the engine runs each kind of step with now, and how
        often they moved (the engine thread, after each step)."""
        with self._lock:
            self.threads, self.thread_changes, self.threads_fixed = dict(counts), changes, fixed

    def tokens_out(self, itl_s: float | None) -> None:
        with self._lock:
            self.generated_tokens += 1
            if itl_s is not None:
                self.itl.observe(itl_s)

    def first_token(self, ttft_s: float) -> None:
        with self._lock:
            self.ttft.observe(ttft_s)

    def prompt(self, n: int, cached: int) -> None:
        with self._lock:
            self.prompt_tokens += n
            self.prompt_tokens_cached += cached

    def render(self) -> str:
        with self._lock:
            out: list[str] = []

            def head(name: str, kind: str, text: str) -> None:
                out.append(f"# HELP {name} {text}")
                out.append(f"# TYPE {name} {kind}")

            head("localllm_requests_total", "counter", "HTTP requests answered, by endpoint and status")
            for (ep, status), n in sorted(self.requests.items()):
                out.append(f'localllm_requests_total{{endpoint="{ep}",status="{status}"}} {n}')
            head("localllm_prompt_tokens_total", "counter", "prompt tokens admitted")
            out.append(f"localllm_prompt_tokens_total {self.prompt_tokens}")
            head("localllm_prompt_tokens_cached_total", "counter", "prompt tokens reused from the KV cache instead of computed")
            out.append(f"localllm_prompt_tokens_cached_total {self.prompt_tokens_cached}")
            head("localllm_generated_tokens_total", "counter", "tokens generated")
            out.append(f"localllm_generated_tokens_total {self.generated_tokens}")
            head("localllm_decode_steps_total", "counter", "llama_decode calls (one batch each)")
            out.append(f"localllm_decode_steps_total {self.steps}")
            head("localllm_time_to_first_token_seconds", "histogram", "from queueing the tokenized request to its first sampled token")
            out.extend(self.ttft.lines("localllm_time_to_first_token_seconds"))
            head("localllm_inter_token_latency_seconds", "histogram", "gap between consecutive tokens of one sequence")
            out.extend(self.itl.lines("localllm_inter_token_latency_seconds"))
            head("localllm_batch_sequences", "gauge", "sequences in the last decoded batch")
            out.append(f"localllm_batch_sequences {self.batch_sequences}")
            head("localllm_batch_tokens", "gauge", "tokens in the last decoded batch")
            out.append(f"localllm_batch_tokens {self.batch_tokens}")
            head("localllm_kv_cells_used", "gauge", "KV cache positions held by all sequences (a shared prefix counts once per sequence)")
            out.append(f"localllm_kv_cells_used {self.kv_cells_used}")
            head("localllm_kv_cells_total", "gauge", "KV cache cells in the shared pool")
            out.append(f"localllm_kv_cells_total {self.kv_cells_total}")
            head("localllm_requests_running", "gauge", "requests holding a sequence slot")
            out.append(f"localllm_requests_running {self.running}")
            head("localllm_requests_queued", "gauge", "requests waiting for a slot")
            out.append(f"localllm_requests_queued {self.queued}")
            if self.threads:  # none before the first step: absent, not 0
                head("localllm_threads", "gauge", "decode threads per kind of step now (token: one token; multi: one token of several "
                     "sequences; prefill: prompt batches), chosen from measured step times unless fixed by --threads")
                mode = "fixed" if self.threads_fixed else "adaptive"
                for kind, n in sorted(self.threads.items()):
                    out.append(f'localllm_threads{{kind="{kind}",mode="{mode}"}} {n}')
                head("localllm_thread_changes_total", "counter", "moves of a thread count (another process took or freed a core)")
                out.append(f"localllm_thread_changes_total {self.thread_changes}")
            out.extend(self._llamacpp())
            return "\n".join(out) + "\n"

    def _llamacpp(self) -> list[str]:
        """llama-server's metrics, its names and help lines; the window gauges reset."""
        p_n, p_s, g_n, g_s = self._window
        self._window = [0, 0.0, 0, 0.0]
        counters = [
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", self.prompt_processed),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", self.prompt_tokens_cached),
            ("prompt_seconds_total", "Total time spent processing prompts", self.prompt_seconds),
            ("tokens_predicted_total", "Number of generation tokens processed", self.predicted),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", self.predicted_seconds),
            ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding", self.steps),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.n_tokens_max),
            ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", self.draft_tokens),
            ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model", self.draft_accepted),
            ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", self.draft_batches),
        ]
        gauges = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", p_n / p_s if p_s else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s", g_n / g_s if g_s else 0.0),
            ("requests_processing", "Number of requests processing", self.running),
            ("requests_deferred", "Number of requests deferred", self.queued),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", self.busy_slots / max(self.steps, 1)),
        ]
        out: list[str] = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, text, value in items:
                out += [f"# HELP llamacpp:{name} {text}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value:g}"]
        return out

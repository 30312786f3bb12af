"""Prefill and decode speed: local only, on one loopback RPC worker, split across
two, side by side in one run; and the bytes that cross the network per token.

    python scripts/bench_rpc.py [--model smollm2] [--quick] [--threads 1]

Workers are ``localllm worker`` processes on 127.0.0.1. llama.cpp does not count
the bytes its RPC client sends, so a small counting TCP relay stands between the
client and the worker for one extra pass (not the timed ones): bytes per decoded
token are the relay's counts over the decode phase divided by its tokens.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localllm.engine import LlamaCppBackend  # noqa: E402
from localllm.engine_api import LoadConfig, SamplingConfig  # noqa: E402
from localllm.errors import InputError  # noqa: E402
from localllm.measure.bench import random_prompt, run_bench  # noqa: E402
from localllm.modelfile.model_info import describe  # noqa: E402
from localllm.plan.workers import Endpoint, probe  # noqa: E402
from localllm.store import resolver  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localllm", "worker", "--port", str(port), "--threads", str(threads)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            probe(Endpoint("127.0.0.1", port), timeout=2)
            return proc, f"127.0.0.1:{port}"
        except InputError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker did not start: {proc.stderr.read() if proc.stderr else ''}") from None
            time.sleep(0.2)


def stop_worker(proc: subprocess.Popen) -> None:
    """Ctrl+C to a worker, then kill it if it has not gone in 10 s."""
    proc.send_signal(2)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


class CountingRelay:
    """127.0.0.1:<port> -> target, counting bytes each way."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.sent = self.received = 0
        self.lock = threading.Lock()
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(4)
        self.endpoint = f"127.0.0.1:{self.srv.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            u = socket.create_connection(self.target)
            for s in (c, u):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(c, u, "sent"), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, "received"), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, which: str) -> None:
        try:
            while True:
                data = a.recv(1 << 16)
                if not data:
                    break
                with self.lock:
                    setattr(self, which, getattr(self, which) + len(data))
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.sent, self.received


def bytes_per_token(path: Path, cfg: LoadConfig, relay: CountingRelay, prompt_len: int, gen: int) -> tuple[float, float, float]:
    """(bytes sent per prompt token, sent per decoded token, received per decoded token)."""
    with LlamaCppBackend() as b:
        b.load(path, cfg)
        d = describe(b.header)
        toks = random_prompt(prompt_len, d.n_vocab, b.header.get("tokenizer.ggml.bos_token_id"), 7)
        s0 = relay.counts()
        marks = []
        for ev in b.stream(toks, SamplingConfig(temperature=0, max_tokens=gen, ignore_eos=True)):
            if ev.index == 0:
                marks.append(relay.counts())
        end = relay.counts()
    n_dec = gen - 1
    return (marks[0][0] - s0[0]) / prompt_len, (end[0] - marks[0][0]) / n_dec, (end[1] - marks[0][1]) / n_dec


def _spread(x: float | None, digits: int) -> str:
    """A figure that was not measured (one repetition has no spread) is n/a."""
    return "n/a" if x is None else f"{x:.{digits}f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--quick", action="store_true", help="one short prompt, few tokens, one rep")
    ap.add_argument("--threads", type=int, default=1, help="threads for the local CPU and for each worker (default 1)")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    prompt, gen, reps = (64, 16, 1) if a.quick else (a.prompt, a.gen, a.reps)
    path = resolver.resolve(a.model)
    base = LoadConfig(n_ctx=1024, n_threads=a.threads, n_gpu_layers=-1)
    workers = [start_worker(a.threads), start_worker(a.threads)]
    eps = [w[1] for w in workers]
    setups = [
        ("local CPU only", LoadConfig(**{**base.to_dict(), "n_gpu_layers": 0})),
        ("one loopback worker (all layers)", LoadConfig(**{**base.to_dict(), "rpc_servers": (eps[0],)})),
        ("split across two workers", LoadConfig(**{**base.to_dict(), "rpc_servers": tuple(eps), "tensor_split": (1.0, 1.0)})),
    ]
    print(f"model {path.name} · prompt {prompt} tokens · {gen} generated · {reps} reps · {a.threads} thread(s) per process · 127.0.0.1")
    print(f"{'setup':<34}{'prefill t/s':>14}{'decode t/s':>14}{'ITL p50 ms':>12}")
    rows = []
    try:
        for name, cfg in setups:
            with LlamaCppBackend() as b:
                b.load(path, cfg)
                d = describe(b.header)
                r = run_bench(b, prompt_lengths=[prompt], gen_tokens=gen, reps=reps, n_vocab=d.n_vocab, bos=b.header.get("tokenizer.ggml.bos_token_id"))[0]
            rows.append((name, r))
            print(
                f"{name:<34}{r.pp_tokens_per_s:>9.1f} ±{_spread(r.pp_std, 0):<4}{r.tg_tokens_per_s:>9.1f} ±{_spread(r.tg_std, 1):<4}"
                f"{_spread(r.itl_p50_ms, 2):>12}",
                flush=True,
            )
        relay = CountingRelay(eps[0])
        cfg = LoadConfig(**{**base.to_dict(), "rpc_servers": (relay.endpoint,)})
        pp_b, tg_sent, tg_recv = bytes_per_token(path, cfg, relay, prompt, gen)
        print()
        print(
            f"network, one worker (counted by a relay): {pp_b:,.0f} B sent per prompt token; per decoded token {tg_sent:,.0f} B sent, {tg_recv:,.0f} B received"
        )
        local = rows[0][1].tg_tokens_per_s
        one = rows[1][1].tg_tokens_per_s
        per_tok_ms = 1000 / one - 1000 / local if one and local else float("nan")
        print(f"decode on one worker costs {per_tok_ms:+.2f} ms per token over local here (loopback: the RPC round trips and copies, not the wire)")
    finally:
        for p, _ in workers:
            stop_worker(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

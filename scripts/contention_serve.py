"""bench_contention's serve rows (issue 50): ``localllm serve`` with its thread
count chosen as it decodes against llama-server at its default threads, with one
core taken by another process, at 1 and 8 clients.

Both servers start before the hog and stay up; each round measures every
client level on both, the order flipped each round, with fresh prompts (the
same for both) so that neither answers from its prompt cache. The figure is
aggregate tokens/s (``localllm.measure.loadtest``, the client of ``localllm
bench --url``), the ratio the geometric mean of the rounds' pairs with its 95%
interval. Target: >= 1.3 at both levels. llama-server gets ``-np`` = the most
clients and a unified cache of that many contexts, as serve's is; neither gets
``-t``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from scripts.paired_runs import free_port, measure_level, rate_of, start_server, stop_server, verdict_line, wait_ready

SERVE_TARGET = 1.3


def serve_rows(path: Path, llama_server: Path, hog_factory, *, rounds: int, gen_tokens: int, clients: tuple[int, ...] = (1, 8),
               ctx: int = 512, prompt_tokens: int = 64, warmup: bool = True, requests: int | None = None) -> list[str]:
    """The verdict lines for each client level (n/a with the reason when a side did not run);
    ``requests`` a level (default: two a client)."""
    top = max(clients)
    if not llama_server.exists():
        return [verdict_line(f"one core busy: serve adaptive / llama-server default threads, {c} client(s) (target >= {SERVE_TARGET})", [],
                             SERVE_TARGET, f"{llama_server} missing: scripts/build_llama_tools.sh builds it") for c in clients]
    args = SimpleNamespace(prompt_tokens=prompt_tokens, gen_tokens=gen_tokens)
    ratios: dict[int, list[float]] = {c: [] for c in clients}
    procs: dict[str, tuple[subprocess.Popen, str]] = {}
    with tempfile.TemporaryDirectory() as logs:
        try:
            port = free_port()
            procs["serve"] = start_server("contention_serve", [sys.executable, "-m", "localllm", "serve", str(path), "--port", str(port),
                                                               "--parallel", str(top), "--ctx", str(ctx)], port, Path(logs))
            port = free_port()
            procs["llama-server"] = start_server("contention_llama_server", [str(llama_server), "-m", str(path), "--port", str(port), "-np", str(top),
                                                                             "-c", str(ctx * top), "-kvu", "--no-webui"], port, Path(logs))
            for proc, base in procs.values():
                wait_ready(proc, base)
            with hog_factory():
                for r in range(rounds):
                    for c in clients:
                        order = ["serve", "llama-server"][:: 1 if r % 2 == 0 else -1]
                        seed = 7_000_000 * (r + 1) + c  # fresh prompts each round, the same for both servers
                        got = {n: rate_of(measure_level(f"{n} busy", procs[n][1], c, args, first=warmup and r == 0, seed=seed,
                                                      requests=requests), "tokens_per_s")
                               for n in order}
                        if got["serve"] and got["llama-server"]:
                            ratios[c].append(got["serve"] / got["llama-server"])
        except RuntimeError as exc:
            return [f"- one core busy: serve / llama-server: a server failed to start: {exc}"]
        finally:
            for proc, _ in procs.values():
                stop_server(proc)
    return [verdict_line(f"one core busy: serve adaptive / llama-server default threads, {c} client(s) (target >= {SERVE_TARGET})", ratios[c],
                         SERVE_TARGET, "no round completed") for c in clients]

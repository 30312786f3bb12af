"""What the paired benchmarks share: starting and stopping a server, and the
paired-ratio verdict (the geometric mean of per-pair ratios and its 95%
interval). Its own module, under every benchmark that uses it: bench_serve
dispatches to bench_embed and bench_agents, which used these from
bench_serve, an import circle."""

from __future__ import annotations

import asyncio
import math
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localllm.measure.loadtest import measure  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, base: str, timeout: float = 180) -> None:
    import httpx2

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            # llama-server answers 503 on /health while it loads; llama_cpp.server has no /health.
            health = httpx2.get(base + "/health", timeout=2).status_code
            if health == 200 or (health == 404 and httpx2.get(base + "/v1/models", timeout=2).status_code == 200):
                return
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError("not ready in time")


def start_server(name: str, cmd: list[str], port: int, log_dir: Path):
    log = open(log_dir / f"{name}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO), f"http://127.0.0.1:{port}"


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def serve_cmd(path: str, port: int, np_: int, ctx: int, threads: int) -> list[str]:
    return [sys.executable, "-m", "localllm", "serve", path, "--port", str(port), "--parallel", str(np_), "--ctx", str(ctx), "--threads", str(threads)]


def measure_level(name: str, base: str, c: int, args, first: bool, extra: dict | None = None, seed: int = 0,
                  requests: int | None = None) -> dict | str:
    """One level of ``c`` clients: ``requests`` in all (default: loadtest's, two a client)."""
    try:
        _, rows = asyncio.run(
            measure(
                base,
                model=None,
                concurrency=[c],
                requests=requests,
                prompt_tokens=[args.prompt_tokens],
                gen_tokens=args.gen_tokens,
                api_key=None,
                warmup=first,
                progress=lambda m: print(f"  {name}: {m}", file=sys.stderr, flush=True),
                extra=extra,
                seed=seed,
            )
        )
        return rows[0].to_dict()
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {exc}"


def rate_of(row: dict | str, key: str) -> float | None:
    return row.get(key) if isinstance(row, dict) else None


def interval(ratios: list[float]) -> tuple[float, float] | None:
    """The 95% interval of the geometric mean (the standard error of the log-ratios,
    normal approximation); None from fewer than two pairs."""
    if len(ratios) < 2:
        return None
    logs = [math.log(r) for r in ratios]
    mean, se = statistics.mean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean - 1.96 * se), math.exp(mean + 1.96 * se)


def verdict_line(label: str, ratios: list[float], target: float, missing: str = "not measured") -> str:
    """``label: geometric mean [pairs] 95% interval (verdict)``; n/a with the reason when no
    pair completed. The verdict: met when the whole interval clears the target; "not
    shown" when the mean does and the interval spans it (a pair swings by a few per
    cent on a shared machine: a mean just over the target is noise, not a lead);
    NOT met when the mean falls short. One pair has no interval: its mean decides."""
    if not ratios:
        return f"- {label}: n/a ({missing})"
    mean = statistics.geometric_mean(ratios)
    pairs = ", ".join(f"{r:.3f}" for r in ratios)
    band = interval(ratios)
    if mean < target:
        verdict = "NOT met"
    elif band is not None and band[0] < target:
        verdict = "not shown: the interval spans the target"
    else:
        verdict = "met"
    spread = f" 95% interval {band[0]:.3f}-{band[1]:.3f}" if band else ""
    return f"- {label}: {mean:.3f} [pairs: {pairs}]{spread} ({verdict})"

"""The conformance cases over RPC placements: one and two loopback llama.cpp workers.

Each case is loaded with every layer and the output offloaded to the workers
(an even split, as ``--rpc`` does with equal workers), with 1, 4 and 8
sequences. Per device: the KV cache the placement (plan.placement) gives it
against llama.cpp's printed buffer, the placement's compute against llama.cpp's,
and llama.cpp's dry run of the same config (RPC devices included) against the
real load.

    python -m scripts.plan_conformance_rpc                 # every case
    python -m scripts.plan_conformance_rpc --arch llama    # some
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root, for scripts.* and tests.*

from localllm.engine_api import LoadConfig
from scripts.plan_conformance import CASES, SEQS, Setting
from scripts.synth_gguf import write_gguf

MiB = 1024 * 1024


@dataclass
class RpcRow:
    case: str
    n_workers: int
    n_seq: int
    kv: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)  # device -> (placed, llama.cpp)
    compute: dict[str, tuple[float, float, float | None]] = field(default_factory=dict)  # device -> (placed, llama.cpp, dry run)
    error: str = ""

    @property
    def kv_ok(self) -> bool:
        return not self.error and all(p == g for p, g in self.kv.values())

    @property
    def dry_ok(self) -> bool:
        return not self.error and all(d is not None and round(d, 2) == round(g, 2) for _, g, d in self.compute.values())

    def ratios(self) -> list[float]:
        return [p / g for p, g, _ in self.compute.values() if g]


def measure(case: str, path: Path, eps: list[str], n_seq: int) -> RpcRow:
    from localllm.engine import LlamaCppBackend, dryrun
    from localllm.errors import LocalLLMError
    from localllm.modelfile.gguf_file import read_header
    from localllm.plan.placement import Device, place
    from localllm.plan.planner import ModelShape

    base = Setting(1000, 512, "f16", True, False, n_seq=n_seq).config()
    split = (1.0,) * len(eps)
    cfg = LoadConfig(**{**base.to_dict(), "n_gpu_layers": -1, "rpc_servers": tuple(eps), "tensor_split": split})
    header = read_header(path)
    devices = [Device(f"RPC0[{ep}]", "rpc", None) for ep in eps]
    pl = place(ModelShape.from_header(header), cfg, devices, Device("CPU", "cpu", None), list(split), header=header)
    row = RpcRow(case, len(eps), n_seq)
    try:
        dry = dryrun.run(path, cfg)
        with LlamaCppBackend() as b:
            b.load(path, cfg)
            logged = b.logged_buffers
    except LocalLLMError as exc:
        row.error = str(exc)
        return row
    for u in pl.uses:
        got = logged.get(u.device.name, {})
        row.kv[u.device.name] = ([round(n / MiB, 2) for n in u.kv_by_cache], got.get("KV", []))
        printed = got.get("compute", [0.0])[0]
        d = dry.buffers.get(u.device.name, {}).get("compute")
        row.compute[u.device.name] = (u.compute_bytes / MiB, printed, None if d is None else d / MiB)
    return row


def render(rows: list[RpcRow]) -> str:
    head = f"{'model':<13} {'workers':>7} {'seqs':>4} {'KV exact':>8} {'compute per device, MiB: placed/llama.cpp/dry run':<64} {'dry = load':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.error:
            lines.append(f"{r.case:<13} {r.n_workers:>7} {r.n_seq:>4} error: {r.error}")
            continue
        per = "  ".join(f"{p:.2f}/{g:.2f}/{'n/a' if d is None else f'{d:.2f}'}" for p, g, d in r.compute.values())
        lines.append(f"{r.case:<13} {r.n_workers:>7} {r.n_seq:>4} {'yes' if r.kv_ok else 'NO':>8} {per:<64} {'yes' if r.dry_ok else 'NO':>10}")
    ok = [r for r in rows if not r.error]
    ratios = [x for r in ok for x in r.ratios()]
    lines += ["", f"{len(rows)} RPC loads: KV exact per device in {sum(r.kv_ok for r in ok)}, dry run's compute per device = the real "
              f"load's in {sum(r.dry_ok for r in ok)}" + (f"; placed compute / llama.cpp per device {min(ratios):.3f}..{max(ratios):.3f}" if ratios else "")]
    return "\n".join(lines)


def run(cases: list[str]) -> list[RpcRow]:
    from tests.helpers.workers import WorkerProc

    rows: list[RpcRow] = []
    with tempfile.TemporaryDirectory() as d:
        for case in cases:
            path = write_gguf(Path(d) / f"{case.replace('+', '-')}.gguf", CASES[case])
            workers = [WorkerProc(), WorkerProc()]  # fresh ones per case: a worker one load left stuck fails only that case
            try:
                eps = [str(w.ep) for w in workers]
                for n in (1, 2):
                    for n_seq in SEQS:
                        rows.append(measure(case, path, eps[:n], n_seq))
            finally:
                for w in workers:
                    w.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", choices=sorted(CASES), help="only these cases (repeatable)")
    a = ap.parse_args(argv)
    import logging

    logging.getLogger("localllm.llama").setLevel(logging.CRITICAL)
    t0 = time.perf_counter()
    rows = run(a.arch or list(CASES))
    print(render(rows))
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0 if all(r.kv_ok and r.dry_ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""``localllm list --catalog``: the curated 4-6 GiB list with the planner's verdicts."""

from __future__ import annotations

import argparse

from localllm.store import curated, registry
from localllm.util import fmt
from localllm.util.units import format_size


def run(args: argparse.Namespace) -> int:
    table = curated.rows()
    here = {(e.repo, e.filename) for e in registry.discover() if e.repo}
    for r in table:
        r["here"] = (r["repo"], r["file"]) in here
    if args.json:
        fmt.print_json(table)
        return 0
    head = ("MODEL", "QUANT", "SIZE", "CTX", "ARCH", "LICENSE", *(f"{curated.budget_label(k)} GPU" for k in curated.BUDGETS), "HERE")
    body = [
        (r["name"] + (" (vision)" if r["vision"] else ""), r["quant"],
         "≈" + format_size(r["size_bytes"], "GiB") + (f" + ≈{format_size(r['mmproj_size_bytes'], 'GiB')} mmproj" if r["vision"] else ""),
         f"{r['context']:,}", r["architecture"], r["license"],
         r["fits_4gib"], r["fits_6gib"], "yes" if r["here"] else "")
        for r in table
    ]
    print(fmt.table(head, body, right=(2, 3)))
    if any(r["vision"] for r in table):
        print("\n(vision): pull fetches its projector (mmproj) beside it; the verdicts count the projector on the GPU too "
              "(its weights and an estimated compute buffer)")
    print("\nuse a name as it is: localllm run NAME[:QUANT] pulls it on first use (localllm plan NAME plans it first, "
          "localllm pull NAME --vram SIZE takes the largest quant that fits)")
    return 0

"""``localllm list --catalog``: the curated 4-6 GiB list with the planner's verdicts."""

from __future__ import annotations

from pathlib import Path

from localllm.store import curated, registry
from localllm.util import fmt
from localllm.util.units import format_size


def run(*, as_json: bool) -> int:
    """``list --catalog`` (``as_json``: --json)."""
    table = curated.rows()
    here = {(e.repo, e.filename): e.path for e in registry.discover() if e.repo}
    for r in table:
        path = here.get((r["repo"], r["file"]))
        r["here"] = path is not None
        _exact_sizes(r, path)
    if as_json:
        fmt.print_json(table)
        return 0
    head = ("MODEL", "QUANT", "SIZE", "CTX", "ARCH", "LICENSE", *(f"{curated.budget_label(k)} GPU" for k in curated.BUDGETS), "HERE")
    body = [
        (r["name"] + (" (vision)" if r["vision"] else ""), r["quant"],
         _size(r["size_bytes"], r["size_approximate"])
         + (f" + {_size(r['mmproj_size_bytes'], r['mmproj_size_approximate'])} mmproj" if r["vision"] else ""),
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


def _exact_sizes(row: dict, path: Path | None) -> None:
    """The catalog's sizes are the Hub listing's, rounded (approximate); once ``pull``
    has stored the file (and the projector beside it, from the same listing), they
    are the files' own, exact."""
    row["size_approximate"], row["mmproj_size_approximate"] = True, (True if row["vision"] else None)
    if path is None:
        return
    try:
        row["size_bytes"], row["size_approximate"] = path.stat().st_size, False
        if row["vision"] and row["mmproj_file"]:
            projector = path.parent / row["mmproj_file"]
            row["mmproj_size_bytes"], row["mmproj_size_approximate"] = projector.stat().st_size, False
    except OSError:
        pass


def _size(n: int, approximate: bool) -> str:
    return ("≈" if approximate else "") + format_size(n, "GiB")

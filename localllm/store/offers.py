"""The catalog as this machine sees it, for a screen that offers models to pull
(the cockpit's F2 catalog tab, as LM Studio's discover tab): the catalog's files
not downloaded yet, each judged for this machine, and a pull that reports bytes
and can be stopped.

Kept here, free of any UI, so the screen only shows what these give:

- ``offers``: every catalog file (``models/catalog.toml``, ``localllm list
  --catalog``) that no registry entry has, by (repo, file) as ``list --catalog``
  tells "here";
- ``judge``: the planner's verdict (``plan.verdict``) for this machine's budget.
  Before a download there is no header: the shape is the published
  configuration with the listing's size spread over it (``curated.shape``), so
  the verdict and the size are estimates, and say so (``ESTIMATE``);
- ``pull``: ``pulling.pull``, the pull ``localllm pull`` and ``/api/pull`` use
  (resume, sha256, the Hub's answers untrusted), with the bytes summed over a
  split model's parts and a ``should_stop`` asked at every step: stopping
  raises ``Stopped`` and keeps the partial file for the next pull to resume, as
  Ctrl+C does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localllm.plan import fitting, verdict
from localllm.store import curated, hub, pulling, registry
from localllm.util.units import GB

ESTIMATE = "estimate"  # the word a figure made before the header is read carries


@dataclass(frozen=True)
class Offer:
    """One catalog file not downloaded here."""

    model: curated.CatalogModel
    file: curated.CatalogFile

    @property
    def name(self) -> str:
        """The name ``localllm pull`` takes for this very file (the catalog's name and quant)."""
        return f"{self.model.name}:{self.file.quant.lower()}"

    @property
    def size_bytes(self) -> int:
        """The listing's size (``size_gb``, rounded, written down offline): an
        estimate; the pull takes the exact size from the Hub."""
        return int(self.file.size_gb * GB)


def offers(entries: list[registry.ModelEntry] | None = None) -> list[Offer]:
    """The catalog's files that none of ``entries`` (default: the registry now) is,
    in the catalog's order."""
    here = {(e.repo, e.filename) for e in (registry.discover() if entries is None else entries) if e.repo}
    return [Offer(m, f) for m in curated.load() for f in m.files if (m.repo, f.file) not in here]


def judge(offer: Offer, hw: Any, request: fitting.Request | None = None) -> verdict.Verdict:
    """The verdict on ``offer`` for ``hw`` (a ``hardware.Hardware``: its GPU budget
    and the RAM available): with ``request`` as asked (the cockpit's settings),
    else the question ``run`` asks with no options (``verdict.judge``, as ``list``
    asks it). An estimate (see the module's note). Raises the fitting service's
    errors (``SettingError``: a cache type llama.cpp refuses for this model)."""
    shape = curated.shape(offer.model, offer.size_bytes)
    if request is None:
        return verdict.judge(shape, offer.model.context, hw.gpu_budget, hw.ram_available_bytes)
    f = fitting.fit(shape, request, fitting.Budget.of(hw), trained_ctx=offer.model.context, ctx_limit=request.config.n_ctx)
    return verdict.of_fit(f, (f.plan.total_gpu_bytes, f.plan.total_cpu_bytes), shape)


class Stopped(Exception):
    """The caller asked the pull to stop: nothing is listed, the partial file is
    kept and the next pull of the same name resumes it."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"stopped at {done} of {total} bytes; the partial file is kept for the next pull to resume")
        self.done = done
        self.total = total


OnBytes = Callable[[int, int], None]


def pull(name: str, *, on_bytes: OnBytes | None = None, should_stop: Callable[[], bool] | None = None) -> hub.PullResult:
    """``pulling.pull(name)``, reporting (bytes done, bytes total) over every part
    of the file (a part's size counts once the Hub announced it), and asking
    ``should_stop`` at every step (before the transfer, after each chunk, before
    each retry): True raises ``Stopped`` there. Blocking: run it in a thread."""
    sizes: dict[str, tuple[int, int]] = {}  # file -> (done, total)

    def step(p: hub.Progress) -> None:
        sizes[p.filename] = (p.completed, p.total)
        done, total = sum(d for d, _ in sizes.values()), sum(t for _, t in sizes.values())
        if should_stop is not None and p.completed < p.total and should_stop():  # a whole file is verified and stored
            raise Stopped(done, total)
        if on_bytes is not None:
            on_bytes(done, total)

    if should_stop is not None and should_stop():
        raise Stopped(0, 0)
    return pulling.pull(name, on_progress=step)

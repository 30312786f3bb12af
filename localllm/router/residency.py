"""Which models may be loaded together: the memory plan decides, before each load.

Each model is fitted as ``run`` fits it, alone on this machine: its context,
cache types and GPU layers are ``run``'s (``localllm.commands.serve`` gives the
pool that fit, ``Memory.plan``: ``prepare_load``, refereed by llama.cpp's dry
run), and so are its bytes per column, GPU and CPU (``LoadPlan.total``: the
figures ``plan`` shows, with llama.cpp's compute and output buffers where its
dry run gave them, so "fits" never rests on an estimate below llama.cpp's).
The child gets the same ``--vram`` the fit was made with, so it loads what
was planned.

A model fits beside the resident ones (loading, loaded or stopping: each holds
or will hold its memory) when the fit's own inequality (``prepare._fits_shown``)
still holds with what they take from the budget:

- GPU: its GPU bytes <= the budget - the fit's head-room - the residents' GPU
  bytes (the head-room is kept once for the device, not once per model);
- RAM: its CPU bytes <= the RAM for models - the residents' CPU bytes, where
  the RAM for models is the smaller of what was available when the router
  started (before any model: ``Budget.ram``, the figure ``run`` fits against
  on this machine) and what is available now plus what the residents are
  planned to hold (``ram_now``). The first never counts a resident twice;
  the second catches other programs that took memory since. (``psutil``'s
  "available" does not drop by a model's weights on the CPU, which are mapped
  from the file and count as reclaimable page cache, so the current figure
  alone would let models pile up; the start figure alone would not see the
  rest of the machine grow.)

When it does not fit, the least recently used idle residents are unloaded,
as few as make room; never one with a request in flight (nor one loading or
stopping). When only busy ones stand in the way, the request waits for one to
become idle. A model that cannot fit even alone is refused at once, and nothing
is unloaded for it. A model is never loaded with fewer layers on the GPU or a
smaller context because others are loaded: they make room for it (as Ollama's
scheduler evicts to load a model whole), so its settings never depend on what
else happens to be loaded.

Pure: ``decide`` takes numbers and returns a decision, for the pool
(``localllm.router.pool``) to act on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localllm.util import fmt


@dataclass(frozen=True)
class Need:
    """A model's planned bytes: on the GPU, and in RAM."""

    gpu: int
    cpu: int

    @classmethod
    def of(cls, plan: Any) -> Need:
        """The bytes of a ``prepare.LoadPlan`` (its ``total``: the figures shown)."""
        gpu, cpu = plan.total
        return cls(int(gpu), int(cpu))


@dataclass(frozen=True)
class Budget:
    """What the models share: the GPU budget (``--vram``, or the device's free
    memory when the router started; None: no GPU), the head-room the fit keeps
    free on it, and the RAM available when the router started."""

    gpu: int | None
    margin: int
    ram: int

    def words(self) -> str:
        gpu = f"GPU {fmt.size(self.gpu)} less {fmt.size(self.margin)} head-room, " if self.gpu is not None else ""
        return f"{gpu}RAM {fmt.size(self.ram)}"


@dataclass(frozen=True)
class Resident:
    """A model in memory (loading, loaded or stopping) as the decision sees it."""

    name: str
    need: Need
    idle: bool  # loaded with no request in flight: may be unloaded
    last_used: float  # monotonic


@dataclass(frozen=True)
class Decision:
    """What to do to load a model:

    - ``load``: it fits beside the residents;
    - ``unload``: it fits once the idle residents ``victims`` (least recently used first) are unloaded;
    - ``wait``: only busy residents stand in the way: wait for one to become idle;
    - ``refuse``: it would fit alone, but the machine's RAM is short now and no model is in the way;
    - ``never``: it does not fit even alone.

    ``why``: what is short (for the log and the refusal), or ``--models-max N``
    when the count is, not the memory."""

    action: str
    victims: tuple[str, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class Memory:
    """The router's memory plan: the ``budget``, ``plan`` (a model file and its
    name -> its ``LoadPlan``, fitted as ``run`` fits it against the budget with
    that model's own options; blocking: a dry run in a child process, so the
    pool calls it in a thread) and ``ram_now`` (the RAM available now, bytes)."""

    budget: Budget
    plan: Callable[[Path, str], Any]
    ram_now: Callable[[], int]


def alone(need: Need, budget: Budget) -> str | None:
    """Why ``need`` cannot fit even with nothing else loaded, or None."""
    if budget.gpu is not None and need.gpu and need.gpu > budget.gpu - budget.margin:
        return f"it needs {fmt.size(need.gpu)} of GPU memory, more than the budget {fmt.size(budget.gpu)} less {fmt.size(budget.margin)} head-room"
    if need.cpu > budget.ram:
        return f"it needs {fmt.size(need.cpu)} of RAM, more than the {fmt.size(budget.ram)} available"
    return None


def short(need: Need, kept: Sequence[Resident], everyone: Sequence[Resident], budget: Budget, ram_now: int) -> str | None:
    """What is short for ``need`` beside the residents ``kept`` (of ``everyone``
    resident now), or None when it fits."""
    if budget.gpu is not None and need.gpu:
        left = budget.gpu - budget.margin - sum(r.need.gpu for r in kept)
        if need.gpu > left:
            return f"it needs {fmt.size(need.gpu)} of GPU memory and the models loaded leave {fmt.size(max(left, 0))}"
    ram = min(budget.ram, ram_now + sum(r.need.cpu for r in everyone))
    left = ram - sum(r.need.cpu for r in kept)
    if need.cpu > left:
        return f"it needs {fmt.size(need.cpu)} of RAM and {fmt.size(max(left, 0))} is left"
    return None


def decide(need: Need | None, residents: Sequence[Resident], budget: Budget | None, ram_now: int, *, slots: int = 0) -> Decision:
    """What to do to load a model that needs ``need`` beside ``residents``.
    ``need`` or ``budget`` None: no memory plan, only the count (``slots``:
    ``--models-max``, 0 for no cap) decides."""
    if need is not None and budget is not None:
        why = alone(need, budget)
        if why is not None:
            return Decision("never", why=why)

    def lack(kept: Sequence[Resident]) -> str | None:
        if need is not None and budget is not None:
            why = short(need, kept, residents, budget, ram_now)
            if why is not None:
                return why
        if slots and len(kept) >= slots:
            return f"--models-max {slots}"
        return None

    first = lack(residents)
    if first is None:
        return Decision("load")
    kept = list(residents)
    victims: list[str] = []
    for r in sorted((r for r in residents if r.idle), key=lambda r: r.last_used):
        kept.remove(r)
        victims.append(r.name)
        if lack(kept) is None:
            return Decision("unload", tuple(victims), first)
    if any(not r.idle for r in residents):
        return Decision("wait", why=first)
    return Decision("refuse", why=first)

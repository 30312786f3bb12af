"""The cockpit over several devices (``localllm tui --rpc``): the load settings
fitted across the workers' devices, a local GPU and the CPU (the same fit as
``run --rpc``: the fitting service over placement.fit_across), and the
memory panel's bars, one per device."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from localllm import api
from localllm.errors import InputError
from localllm.plan import fitting
from localllm.util import fmt

COLORS = {"weights": "dodger_blue2", "kv": "magenta", "kv_later": "plum4", "compute": "yellow3", "free": "grey35"}


def fit_over_workers(path: Path, settings, hardware, endpoints: Sequence[object]):
    """The cockpit's settings fitted across the devices by the fitting service
    (as ``run --rpc``): returns (the LoadConfig with the workers and the planned
    split, a note on what the fit changed, the placement). The settings' cache
    types are kept, a set number of GPU layers too. Probes every worker first:
    one that is down is an InputError naming it."""
    servers = tuple(str(ep) for ep in endpoints)
    request = settings.fit_request()
    request = replace(request, config=replace(request.config, rpc_servers=servers))
    # llama.cpp's dry run gives each device's compute buffer (plan.prepare)
    fit = api.prepare(path, request, n_ctx=request.config.n_ctx, rpc=list(endpoints), hw=hardware).fit
    if not fit.fits or fit.placement is None:
        raise InputError(f"does not fit: {fit.sentence}")
    fitted = replace(fit.config, rpc_servers=servers, tensor_split=fit.placement.split)
    note = "" if fit.outcome is fitting.Outcome.FITS_AS_ASKED else f"auto-fit: {fit.sentence}"
    return fitted, note, fit.placement


def kv_now(placement, use, n_tokens: int) -> int:
    """Bytes of one device's KV cache holding ``n_tokens`` now (planner.kv_bytes_in_use
    over that device's layers: a sliding-window layer holds at most its window)."""
    layers = set(use.layers)
    total = 0
    for kl in placement.plan.kv_layers:
        if kl.layer in layers:
            total += (kl.k_bytes + kl.v_bytes) // max(kl.cells, 1) * min(n_tokens, kl.cells)
    return total


class DeviceBars(Widget):
    """One bar per device (the workers' devices, a local GPU, the CPU): its budget
    (the free memory the worker reported; the RAM available for the CPU) split
    into weights, the KV cache in use now, the rest of the KV cache at full
    context, compute, and free (``rows``). Hidden until a load over workers
    sets ``placement``."""

    DEFAULT_CSS = """
    DeviceBars { height: auto; width: 100%; display: none; }
    DeviceBars.-shown { display: block; }
    """

    ROWS = 4  # per device
    context_used: reactive[int] = reactive(0, layout=False)
    """Tokens in the KV cache now (the same on every device)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.placement = None

    def set_placement(self, placement) -> None:
        self.placement = placement
        self.set_class(placement is not None, "-shown")
        self.refresh(layout=True)

    def rows(self, width: int) -> list[Text]:
        """The text of the bars (the tests read it), ``ROWS`` rows per device, each
        cut to ``width``: the name and the budget, the bar, weights and compute
        (with the logits buffer where the device holds it), the KV cache now
        and at full context with the layers the device holds (the output layer
        counted, as ``--ngl`` counts it)."""
        p = self.placement
        if p is None:
            return []
        width = max(width, 10)
        n_all = sum(len(u.layers) for u in p.uses) + 1
        out: list[Text] = []
        for u in p.uses:
            budget = u.device.free_bytes
            now = kv_now(p, u, self.context_used)
            compute = u.compute_bytes + u.output_bytes
            # counted as --ngl counts them: the output layer is one
            layers = f"{len(u.layers) + u.output_layer}/{n_all} layers"
            rows = [
                Text.assemble((fmt.safe(u.device.name), "bold"), "  free " + ("n/a" if budget is None else fmt.size(budget))),
                self._bar(width, budget, u.weights_bytes, now, u.kv_bytes, compute),
                Text.assemble(("■", COLORS["weights"]), f" weights {fmt.size(u.weights_bytes)}  ", ("■", COLORS["compute"]),
                              f" compute {fmt.size(compute)}"),
                Text.assemble(("■", COLORS["kv"]), f" KV {fmt.size(now)} of {fmt.size(u.kv_bytes)}" if u.kv_bytes else " KV none",
                              (f" · {layers}", "dim")),
            ]
            for r in rows:
                r.truncate(width, overflow="ellipsis")
                r.no_wrap = True
            out.extend(rows)
        return out

    @staticmethod
    def _bar(width: int, budget: int | None, weights: int, kv_now_bytes: int, kv_full: int, compute: int) -> Text:
        total = weights + kv_full + compute
        scale = budget if budget else max(total, 1)  # no budget known: the bar is the device's own total
        text = Text()
        used = 0
        for value, color in ((weights, "weights"), (kv_now_bytes, "kv"), (max(kv_full - kv_now_bytes, 0), "kv_later"), (compute, "compute")):
            cells = min(round(width * value / scale), width - used)
            text.append(("█" if color != "kv_later" else "▒") * cells, style=COLORS[color])
            used += cells
        text.append("░" * (width - used), style=COLORS["free"])
        return text

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self.ROWS * len(self.placement.uses) if self.placement is not None else 0

    def render(self) -> Text:
        return Text("\n").join(self.rows(self.size.width))

    def watch_context_used(self) -> None:
        self.refresh()

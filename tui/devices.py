"""The cockpit over several devices (``localllm tui --rpc``): the load settings
fitted across the workers' devices, a local GPU and the CPU (the same fit as
``run --rpc``: commands._common._fit_rpc over placement.fit_across), and the
memory panel's bars, one per device."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from localllm import fmt

COLORS = {"weights": "dodger_blue2", "kv": "magenta", "kv_later": "plum4", "compute": "yellow3", "free": "grey35"}


def fit_over_workers(path: Path, cfg, settings, hardware, endpoints: Sequence[object]):
    """``cfg`` (a LoadConfig) fitted across the devices: returns (the LoadConfig
    with the workers and the planned split, a note on what the fit changed, the
    placement). The user's cache types are kept, as the cockpit's own fit does;
    ``--ngl`` (a set number of layers) is kept too. Probes every worker first:
    one that is down is an InputError naming it."""
    from localllm import planner
    from localllm.backend import run_config
    from localllm.commands._common import _fit_rpc
    from localllm.errors import InputError
    from localllm.gguf_file import read_header
    from localllm.model_info import describe

    header = read_header(path)
    shape = planner.ModelShape.from_header(header)
    args = SimpleNamespace(rpc=list(endpoints), policy="ctx", kv_type=None, k_type=settings.type_k, v_type=settings.type_v,
                           ngl=settings.n_gpu_layers)
    ctx_limit = max(cfg.n_ctx, describe(header).context_length or 0)
    result, placement = _fit_rpc(args, shape, run_config(cfg), hardware, ctx_limit, header)
    if not result.fits:
        raise InputError(f"does not fit: {result.reason}")
    c = result.config
    fitted = replace(cfg, n_ctx=c.n_ctx, n_gpu_layers=c.n_gpu_layers, type_k=c.type_k, type_v=c.type_v,
                     rpc_servers=tuple(str(ep) for ep in endpoints), tensor_split=placement.split)
    note = "" if result.reason == "fits as asked" else f"auto-fit: {result.reason}"
    return fitted, note, placement


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

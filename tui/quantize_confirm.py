"""The cockpit's quantize asks first, as the CLI's choices do: the output's
name, its size (predicted by llama.cpp's own dry run) and type, and for an
already-quantized source the explicit requantize choice ``--allow-requantize``
stands for on the command line (unticked, the button stays off)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Label

from localllm.util import fmt


@dataclass(frozen=True)
class QuantizePlan:
    """What a quantize would do, worked out in a worker before the question."""

    src: Path
    dst: Path
    qtype: str
    source_type: str
    predicted_bytes: int | None  # llama.cpp's dry run; None when it could not say
    requantize: bool  # the source is quantized already: the user must choose to go on
    problem: str = ""  # a reason it cannot be done at all (the output exists, ...)


class QuantizeConfirm(ModalScreen[bool | None]):
    """Quantize? Dismissed with the requantize choice (True/False) to go on, None to cancel."""

    DEFAULT_CSS = """
    QuantizeConfirm { align: center middle; }
    QuantizeConfirm > Vertical { width: 76; height: auto; border: round $primary; padding: 1 2; background: $surface; }
    QuantizeConfirm Label { width: 100%; }
    QuantizeConfirm Horizontal { height: auto; margin-top: 1; }
    QuantizeConfirm Button { margin-right: 2; }
    """
    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, plan: QuantizePlan) -> None:
        super().__init__()
        self.plan = plan

    def compose(self) -> ComposeResult:
        p = self.plan
        size = "size n/a" if p.predicted_bytes is None else f"about {fmt.size(p.predicted_bytes)} (llama.cpp's dry run)"
        with Vertical():
            yield Label(f"Quantize {fmt.safe(p.src.name)} ({p.source_type}) to {p.qtype}?", id="q-title")
            yield Label(f"writes {fmt.safe(p.dst)}\n{size}", id="q-output")
            if p.problem:
                yield Label(p.problem, id="q-problem")
            if p.requantize:
                yield Checkbox(f"requantize: {p.source_type} is quantized already, this loses more quality (--allow-requantize)",
                               id="q-requantize")
            with Horizontal():
                yield Button("Quantize", variant="primary", id="q-go", disabled=bool(p.problem) or p.requantize)
                yield Button("Cancel", id="q-cancel")

    @on(Checkbox.Changed, "#q-requantize")
    def _requantize(self, event: Checkbox.Changed) -> None:
        self.query_one("#q-go", Button).disabled = bool(self.plan.problem) or not event.value

    @on(Button.Pressed, "#q-go")
    def _go(self) -> None:
        self.dismiss(self.plan.requantize)

    @on(Button.Pressed, "#q-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)

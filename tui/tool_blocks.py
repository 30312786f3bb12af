"""A tool call as the cockpit shows it: the call's block (tool, server,
arguments as pretty JSON), its result's one folded line and whole text, and
the approval screen (allow once, always allow this tool, deny). Apart from
tools.py, which runs the loop. Every text here is a server's or a model's:
names go through ``printable`` and the screen's labels take no markup."""

from __future__ import annotations

from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from localllm.mcp.agent import Decision, ToolCall
from localllm.mcp.tools import ToolResult
from localllm.tui.saved import printable
from localllm.util import fmt

MAX_SHOWN = 16 * 1024  # characters of a result the log shows unfolded (the model gets all the hub kept)


def call_text(call: ToolCall) -> str:
    """A call's block: the tool, its server, its arguments as pretty JSON."""
    args = call.pretty_arguments()
    if len(args) > MAX_SHOWN:
        args = args[:MAX_SHOWN] + f"\n… ({fmt.size(len(args.encode('utf-8', 'replace')))} of arguments in all)"
    return f"⚙ tool call: {printable(call.name)} · server {printable(call.server)}\n{args}"


def result_lines(call: ToolCall, decision: Decision, r: ToolResult) -> tuple[str, str]:
    """A result's (one line, whole block): what it is, its size and time, the
    first line of its text; then the text as it is (bounded)."""
    name = printable(call.name)
    if decision is Decision.DENY:
        return f"↳ {name}: denied (the model is told)", f"↳ {name}: denied; the model is told:\n{r.text}"
    status = "failed" if r.failed else "error" if r.is_error else "result"
    size = fmt.size(r.size) if r.size else fmt.size(len(r.text.encode("utf-8", "replace")))
    first = next((line.strip() for line in r.text.splitlines() if line.strip()), "")
    first = first if len(first) <= 60 else first[:59] + "…"
    head = f"↳ {name} {status} · {size}{' (cut)' if r.truncated else ''} · {r.elapsed_ms:.0f} ms"
    text = r.text if len(r.text) <= MAX_SHOWN else r.text[:MAX_SHOWN] + f"\n… (the log shows the first {MAX_SHOWN // 1024} KiB)"
    return f"{head} · {first}  [Enter/click: whole]", f"{head}\n{text}"


class ApproveScreen(ModalScreen[Decision]):
    """Run this call? Allow once, always allow this tool, or deny (Esc denies)."""

    DEFAULT_CSS = """
    ApproveScreen { align: center bottom; }
    ApproveScreen > Vertical { width: 90%; max-width: 100; height: auto; max-height: 80%; border: round $warning;
                               padding: 0 1; background: $surface; margin-bottom: 3; }
    ApproveScreen Label { width: 100%; }
    ApproveScreen VerticalScroll { height: auto; max-height: 12; }
    ApproveScreen Horizontal { height: auto; }
    ApproveScreen Button { margin-right: 1; }
    """
    BINDINGS = [Binding("o", "answer('once')", "Allow once"), Binding("a", "answer('always')", "Always allow"),
                Binding("d,escape", "answer('deny')", "Deny")]

    def __init__(self, call: ToolCall, saved_where: Path | None) -> None:
        super().__init__()
        self.call, self.saved_where = call, saved_where

    def compose(self) -> ComposeResult:
        c = self.call
        kept = "kept in the config file" if self.saved_where is not None else "for this session"
        with Vertical():
            yield Label(f"The model calls {printable(c.name)} on the MCP server {printable(c.server)}. Run it? "
                        f"(always: this tool from now on, {kept}; deny: the model is told)", id="ask-title", markup=False)
            with VerticalScroll():
                yield Static(call_text(c).split("\n", 1)[1], id="ask-args", markup=False)
            with Horizontal():
                yield Button("Allow once [o]", variant="primary", id="once")
                yield Button("Always allow this tool [a]", id="always")
                yield Button("Deny [d]", variant="error", id="deny")

    def on_mount(self) -> None:
        self.query_one("#once", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.action_answer(event.button.id or "deny")

    def action_answer(self, choice: str) -> None:
        self.dismiss({"once": Decision.ONCE, "always": Decision.ALWAYS}.get(choice, Decision.DENY))

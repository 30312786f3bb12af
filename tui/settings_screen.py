"""The settings screen: model, sampling and system prompt, one tab each.

Tabs, because every setting on one page needed scrolling at 80×24; each tab
fits 80×24 with one-line (compact) fields. The sampling tab offers every field
of ``SamplingConfig``; the system prompt is a ``TextArea`` (prompts are often
several lines). A bad value is one line naming the field, and the tab holding
it is shown; nothing is applied until every value is valid.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, TabbedContent, TabPane, TextArea

from localllm.engine_api.llama_rules import KV_CACHE_TYPES
from localllm.tui.saved import printable
from localllm.tui.settings import Settings

# Each field's label on the screen, and the tab that holds it (an error names
# the label and shows the tab).
LABELS = {
    "n_ctx": "context tokens", "n_keep": "keep tokens", "compact_at": "compact at",
    "n_gpu_layers": "GPU layers", "threads": "threads", "n_cpu_moe": "experts in RAM",
    "temperature": "temperature", "top_k": "top-k", "top_p": "top-p", "min_p": "min-p",
    "repeat_penalty": "repeat penalty", "max_tokens": "max tokens", "seed": "seed", "reasoning_budget": "thinking budget",
}
# The sampling tab's rows: field, label (what its edge value means), input type, placeholder when blank.
SAMPLING_ROWS: tuple[tuple[str, str, Literal["integer", "number"], str], ...] = (
    ("temperature", "temperature (0: greedy)", "number", ""),
    ("top_k", "top-k (0: all tokens)", "integer", ""),
    ("top_p", "top-p (1: all tokens)", "number", ""),
    ("min_p", "min-p (0: none dropped)", "number", ""),
    ("repeat_penalty", "repeat penalty (1: off)", "number", ""),
    ("max_tokens", "max tokens (-1: no limit)", "integer", ""),
    ("seed", "seed (blank: random)", "integer", "random"),
    ("reasoning_budget", "thinking (-1: no cap, 0: off)", "integer", ""),
)
SAMPLING_TAB = tuple(row[0] for row in SAMPLING_ROWS)


@dataclass(frozen=True)
class Switch:
    """A row of the Tools tab: a tool of a running MCP server (``tool``), or a
    configured server not running (``tool`` empty: switching it on starts it),
    or one that failed (``note``: why, no switch)."""

    server: str
    tool: str = ""
    on: bool = False
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.server}/{self.tool}"


class BadValue(ValueError):
    """A value the screen cannot apply: the field it is in, and why."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(why)
        self.field = field


def _whole(field: str, text: str, *, blank: bool) -> int | None:
    text = text.strip()
    if not text and blank:
        return None
    try:
        return int(text)
    except ValueError:
        raise BadValue(field, f"{LABELS[field]} must be a whole number{' or blank' if blank else ''}, got {text!r}") from None


def _number(field: str, text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise BadValue(field, f"{LABELS[field]} must be a number, got {text.strip()!r}") from None


def _fraction(field: str, text: str) -> float | None:
    """A fraction of the context above 0 and at most 1, or blank (None: off)."""
    if not text.strip():
        return None
    value = _number(field, text)
    if not 0 < value <= 1:
        raise BadValue(field, f"{LABELS[field]} must be a fraction of the context above 0 and at most 1 (e.g. 0.85), or blank for off, got {text.strip()}")
    return value


class SettingsScreen(ModalScreen[Settings | None]):
    """Model (those marked * reload it), sampling, system prompt; Apply or Esc."""

    DEFAULT_CSS = """
    SettingsScreen { align: center middle; }
    SettingsScreen > Vertical { width: 76; max-width: 100%; height: auto; max-height: 100%; border: thick $primary;
                                background: $surface; padding: 0 1; }
    SettingsScreen TabbedContent { height: auto; }
    SettingsScreen TabPane { padding: 1 0 0 0; height: auto; }
    SettingsScreen Grid { grid-size: 2; grid-columns: 30 1fr; grid-rows: 1; height: auto; grid-gutter: 0 1; }
    SettingsScreen TextArea { height: 9; }
    SettingsScreen #tool-switches { height: auto; max-height: 14; }
    SettingsScreen .hint { color: $text-muted; margin-top: 1; }
    SettingsScreen #error { color: $error; height: auto; }
    SettingsScreen Horizontal { height: auto; }
    SettingsScreen Button { margin-right: 2; }
    """
    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, current: Settings, tools: list[Switch] | None = None, planned_ctx: int | None = None) -> None:
        super().__init__()
        self.current = current
        self.planned_ctx = planned_ctx  # the context the plan chose for the loaded model (shown where the setting is blank)
        self.tools = tools  # the MCP servers' switches; None: no Tools tab (no server is configured)
        self.tools_off: frozenset[str] | None = None  # on Apply: "server/tool" switched off
        self.servers_on: frozenset[str] = frozenset()  # on Apply: servers not running switched on (to start)

    def compose(self) -> ComposeResult:
        s = self.current
        kv = [(t, t) for t in KV_CACHE_TYPES]

        def box(field: str, value: object, kind: Literal["integer", "number"], blank: str = "") -> Input:
            return Input("" if value is None else str(value), placeholder=blank, id=field, type=kind, compact=True)

        with Vertical():
            with TabbedContent(id="tabs"):
                with TabPane("Model", id="model-tab"):
                    with Grid():
                        yield Label("context tokens *")
                        yield box("n_ctx", s.n_ctx, "integer", f"the plan's: {self.planned_ctx:,}" if self.planned_ctx else "the plan's")
                        yield Label("K cache type *")
                        yield Select(kv, value=s.type_k, allow_blank=False, id="type_k", compact=True)
                        yield Label("V cache type *")
                        yield Select(kv, value=s.type_v, allow_blank=False, id="type_v", compact=True)
                        yield Label("GPU layers * (blank: fit)")
                        yield box("n_gpu_layers", s.n_gpu_layers, "integer", "fit")
                        yield Label("threads * (blank: auto)")
                        yield box("threads", s.threads, "integer", "adaptive")
                        yield Label("experts in RAM * (blank: fit)")
                        yield box("n_cpu_moe", s.n_cpu_moe, "integer", "fit (MoE: first N layers, -1 all)")
                        yield Label("sliding window")
                        yield Checkbox("shift the context when full", value=s.sliding_window, id="sliding_window", compact=True)
                        yield Label("compact at (blank: off)")
                        yield box("compact_at", s.compact_at, "number", "off: the sliding window alone")
                        yield Label("keep tokens (blank: system)")
                        yield box("n_keep", s.n_keep, "integer", "the system prompt")
                    yield Static("* reloads the model", classes="hint")
                with TabPane("Sampling", id="sampling-tab"):
                    with Grid():
                        for field, label, kind, blank in SAMPLING_ROWS:
                            yield Label(label)
                            yield box(field, getattr(s, field), kind, blank)
                        yield Label("thinking")
                        yield Checkbox("a thinking model thinks", value=s.thinking, id="thinking", compact=True)
                    yield Static("defaults are llama.cpp's: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, "
                                 "repeat penalty 1 (off), no token limit, a random seed", classes="hint")
                with TabPane("System prompt", id="system-tab"):
                    yield TextArea(s.system_prompt, id="system_prompt", soft_wrap=True, show_line_numbers=False)
                    yield Static("a new system prompt starts a new chat", classes="hint")
                if self.tools is not None:  # only with --tools: the screen is as it was without
                    with TabPane("Tools", id="tools-tab"), VerticalScroll(id="tool-switches"):
                        for i, row in enumerate(self.tools):
                            if row.note:
                                yield Static(Text(f"{printable(row.server)}: {printable(row.note)}"), classes="hint")
                            elif row.tool:
                                yield Checkbox(Text(f"{printable(row.server)} · {printable(row.tool)}"), value=row.on, id=f"tool-{i}",
                                               compact=True)
                            else:
                                yield Checkbox(Text(f"MCP server {printable(row.server)} (not started)"), value=False, id=f"tool-{i}",
                                               compact=True)
                        yield Static("a tool switched off is not offered to the model from the next message on; "
                                     "a server switched on starts on Apply", classes="hint")
            yield Static("", id="error")
            with Horizontal():
                yield Button("Apply", variant="primary", id="apply", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def _text(self, field: str) -> str:
        return self.query_one(f"#{field}", Input).value

    def _read(self) -> Settings:
        n_ctx = _whole("n_ctx", self._text("n_ctx"), blank=True)  # blank: the plan decides
        if n_ctx is not None and n_ctx < 1:
            raise BadValue("n_ctx", f"context tokens must be at least 1, got {n_ctx}")
        new = replace(  # the settings this screen does not show (flash attention, batches, policy...) stay as they are
            self.current,
            n_ctx=n_ctx,
            type_k=str(self.query_one("#type_k", Select).value),
            type_v=str(self.query_one("#type_v", Select).value),
            sliding_window=self.query_one("#sliding_window", Checkbox).value,
            compact_at=_fraction("compact_at", self._text("compact_at")),
            n_keep=_whole("n_keep", self._text("n_keep"), blank=True),
            n_gpu_layers=_whole("n_gpu_layers", self._text("n_gpu_layers"), blank=True),
            threads=_whole("threads", self._text("threads"), blank=True),
            n_cpu_moe=_whole("n_cpu_moe", self._text("n_cpu_moe"), blank=True),
            temperature=_number("temperature", self._text("temperature")),
            top_k=_whole("top_k", self._text("top_k"), blank=False),
            top_p=_number("top_p", self._text("top_p")),
            min_p=_number("min_p", self._text("min_p")),
            repeat_penalty=_number("repeat_penalty", self._text("repeat_penalty")),
            max_tokens=_whole("max_tokens", self._text("max_tokens"), blank=False),
            seed=_whole("seed", self._text("seed"), blank=True),
            reasoning_budget=_whole("reasoning_budget", self._text("reasoning_budget"), blank=False),
            thinking=self.query_one("#thinking", Checkbox).value,
            system_prompt=self.query_one("#system_prompt", TextArea).text,
        )
        for field in ("n_keep", "threads"):
            if (getattr(new, field) or 0) < 0:
                raise BadValue(field, f"{LABELS[field]} must be 0 or more, or blank")
        if (new.n_cpu_moe or 0) < -1:
            raise BadValue("n_cpu_moe", "experts in RAM must be -1 (every layer), 0 or more, or blank")
        problem = new.sampling().problem()
        if problem is not None:
            field = problem.split()[0]
            raise BadValue(field, LABELS.get(field, field) + problem[len(field):])
        return new

    @on(Button.Pressed, "#apply")
    def _apply(self) -> None:
        try:
            new = self._read()
            if self.tools is not None:
                value = {i: self.query_one(f"#tool-{i}", Checkbox).value for i, row in enumerate(self.tools) if not row.note}
                self.tools_off = frozenset(row.key for i, row in enumerate(self.tools) if row.tool and not row.note and not value[i])
                self.servers_on = frozenset(row.server for i, row in enumerate(self.tools) if not row.tool and not row.note and value[i])
            self.dismiss(new)
        except BadValue as exc:
            self.query_one("#error", Static).update(f"not applied: {exc}")
            self.query_one("#tabs", TabbedContent).active = "sampling-tab" if exc.field in SAMPLING_TAB else "model-tab"
            self.query_one(f"#{exc.field}", Input).focus()

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)

"""Widgets of the cockpit: text blocks, the latency panel and the memory panel (the chat log is ``chatview``)."""

from __future__ import annotations

from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Size
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Sparkline

from localllm.engine_api.stats import percentile
from localllm.tui.devices import DeviceBars
from localllm.util import fmt


class Lines(Widget):
    """A block of text lines, each wrapped to the width. Setting ``lines`` repaints
    this widget only: unlike a Label update it asks for a new layout (which would
    re-render the whole screen, measured: ~17 ms a frame) only when the number
    of wrapped rows changes, which the streaming figures never make it do."""

    DEFAULT_CSS = """
    Lines { height: auto; width: 100%; }
    """

    lines: reactive[tuple[Text | str, ...]] = reactive(tuple, layout=False)

    def __init__(self, n: int, *, max_rows: int | None = None, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.min_rows, self.max_rows = n, max_rows
        self._wrapped: tuple[tuple[tuple[Text | str, ...], int], list[Text]] | None = None
        self.set_reactive(Lines.lines, ("",) * n)

    def _rows(self, width: int) -> list[Text]:
        """The wrapped rows, kept for the last (lines, width): the height check
        and the render of one update wrap the same text."""
        key = (self.lines, width)
        if self._wrapped is not None and self._wrapped[0] == key:
            return self._wrapped[1]
        rows: list[Text] = []
        for entry in self.lines:
            text = Text(entry) if isinstance(entry, str) else entry
            rows.extend(text.wrap(self.app.console, max(width, 10)) if text.plain else [Text("")])
        self._wrapped = (key, rows)
        return rows

    def _height(self, width: int) -> int:
        n = max(self.min_rows, len(self._rows(width)))
        return n if self.max_rows is None else min(n, self.max_rows)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self._height(width)

    def watch_lines(self) -> None:
        if self.size.width and self._height(self.size.width) != self.size.height:
            self.refresh(layout=True)

    def render(self) -> Text:
        rows = self._rows(self.size.width)
        return Text("\n").join(rows[: max(self.size.height, 1)])


class StatusLine(Lines):
    """The panels' main figures on one line, shown instead of the panels when
    the terminal is too narrow for them (see ``LocalLLMApp.HORIZONTAL_BREAKPOINTS``)."""

    DEFAULT_CSS = """
    StatusLine { height: 1; padding: 0 1; color: $text-muted; }
    """

    def __init__(self, **kw: object) -> None:
        super().__init__(1, max_rows=1, **kw)

    def show(self, latency: LatencyPanel, memory: MemoryPanel) -> None:
        gaps = latency.gaps_ms
        parts = [
            "TTFT n/a" if latency.ttft_ms is None else f"TTFT {latency.ttft_ms:.0f} ms",
            f"ITL p50 {percentile(gaps, 50):.1f} ms" if gaps else "ITL p50 n/a",
            "decode n/a" if latency.decode_tps is None else f"decode {latency.decode_tps:.1f} t/s",
            f"ctx {memory.context_used}/{memory.n_ctx}",
            f"KV {fmt.size(memory.kv_now_bytes)}",
        ]
        if memory.shifts:
            parts.append(f"shifts {memory.shifts}")
        # One row: the figures at the end give way whole, rather than a figure
        # being cut mid-number (a long context at 80 columns).
        while len(parts) > 3 and len(" · ".join(parts)) > (self.size.width or 78):
            parts.pop()
        self.lines = (" · ".join(parts),)


class ItlSparkline(Sparkline):
    """Textual's ``Sparkline`` (same buckets, bars and colours from its CSS
    component classes), drawn through the line API: one colour per bar height,
    computed once, and runs of one colour as one segment. Textual's draws a new
    style and a colour blend for every cell and goes through its text pipeline:
    about 20 ms a redraw of 46×3 cells with real gaps here, CPU that comes out
    of the decode threads."""

    BARS = "▁▂▃▄▅▆▇█"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._drawn: tuple[tuple[object, ...], list[Strip]] | None = None
        self._style: Style | None = None

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._style = None
        self._drawn = None

    def render_line(self, y: int) -> Strip:
        rows = self._rows()
        return rows[y] if 0 <= y < len(rows) else Strip.blank(self.size.width, self.rich_style)

    def _rows(self) -> list[Strip]:
        data = list(self.data or [])
        width, height = self.size.width, max(self.size.height, 1)
        if self._style is None:  # computing it walks the ancestors: kept until the styles change
            self._style = self.rich_style
        base = self._style
        key = (tuple(data), width, height, base)
        if self._drawn is not None and self._drawn[0] == key:
            return self._drawn[1]
        _, background = self.background_colors
        low = background + self.get_component_styles("sparkline--min-color").color
        high = background + self.get_component_styles("sparkline--max-color").color
        steps = len(self.BARS)
        levels = steps * height - 1
        if not data:
            heights = [0] * width
            styles = [base + Style(color=low.rich_color)]
        elif len(data) == 1:
            heights = [levels] * width
            styles = [base + Style(color=high.rich_color)] * (levels + 1)
        else:
            styles = [base + Style(color=low.blend(high, n / levels).rich_color) for n in range(levels + 1)]
            lo, hi = min(data), max(data)
            extent = (hi - lo) or 1
            buckets = [max(part) for b in range(width) if (part := data[len(data) * b // width: len(data) * (b + 1) // width])]
            heights = [int((buckets[c * len(buckets) // width] - lo) / extent * levels) for c in range(width)]
        rows = []
        for row in range(height - 1, -1, -1):
            bottom, top = row * steps, (row + 1) * steps
            segments: list[Segment] = []
            run, run_style = "", None
            for h in heights:
                if h < bottom:
                    cell, style = " ", base
                else:
                    cell = "█" if h >= top else self.BARS[h % steps]
                    style = styles[min(h, len(styles) - 1)]
                if style is run_style:
                    run += cell
                else:
                    if run:
                        segments.append(Segment(run, run_style))
                    run, run_style = cell, style
            if run:
                segments.append(Segment(run, run_style))
            rows.append(Strip(segments, width))
        self._drawn = (key, rows)
        return rows


class LatencyPanel(Vertical):
    """TTFT, ITL percentiles and sparkline, prefill and decode rates, and the verdict.

    The values are reactive: the app sets them as token batches arrive; the panel
    repaints its text block without a new layout."""

    DEFAULT_CSS = """
    LatencyPanel { height: auto; border: round $primary; padding: 0 1; }
    LatencyPanel ItlSparkline { height: 3; margin: 0 0 1 0; }
    """

    ttft_ms: reactive[float | None] = reactive(None, repaint=False)
    """Time to first token of the latest reply (prefill), in ms."""
    answer_ms: reactive[float | None] = reactive(None, repaint=False)
    """A reasoning model's reply: time to its first answer token (after ``</think>``), in ms; None otherwise."""
    gaps_ms: reactive[list[float]] = reactive(list, always_update=True, repaint=False)
    """Inter-token gaps of the latest reply, in ms (the ITL samples)."""
    prefill_tps: reactive[float | None] = reactive(None, repaint=False)
    """Prompt tokens per second of the latest reply (known when it ends)."""
    decode_tps: reactive[float | None] = reactive(None, repaint=False)
    """Generated tokens per second of the latest reply."""
    ceiling_tps: reactive[float | None] = reactive(None, repaint=False)
    """Decode ceiling: measured memory bandwidth over the bytes read per token."""
    verdict: reactive[tuple[str, str]] = reactive(("", ""), repaint=False)
    """What dominates the reply, or "slow ..." when a rate is under reading speed or far under the roofline
    (``measure.diagnose``), and the figures that decided it."""
    threads: reactive[str] = reactive("threads n/a", repaint=False)
    """The decode thread count now and its last move with why (``ThreadController.short``), or "threads n/a"."""
    speculation: reactive[str] = reactive("speculation n/a", repaint=False)
    """Draftless speculation's count for the latest reply (``speculation.line``), or "speculation n/a"."""
    split: reactive[tuple[float | None, float | None, float, float, str] | None] = reactive(None, repaint=False)
    """TTFT in its three phases, once the reply has ended: (encode ms, its rate, prefill ms, first token ms, the rate's
    unit: "images/s", or "s of audio/s" for sound); encode is None without an image or a clip. None: no reply measured yet."""

    def compose(self) -> ComposeResult:
        yield Lines(4, id="latency-top")
        yield ItlSparkline([], id="spark")
        yield Lines(7, id="latency-bottom")

    def on_mount(self) -> None:
        self._paint()

    def _paint(self) -> None:
        gaps = self.gaps_ms
        ttft = "TTFT n/a" if self.ttft_ms is None else f"TTFT {self.ttft_ms:.1f} ms"
        if self.answer_ms is not None:
            ttft += f" · answer {self.answer_ms:.0f} ms"
        itl = f"ITL p50 {percentile(gaps, 50):.1f} ms · p95 {percentile(gaps, 95):.1f} ms" if gaps else "ITL p50 n/a · p95 n/a"
        pre = "n/a" if self.prefill_tps is None else f"{self.prefill_tps:.1f} t/s"
        dec = "n/a" if self.decode_tps is None else f"{self.decode_tps:.1f} t/s"
        self.query_one("#latency-top", Lines).lines = (Text("Latency", style="bold"), ttft, split_line(self.split), itl)
        headline, detail = self.verdict
        roof = ""
        if self.ceiling_tps and self.decode_tps:
            roof = f"roofline {self.ceiling_tps:.0f} t/s: decode at {100 * self.decode_tps / self.ceiling_tps:.0f}%"
        self.query_one("#latency-bottom", Lines).lines = (
            f"prefill {pre} · decode {dec}", self.threads, self.speculation, roof, Text(headline, style="bold yellow"),
            Text(detail, style="yellow"))

    def watch_ttft_ms(self, _: float | None) -> None:
        self._paint()

    def watch_answer_ms(self, _: float | None) -> None:
        self._paint()

    def watch_gaps_ms(self, gaps: list[float]) -> None:
        self.query_one("#spark", ItlSparkline).data = gaps[-200:]
        self._paint()

    def watch_prefill_tps(self, _: float | None) -> None:
        self._paint()

    def watch_decode_tps(self, _: float | None) -> None:
        self._paint()

    def watch_ceiling_tps(self, _: float | None) -> None:
        self._paint()

    def watch_verdict(self, _: tuple[str, str]) -> None:
        self._paint()

    def watch_threads(self, _: str) -> None:
        self._paint()

    def watch_speculation(self, _: str) -> None:
        self._paint()

    def watch_split(self, _: object) -> None:
        self._paint()


def split_line(split: tuple[float | None, float | None, float, float, str] | None) -> str:
    """``encode n/a · prefill 299.8 ms · first 0.2 ms``: TTFT's three phases (the
    seeds' split, with a vision model's image encode and its rate in images/s, an
    audio model's in seconds of audio a second: a slow encoder shows apart from prefill)."""
    if split is None:
        return "encode n/a · prefill n/a · first n/a"
    encode, rate, prefill, first, unit = split
    enc = "n/a" if encode is None else f"{encode:.1f} ms" + (f" ({rate:.1f} {unit})" if rate else "")
    return f"encode {enc} · prefill {prefill:.1f} ms · first {first:.1f} ms"


class BudgetBar(Widget):
    """A bar of the memory budget split into weights, KV cache, compute and free."""

    DEFAULT_CSS = """
    BudgetBar { height: 1; width: 100%; }
    """

    parts: reactive[tuple[int, int, int, int]] = reactive((0, 0, 0, 1))
    """(weights, KV cache, compute, budget) in bytes."""

    COLORS = ("dodger_blue2", "magenta", "yellow3")

    def render(self) -> Text:
        weights, kv, compute, budget = self.parts
        width = max(self.size.width, 10)
        text = Text()
        used = 0
        for value, color in zip((weights, kv, compute), self.COLORS):
            cells = round(width * value / budget) if budget else 0
            cells = min(cells, width - used)
            text.append("█" * cells, style=color)
            used += cells
        text.append("░" * (width - used), style="grey35")
        return text


class MemoryPanel(Vertical):
    """The memory budget and the KV-cache footprint."""

    DEFAULT_CSS = """
    MemoryPanel { height: auto; border: round $primary; padding: 0 1; }
    """

    context_used: reactive[int] = reactive(0, repaint=False)
    """Tokens in the KV cache now."""
    kv_now_bytes: reactive[int] = reactive(0, repaint=False)
    """Bytes of KV cache those tokens occupy."""
    shifts: reactive[int] = reactive(0, repaint=False)
    """Context shifts (sliding window) so far in this chat."""

    def __init__(self) -> None:
        super().__init__()
        self.n_ctx = 0
        self.kv_full_bytes = 0
        self.kv_per_token = 0
        self.kv_types = ""
        self._head: tuple[Text | str, ...] = (Text("Memory", style="bold"), "")
        self._plan: tuple[Text | str, ...] = ("", "")
        self._check: tuple[Text | str, ...] = ()
        self._tools: tuple[Text | str, ...] = ()  # the tools' line (the cockpit with --tools), else nothing
        self._compacted: tuple[Text | str, ...] = ()  # the last compaction's line, once one ran

    def compose(self) -> ComposeResult:
        yield Lines(2, id="memory-top")
        yield BudgetBar()
        yield DeviceBars()
        yield Lines(6, id="memory-bottom")

    def set_devices(self, placement) -> None:
        """A load over several devices (``--rpc``): one bar per device instead of
        the one budget bar, and the plan's totals over all of them. None: back to one bar."""
        self.query_one(DeviceBars).set_placement(placement)
        self.query_one(BudgetBar).display = placement is None
        if placement is None:
            return
        uses = placement.uses
        weights = sum(u.weights_bytes + u.output_bytes for u in uses)
        kv = sum(u.kv_bytes for u in uses)
        compute = sum(u.compute_bytes for u in uses)
        self._head = (Text("Memory", style="bold"), f"{len(uses)} devices: {', '.join(fmt.safe(u.device.name) for u in uses)}")
        self._plan = (
            Text.assemble(("■", "dodger_blue2"), f" weights {fmt.size(weights)}  ", ("■", "magenta"), f" KV {fmt.size(kv)}  ",
                          ("■", "yellow3"), f" compute {fmt.size(compute)}"),
            *self._plan[1:],
        )
        self._paint()

    def set_check(self, check) -> None:
        """After a load: llama.cpp's allocations against the plan (a
        memcheck.MemoryCheck; None when the log was not readable: nothing shown).
        Each buffer that differs by more than the tolerance gets a line with both
        figures; when they agree, one quiet line says so."""
        if check is None:
            self._check = ()
        elif check.error is not None:
            self._check = (Text(f"memory check failed: {check.error}", style="bold yellow"),)
        elif check.ok:
            self._check = (Text(f"llama.cpp allocated as planned (within {check.tolerance:.0%})", style="dim"),)
        else:
            self._check = tuple(Text(line.replace("memory check: ", "plan ≠ llama.cpp: "), style="bold yellow")
                                for line in check.mismatch_lines())
        self._paint()

    def set_compaction(self, before: int | None, after: int = 0, seconds: float = 0.0) -> None:
        """The last compaction: the conversation's tokens before and after it and its
        time (``localllm.compaction``); None: no line (none ran on this model's chat)."""
        self._compacted = () if before is None else (f"compacted {before:,} → {after:,} tokens in {fmt.num(seconds, 1)} s",)
        self._paint()

    def set_tools(self, line: str | None) -> None:
        """What the offered tools take of the context (tools.py measures it), or None: no line."""
        self._tools = () if line is None else (line,)
        self._paint()

    def set_plan(self, *, budget_label: str, budget: int, weights: int, kv_full: int, compute: int, kv_per_token: int, types: str, n_ctx: int) -> None:
        self.n_ctx, self.kv_full_bytes, self.kv_per_token, self.kv_types = n_ctx, kv_full, kv_per_token, types
        free = budget - weights - kv_full - compute
        self._head = (Text("Memory", style="bold"), f"{budget_label} {fmt.size(budget)}, free {fmt.size(max(free, 0))}")
        self.query_one(BudgetBar).parts = (weights, kv_full, compute, max(budget, 1))
        self._plan = (
            Text.assemble(("■", "dodger_blue2"), f" weights {fmt.size(weights)}  ", ("■", "magenta"), f" KV {fmt.size(kv_full)}  ",
                          ("■", "yellow3"), f" compute {fmt.size(compute)}"),
            f"KV cache {types} · {fmt.size(kv_per_token)}/token · full {fmt.size(kv_full)}",
        )
        self._paint()

    def _paint(self) -> None:
        self.query_one("#memory-top", Lines).lines = self._head
        self.query_one("#memory-bottom", Lines).lines = (
            *self._plan,
            f"KV now {fmt.size(self.kv_now_bytes)} ({self.context_used} tokens)",
            f"context {self.context_used} of {self.n_ctx} · shifts {self.shifts}",
            *self._compacted,
            *self._tools,
            *self._check,
        )

    def watch_context_used(self, used: int) -> None:
        self.query_one(DeviceBars).context_used = used
        self._paint()

    def watch_kv_now_bytes(self, _: int) -> None:
        self._paint()

    def watch_shifts(self, _: int) -> None:
        self._paint()

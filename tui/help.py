"""The help screen (F1, or ? when the prompt box does not have focus): the cockpit's keys, and
what each figure on screen means with what to do about it. The figures are
only useful to someone who knows what moves them; this is the one place that
says it, in the words the panels use."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from localllm.measure.diagnose import READING_TOKENS_PER_S

FIGURES: tuple[tuple[str, str], ...] = (
    ("TTFT and prefill",
     "TTFT (time to first token) runs from Enter to the first token of the reply: llama.cpp first reads the whole "
     "prompt, the chat so far included (prefill, in prompt tokens/s), which is bound by compute. A long chat or system "
     "prompt raises it: start a new chat (Ctrl+L), shorten the system prompt, or put more layers on the GPU."),
    ("TTFT's split and the forecast",
     "Under TTFT, its three phases: image encode (a vision model's pictures, with their rate in images/s), prefill, and the "
     "first token (the template, tokenizing and the first sample); above the message box, the next message's new tokens "
     "(typed text, attached files and images, history not in the cache) and its TTFT forecast from this chat's measured "
     "prefill (n/a until one is measured), a long prompt's progress while it is read, then the forecast against the measured TTFT. "
     "Ctrl+F attaches a file or a picture, as does a path pasted or dropped into the box; ✕ or Backspace in an empty box removes one."),
    ("ITL and decode",
     "ITL (inter-token latency) is the time between two tokens as they reach you: p50 is the typical gap, p95 the "
     "slow one in twenty. Decode t/s is tokens per second inside llama.cpp, bound by memory bandwidth: a smaller "
     "quant (Q4_K_M rather than Q8_0) or more GPU layers make it faster."),
    ("The roofline and decode efficiency",
     "The roofline is the fastest decode this machine's memory allows: its measured bandwidth over the bytes read per "
     "token (the weights, and the KV cache in use); \"decode at 60%\" is the share of it reached. Far below it, "
     "something else holds the CPU or too many threads compete: try fewer (--threads, or threads in F3)."),
    ("The verdict",
     "The line under the figures says what dominates the reply, the prompt (TTFT) or the streaming. It says slow only "
     f"when a rate is under reading speed (~{READING_TOKENS_PER_S:.0f} tokens/s, about 450 words a minute) or decode "
     "is under a third of the roofline; a reply under a third of this model's earlier rate gets a line naming the fix."),
    ("The KV cache and its types",
     "The KV cache keeps the keys and values of every token in the context: KV now grows with the context used, up to "
     "full. q8_0 halves it against f16 at a negligible quality loss, q4_0 quarters it at a measurable one "
     "(--kv-type, or F3); when the context fills, the oldest turns are shifted out."),
    ("The VRAM budget",
     "The bar splits the budget (GPU memory, or RAM without a GPU) into weights, KV cache and compute buffers as "
     "planned before the load, checked against what llama.cpp allocated. When a model does not fit, the context "
     "shrinks or layers move to the CPU (--policy); --vram sets the budget."),
    ("PPL, KL and top-1",
     "From localllm quantize --eval: perplexity (PPL, lower is better) on a public-domain text, the KL divergence of "
     "the quantized model's next-token odds from the source's (mean and p99; near 0 is lossless) and top-1, how often "
     "both pick the same next token. A quant whose KL is high loses quality: pick a larger one."),
)


def app_keys(active: Iterable[ActiveBinding], app: App) -> list[tuple[str, str]]:
    """(key, what it does) for the app's own bindings and any other shown in the
    footer, as they are bound now (a keymap included), one row per action;
    a text box's editing keys are left to its own conventions. The app's keys
    that a focused text box takes (``?``) are listed too, from ``BINDINGS``."""
    rows: dict[str, tuple[str, str]] = {}
    listed = [(node, binding) for node, binding, _enabled, _tooltip in active]
    shown = {(node, binding.key) for node, binding in listed}
    listed += [(app, b) for b in app.BINDINGS if isinstance(b, Binding) and (app, b.key) not in shown]
    for node, binding in listed:
        if not binding.description or not (node is app or binding.show):
            continue
        key = app.get_key_display(binding)
        what = binding.tooltip or binding.description
        action = f"{id(node)}.{binding.action}"
        rows[action] = (f"{rows[action][0]} {key}", rows[action][1]) if action in rows else (key, what)
    return list(rows.values())


class HelpScreen(ModalScreen[None]):
    """The keys (as the app binds them) and the figures, scrolled when the
    terminal is small: every line wraps, none is cut."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 100%; max-width: 96; height: 100%; max-height: 48; border: round $primary;
                            background: $surface; padding: 0 1; }
    HelpScreen VerticalScroll { height: 1fr; }
    HelpScreen .help-head { text-style: bold; color: $accent; margin: 1 0 0 0; }
    HelpScreen #help-close { color: $text-muted; height: 1; }
    """

    BINDINGS = [
        Binding("escape", "close", "Close", show=False),
        Binding("f1", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
        Binding("question_mark", "close", "Close", show=False),
    ]

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys  # (key, what it does), as the main screen binds them

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Help: keys and figures"
            with VerticalScroll(id="help-body"):
                yield Static("Keys", classes="help-head")
                width = max((len(k) for k, _ in self.keys), default=0)
                yield Static(Text("\n".join(f"{k.rjust(width)}  {what}" for k, what in self.keys)), id="help-keys")
                for title, body in FIGURES:
                    yield Static(title, classes="help-head")
                    yield Static(body)
            yield Static("Esc, F1 or q closes · ↑↓ PgUp PgDn scroll", id="help-close")

    def on_mount(self) -> None:
        self.query_one("#help-body").focus()  # the arrows and PgUp/PgDn scroll it at once

    def action_close(self) -> None:
        self.dismiss(None)

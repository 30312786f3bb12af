"""The localllm cockpit: chat on the left, live latency and memory on the right.

The session (``localllm.cockpit``: the engine thread, a model's load and
rollback, counting, generating, saving) has no Textual in it; this app lays it
out, binds its keys and draws what it says. Its thread workers hand the
session's blocking calls their own threads; what the session's threads learn
(a reply's tokens, posted at most every 200 ms so redraws never slow the
stream) arrives as messages (``messages.py``). The core never imports this package.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Footer, Header

from localllm.audio.sound import AudioClip
from localllm.chat import sessions
from localllm.chat.session import ChatSession
from localllm.cockpit.attachments import Count, Pending, shown_saved
from localllm.cockpit.heap import Heap
from localllm.cockpit.loading import Footprint, LoadResult, shown, start
from localllm.cockpit.session import CockpitSession
from localllm.cockpit.settings import Settings
from localllm.cockpit.wording import printable, reason
from localllm.engine_api import Engine, LoadConfig
from localllm.forecast import Forecast, Forecaster
from localllm.mcp.hub import Hub
from localllm.plan import planner
from localllm.plan.hardware import Hardware
from localllm.plan.workers import Endpoint
from localllm.tui.attachments import AttachBar, ForecastLine
from localllm.tui.chatview import ChatView, MessageView
from localllm.tui.compacting import AutoCompacting, Compacting
from localllm.tui.controls import BINDINGS as CONTROL_BINDINGS
from localllm.tui.controls import ConversationControls, ThinkClock
from localllm.tui.messages import EngineLost, ModelLoaded, Resumed, SaveFailed, poster
from localllm.tui.next_message import NextMessage
from localllm.tui.prompt import PromptBox
from localllm.tui.replying import Replying
from localllm.tui.screen_actions import ScreenActions
from localllm.tui.session_attrs import Of
from localllm.tui.tools import ToolControls
from localllm.tui.widgets import LatencyPanel, MemoryPanel, StatusLine
from localllm.vision.marker import MARKER
from localllm.vision.projector import ProjectorInfo

PLACEHOLDER = "Message (Enter sends · Ctrl+J new line · Up: earlier ones · Esc stops)"


class LocalLLMApp(Compacting, ToolControls, ConversationControls, Replying, AutoCompacting, NextMessage, ScreenActions, App):
    """Chat with a local model and watch TTFT, ITL, the budget and the KV cache."""

    CSS_PATH = "localllm.tcss"
    TITLE = "localllm"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-medium"), (120, "-wide")]
    # Short descriptions: the footer must fit 80 columns (tests/tui/test_help.py).
    BINDINGS = [
        Binding("escape", "stop", "Stop", tooltip="Stop the reply"),
        Binding("f1", "help", "Help", tooltip="Keys, and what each figure means"),
        # ? only where it types nothing: Textual leaves a printable key to a focused text box
        Binding("question_mark", "help", "Help (prompt not focused)", show=False),
        Binding("f2", "models", "Models"),
        Binding("f3", "settings", "Settings"),
        Binding("f4", "sessions", "Sessions"),
        Binding("ctrl+l", "clear_chat", "New chat"),
        Binding("ctrl+f", "attach", "Attach a file", show=False,
                tooltip="Attach a file or a picture to the next message (a path pasted or dropped in the box attaches too)"),
        Binding("ctrl+q", "quit", "Quit"),
        *CONTROL_BINDINGS,
    ]

    busy: reactive[bool] = reactive(False)
    """A reply is streaming (or a model loading): Enter does not send."""
    model_name: reactive[str] = reactive("")
    """The loaded model's file name, shown in the header."""

    # the session's state, read and set on it (the tests and the mixins read them on the app)
    model_path, backend_factory, hardware = Of[Path](), Of[Callable[[], Engine]](), Of[Hardware]()
    settings, backend, chat, saved = Of[Settings](), Of[Engine | None](), Of[ChatSession | None](), Of[sessions.SavedSession | None]()
    footprint, load_config, memory_check = Of[Footprint | None](), Of[LoadConfig | None](), Of[object]()
    bandwidth, gpu_bandwidth, rpc = Of[float | None](), Of[float | None](), Of[list[Endpoint]]()
    mmproj, mmproj_model, no_mmproj = Of[Path | None](), Of[Path | None](), Of[bool]()
    projector_info, forecaster = Of[ProjectorInfo | None](), Of[Forecaster]()

    def __init__(self, *, model_path: Path, backend_factory: Callable[[], Engine], hardware: Hardware, settings: Settings) -> None:
        super().__init__()
        self.core = CockpitSession(model_path, backend_factory, hardware, settings)
        self.core.emit = poster(self.post_message)  # the session's threads speak through messages
        self._heap = Heap()
        self._stop = threading.Event()
        self.stop_ns: int | None = None  # when the reply was asked to stop (perf_counter_ns)
        self._reply: MessageView | None = None
        self._gaps: list[float] = []
        self._last_stamp: int | None = None
        self._panel_ns = 0
        self._blink = True  # the input cursor's blink, off while busy
        self._editing = False  # the box holds the last message, to send in its place (Ctrl+G)
        self._think: ThinkClock | None = None
        self._said_stop = False  # Esc wrote "(stopped)" on the log
        self.first_answer_ms: float | None = None  # Enter to the first token after </think> (or TTFT's token)
        self.mmproj_notice: str | None = None  # a projector found beside the model that does not fit it
        self.chips: list[Pending] = []  # attached, going with the next message
        self.count: Count | None = None  # the box's message, counted
        self._sent_forecast: Forecast | None = None  # the reply in flight's forecast, for "forecast against measured"
        self._sent_images = 0
        self._sent_audio_s: float | None = None  # the sent clips' seconds, where all the reply's media were sound (the encode's rate)
        self._sent_count: Count | None = None
        self._reply_start_ns = 0
        self._reply_prefix = 0  # tokens the cache held when the reply in flight was sent
        self._last_sent: tuple[str, list[Pending], str] | None = None  # (typed, chips, content) of the last message: Ctrl+G restores them

    # -- layout ------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        # Kept: the streaming path reaches them 5 times a second, and a DOM
        # query costs about a millisecond of the CPU the decode threads need.
        self._view, self._latency, self._memory = ChatView(id="chat"), LatencyPanel(), MemoryPanel()
        self._status = StatusLine(id="status")
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat-pane"):
                yield self._view
                yield self._status
                self._chips, self._forecast = AttachBar(id="attachments"), ForecastLine(id="forecast")
                yield self._forecast  # above the chips: a line that comes and goes moves the log, not the chips under a click
                yield self._chips
                self._prompt = PromptBox(placeholder=PLACEHOLDER, id="prompt")
                yield self._prompt
            with Vertical(id="side"):
                yield self._latency
                yield self._memory
        yield Footer(compact=True, show_command_palette=False)  # 80 columns: ^p is listed by F1 instead

    def on_mount(self) -> None:
        self._prompt.focus()
        if self.mmproj_notice:
            self._view.add("note", printable(self.mmproj_notice))
        self.reload_model()
        self.read_tool_config()  # the config file's MCP servers, for the settings' Tools tab

    def watch_busy(self, busy: bool) -> None:
        """The input's cursor stops blinking while a reply streams or a model
        loads: each blink redraws the input box (about 3 ms of CPU, twice a
        second), time the decode threads need on a 2-core laptop."""
        for box in self.query("#prompt").results(PromptBox):
            if busy:
                self._blink, box.cursor_blink = box.cursor_blink, False
            else:
                box.cursor_blink = self._blink

    def watch_model_name(self, name: str) -> None:
        self.sub_title = name

    def _gone(self) -> bool:
        """The chat screen is gone (the app is closing): the engine thread's last
        messages may still arrive, and have nothing left to draw on."""
        return not self._view.is_attached

    # -- loading -----------------------------------------------------------------
    def reload_model(self, path: Path | None = None, settings: Settings | None = None, *,
                     messages: list[dict[str, str]] | None = None, saved: sessions.SavedSession | None = None,
                     redraw: bool = False, image_refs: list[dict[str, Any]] | None = None) -> None:
        """Load ``path`` with ``settings`` (by default the current ones) on the
        engine thread; they become current only once llama.cpp has loaded it."""
        req = self.core.request(path, settings, messages=messages, saved=saved, redraw=redraw, image_refs=image_refs)
        self.busy = True
        self._thaw_heap()  # the model being replaced can be collected once it is closed
        self.query_one(ChatView).add("note", f"loading {shown(req.path)} …")
        self._load(req)

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load(self, req: Any) -> None:
        loaded = self.core.load(req)
        if loaded is not None:
            self.post_message(ModelLoaded(loaded))

    @on(EngineLost)
    def _engine_lost(self, msg: EngineLost) -> None:
        """End the reply (or load) in flight with one line; the app goes on with
        a new engine thread and no model (the old one is held by llama.cpp)."""
        self.core.lost(msg.event.text)
        if self._gone():
            return
        if self.saved is not None and self._reply is not None and self._reply.text and self.busy:
            self.saved.messages = [*self.saved.messages, {"role": "assistant", "content": self._reply.text}]
            self.core.save(self.saved)
        self._reply = None
        self.model_name = ""
        self.busy = False
        self.query_one(ChatView).add("note", f"error: {msg.event.text} · the model is lost (the chat is saved: F4); "
                                             "quit (Ctrl+Q) and start the cockpit again to load one")

    @on(ModelLoaded)
    def _loaded(self, msg: ModelLoaded) -> None:
        if self._gone():
            return
        try:
            self._apply_load(msg.result)
        finally:
            self._settle_heap()  # whatever came of it: reload_model unfroze the heap

    def _settle_heap(self) -> None:
        """After a load, the heap out of the garbage collector's generations (``cockpit.heap``: 75 ms pauses while a reply streamed)."""
        self._heap.settle()

    def _thaw_heap(self) -> None:
        self._heap.thaw()

    def _apply_load(self, res: LoadResult) -> None:
        view, req = self._view, res.request
        self.busy = False
        self.core.adopt(res)
        if res.error is not None:
            if res.kept:
                view.add("note", f"could not load {shown(req.path)}: {res.error} · still on {shown(self.model_path)}")
                self._update_footprint()  # reloaded as it was: its cache starts empty
            else:
                self.model_name = ""
                view.add("note", f"could not load {shown(req.path)}: {res.error} · no model loaded: F2 picks one")
            return
        self.model_name = shown(req.path)
        self._reset_latency()  # the figures shown were measured on the model (or settings) replaced
        self.forget_compaction()
        self.count = None
        if req.redraw:
            self._redraw(res)
        try:
            chat = self.core.start_chat(res)
        except Exception as exc:  # noqa: BLE001
            view.add("note", f"{shown(req.path)} loaded, but the chat could not start: {reason(exc)}")
            return
        c = res.config
        assert c is not None
        mode = " · completion mode: no chat template, so your text is continued" if chat.completion else ""
        view.add("note", f"{shown(req.path)} · context {c.n_ctx} · KV {c.type_k}/{c.type_v}" + (f" · {res.note}" if res.note else "") + mode)
        for line in res.notes:
            view.add("note", printable(line))
        self._prompt.placeholder = PLACEHOLDER.replace("Message", "Text to continue") if chat.completion else PLACEHOLDER
        self._show_plan()
        self._chips_after_load()

    def _redraw(self, res: LoadResult) -> None:
        """The chat log shows the loaded conversation (a session reopened, another model)."""
        view = self._view
        view.clear_messages()
        had = iter(res.images)  # the markers left are the images (and clips) had again, in order
        for m in res.messages or []:
            if m["role"] == "user":
                mine = [x for _, x in zip(range(m["content"].count(MARKER)), had, strict=False)]
                view.add("user", shown_saved(m["content"], bool(m.get("data")), [x.name for x in mine],
                                             ["audio" if isinstance(x, AudioClip) else "image" for x in mine]))
            elif m["role"] == "assistant":
                view.add(m["role"], m["content"])
            elif m["role"] == "tool":  # a saved session's tool result, folded as it was shown
                view.add("tool", f"↳ {printable(m.get('name', 'tool'))} result\n{m['content']}",
                         folded=f"↳ {printable(m.get('name', 'tool'))} result · {len(m['content'].encode())} bytes  [Enter/click: whole]")

    def _show_plan(self) -> None:
        fp = self.footprint
        if fp is None or self.load_config is None:
            return
        p = fp.plan
        gpu = fp.budget_label != "RAM"
        weights = p.weights_gpu_bytes if gpu else p.weights_cpu_bytes + p.weights_gpu_bytes
        kv = p.kv_gpu_bytes if gpu else p.kv_cache_bytes
        compute = p.compute_bytes if (not gpu or p.compute_on_gpu) else 0
        panel = self._memory
        panel.set_plan(budget_label=fp.budget_label, budget=fp.budget, weights=weights, kv_full=kv, compute=compute,
                       kv_per_token=p.kv_bytes_per_token, types=f"{p.type_k}/{p.type_v}", n_ctx=p.n_ctx)
        panel.set_devices(fp.placement)
        panel.set_check(self.memory_check)
        self._update_footprint()

    def _update_footprint(self) -> None:
        if self.footprint is None or self.chat is None:
            return
        panel = self._memory
        used = self.chat.context_used
        panel.context_used = used
        panel.kv_now_bytes = planner.kv_bytes_in_use(self.footprint.plan, used)
        panel.shifts = len(self.chat.shifts)
        self._status.show(self._latency, panel)

    @on(SaveFailed)
    def _save_failed(self, msg: SaveFailed) -> None:
        if not self._gone():
            text = msg.event.text
            self._view.add("note", "the session is saved again" if text is None else f"the session could not be saved: {text}")

    @on(Resumed)
    def _resumed(self, msg: Resumed) -> None:
        if self._gone():
            return
        if msg.event.text is None:
            n = msg.event.images
            self._view.add("note", "the conversation's KV cache was kept: " + (f"its {n} image(s) are not encoded again" if n else "it is not read again"))
        else:
            self._view.add("note", f"the kept KV cache is not used ({msg.event.text}): the next message reads the conversation again")
        self._update_footprint()
        self._schedule_count()

    # -- stopping, a new chat, the end ----------------------------------------------
    async def action_quit(self) -> None:
        self._stop_reply()  # a reply in flight ends at its next token, not at its last
        self.exit()

    def _stop_reply(self) -> None:
        if self.stop_ns is None:
            self.stop_ns = time.perf_counter_ns()
        self._stop.set()
        if self.tool_chat is not None:
            self.tool_chat.cancel()  # a tool in flight ends now, not at its timeout

    def on_unmount(self) -> None:
        self._thaw_heap()  # what this app froze (_settle_heap) can be collected again
        self._stop_reply()
        try:
            self.core.close()  # the conversation kept, the model closed, the last saves on disk
        finally:
            self.close_own_hub()

    def action_stop(self) -> None:
        """Esc: the reply stops at its next token, and the log says so now; with
        an edit in the box and no reply, the edit is dropped. While a tool runs,
        Esc cancels the tool only (tools.py)."""
        if self.busy and self._cancel_tool():
            return
        if self.busy:
            self._stop_reply()
            reply = self._reply
            if reply is not None and reply.log is not None and not self._said_stop:
                self._view.finish(reply)
                self._view.add("note", "(stopped)")
                self._said_stop = True
        elif self._editing:
            self._editing = False
            self._prompt.value = ""
            self._set_chips([])
            self.notify("edit dropped: your last message stays as it was")

    def action_clear_chat(self) -> None:
        if self.busy or self.chat is None:
            return
        self.core.leave().result()  # the KV cache kept before it is emptied
        self.chat.clear()
        self.saved = None
        view = self._view
        view.clear_messages()
        view.add("note", "new chat")
        self._reset_latency()  # its figures were the old chat's last reply
        self.forget_compaction()
        self._update_footprint()
        self._said_after = False
        self._schedule_count()  # the box's message, forecast on an empty cache


def create_app(
    model: str | None = None,
    *,
    vram: int | None = None,
    settings: Settings | None = None,
    backend_factory: Callable[[], Engine] | None = None,
    bandwidth: float | None = None,
    rpc: list[Endpoint] | None = None,
    hub: Hub | None = None,
    tools_config: Path | None = None,
    mmproj: str | Path | None = None,
    no_mmproj: bool = False,
) -> LocalLLMApp:
    """The one app factory: the CLI and the tests build the cockpit here.
    ``bandwidth`` (bytes/s) skips measuring it, for reproducible screens.
    ``rpc`` (rpc.Endpoint): workers whose devices join this machine's; each is
    probed here, so one that is down is one line before the screen opens.
    ``hub``: started MCP servers (``localllm.mcp.Hub``, tools.py) whose tools the
    chat offers; ``tools_config``: the config file "always allow" writes to.
    ``mmproj``: a vision model's projector (``--mmproj``); without it, one found
    beside the model is loaded, unless ``no_mmproj``. A projector given as the
    model, or one that does not match it, is one line before the screen opens."""
    first = start(model, vram=vram, backend_factory=backend_factory, rpc=rpc, mmproj=mmproj, no_mmproj=no_mmproj)
    app = LocalLLMApp(model_path=first.path, backend_factory=first.backend_factory, hardware=first.hardware, settings=settings or Settings())
    app.bandwidth = bandwidth
    app.hub, app.tools_config = hub, tools_config
    app.mmproj, app.mmproj_model, app.no_mmproj, app.mmproj_notice = first.projector, first.path, no_mmproj, first.notice
    if rpc:
        app.rpc = list(rpc)
        app.core.keep_alive_on_abort()  # a worker that dies mid-reply: llama.cpp aborts; the cockpit says so and stays up
    return app

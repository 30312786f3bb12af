"""The localllm cockpit: chat on the left, live latency and memory on the right.

Generation runs in a thread worker (``@work(thread=True, exclusive=True)``) that
posts batches of tokens to the app at most every 50 ms, so redraws never slow
the stream. The core (``localllm``) never imports this package.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header
from textual.worker import Worker, WorkerState

from localllm import api
from localllm.chat import sessions
from localllm.chat.session import ChatSession, prompt_cache_path
from localllm.engine_api import Engine, GenerationStats, LoadConfig
from localllm.errors import InputError, LocalLLMError
from localllm.mcp.hub import Hub
from localllm.measure.diagnose import verdict
from localllm.measure.doctor import gpu_weights_read_per_token, weights_read_per_token
from localllm.measure.roofline import measure_bandwidth, roofline
from localllm.measure.starved import StarveWatch, advice, busiest_process
from localllm.modelfile.gguf_file import read_header
from localllm.plan import fitting, hardware, planner
from localllm.plan.hardware import Hardware, gpu_memory_bandwidth, physical_cores
from localllm.plan.memcheck import load_checked
from localllm.plan.workers import Endpoint, probe_all
from localllm.store import resolver
from localllm.tui.chatview import ChatView, MessageView
from localllm.tui.controls import BINDINGS as CONTROL_BINDINGS
from localllm.tui.controls import ConversationControls, ThinkClock
from localllm.tui.devices import fit_over_workers
from localllm.tui.help import HelpScreen, app_keys
from localllm.tui.prompt import PromptBox
from localllm.tui.replies import BATCH_NS, ReplyDone, TokenBatch
from localllm.tui.saved import printable, reason
from localllm.tui.screens import ModelsScreen, ensure_built_in
from localllm.tui.sessions_screen import SessionsScreen
from localllm.tui.settings import Settings
from localllm.tui.settings_screen import SettingsScreen
from localllm.tui.tools import ToolControls
from localllm.tui.widgets import LatencyPanel, MemoryPanel, StatusLine

# Redraws cost CPU that the decode threads need (on 2 cores, a 20 fps chat cost
# 25% of decode speed, measured by scripts/bench_tui.py). So tokens reach the
# screen in batches, and the number panels refresh less often than the text.
PLACEHOLDER = "Message (Enter sends · Ctrl+J new line · Up: earlier ones · Esc stops)"
PANEL_NS = int(float(os.environ.get("LOCALLLM_TUI_PANEL_MS", "1000")) * 1e6)  # number panels: once a second


def _settle_heap() -> None:
    """After a load, take every object alive (Textual's widgets, the model's
    vocabulary and chat template, ...) out of the garbage collector's
    generations (``gc.freeze``), after one collection so that no garbage is
    kept. Measured while a reply streamed: a full collection took 75 ms on the
    UI thread, holding the GIL while the engine thread waited to sample the
    next token; with these objects frozen, collections only walk what the
    reply allocates. ``reload_model`` unfreezes them first."""
    gc.collect()
    gc.freeze()


class StarvedAdvice(Message):
    """Decode was starved of CPU: the line that says so, with the fix."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class SaveFailed(Message):
    """The disk thread could not write the session (the reason, one line), or
    (None) it could again after failing."""

    def __init__(self, text: str | None) -> None:
        super().__init__()
        self.text = text


class EngineLost(Message):
    """llama.cpp aborted (a worker that stopped answering): the thread that was
    running it is held by llama.cpp for good, and so is the model."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


@dataclass
class Footprint:
    shape: planner.ModelShape
    plan: planner.MemoryPlan
    budget_label: str
    budget: int
    placement: object = None  # placement.Placement, with --rpc: per device


@dataclass
class LoadRequest:
    """A model to load, and what becomes current once it is loaded (nothing
    changes before: a load that fails leaves the app as it was)."""

    path: Path
    settings: Settings
    messages: list[dict[str, str]] | None  # the conversation to carry on (None: a new chat)
    saved: sessions.SavedSession | None  # the saved session that conversation belongs to
    redraw: bool  # show ``messages`` in the chat log instead of what it shows now
    # What the engine thread needs of the app, read on the UI thread when the
    # request is made: the engine thread reads its request, never the app.
    previous: tuple[Engine, Path, LoadConfig] | None = None  # the loaded model, closed first and reloaded on failure
    bandwidth: float | None = None  # the RAM bandwidth measured before (None: measure it)
    gpu_bandwidth: float | None = None


class ModelLoaded(Message):
    """The engine thread's answer to a LoadRequest: the loaded backend and its
    numbers, or the error and whether the previous model is still loaded."""

    def __init__(self, request: LoadRequest, *, backend: Engine | None = None, config: LoadConfig | None = None, note: str = "",
                 footprint: Footprint | None = None, bandwidth: float | None = None, error: str | None = None,
                 kept: bool = False, gpu_bandwidth: float | None = None, memory_check: object = None) -> None:
        super().__init__()
        self.request, self.backend, self.config, self.note = request, backend, config, note
        self.footprint, self.bandwidth, self.error, self.kept = footprint, bandwidth, error, kept
        self.gpu_bandwidth = gpu_bandwidth  # the GPU's memory bandwidth, where it is known
        self.memory_check = memory_check  # memcheck.MemoryCheck of this load, or None


def shown(path: Path) -> str:
    """A file's name as the screen may show it: control characters escaped, so a
    model's name cannot move the cursor or forge a line."""

    return printable(path.name)


class LocalLLMApp(ToolControls, ConversationControls, App):
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
        Binding("ctrl+q", "quit", "Quit"),
        *CONTROL_BINDINGS,
    ]

    busy: reactive[bool] = reactive(False)
    """A reply is streaming (or a model loading): Enter does not send."""
    model_name: reactive[str] = reactive("")
    """The loaded model's file name, shown in the header."""

    def __init__(self, *, model_path: Path, backend_factory: Callable[[], Engine], hardware: Hardware, settings: Settings) -> None:
        super().__init__()
        self.model_path = model_path
        self.backend_factory = backend_factory
        self.hardware = hardware
        self.settings = settings
        self.backend: Engine | None = None
        self.chat: ChatSession | None = None
        self.saved: sessions.SavedSession | None = None
        self.footprint: Footprint | None = None
        self.bandwidth: float | None = None  # bytes/s, measured once, for the decode roofline
        self.gpu_bandwidth: float | None = None  # the GPU's, where hardware.gpu_memory_bandwidth knows it
        self.load_config: LoadConfig | None = None
        self.rpc: list[Endpoint] = []  # rpc.Endpoint: workers whose devices join the local ones (--rpc)
        self.memory_check: object = None  # memcheck.MemoryCheck of the loaded model, or None
        self._lost: Future = Future()  # set when llama.cpp aborts (see EngineLost)
        self._lost_text = ""  # why, once it has happened
        # Every llama.cpp call runs on this one thread. Measured here: decoding on
        # a second thread after llama.cpp computed on another ran at 33 t/s
        # instead of 93 t/s (its OpenMP thread team belongs to the first thread).
        # Textual's thread workers are new threads each time, so they hand the
        # work to this executor and wait.
        self._engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
        self._disk = ThreadPoolExecutor(max_workers=1, thread_name_prefix="save")  # sessions, in order, off the UI thread
        self._disk_error: str | None = None  # the last save's failure (read and set on the disk thread)
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
        self._starve = StarveWatch()  # each model's best decode rate here, for the starved-decode advice

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
                self._prompt = PromptBox(placeholder=PLACEHOLDER, id="prompt")
                yield self._prompt
            with Vertical(id="side"):
                yield self._latency
                yield self._memory
        yield Footer(compact=True, show_command_palette=False)  # 80 columns: ^p is listed by F1 instead

    def on_mount(self) -> None:
        self._prompt.focus()
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

    # -- loading -----------------------------------------------------------------
    def reload_model(self, path: Path | None = None, settings: Settings | None = None, *,
                     messages: list[dict[str, str]] | None = None, saved: sessions.SavedSession | None = None,
                     redraw: bool = False) -> None:
        """Load ``path`` with ``settings`` (by default the current ones) in the
        engine thread; they become current only once llama.cpp has loaded it."""
        previous = (self.backend, self.model_path, self.load_config) if self.backend is not None and self.load_config is not None else None
        req = LoadRequest(path or self.model_path, settings or self.settings, messages, saved, redraw, previous,
                          self.bandwidth, self.gpu_bandwidth)
        self.busy = True
        gc.unfreeze()  # the model being replaced can be collected once it is closed
        self.query_one(ChatView).add("note", f"loading {shown(req.path)} …")
        self._load(req)

    def _choose_config(self, path: Path, s: Settings) -> tuple[LoadConfig, str, Footprint]:
        """Ask the fitting service, as the CLI does: the settings' cache types
        are kept, blank GPU layers are fitted, the context shrinks (or layers
        move to the CPU, by the policy) when the budget is short. With --rpc,
        across the workers' devices, a local GPU and the CPU."""

        hw = self.hardware
        if self.rpc:

            if self._lost_text:
                # llama.cpp keeps the lost connection (its dispatcher, held) for this endpoint in this
                # process, and would queue the new load's calls to it: the load would never end
                raise InputError("llama.cpp still holds the connection to the worker that stopped: "
                                 "quit (Ctrl+Q) and start localllm tui --rpc again")

            cfg, note, placement = fit_over_workers(path, s, hw, self.rpc)
            shape = planner.ModelShape.from_header(read_header(path))
            return cfg, note, Footprint(shape, placement.plan, "RAM", hw.ram_available_bytes, placement)
        shape = planner.ModelShape.from_header(read_header(path))
        request = s.fit_request()
        # llama.cpp's dry run referees the compute figure where the replay does not cover the model
        lp = api.prepare(path, request, n_ctx=request.config.n_ctx, hw=hw)
        fit = lp.fit
        if not fit.fits:
            raise InputError(f"does not fit: {fit.sentence}")
        note = "" if fit.outcome is fitting.Outcome.FITS_AS_ASKED else f"auto-fit: {fit.sentence}"
        if hw.gpu_budget is not None:
            label = {"--vram": "GPU budget (--vram)", "nvml": f"GPU {hw.gpu_name}", "apple-unified": "unified memory"}.get(hw.gpu_source, "GPU")
            fp = Footprint(shape, lp.plan, label, hw.gpu_budget)
        else:
            fp = Footprint(shape, lp.plan, "RAM", hw.ram_available_bytes)
        return fit.config, note, fp

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load(self, req: LoadRequest) -> None:
        loaded = self._wait_engine(self._engine.submit(self._load_on_engine_thread, req))
        if loaded is not None:
            self.post_message(loaded)

    def _wait_engine(self, fut: Future) -> Any:
        """The engine thread's answer, or None when llama.cpp aborted meanwhile:
        its thread then never answers (see EngineLost)."""
        wait([fut, self._lost], return_when=FIRST_COMPLETED)
        return fut.result() if fut.done() else None

    def _abort_hook(self, text: str) -> None:
        """On llama.cpp's aborting thread (rpc.keep_alive_on_abort)."""
        if not self._lost.done():  # several workers may stop at once: one line
            self._lost.set_result(text)
            self.post_message(EngineLost(text))

    @on(EngineLost)
    def _engine_lost(self, msg: EngineLost) -> None:
        """End the reply (or load) in flight with one line; the app goes on with
        a new engine thread and no model (the old one is held by llama.cpp)."""
        old, self._engine = self._engine, ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
        old.shutdown(wait=False)
        self._lost = Future()
        self._lost_text = msg.text
        if self._gone():
            return
        if self.saved is not None and self._reply is not None and self._reply.text and self.busy:
            self.saved.messages = [*self.saved.messages, {"role": "assistant", "content": self._reply.text}]
            self._save(self.saved)
        self.backend = self.chat = self.load_config = self._reply = None
        self.model_name = ""
        self.busy = False
        self.query_one(ChatView).add("note", f"error: {msg.text} · the model is lost (the chat is saved: F4); "
                                             "quit (Ctrl+Q) and start the cockpit again to load one")

    def _load_on_engine_thread(self, req: LoadRequest) -> ModelLoaded:
        """Load the requested model. The previous one is closed first (two models
        at once may not fit); if the new one fails, the previous one is loaded
        again as it was, so a bad file or an absurd setting costs nothing."""
        try:
            ensure_built_in(req.path)  # gemma3-270m chosen on F2 before its first use: assembled here, off the UI thread
            cfg, note, fp = self._choose_config(req.path, req.settings)
        except Exception as exc:  # noqa: BLE001 - a bad file must not end the app
            return ModelLoaded(req, error=reason(exc), kept=req.previous is not None)
        old, old_path, old_cfg = req.previous or (None, req.path, None)
        if old is not None:
            old.close()
        try:

            backend = self.backend_factory()
            _, check = load_checked(backend, req.path, cfg, fp.placement, fp.plan)
            if req.settings.lora:  # --lora: each file checked against the model, one line if wrong (LlamaCppBackend.load_adapters)
                load_adapters = getattr(backend, "load_adapters", None)
                if load_adapters is None:
                    raise InputError("this engine cannot load LoRA adapters")
                try:
                    load_adapters(req.settings.adapter_specs())
                except BaseException:
                    backend.close()  # not left loaded beside the previous model, which is loaded again below
                    raise
        except Exception as exc:  # noqa: BLE001
            error, kept = reason(exc), False
            if old is not None and old_cfg is not None:
                try:
                    old.load(old_path, old_cfg)
                    kept = True
                except Exception as again:  # noqa: BLE001
                    error += f"; reloading {shown(old_path)} failed too: {reason(again)}"
            return ModelLoaded(req, error=error, kept=kept)

        bandwidth = req.bandwidth
        if bandwidth is None:

            try:
                bandwidth = measure_bandwidth(mib=128, passes=3, threads=cfg.n_threads or physical_cores())
            except Exception:  # noqa: BLE001 - the roofline line is then left out
                bandwidth = None
        gpu_bandwidth = req.gpu_bandwidth if req.bandwidth is not None else gpu_memory_bandwidth()
        return ModelLoaded(req, backend=backend, config=cfg, note=note, footprint=fp, bandwidth=bandwidth, gpu_bandwidth=gpu_bandwidth,
                           memory_check=check)

    @on(ModelLoaded)
    def _loaded(self, msg: ModelLoaded) -> None:
        if self._gone():
            return
        try:
            self._apply_load(msg)
        finally:
            _settle_heap()  # whatever came of it: reload_model unfroze the heap

    def _apply_load(self, msg: ModelLoaded) -> None:
        view = self.query_one(ChatView)
        req = msg.request
        self.busy = False
        if msg.error is not None:
            if msg.kept:
                view.add("note", f"could not load {shown(req.path)}: {msg.error} · still on {shown(self.model_path)}")
                self._update_footprint()  # reloaded as it was: its cache starts empty
            else:
                self.backend = self.chat = self.load_config = self.footprint = None
                self.model_name = ""
                view.add("note", f"could not load {shown(req.path)}: {msg.error} · no model loaded: F2 picks one")
            return
        self.backend, self.footprint, self.bandwidth = msg.backend, msg.footprint, msg.bandwidth
        self.gpu_bandwidth = msg.gpu_bandwidth
        self.memory_check = msg.memory_check
        self.model_path, self.settings, self.load_config = req.path, req.settings, msg.config
        self.model_name = shown(req.path)
        self._reset_latency()  # the figures shown were measured on the model (or settings) replaced
        if req.redraw:
            view.clear_messages()
            for m in req.messages or []:
                if m["role"] in ("user", "assistant"):
                    view.add(m["role"], m["content"])
                elif m["role"] == "tool":  # a saved session's tool result, folded as it was shown
                    view.add("tool", f"↳ {printable(m.get('name', 'tool'))} result\n{m['content']}",
                             folded=f"↳ {printable(m.get('name', 'tool'))} result · {len(m['content'].encode())} bytes  [Enter/click: whole]")
            self.saved = req.saved
        try:
            self.chat = self._new_chat(req.messages)
        except Exception as exc:  # noqa: BLE001
            self.chat = None
            view.add("note", f"{shown(req.path)} loaded, but the chat could not start: {reason(exc)}")
            return
        c = msg.config
        assert c is not None
        mode = " · completion mode: no chat template, so your text is continued" if self.chat.completion else ""
        view.add("note", f"{shown(req.path)} · context {c.n_ctx} · KV {c.type_k}/{c.type_v}" + (f" · {msg.note}" if msg.note else "") + mode)
        self._prompt.placeholder = PLACEHOLDER.replace("Message", "Text to continue") if self.chat.completion else PLACEHOLDER
        self._show_plan()

    def _new_chat(self, messages: list[dict[str, str]] | None) -> ChatSession:
        """A chat on the loaded model. A model without a chat template (a base
        model) gets completion mode: the conversation is one text it continues,
        with no system prompt (a base model has no notion of one)."""
        assert self.backend is not None and self.load_config is not None
        s, c = self.settings, self.load_config
        completion = not self.backend.has_chat_template
        system = None if completion else (s.system_prompt or None)
        chat = ChatSession(
            self.backend,
            system_prompt=system,
            sampling=s.sampling(),
            sliding_window=s.sliding_window,
            keep_override=s.n_keep,
            completion=completion,
            prompt_cache=prompt_cache_path(self.model_path, system, c.type_k, c.type_v, c.swa_full) if system else None,
        )
        if messages:
            chat.messages = ([{"role": "system", "content": system}] if system else []) + [m for m in messages if m["role"] != "system"]
        return chat

    def _show_plan(self) -> None:
        fp = self.footprint
        if fp is None or self.load_config is None:
            return
        p = fp.plan
        gpu = fp.budget_label != "RAM"
        weights = p.weights_gpu_bytes if gpu else p.weights_cpu_bytes + p.weights_gpu_bytes
        kv = p.kv_gpu_bytes if gpu else p.kv_cache_bytes
        compute = p.compute_bytes if (not gpu or p.compute_on_gpu) else 0
        self.query_one(MemoryPanel).set_plan(
            budget_label=fp.budget_label, budget=fp.budget, weights=weights, kv_full=kv, compute=compute,
            kv_per_token=p.kv_bytes_per_token, types=f"{p.type_k}/{p.type_v}", n_ctx=p.n_ctx,
        )
        panel = self.query_one(MemoryPanel)
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

    # -- chatting ----------------------------------------------------------------
    @on(PromptBox.Submitted, "#prompt")
    def _submit(self, event: PromptBox.Submitted) -> None:
        """Send the box's text; refused with the reason while a reply streams or
        a model loads (the text stays in the box)."""
        text = event.text.strip()
        if not text:
            return
        if self.busy:
            doing = ("a model is loading" if self._reply is None else
                     "the reply is stopping" if self._said_stop else "a reply is streaming: Esc stops it")
            self.notify(f"not sent: {doing}; your message stays in the box", severity="warning")
            return
        view = self._view
        if self.chat is None:
            view.add("note", "no model is loaded: F2 picks one")
            return
        if self._editing:
            self._take_back_for_edit()
        event.box.take()
        view.add("user", text)
        self._start_reply(text)

    def _start_reply(self, text: str) -> None:
        """Stream the reply to ``text`` (the user's message is on the log)."""
        assert self.chat is not None
        self._reply = self._view.add("assistant", "")
        self._persist(extra_user=text)
        self._reset_latency()
        self._gaps = []
        self._last_stamp = None
        self._stop.clear()
        self._said_stop = False
        self.stop_ns = None
        self.busy = True
        submitted = time.perf_counter_ns()
        self._think = ThinkClock(submitted)
        self._tool_steps = 0
        self._generate(self.chat, text, submitted)

    @work(thread=True, exclusive=True, group="reply", exit_on_error=False)
    def _generate(self, chat: ChatSession, text: str, submitted_ns: int) -> None:
        run = self._generate_tools_on_engine_thread if self.hub is not None and not chat.completion else self._generate_on_engine_thread
        self._wait_engine(self._engine.submit(run, chat, text, submitted_ns))

    def _generate_on_engine_thread(self, chat: ChatSession, text: str, submitted_ns: int) -> None:
        """TTFT runs from Enter (``submitted_ns``) to the first token that prints
        text, on the same clock for the live figure and the final stats. What
        it learns goes back in messages (TokenBatch, ReplyDone): the stats are
        the generation's own, read once it is closed."""
        start = submitted_ns
        first_text: int | None = None
        pieces: list[str] = []
        stamps: list[int] = []
        last_post = 0  # the first token is posted at once: it is the TTFT the user waits for
        stopped = False
        error = None
        reply = None
        try:
            reply = chat.send(text, start_ns=start)
            for event in reply:
                pieces.append(event.text)
                stamps.append(event.t_ns)
                if first_text is None and event.text:
                    first_text = event.t_ns
                if event.t_ns - last_post >= BATCH_NS:
                    self.post_message(TokenBatch("".join(pieces), stamps, start, first_text, tuple(pieces)))
                    pieces, stamps, last_post = [], [], event.t_ns
                if self._stop.is_set():  # Esc or quit: checked after every token
                    stopped = True
                    break
        except Exception as exc:  # noqa: BLE001 - shown in the chat log; the app goes on
            error = reason(exc)
        finally:
            if reply is not None:
                reply.close()  # ends the generation now and records the turn
        if pieces:
            self.post_message(TokenBatch("".join(pieces), stamps, start, first_text, tuple(pieces)))
        stats = reply.stats if reply is not None and error is None else None
        self.post_message(ReplyDone(stats, stopped, error))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The last net: a worker that failed anyway shows why in the chat log."""
        if event.state == WorkerState.ERROR and not self._gone():
            self.query_one(ChatView).add("note", f"error: {reason(event.worker.error or RuntimeError('unknown'))}")
            self.busy = False

    def _gone(self) -> bool:
        """The chat screen is gone (the app is closing): the engine thread's last
        messages may still arrive, and have nothing left to draw on."""
        return not self._view.is_attached

    @on(TokenBatch)
    def _tokens(self, msg: TokenBatch) -> None:
        if self._gone():
            return
        if self._reply is not None:
            self._reply.append(msg.text)  # after Esc, to the text only: the log was told at once
        if self._think is not None:
            self._think.feed(msg.pieces, msg.stamps)
        latency = self._latency
        if latency.ttft_ms is None and msg.first_text_ns is not None:
            latency.ttft_ms = (msg.first_text_ns - msg.start_ns) / 1e6
        for t in msg.stamps:
            if self._last_stamp is not None:
                self._gaps.append((t - self._last_stamp) / 1e6)
            self._last_stamp = t
        now = time.perf_counter_ns()
        if now - self._panel_ns >= PANEL_NS:
            self._panel_ns = now
            if self._gaps:  # set quietly: the gaps' watcher (it always fires) paints once for both
                latency.set_reactive(LatencyPanel.decode_tps, 1000 / (sum(self._gaps) / len(self._gaps)))
            latency.set_reactive(LatencyPanel.threads, self._threads_text())  # painted with the gaps, next line
            latency.gaps_ms = self._gaps
            self._update_footprint()

    def _threads_text(self) -> str:
        """The decode thread count as the engine chose it, and its last move (issue 50)."""
        ctl = getattr(self.backend, "threads", None)  # the llama.cpp engine's; the scripted fake has none
        return ctl.short("token") if ctl is not None else "threads n/a"

    @on(ReplyDone)
    def _done(self, msg: ReplyDone) -> None:
        if self._gone():
            return
        latency = self.query_one(LatencyPanel)
        view = self.query_one(ChatView)
        reply, think = self._reply, self._think
        if reply is not None and think is not None:
            reply.think_tokens, reply.think_ms = think.think_tokens, think.think_ms
            self.first_answer_ms = think.answer_ms
            latency.answer_ms = think.answer_ms if think.think_tokens else None  # shown beside TTFT after a <think> block
        if reply is not None and self.hub is not None and not reply.text.strip():
            self._close_reply()  # with tools, a reply with no text (after a call, a line) is no block
        elif reply is not None:
            view.finish(reply)  # Markdown, drawn once (markdown.py says why)
        if msg.error:
            view.add("note", f"error: {msg.error}")
        if msg.stopped and not self._said_stop:
            view.add("note", "(stopped)")
        s = msg.stats
        latency.threads = self._threads_text()
        latency.gaps_ms = self._gaps
        if s is not None:
            latency.ttft_ms = s.ttft_ms
            latency.prefill_tps = s.prefill_tokens_per_s
            latency.decode_tps = s.decode_tokens_per_s
            latency.ceiling_tps = self._ceiling(s)
            v = verdict(s, latency.ceiling_tps)
            latency.verdict = (v.headline, v.detail) if v else ("", "")
            self._check_starved(s.decode_tokens_per_s)
            for shift in s.context_shifts:
                view.add("note", f"context shift: dropped {shift.dropped} tokens, kept {shift.kept} ({shift.method}, {shift.ms:.1f} ms)")
        self._update_footprint()
        self._persist()
        self._reply = None  # no reply in flight: Enter is refused for a load, not for it
        self.busy = False

    def _ceiling(self, s: GenerationStats) -> float | None:
        """This machine's decode roofline for the loaded model at the reply's
        context, or None where it is not known."""
        # over --rpc, layers are read by the workers' devices at bandwidths we do not know: no roofline
        if not self.bandwidth or self.footprint is None or self.footprint.placement is not None:
            return None
        fp = self.footprint
        kv = planner.kv_bytes_in_use(fp.plan, s.context_used)
        # offloaded layers are read at the GPU's speed; a CPU build (or a
        # --vram plan on a machine without a GPU) offloads nothing
        info = self.backend.info if self.backend is not None else None
        offloads = bool(info and info.gpu_offload_supported)
        gpu_read = gpu_weights_read_per_token(fp.shape, fp.plan, True) if offloads else 0
        return roofline(
            self.bandwidth, weights_read_per_token(fp.shape), kv, s.decode_tokens_per_s,
            gpu_bytes=gpu_read, gpu_bandwidth=self.gpu_bandwidth,
        ).ceiling_tokens_per_s

    def _check_starved(self, rate: float | None) -> None:
        """A reply far below what this model did before here: once per model,
        the busiest other program is looked up off the UI thread and a line
        names it with a thread count to use (StarvedAdvice)."""
        reference = self._starve.check(self.model_path, rate)
        if reference is not None and rate is not None:
            threads = (self.load_config.n_threads if self.load_config else None) or physical_cores()
            self._advise_starved(rate, reference, threads)

    @work(thread=True, group="advice", exit_on_error=False)
    def _advise_starved(self, rate: float, reference: tuple[float, str], threads: int) -> None:
        self.post_message(StarvedAdvice(advice(rate, reference, threads, busiest_process())))

    @on(StarvedAdvice)
    def _starved_advice(self, msg: StarvedAdvice) -> None:
        if not self._gone():
            self._view.add("note", msg.text)

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
        gc.unfreeze()  # what this app froze (_settle_heap) can be collected again
        self._stop_reply()
        if self.rpc:
            # lazy: loads llama.cpp (~169 ms here), which app does not load at import
            from localllm.engine import rpc

            rpc.drop_keep_alive(self._abort_hook)
        try:
            if self.backend is not None:
                self._engine.submit(self.backend.close).result()
            self._engine.shutdown(wait=True)
        finally:
            self._disk.shutdown(wait=True)  # the last saves reach the disk before the app ends
            self.close_own_hub()

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
        else:
            self.push_screen(HelpScreen(app_keys(self.screen.active_bindings.values(), self)))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's commands, with "Keys" opening the help screen: Textual's
        own keys panel lists the focused text box's editing keys first, and
        the cockpit's below the fold."""
        for command in super().get_system_commands(screen):
            if command.title != "Keys":
                yield command
        yield SystemCommand("Keys", "The cockpit's keys, and what each figure means (F1)", self.action_help)

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
            self.notify("edit dropped: your last message stays as it was")

    def action_clear_chat(self) -> None:
        if self.busy or self.chat is None:
            return
        self.chat.clear()
        self.saved = None
        view = self.query_one(ChatView)
        view.clear_messages()
        view.add("note", "new chat")
        self._reset_latency()  # its figures were the old chat's last reply
        self._update_footprint()

    def _reset_latency(self) -> None:
        latency = self._latency
        latency.ttft_ms = latency.answer_ms = None
        latency.gaps_ms = []
        latency.prefill_tps = latency.decode_tps = latency.ceiling_tps = None
        latency.verdict = ("", "")
        latency.threads = self._threads_text()

    # -- sessions ----------------------------------------------------------------
    def _persist(self, extra_user: str | None = None) -> None:
        """Save the chat atomically: after the user's message, and after each reply."""
        if self.chat is None:
            return
        if self.saved is None:
            self.saved = sessions.SavedSession.new(str(self.model_path), self.settings.system_prompt, self.settings.to_dict())
        msgs = list(self.chat.messages)
        if extra_user is not None:
            msgs.append({"role": "user", "content": extra_user})
        self.saved.messages = msgs
        self.saved.settings = self.settings.to_dict()
        self._save(self.saved)

    def _save(self, saved: sessions.SavedSession) -> None:
        """Write a copy of the session on the disk thread: a save is two fsyncs,
        which a slow disk can hold for longer than a frame. One thread, so the
        saves land in the order they were made; a failed one (disk full, a
        read-only folder) is a line in the chat log, and the chat goes on."""
        snapshot = dataclasses.replace(saved, messages=list(saved.messages), settings=dict(saved.settings or {}))
        self._disk.submit(self._save_on_disk_thread, snapshot)

    def wait_for_saves(self) -> None:
        """Block until the saves queued so far are on disk (call it off the UI
        thread): a reader of the session files must not see an older chat."""
        self._disk.submit(lambda: None).result()

    def _save_on_disk_thread(self, snapshot: sessions.SavedSession) -> None:
        """Save; tell the app only when saving starts failing or works again
        (one line for a full disk, not one per message)."""
        try:
            sessions.save(snapshot)
            error = None
        except (OSError, LocalLLMError) as exc:
            error = reason(exc)
        if error != self._disk_error:
            self._disk_error = error
            self.post_message(SaveFailed(error))

    @on(SaveFailed)
    def _save_failed(self, msg: SaveFailed) -> None:
        if not self._gone():
            self._view.add("note", "the session is saved again" if msg.text is None else f"the session could not be saved: {msg.text}")

    def open_session(self, saved: sessions.SavedSession) -> None:
        """Load the session's model with its settings and show its messages (once
        the model is loaded: a session whose model is gone changes nothing)."""
        # An unanswered last message (the app died mid-reply) is dropped: the reply in flight is what is lost.
        msgs = list(saved.messages)
        if msgs and msgs[-1]["role"] == "user":
            msgs.pop()
        settings = Settings.from_dict(saved.settings) if saved.settings else self.settings
        self.reload_model(Path(saved.model), settings, messages=msgs, saved=saved, redraw=True)

    def action_sessions(self) -> None:

        def chosen(saved: sessions.SavedSession | None) -> None:
            if saved is not None:
                self.open_session(saved)

        if not self.busy:
            self.push_screen(SessionsScreen(self.wait_for_saves), chosen)

    @on(SessionsScreen.Renamed)
    def _session_renamed(self, msg: SessionsScreen.Renamed) -> None:
        """The open chat keeps its new name in its next save."""
        if self.saved is not None and self.saved.id == msg.session.id:
            self.saved.name = msg.session.name

    @on(SessionsScreen.Deleted)
    def _session_deleted(self, msg: SessionsScreen.Deleted) -> None:
        """The open chat's file is gone: its next message starts a new saved session, not the deleted one again."""
        if self.saved is not None and self.saved.id == msg.session_id:
            self.saved = None

    # -- settings and models -------------------------------------------------------
    def action_settings(self) -> None:
        screen = SettingsScreen(self.settings, self.tool_switches())

        def apply(new: Settings | None) -> None:
            if new is not None and screen.tools_off is not None:
                self.set_tools_off(screen.tools_off)
                self.start_servers(screen.servers_on)
            if new is None or new == self.settings:
                return
            if new.needs_reload(self.settings):
                self.query_one(ChatView).add("note", "these settings need the model reloaded: reloading")
                self.reload_model(settings=new, messages=self.chat.messages if self.chat else None, saved=self.saved)
                return
            self.settings = new
            self.tool_chat = None  # made again at the next message: its grammar joins the new sampling
            if self.chat is not None:
                self.chat.sampling = new.sampling()
                self.chat.sliding_window = new.sliding_window
                self.chat.keep_override = new.n_keep
                if new.system_prompt != (self.chat.system_prompt or ""):
                    self.chat.system_prompt = new.system_prompt or None
                    self.chat.clear()
                    self.query_one(ChatView).add("note", "system prompt changed: new chat")
                self.query_one(ChatView).add("note", "settings applied")

        if not self.busy:
            self.push_screen(screen, apply)

    def action_models(self) -> None:

        def switch(path: Path | None) -> None:
            if path and (path != self.model_path or self.backend is None):
                self.reload_model(path, redraw=True)

        if not self.busy:
            self.push_screen(ModelsScreen(self.model_path, self.hardware, self.settings), switch)


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
) -> LocalLLMApp:
    """The one app factory: the CLI and the tests build the cockpit here.
    ``bandwidth`` (bytes/s) skips measuring it, for reproducible screens.
    ``rpc`` (rpc.Endpoint): workers whose devices join this machine's; each is
    probed here, so one that is down is one line before the screen opens.
    ``hub``: started MCP servers (``localllm.mcp.Hub``, tools.py) whose tools the
    chat offers; ``tools_config``: the config file "always allow" writes to."""

    path = resolver.resolve(model)
    read_header(path)  # a bad file is a one-line error before the screen opens
    if rpc:

        probe_all(list(rpc))
    if backend_factory is None:
        # lazy: loads llama.cpp (~155 ms here), which app does not load at import
        from localllm.engine import LlamaCppBackend

        backend_factory = LlamaCppBackend
    app = LocalLLMApp(model_path=path, backend_factory=backend_factory, hardware=hardware.detect(vram), settings=settings or Settings())
    app.bandwidth = bandwidth
    app.hub, app.tools_config = hub, tools_config
    if rpc:
        app.rpc = list(rpc)
        # a worker that dies mid-reply: llama.cpp aborts; the cockpit says so and stays up
        # lazy: loads llama.cpp (~169 ms here), which app does not load at import
        from localllm.engine.rpc import keep_alive_on_abort

        keep_alive_on_abort(app._abort_hook)
    return app

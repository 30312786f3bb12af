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
from collections.abc import Callable, Iterable, Mapping
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

from localllm import runtime
from localllm.chat import resume, sessions
from localllm.chat.session import ChatSession, prompt_cache_path
from localllm.engine_api import Engine, GenerationStats, LoadConfig
from localllm.errors import InputError, LocalLLMError
from localllm.forecast import Forecast, Forecaster, reply_room
from localllm.mcp.hub import Hub
from localllm.measure.diagnose import verdict
from localllm.measure.doctor import gpu_weights_read_per_token, weights_read_per_token
from localllm.measure.predict import measured_ram_bandwidth
from localllm.measure.roofline import roofline
from localllm.measure.starved import StarveWatch, advice, busiest_process
from localllm.modelfile.gguf_file import read_header
from localllm.plan import fitting, hardware, planner
from localllm.plan.hardware import Hardware, gpu_memory_bandwidth, physical_cores
from localllm.plan.workers import Endpoint, probe_all
from localllm.store import resolver
from localllm.tui.attachments import (
    AttachBar,
    AttachScreen,
    Count,
    ForecastLine,
    Pending,
    ReloadConfirm,
    count_file,
    is_image,
    restore_images,
    shown_saved,
)
from localllm.tui.attachments import count as count_prompt
from localllm.tui.attachments import message as attach_message
from localllm.tui.attachments import read as read_attachment
from localllm.tui.attachments import shown as shown_message
from localllm.tui.chatview import ChatView, MessageView
from localllm.tui.controls import BINDINGS as CONTROL_BINDINGS
from localllm.tui.controls import ConversationControls, ThinkClock
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
from localllm.vision import choice as projector_choice
from localllm.vision.image import RGBImage
from localllm.vision.marker import MARKER, with_images
from localllm.vision.projector import ProjectorInfo

# Redraws cost CPU that the decode threads need (on 2 cores, a 20 fps chat cost
# 25% of decode speed, measured by scripts/bench_tui.py). So tokens reach the
# screen in batches, and the number panels refresh less often than the text.
PLACEHOLDER = "Message (Enter sends · Ctrl+J new line · Up: earlier ones · Esc stops)"
PANEL_NS = int(float(os.environ.get("LOCALLLM_TUI_PANEL_MS", "1000")) * 1e6)  # number panels: once a second
COUNT_DELAY_S = 0.2  # the prompt's tokens are counted once typing pauses this long (on the engine thread)
PROGRESS_NS = 100_000_000  # a long prefill's progress line: at most ten redraws a second


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


class Resumed(Message):
    """A reopened conversation's kept KV cache was loaded (None), or why it was not."""

    def __init__(self, text: str | None, images: int) -> None:
        super().__init__()
        self.text = text
        self.images = images


class EngineLost(Message):
    """llama.cpp aborted (a worker that stopped answering): the thread that was
    running it is held by llama.cpp for good, and so is the model."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class PrefillProgress(Message):
    """The engine read ``done`` of the prompt's ``total`` tokens (at ``t_ns``): a long prefill's progress."""

    def __init__(self, done: int, total: int, t_ns: int) -> None:
        super().__init__()
        self.done, self.total, self.t_ns = done, total, t_ns


class AttachRead(Message):
    """A file read to attach (off the UI thread), its tokens counted or not yet; or the line refusing it."""

    def __init__(self, pending: Pending | None, error: str | None = None) -> None:
        super().__init__()
        self.pending, self.error = pending, error


class Counted(Message):
    """The next message's tokens, counted on the engine thread (None: the count failed)."""

    def __init__(self, count: Count | None, key: tuple) -> None:
        super().__init__()
        self.count, self.key = count, key


@dataclass
class Footprint:
    shape: planner.ModelShape
    plan: planner.MemoryPlan
    budget_label: str
    budget: int
    placement: object = None  # placement.Placement, with --rpc: per device
    max_ctx_by_kv_type: Mapping[str, int] | None = None  # the fit's largest context per KV cache type (what would hold a message)
    trained_ctx: int | None = None


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
    # a vision model's projector: (--mmproj, the model it was given for, --no-mmproj), decided on the engine thread
    mmproj: tuple[Path | None, Path | None, bool] = (None, None, False)
    images: Mapping[str, RGBImage] | None = None  # the conversation's images at hand (by sha256: a reload with other settings)
    image_refs: list[dict[str, Any]] | None = None  # where each of the conversation's images was read from, in marker order


class ModelLoaded(Message):
    """The engine thread's answer to a LoadRequest: the loaded backend and its
    numbers, or the error and whether the previous model is still loaded."""

    def __init__(self, request: LoadRequest, *, backend: Engine | None = None, config: LoadConfig | None = None, note: str = "",
                 footprint: Footprint | None = None, bandwidth: float | None = None, error: str | None = None,
                 kept: bool = False, gpu_bandwidth: float | None = None, memory_check: object = None,
                 projector: ProjectorInfo | None = None, notes: list[str] | None = None,
                 messages: list[dict[str, str]] | None = None, images: list[RGBImage] | None = None) -> None:
        super().__init__()
        self.request, self.backend, self.config, self.note = request, backend, config, note
        self.footprint, self.bandwidth, self.error, self.kept = footprint, bandwidth, error, kept
        self.gpu_bandwidth = gpu_bandwidth  # the GPU's memory bandwidth, where it is known
        self.memory_check = memory_check  # memcheck.MemoryCheck of this load, or None
        self.projector = projector  # the vision projector loaded with it, or None
        self.notes = notes or []  # lines for the log: a projector not loaded, an image not read again
        self.messages = messages if messages is not None else request.messages  # the conversation, its lost images' markers replaced
        self.images = images or []  # its images, in marker order


def _dur(ms: float) -> str:
    """A TTFT for the forecast line: ``340 ms``, ``1.2 s``, ``13 s``."""
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s" if ms < 10_000 else f"{ms / 1000:.0f} s"


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
        Binding("ctrl+f", "attach", "Attach a file", show=False,
                tooltip="Attach a file or a picture to the next message (a path pasted or dropped in the box attaches too)"),
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
        self._froze_heap = False  # _settle_heap froze the heap, and nothing has unfrozen it since
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
        # images and files (attachments.py): the projector asked for, the chips, the prompt's count and forecast
        self.mmproj: Path | None = None  # --mmproj, or the projector found beside the first model
        self.mmproj_model: Path | None = None  # the model it goes with
        self.no_mmproj = False
        self.mmproj_notice: str | None = None  # a projector found beside the model that does not fit it
        self.projector_info: ProjectorInfo | None = None  # the projector loaded with the model, or None (text only)
        self.chips: list[Pending] = []  # attached, going with the next message
        self.forecaster = Forecaster()  # this model's measured prefills and encodes (new at each load)
        self.count: Count | None = None  # the box's message, counted
        self._count_timer: Any = None
        self._sent_forecast: Forecast | None = None  # the reply in flight's forecast, for "forecast against measured"
        self._sent_images = 0
        self._sent_count: Count | None = None
        self._said_after = False  # the forecast line shows the last reply's forecast against its measured TTFT
        self._wrap: list[int] = []  # what the template added to a typed message's tokens, measured on the last turns
        self._progress_ns = 0  # the last prefill progress posted (engine thread)
        self._reply_start_ns = 0
        self._reply_prefix = 0  # tokens the cache held when the reply in flight was sent
        self._image_refs: dict[str, dict[str, Any]] = {}  # each attached picture's path and pixels' sha256, by sha256
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

    # -- loading -----------------------------------------------------------------
    def reload_model(self, path: Path | None = None, settings: Settings | None = None, *,
                     messages: list[dict[str, str]] | None = None, saved: sessions.SavedSession | None = None,
                     redraw: bool = False, image_refs: list[dict[str, Any]] | None = None) -> None:
        """Load ``path`` with ``settings`` (by default the current ones) in the
        engine thread; they become current only once llama.cpp has loaded it.
        The conversation's images go with ``messages``: those at hand (a reload
        with other settings), else read again from ``image_refs`` (a saved session)."""
        previous = (self.backend, self.model_path, self.load_config) if self.backend is not None and self.load_config is not None else None
        have = {im.sha256: im for im in self.chat.images} if self.chat is not None and messages is not None else {}
        if messages is not None and image_refs is None and self.chat is not None:
            image_refs = self._refs(self.chat.images)
        req = LoadRequest(path or self.model_path, settings or self.settings, messages, saved, redraw, previous,
                          self.bandwidth, self.gpu_bandwidth, (self.mmproj, self.mmproj_model, self.no_mmproj), have, image_refs)
        self.busy = True
        self._thaw_heap()  # the model being replaced can be collected once it is closed
        self.query_one(ChatView).add("note", f"loading {shown(req.path)} …")
        self._load(req)

    def _choose_config(self, path: Path, s: Settings, projector: Path | None = None) -> tuple[runtime.Planned, str, Footprint]:
        """Ask the load path's fitting service, as the CLI does: the settings' cache
        types are kept, blank GPU layers are fitted, the context shrinks (or layers
        move to the CPU, by the policy) when the budget is short. With --rpc,
        across the workers' devices, a local GPU and the CPU. The header is read
        once, by ``runtime.plan``; the memory panel's shape comes from it."""

        hw = self.hardware
        if self.rpc and self._lost_text:
            # llama.cpp keeps the lost connection (its dispatcher, held) for this endpoint in this
            # process, and would queue the new load's calls to it: the load would never end
            raise InputError("llama.cpp still holds the connection to the worker that stopped: "
                             "quit (Ctrl+Q) and start localllm tui --rpc again")
        # llama.cpp's dry run referees the compute figure where the replay does not cover the model;
        # does not fit (the model, or its projector beside it): one line, before the model loaded now is closed
        request = runtime.LoadRequest(model=path, options=s.load_options(), hardware=hw, rpc=tuple(self.rpc or ()),
                                      lora=tuple(s.adapter_specs()), projector=projector, projector_optional=True)
        planned = runtime.plan(request).check()
        fit = planned.fit
        shape = planner.ModelShape.from_header(planned.header)
        note = "" if fit.outcome is fitting.Outcome.FITS_AS_ASKED else f"auto-fit: {fit.sentence}"
        if self.rpc:
            pl = planned.placement
            return planned, note, Footprint(shape, pl.plan, "RAM", hw.ram_available_bytes, pl)
        if hw.gpu_budget is not None:
            label = {"--vram": "GPU budget (--vram)", "nvml": f"GPU {hw.gpu_name}", "apple-unified": "unified memory"}.get(hw.gpu_source, "GPU")
            fp = Footprint(shape, planned.lp.plan, label, hw.gpu_budget)
        else:
            fp = Footprint(shape, planned.lp.plan, "RAM", hw.ram_available_bytes)
        fp.max_ctx_by_kv_type, fp.trained_ctx = fit.max_ctx_by_kv_type, fit.trained_ctx
        return planned, note, fp

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
        """Load the requested model through the load path. The previous one is
        closed first (two models at once may not fit); if the new one fails, the
        previous one is loaded again as it was (``runtime.reload_or_restore``),
        so a bad file or an absurd setting costs nothing."""
        notes: list[str] = []
        try:
            ensure_built_in(req.path)  # gemma3-270m chosen on F2 before its first use: assembled here, off the UI thread
            projector = self._projector_for(req, notes)
            planned, note, fp = self._choose_config(req.path, req.settings, projector)
        except Exception as exc:  # noqa: BLE001 - a bad file must not end the app
            return ModelLoaded(req, error=reason(exc), kept=req.previous is not None)
        previous = None
        if req.previous is not None:
            old, old_path, old_cfg = req.previous
            old_projector = getattr(getattr(old, "projector", None), "path", None)  # loaded again with the old model, if it comes back
            # --lora is given on the command line only: the previous model had the same adapters
            previous = runtime.Previous(old, old_path, old_cfg, projector=old_projector, lora=tuple(req.settings.adapter_specs()))
        switched = runtime.reload_or_restore(previous, planned, self.backend_factory)
        if switched.loaded is None:
            assert switched.error is not None, "a switch that loaded nothing says why"
            error = reason(switched.error)
            if switched.restore_error is not None and previous is not None:
                error += f"; reloading {shown(previous.path)} failed too: {reason(switched.restore_error)}"
            if switched.projector_error is not None and previous is not None and previous.projector is not None:
                error += "; " + self._projector_note(previous.projector, None, switched.projector_error)
            return ModelLoaded(req, error=error, kept=switched.kept)
        loaded = switched.loaded
        backend, cfg = loaded.engine, loaded.config

        bandwidth = req.bandwidth
        if bandwidth is None:

            try:
                bandwidth = measured_ram_bandwidth(cfg.n_threads or physical_cores())  # once a process: a reload reads it again
            except Exception:  # noqa: BLE001 - the roofline line is then left out
                bandwidth = None
        gpu_bandwidth = req.gpu_bandwidth if req.bandwidth is not None else gpu_memory_bandwidth()
        info = loaded.projector
        if projector is not None:
            notes.append(self._projector_note(projector, info, loaded.projector_error))
        messages, images = req.messages, []
        if messages and any(MARKER in m["content"] for m in messages):  # the conversation's images, read again where not at hand
            have = req.images or {}
            messages, images, lost = restore_images(messages, req.image_refs or [], can_see=info is not None, have=have)
            notes += lost
        return ModelLoaded(req, backend=backend, config=cfg, note=note, footprint=fp, bandwidth=bandwidth, gpu_bandwidth=gpu_bandwidth,
                           memory_check=loaded.memory_check, projector=info, notes=notes, messages=messages, images=images)

    @staticmethod
    def _projector_for(req: LoadRequest, notes: list[str]) -> Path | None:
        """The projector to load with ``req.path`` (engine thread): --mmproj for the model
        it was given with, else one found beside the model (checked against it), unless
        --no-mmproj. One found that does not match is a note, and the model runs text only."""
        given, given_for, no_mmproj = req.mmproj
        if no_mmproj:
            return None
        if given is not None and given_for is not None and req.path == given_for:
            return given
        found, notice = projector_choice.choose(req.path, None)
        if notice:
            notes.append(notice)
        return found

    @staticmethod
    def _projector_note(path: Path, info: ProjectorInfo | None, error: Exception | None) -> str:
        """The log's line on the projector the load path loaded (or why not: the chat goes on text only)."""
        if isinstance(error, runtime.NoImages):  # the scripted fake takes no images
            return f"this engine takes no images: the projector {shown(path)} is not loaded"
        if info is None:
            return f"the projector {shown(path)} was not loaded: {reason(error) if error is not None else 'n/a'} · text only"
        size = f"{info.image_size} px" if info.image_size else "n/a"
        tokens = f"{info.tokens_per_image} tokens an image" if info.tokens_per_image is not None else "tokens by picture size"
        return f"vision: projector {shown(path)} ({printable(info.projector_type)}, images at {size}, {tokens}) · Ctrl+F attaches"

    @on(ModelLoaded)
    def _loaded(self, msg: ModelLoaded) -> None:
        if self._gone():
            return
        try:
            self._apply_load(msg)
        finally:
            self._settle_heap()  # whatever came of it: reload_model unfroze the heap

    def _settle_heap(self) -> None:
        """After a load, take every object alive (Textual's widgets, the model's
        vocabulary and chat template, ...) out of the garbage collector's
        generations (``gc.freeze``), after one collection so that no garbage is
        kept. Measured while a reply streamed: a full collection took 75 ms on the
        UI thread, holding the GIL while the engine thread waited to sample the
        next token; with these objects frozen, collections only walk what the
        reply allocates. ``reload_model`` unfreezes them first."""
        gc.collect()
        gc.freeze()
        self._froze_heap = True

    def _thaw_heap(self) -> None:
        """Undo ``_settle_heap``, if it ran: ``gc.unfreeze`` is the whole process's, and
        a heap this app never froze (a program embedding it froze its own) stays as it is."""
        if self._froze_heap:
            gc.unfreeze()
            self._froze_heap = False

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
        self.forecaster = Forecaster()  # another model, or other settings: other rates
        self._wrap = []
        self.count = None
        self.projector_info = msg.projector
        if hasattr(self.backend, "prefill_progress"):  # an engine that says how far a prompt's read has got
            self.backend.prefill_progress = self._prefill_progress  # type: ignore[union-attr]
        if req.redraw:
            view.clear_messages()
            names = iter([im.name for im in msg.images])  # the markers left are the images had again, in order
            for m in msg.messages or []:
                if m["role"] == "user":
                    n = m["content"].count(MARKER)
                    view.add("user", shown_saved(m["content"], bool(m.get("data")), [next(names, "image") for _ in range(n)]))
                elif m["role"] == "assistant":
                    view.add(m["role"], m["content"])
                elif m["role"] == "tool":  # a saved session's tool result, folded as it was shown
                    view.add("tool", f"↳ {printable(m.get('name', 'tool'))} result\n{m['content']}",
                             folded=f"↳ {printable(m.get('name', 'tool'))} result · {len(m['content'].encode())} bytes  [Enter/click: whole]")
            self.saved = req.saved
        try:
            self.chat = self._new_chat(msg.messages)
        except Exception as exc:  # noqa: BLE001
            self.chat = None
            view.add("note", f"{shown(req.path)} loaded, but the chat could not start: {reason(exc)}")
            return
        self.chat.images = list(msg.images)
        if req.saved is not None and req.saved.kv is not None and self.chat.images:
            self._engine.submit(self._resume_kv, self.chat, req.saved)
        for im in msg.images:  # where each came from, for the next save
            ref = next((r for r in req.image_refs or [] if r.get("sha256") == im.sha256), None)
            if ref is not None and ref.get("path"):
                self._image_refs[im.sha256] = dict(ref)
        c = msg.config
        assert c is not None
        mode = " · completion mode: no chat template, so your text is continued" if self.chat.completion else ""
        view.add("note", f"{shown(req.path)} · context {c.n_ctx} · KV {c.type_k}/{c.type_v}" + (f" · {msg.note}" if msg.note else "") + mode)
        for line in msg.notes:
            view.add("note", printable(line))
        self._prompt.placeholder = PLACEHOLDER.replace("Message", "Text to continue") if self.chat.completion else PLACEHOLDER
        self._show_plan()
        self._chips_after_load()

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
        chips = list(self.chips)
        if not text and not chips:
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
        if any(c.file is not None and c.tokens is None for c in chips):
            self.notify("not sent: a file is still being read or counted; Enter again in a moment", severity="warning")
            return
        if chips and self.hub is not None and not self.chat.completion:  # the tool loop sends text turns
            if any(c.image is not None for c in chips):
                view.add("note", "not sent: images do not go with tools yet (✕ removes the image, or start without --tools)")
                return
            if any(c.special for c in chips):
                view.add("note", "not sent: a file holds the text of the model's control tokens: with tools it cannot be kept as data")
                return
        if self._editing:
            self._take_back_for_edit()
        message = attach_message(text, chips)
        images = [c.image for c in chips if c.image is not None]
        count = self._count_now(message, chips) if chips or self.count is None or self.count.key != self._count_key() else self.count
        if count is not None and count.line:  # the message does not fit: said, and a reload offered; the box and chips stay
            view.add("note", count.line)
            if count.fix is not None:
                self._offer_reload(count.line, *count.fix)
            return
        event.box.take()
        self._set_chips([])
        view.add("user", shown_message(text, chips) if chips else text)
        self._last_sent = (text, chips, message["content"]) if chips else None
        self._start_reply(message, images, count)

    def _start_reply(self, message: dict[str, str], images: list[RGBImage] | None = None, count: Count | None = None) -> None:
        """Stream the reply to ``message`` (the user's message is on the log) with
        ``images``; ``count``: its tokens, counted before (else now), for the forecast."""
        assert self.chat is not None
        if count is None:
            count = self._count_now(message, [], images=len(images or []))
        self._sent_forecast = self.forecaster.predict(count.new_tokens, prefix=self.chat.context_used, images=count.images) \
            if count is not None else None
        self._sent_images = len(images or [])
        self._sent_count = count
        self._reply = self._view.add("assistant", "")
        self._persist(extra_user=message, images=images or [])
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
        self._reply_start_ns = submitted
        self._reply_prefix = self.chat.context_used
        self._progress_ns = 0
        self._generate(self.chat, message, images or [], submitted)

    @work(thread=True, exclusive=True, group="reply", exit_on_error=False)
    def _generate(self, chat: ChatSession, message: dict[str, str], images: list[RGBImage], submitted_ns: int) -> None:
        if self.hub is not None and not chat.completion:  # the tool loop: text turns (_submit refused images)
            self._wait_engine(self._engine.submit(self._generate_tools_on_engine_thread, chat, message["content"], submitted_ns))
        else:
            self._wait_engine(self._engine.submit(self._generate_on_engine_thread, chat, message, submitted_ns, images))

    def _generate_on_engine_thread(self, chat: ChatSession, message: dict[str, str], submitted_ns: int,
                                   images: list[RGBImage] | None = None) -> None:
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
            reply = chat.send_messages([message], start_ns=start, images=images or None)
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

    def _after_reply(self, s: GenerationStats | None) -> None:
        """The reply's TTFT in its three phases (image encode, prefill, the first
        token), measured against its forecast; its prefill (and encode) join the
        forecaster's measurements."""
        if s is None or s.ttft_ms is None:
            self._forecast.say("")
            self._said_after = False
            self._schedule_count()
            return
        encode = s.encode_ms if s.images else None
        self._latency.split = (encode, s.images_per_s if s.images else None, s.prefill_ms,
                               max(s.ttft_ms - (encode or 0.0) - s.prefill_ms, 0.0))
        f = self._sent_forecast
        self.forecaster.observe_stats(s)
        sent = self._sent_count
        if sent is not None and sent.text_tokens >= 0 and not s.images and not s.context_shifts and s.prompt_tokens >= sent.text_tokens:
            self._wrap = [*self._wrap[-7:], s.prompt_tokens - sent.text_tokens]  # the template's turn markers, as chat learns them
        if f is None:
            said = "forecast n/a"
        elif f.ttft_ms is None:
            said = "forecast n/a (all in the cache)" if f.new_tokens == 0 else f"forecast n/a ({f.source})"
        else:
            said = f"forecast {_dur(f.ttft_ms)}"
        self._forecast.say(f"{said}, measured {_dur(s.ttft_ms)}")
        self._said_after = True
        if self._prompt.text.strip() or self.chips:  # typed meanwhile: its forecast, with this reply measured
            self._schedule_count()

    # -- the next message: attachments, its count and forecast, a long prefill's progress ------------------------
    def _prefill_progress(self, done: int, total: int) -> None:
        """On the engine thread (``prefill_progress``): a long prompt's read, at most ten times a second."""
        now = time.perf_counter_ns()
        if 0 < done < total and now - self._progress_ns < PROGRESS_NS:
            return
        self._progress_ns = now
        self.post_message(PrefillProgress(done, total, now))

    @on(PrefillProgress)
    def _prefill_progressed(self, msg: PrefillProgress) -> None:
        """Tokens read of the prompt and the time left (the forecaster's shape, scaled
        by how this read is going): shown for a prompt of more than one batch, or with images."""
        if self._gone() or self._reply is None or self._latency.ttft_ms is not None:
            return
        n_batch = self.load_config.n_batch if self.load_config is not None else 512
        if msg.total <= n_batch and not self._sent_images:
            return
        p = self.forecaster.progress(msg.done, msg.total, (msg.t_ns - self._reply_start_ns) / 1e6, prefix=self._reply_prefix)
        self._said_after = False
        self._forecast.say(p.line() + (" (the images are encoded first)" if self._sent_images and not msg.done else ""))

    def _count_key(self) -> tuple:
        """What the box's message depends on: its text, the chips, the chat's state."""
        chat = self.chat
        return (self._prompt.text.strip(), tuple((c.id, c.tokens) for c in self.chips), id(chat),
                len(chat.messages) if chat is not None else 0, chat.context_used if chat is not None else 0, id(self.backend))

    def _count_args(self, message: dict[str, str], chips: list[Pending], images: int | None = None) -> tuple:
        assert self.chat is not None and self.load_config is not None
        fp = self.footprint
        n_ctx = self.chat.n_ctx or self.load_config.n_ctx
        return (self.chat, self._count_key(), message, chips,
                dict(tokens_per_image=self.projector_info.tokens_per_image if self.projector_info is not None else None,
                     reply=reply_room(self.settings.max_tokens, n_ctx), images=images,
                     wrap=sorted(self._wrap)[len(self._wrap) // 2] if self._wrap else 0,
                     max_ctx_by_kv_type=fp.max_ctx_by_kv_type if fp is not None else None,
                     trained_ctx=fp.trained_ctx if fp is not None else None))

    @staticmethod
    def _count_on_engine_thread(chat: ChatSession, key: tuple, message: dict[str, str], chips: list[Pending],
                                kw: dict[str, Any]) -> Count | None:
        try:
            return count_prompt(chat, key, message, chips, **kw)
        except Exception:  # noqa: BLE001 - a template that cannot render it, a model closed meanwhile: the forecast is n/a
            return None

    def _schedule_count(self) -> None:
        """Count the box's message once typing pauses (``COUNT_DELAY_S``)."""
        if self._count_timer is not None:
            self._count_timer.stop()
        self._count_timer = self.set_timer(COUNT_DELAY_S, self._recount)

    def _recount(self) -> None:
        self._count_timer = None
        if self.busy or self.chat is None or self.load_config is None:
            return  # counted again when the reply (or the load) ends
        text = self._prompt.text.strip()
        if not text and not self.chips:
            self.count = None
            if not self._said_after:  # the last reply's forecast against measured stays until something is typed
                self._forecast.say("")
            return
        self._count_worker(self._count_args(attach_message(text, self.chips), list(self.chips)))

    @work(thread=True, exclusive=True, group="count", exit_on_error=False)
    def _count_worker(self, args: tuple) -> None:
        counted = self._wait_engine(self._engine.submit(self._count_on_engine_thread, *args))
        self.post_message(Counted(counted, args[1]))

    def _count_now(self, message: dict[str, str], chips: list[Pending], images: int | None = None) -> Count | None:
        """The message counted now, on the engine thread (idle: no reply streams), waited for (a few ms)."""
        if self.chat is None or self.load_config is None:
            return None
        fut = self._engine.submit(self._count_on_engine_thread, *self._count_args(message, chips, images))
        wait([fut, self._lost], timeout=60, return_when=FIRST_COMPLETED)
        return fut.result() if fut.done() else None

    @on(Counted)
    def _counted(self, msg: Counted) -> None:
        if self._gone() or self.busy or msg.key != self._count_key():
            return  # the box, the chips or the chat changed meanwhile: counted again
        self.count = msg.count
        self._said_after = False
        c = msg.count
        if c is None:
            self._forecast.say("≈ n/a new tokens: the prompt could not be counted")
        elif c.line:
            self._forecast.say(c.line + (" · Enter offers to reload" if c.fix else ""), warn=True)
        else:
            f = self.forecaster.predict(c.new_tokens, prefix=self.chat.context_used if self.chat else 0, images=c.images)
            self._forecast.say(f.line() + ("" if c.image_tokens_known else " (images' tokens: by picture size, not counted)"))

    @on(PromptBox.Changed, "#prompt")
    def _prompt_changed(self) -> None:
        self._schedule_count()

    def _set_chips(self, chips: list[Pending]) -> None:
        self.chips = chips
        self._chips.show(chips)
        self._schedule_count()

    def _chips_after_load(self) -> None:
        """Another model (or the same one reloaded): pictures need its projector, files its tokenizer."""
        if not self.chips:
            self._schedule_count()
            return
        kept: list[Pending] = []
        for c in self.chips:
            if c.image is not None and self.projector_info is None:
                self._view.add("note", f"{printable(c.name)} is no longer attached: this model has no projector")
                continue
            if c.image is not None:
                c.tokens = self.projector_info.tokens_per_image if self.projector_info is not None else None
            elif c.file is not None:
                c.tokens = None
                self._count_chip(c)
            kept.append(c)
        self._set_chips(kept)

    def action_attach(self) -> None:
        """Ctrl+F: a path, asked for; attached as a pasted path is."""
        if self.chat is None:
            self._view.add("note", "no model is loaded: F2 picks one")
            return

        def chosen(paths: list[str] | None) -> None:
            if paths:
                self._attach_paths([Path(p) for p in paths])

        self.push_screen(AttachScreen(self.projector_info is not None), chosen)

    @on(PromptBox.Dropped, "#prompt")
    def _dropped(self, event: PromptBox.Dropped) -> None:
        self._attach_paths(event.paths)

    @on(PromptBox.RemoveLast)
    def _remove_last(self) -> None:
        if self.chips:
            self._set_chips(self.chips[:-1])

    @on(AttachBar.Remove)
    def _remove_chip(self, event: AttachBar.Remove) -> None:
        self._set_chips([c for c in self.chips if c.id != event.chip_id])
        self._prompt.focus()

    def _attach_paths(self, paths: list[Path]) -> None:
        if self.chat is None:
            self._view.add("note", "no model is loaded: F2 picks one")
            return
        tpi = self.projector_info.tokens_per_image if self.projector_info is not None else None
        self._read_attachments(paths, self.projector_info is not None, tpi)

    @work(thread=True, group="attach", exit_on_error=False)
    def _read_attachments(self, paths: list[Path], vision: bool, tokens_per_image: int | None) -> None:
        """Read ``paths`` in order off the UI thread (Pillow, pypdf), then count each file's tokens on the engine thread."""
        for path in paths:
            try:
                if not vision and is_image(path):
                    raise InputError(f"{path.name} is a picture, and this model has no projector: start localllm tui with --mmproj FILE "
                                     f"(none was found beside {self.model_path.name})")
                pending = read_attachment(path, tokens_per_image=tokens_per_image)
            except Exception as exc:  # noqa: BLE001 - a bad file is one line; the chat goes on
                self.post_message(AttachRead(None, reason(exc)))
                continue
            self.post_message(AttachRead(pending))
            if pending.file is not None:
                self._count_on_engine(pending)

    def _count_on_engine(self, pending: Pending) -> None:
        """A file's block counted by the model's tokenizer (engine thread), then the chip updated (worker thread)."""
        def run() -> Pending | None:
            try:
                return count_file(self.backend, pending) if self.backend is not None else None
            except Exception:  # noqa: BLE001 - the model closed meanwhile: counted again after the load
                return None

        if self._wait_engine(self._engine.submit(run)) is not None:
            self.post_message(AttachRead(pending))

    @work(thread=True, group="attach", exit_on_error=False)
    def _count_chip(self, pending: Pending) -> None:
        self._count_on_engine(pending)

    @on(AttachRead)
    def _attach_read(self, msg: AttachRead) -> None:
        if self._gone():
            return
        if msg.pending is None:
            self._view.add("note", f"not attached: {msg.error or 'unreadable'}")
            return
        p = msg.pending
        if p.image is not None:
            self._image_refs[p.image.sha256] = p.ref()
        known = any(c.id == p.id for c in self.chips)
        if not known and p.file is not None:
            for note in p.file.notes:
                self._view.add("note", f"{printable(p.name)}: {printable(note)}")
        self._set_chips([p if c.id == p.id else c for c in self.chips] if known else [*self.chips, p])

    def _offer_reload(self, line: str, n_ctx: int, kv: str) -> None:
        """The message does not fit: reload with a context and KV cache type that hold it (asked first)."""

        def answered(yes: bool | None) -> None:
            if yes and not self.busy:
                new = dataclasses.replace(self.settings, n_ctx=n_ctx, type_k=kv, type_v=kv)
                self._view.add("note", f"reloading with a context of {n_ctx:,} and the KV cache in {kv}")
                self.reload_model(settings=new, messages=self.chat.messages if self.chat else None, saved=self.saved)

        self.push_screen(ReloadConfirm(line, n_ctx, kv), answered)

    def _refs(self, images: list[RGBImage]) -> list[dict[str, Any]]:
        """The images as a saved session keeps them: path and pixels' sha256 (a name only, where it is not known)."""
        return [dict(self._image_refs.get(im.sha256) or {"name": im.name}) for im in images]

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
        self._after_reply(s)
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
        self._thaw_heap()  # what this app froze (_settle_heap) can be collected again
        self._stop_reply()
        if self.rpc:
            # lazy: loads llama.cpp (~169 ms here), which app does not load at import
            from localllm.engine import rpc

            rpc.drop_keep_alive(self._abort_hook)
        try:
            if self.backend is not None:
                self._engine.submit(self._keep_kv, self.chat, self.saved).result()
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
        yield SystemCommand("Attach a file", "A picture, a text file or a PDF for the next message (Ctrl+F)", self.action_attach)

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
        self._engine.submit(self._keep_kv, self.chat, self.saved).result()  # before the cache is emptied
        self.chat.clear()
        self.saved = None
        view = self.query_one(ChatView)
        view.clear_messages()
        view.add("note", "new chat")
        self._reset_latency()  # its figures were the old chat's last reply
        self._update_footprint()
        self._said_after = False
        self._schedule_count()  # the box's message, forecast on an empty cache

    def _reset_latency(self) -> None:
        latency = self._latency
        latency.ttft_ms = latency.answer_ms = None
        latency.gaps_ms = []
        latency.prefill_tps = latency.decode_tps = latency.ceiling_tps = None
        latency.verdict = ("", "")
        latency.split = None
        latency.threads = self._threads_text()

    # -- sessions ----------------------------------------------------------------
    def _persist(self, extra_user: dict[str, str] | None = None, images: list[RGBImage] | None = None) -> None:
        """Save the chat atomically: after the user's message (``extra_user``, with
        ``images``), and after each reply. Images are kept as their paths and the
        sha256 of their pixels (``sessions.image_refs``), never as pixels."""
        if self.chat is None:
            return
        if self.saved is None:
            self.saved = sessions.SavedSession.new(str(self.model_path), self.settings.system_prompt, self.settings.to_dict())
        msgs = list(self.chat.messages)
        pictures = list(self.chat.images)
        if extra_user is not None:
            content = with_images(extra_user["content"], len(images or [])) if images or pictures else extra_user["content"]
            msgs.append({**extra_user, "content": content})
            pictures += images or []
        self.saved.messages = msgs
        self.saved.images = self._refs(pictures)
        self.saved.kv = None  # the conversation moved on from a kept cache (its file is written over at the next leave)
        self.saved.settings = self.settings.to_dict()
        self._save(self.saved)

    def _save(self, saved: sessions.SavedSession) -> None:
        """Write a copy of the session on the disk thread: a save is two fsyncs,
        which a slow disk can hold for longer than a frame. One thread, so the
        saves land in the order they were made; a failed one (disk full, a
        read-only folder) is a line in the chat log, and the chat goes on."""
        snapshot = dataclasses.replace(saved, messages=list(saved.messages), settings=dict(saved.settings or {}), images=list(saved.images))
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

    def _keep_kv(self, chat: ChatSession | None, saved: sessions.SavedSession | None) -> None:
        """Engine thread: as the cockpit leaves a conversation with images, keep
        its KV cache beside its saved session (``chat.resume``), so reopening it
        encodes no image again. A failed write only loses that saving."""
        if chat is None or saved is None or not chat.images or self.backend is None:
            return
        try:
            mark = resume.keep(chat, sessions.state_path(saved.id))
        except (OSError, LocalLLMError):
            mark = None
        if mark is not None:
            saved.kv = mark
            self._save(saved)

    def _resume_kv(self, chat: ChatSession, saved: sessions.SavedSession) -> None:
        """Engine thread: a reopened conversation's kept KV cache, loaded when it stands for the conversation."""
        assert saved.kv is not None
        try:
            why = resume.resume(chat, sessions.state_path(saved.id), saved.kv)
        except (OSError, LocalLLMError) as exc:
            why = reason(exc)
        self.post_message(Resumed(why, len(chat.images)))

    @on(Resumed)
    def _resumed(self, msg: Resumed) -> None:
        if self._gone():
            return
        if msg.text is None:
            self._view.add("note", f"the conversation's KV cache was kept: its {msg.images} image(s) are not encoded again")
        else:
            self._view.add("note", f"the kept KV cache is not used ({msg.text}): the next message reads the conversation again")
        self._update_footprint()
        self._schedule_count()

    def open_session(self, saved: sessions.SavedSession) -> None:
        """Load the session's model with its settings and show its messages (once
        the model is loaded: a session whose model is gone changes nothing)."""
        # An unanswered last message (the app died mid-reply) is dropped: the reply in flight is what is lost.
        msgs = list(saved.messages)
        if msgs and msgs[-1]["role"] == "user":
            msgs.pop()
        settings = Settings.from_dict(saved.settings) if saved.settings else self.settings
        self._engine.submit(self._keep_kv, self.chat, self.saved)  # the conversation left behind, as at quit
        self.reload_model(Path(saved.model), settings, messages=msgs, saved=saved, redraw=True, image_refs=list(saved.images))

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

    path = resolver.resolve(model)
    header = read_header(path)  # a bad file is a one-line error before the screen opens
    projector, notice = projector_choice.choose(path, mmproj, no_mmproj=no_mmproj, header=header)
    if rpc:

        probe_all(list(rpc))
    if backend_factory is None:
        # lazy: loads llama.cpp (~155 ms here), which app does not load at import
        from localllm.engine import LlamaCppBackend

        backend_factory = LlamaCppBackend
    app = LocalLLMApp(model_path=path, backend_factory=backend_factory, hardware=hardware.detect(vram), settings=settings or Settings())
    app.bandwidth = bandwidth
    app.hub, app.tools_config = hub, tools_config
    app.mmproj, app.mmproj_model, app.no_mmproj, app.mmproj_notice = projector, path, no_mmproj, notice
    if rpc:
        app.rpc = list(rpc)
        # a worker that dies mid-reply: llama.cpp aborts; the cockpit says so and stays up
        # lazy: loads llama.cpp (~169 ms here), which app does not load at import
        from localllm.engine.rpc import keep_alive_on_abort

        keep_alive_on_abort(app._abort_hook)
    return app

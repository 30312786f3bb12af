"""Tools (MCP servers) in the cockpit: the model's calls shown, approved and run.

``localllm tui --tools NAME,...|all`` starts the config file's servers
(``[mcp.servers.NAME]``) before the screen opens; the chat then runs through
``localllm.mcp``'s ``ToolChat`` (the loop ``chat --tools`` uses). The loop runs
on the engine thread, as a reply does. A call asks the UI thread for approval
with a message (``ToolAsked``) carrying a future: the approval screen answers
it, and the engine thread waits on the future, never the event loop. Its
answers are "allow once", "always allow this tool" (for the session, and in
the config file's ``allow`` list) and "deny", which the model is told.

A call is a block in the chat: the tool, its server, its arguments as pretty
JSON; its result a block folded to one line with its size, unfolded by a click
or Enter on the log. Esc while a tool runs cancels it (the SDK sends the
server ``notifications/cancelled`` and stops waiting at once: a tool that
ignores the cancellation is cut off); the model is told the call was
cancelled and goes on. A second Esc stops the reply.

A mixin of ``LocalLLMApp``, as ``controls.py`` is: the session (``localllm.cockpit``)
holds the engine thread, which runs the loop here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App
from textual.message import Message

from localllm.cockpit.events import ReplyEnded
from localllm.cockpit.replies import Batcher
from localllm.cockpit.wording import printable, reason
from localllm.errors import LocalLLMError
from localllm.mcp.agent import CallDone, CallRun, Decision, Event, Notice, StepDone, TextOut, ToolCall, ToolChat
from localllm.mcp.config import load_settings
from localllm.mcp.hub import Hub, start_configured
from localllm.tui.chatview import ChatView, MessageView
from localllm.tui.settings_screen import Switch
from localllm.tui.tool_blocks import ApproveScreen, call_text, result_lines
from localllm.tui.widgets import MemoryPanel

if TYPE_CHECKING:
    from localllm.chat.session import ChatSession
    from localllm.cockpit.session import CockpitSession

BETTER = ("qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "mistral-7b-instruct-v0.3")  # the catalog's models that call tools well


def start_hub(spec: str, say: Callable[[str], None]) -> tuple[Hub, Path | None]:
    """The servers ``--tools NAME,...`` (or ``all``) names, started as ``chat --tools``
    starts them, and the config file they came from."""
    return start_configured(spec, say)


class ToolAsked(Message):
    """The engine thread asks: may ``call`` run? The answer goes in ``answer``."""

    def __init__(self, call: ToolCall, answer: Future[Decision]) -> None:
        super().__init__()
        self.call, self.answer = call, answer


class ToolFigures(Message):
    """The tools offered to the current chat, and the context tokens their
    descriptions take (None where they could not be measured)."""

    def __init__(self, offered: int, servers: list[str], tokens: int | None) -> None:
        super().__init__()
        self.offered, self.servers, self.tokens = offered, servers, tokens


def description_tokens(chat: ChatSession) -> int | None:
    """The tokens the offered tools add to the prompt: the chat's template
    rendered for a one-word message with them (as the tool loop renders it:
    ``prepare``, ``tools``) and without, each tokenized by the model (measured
    by its tokenizer, not estimated). None where the model cannot render it."""
    backend = chat.backend
    probe: list[dict[str, str]] = [*chat.messages[:1], {"role": "user", "content": "hi"}] if chat.messages[:1] and \
        chat.messages[0]["role"] == "system" else [{"role": "user", "content": "hi"}]
    try:
        shown = chat.prepare(probe) if chat.prepare is not None else probe
        with_tools = backend.render_chat(shown, tools=chat.tools) if chat.tools else backend.render_chat(shown)
        without = backend.render_chat(probe)
        count = len(backend.tokenize(with_tools, add_special=False, parse_special=True))
        return count - len(backend.tokenize(without, add_special=False, parse_special=True))
    except Exception:  # noqa: BLE001 - a template that cannot render this: the figure is n/a
        return None


class ToolConfig(Message):
    """The MCP servers the config file names, and the file."""

    def __init__(self, names: tuple[str, ...], source: Path | None) -> None:
        super().__init__()
        self.names, self.source = names, source


class ToolsStarted(Message):
    """Servers switched on in the settings started (``lines``: those that failed)."""

    def __init__(self, hub: Hub, lines: list[str], source: Path | None) -> None:
        super().__init__()
        self.hub, self.lines, self.source = hub, lines, source


class ToolStep(Message):
    """An event of the tool loop for the log: a call run, its result, a notice."""

    def __init__(self, event: CallRun | CallDone | Notice) -> None:
        super().__init__()
        self.event = event


class ToolControls(App):
    """The cockpit's side of the tool loop (a mixin of ``LocalLLMApp``)."""

    hub: Hub | None = None  # the MCP servers started for this cockpit (None: no tools)
    tools_config: Path | None = None  # where "always allow" is kept (None: this session only)
    max_tool_steps: int = 10
    tool_choice: Any = "auto"  # OpenAI's tool_choice: "auto" (the model calls when it wants to); a test forces a call
    tool_chat: ToolChat | None = None  # the loop over the current chat (made on the engine thread)
    tools_off: frozenset[str] = frozenset()  # "server/tool" switched off on the settings screen (F3)
    _tools_always: set[str] | None = None  # "always allow" of this session, kept over a new loop
    _tool_steps = 0  # calls in the reply in flight
    _cancelled: object = None  # the call Esc cancelled (a second Esc stops the reply)
    _configured: tuple[str, ...] = ()  # the config file's servers (read at mount)
    _own_hub: Hub | None = None  # a hub the cockpit started (the settings' switches), closed at its end

    if TYPE_CHECKING:  # what the mixin uses of the app
        core: CockpitSession
        _view: ChatView
        _reply: MessageView | None
        _stop: threading.Event
        chat: ChatSession | None

    # -- the engine thread -------------------------------------------------------------
    def _tool_chat_for(self, chat: ChatSession) -> ToolChat:
        """The loop over ``chat`` (made at its first message: the tool texts are
        checked against the model's tokens, a llama.cpp call, on this thread)."""
        tc = self.tool_chat
        if tc is None or tc.session is not chat:
            assert self.hub is not None
            tc = ToolChat(chat, self.hub, approve=self._approve, max_steps=self.max_tool_steps, choice=self.tool_choice,
                          allowed=self._tools_always or (), off=self.tools_off)
            self.tool_chat, self._tools_always = tc, tc.always
            for line in tc.notices:
                self.post_message(ToolStep(Notice(line)))
            servers = sorted({t.server for t in tc.tools})
            generic = " (the template has no tool-call format of its own: the generic JSON one)" if tc.fmt.name == "generic" else ""
            said = (f"tools: {len(tc.tools)} offered from {', '.join(servers)} · format {tc.fmt.name}{generic}"
                    if tc.tools else "no tools to offer: the chat goes on without them")
            self.post_message(ToolStep(Notice(f"{said} · small models call tools poorly; {', '.join(BETTER)} do better (F2)")))
            self.post_message(ToolFigures(len(tc.tools), servers, description_tokens(chat) if tc.tools else 0))
        return tc

    def _approve(self, call: ToolCall) -> Decision:
        """On the engine thread: ask the UI and wait for the answer (Esc or
        quitting meanwhile denies). "Always" is written to the config here, off
        the UI thread."""
        answer: Future[Decision] = Future()
        self.post_message(ToolAsked(call, answer))
        while True:
            try:
                decision = answer.result(timeout=0.1)
                break
            except FutureTimeout:
                if self._stop.is_set():
                    return Decision.DENY
        if decision is Decision.ALWAYS and self.tools_config is not None:
            from localllm.mcp.importer import allow_tool  # lazy: the config writer, only on "always"

            try:
                if allow_tool(self.tools_config, call.server, call.name):
                    self.post_message(ToolStep(Notice(f"{call.server}/{call.name} is always allowed: kept in {self.tools_config}")))
            except (OSError, LocalLLMError) as exc:
                self.post_message(ToolStep(Notice(f"always allowed for this session only: {reason(exc)}")))
        return decision

    def _generate_tools_on_engine_thread(self, chat: ChatSession, text: str, submitted_ns: int) -> None:
        """The reply to ``text`` with tools: its text in batches (as a plain
        reply's), the loop's events as messages, and the last step's stats."""
        emit = self.core.emit
        batch = Batcher(submitted_ns, emit)
        stopped, error, stats = False, None, None
        events: Iterator[Event] | None = None
        try:
            events = self._tool_chat_for(chat).send(text, start_ns=submitted_ns)
            for ev in events:
                if isinstance(ev, TextOut):
                    batch.add(ev.text, time.perf_counter_ns())  # the loop yields text as the model writes it
                elif isinstance(ev, StepDone):
                    stats = ev.stats if ev.stats is not None else stats
                else:
                    batch.flush()
                    self.post_message(ToolStep(ev))
                if self._stop.is_set():
                    stopped = True
                    break
        except Exception as exc:  # noqa: BLE001 - shown in the chat log; the app goes on
            error = reason(exc)
        finally:
            close = getattr(events, "close", None)  # a generator: closing it ends the generation in flight now
            if close is not None:
                close()
        batch.flush()
        emit(ReplyEnded(stats if error is None else None, stopped, error))

    # -- the UI thread ------------------------------------------------------------------
    def _close_reply(self) -> None:
        """The reply streamed so far ends where a call begins (an empty one is taken off)."""
        reply = self._reply
        view = self._view
        if reply is None or reply not in view.messages:
            return
        if not reply.text.strip() and view.messages[-1] is reply:
            view.truncate(reply)
            reply.log = None
        else:
            view.finish(reply)

    def _show_call(self, call: ToolCall) -> None:
        self._close_reply()
        self._view.add("tool", call_text(call))
        self._tool_steps += 1

    def on_tool_asked(self, msg: ToolAsked) -> None:
        if not self._view.is_attached:
            msg.answer.set_result(Decision.DENY)
            return
        self._show_call(msg.call)
        call = msg.call

        def answered(decision: Decision | None) -> None:
            decision = decision or Decision.DENY
            always = f"{printable(call.name)} always allowed" + (" (this session)" if self.tools_config is None else "")
            said = {Decision.ONCE: "allowed once", Decision.ALWAYS: always,
                    Decision.DENY: "denied: the model is told"}[decision]
            self._view.add("note", said)
            if not msg.answer.done():
                msg.answer.set_result(decision)

        self.push_screen(ApproveScreen(call, self.tools_config), answered)

    def on_tool_step(self, msg: ToolStep) -> None:
        if not self._view.is_attached:
            return
        ev, view = msg.event, self._view
        if isinstance(ev, CallRun):
            if ev.decision is Decision.ALWAYS and (not view.messages or view.messages[-1].role == "assistant"):
                self._show_call(ev.call)  # allowed before: no question, the block shows here
                view.add("note", f"running: {printable(ev.call.name)} is always allowed")
        elif isinstance(ev, CallDone):
            line, whole = result_lines(ev.call, ev.decision, ev.result)
            view.add("tool", whole, folded=line)
            self._reply = view.add("assistant", "")  # the model goes on with the result
        elif isinstance(ev, Notice):
            self._close_reply()
            view.add("note", printable(ev.line))
            if self._reply is not None:  # the reply goes on under the line (an empty one is taken off at its end)
                self._reply = view.add("assistant", "")

    def on_tool_figures(self, msg: ToolFigures) -> None:
        if not self._view.is_attached:
            return
        tokens = "n/a" if msg.tokens is None else f"{msg.tokens} tokens"
        self.query_one(MemoryPanel).set_tools(f"tools {msg.offered} ({', '.join(printable(s) for s in msg.servers) or 'none'}) "
                                              f"· descriptions {tokens} of context")

    def tool_switches(self) -> list[Switch] | None:
        """The settings screen's Tools tab: a switch per tool of each running
        server, one per configured server not started, a line per one that
        failed; None when no server is configured or running (no tab)."""
        running = self.hub.servers if self.hub is not None else {}
        names = [*running, *(n for n in self._configured if n not in running)]
        if not names:
            return None
        rows: list[Switch] = []
        for name in names:
            state = running.get(name)
            if state is None:
                rows.append(Switch(name))
            elif not state.running:
                rows.append(Switch(name, note=state.error or "stopped"))
            else:
                rows += [Switch(name, t.name, f"{name}/{t.name}" not in self.tools_off) for t in state.tools]
        return rows

    @work(thread=True, group="tools-config", exit_on_error=False)
    def read_tool_config(self) -> None:
        """The config file's MCP servers, read off the UI thread (at mount), for the Tools tab."""
        try:
            settings = load_settings()
        except (OSError, LocalLLMError):
            return  # a bad config file: the commands that use it say why
        self.post_message(ToolConfig(tuple(settings.servers), settings.source))

    def on_tool_config(self, msg: ToolConfig) -> None:
        self._configured = msg.names

    def start_servers(self, names: frozenset[str]) -> None:
        """Start the configured servers ``names`` (switched on in the Tools tab),
        with those running, in a worker; their tools are offered once they run."""
        if not names:
            return
        self._view.add("note", f"starting MCP servers: {', '.join(printable(n) for n in sorted(names))} …")
        running = list(self.hub.servers) if self.hub is not None else []
        self._start_hub([*running, *sorted(n for n in names if n not in running)], self.hub)

    @work(thread=True, group="tools-start", exclusive=True, exit_on_error=False)
    def _start_hub(self, names: list[str], old: Hub | None) -> None:
        lines: list[str] = []
        try:
            settings = load_settings()
            hub = Hub.from_settings(settings, names)
        except (OSError, LocalLLMError) as exc:
            self.post_message(ToolStep(Notice(f"MCP servers not started: {reason(exc)}")))
            return
        lines += [f"MCP server {failed.error}" for failed in hub.start()]
        if old is not None:
            old.close()  # its servers run again in the new hub (closing twice is nothing: the CLI closes its own)
        self.post_message(ToolsStarted(hub, lines, settings.source))

    def on_tools_started(self, msg: ToolsStarted) -> None:
        self.hub = self._own_hub = msg.hub
        self.tools_config = self.tools_config or msg.source
        self.tool_chat = None  # made again, with the new servers' tools, at the next message
        if not self._view.is_attached:
            return
        for line in msg.lines:
            self._view.add("note", printable(line))
        tools = len(msg.hub.tools)
        self._view.add("note", f"tools: {tools} from {', '.join(printable(n) for n, s in msg.hub.servers.items() if s.running) or 'no server'}"
                               " · offered from the next message")

    def close_own_hub(self) -> None:
        """At the end: the servers the cockpit started itself (the CLI closes those of --tools)."""
        if self._own_hub is not None:
            self._own_hub.close()

    def set_tools_off(self, off: frozenset[str]) -> None:
        """The settings screen's switches: the next message offers the tools left on."""
        if off != self.tools_off:
            self.tools_off = off
            self.tool_chat = None  # made again, with these, at the next message
            self._view.add("note", f"tools: {len(off)} switched off" if off else "tools: all switched on")

    def _cancel_tool(self) -> bool:
        """Esc while a tool runs: cancel it (the model is told, the reply goes on)."""
        tc = self.tool_chat
        running = tc.running if tc is not None else None
        if tc is None or running is None or running is self._cancelled:
            return False  # no tool runs (or it is being cancelled): Esc stops the reply
        self._cancelled = running
        tc.cancel()
        self._view.add("note", "(tool call cancelled: the server is told; Esc again stops the reply)")
        return True

"""A chat whose model calls MCP tools: the loop ``chat --tools``, ``run
--tools`` and the cockpit share.

The model is offered the hub's tools through its chat template, in the
tool-call format the template speaks (``serve/tools.py``: the same detection,
grammar and parsing as ``serve``). When a reply is a call, ``approve`` decides
(allow once, always for this session, deny; or refuse, where nobody can be
asked); an allowed call runs on its server under the hub's bounds, and its
result goes back as a ``tool`` message: data, which the session tokenizes as
text (``chat/untrusted.py``), so a result cannot forge a turn. A denial is told
to the model as the result. After ``max_steps`` rounds of calls a reply that
calls again ends the turn, with a notice.

``ToolChat.send`` yields events, for a terminal or a UI to show: ``TextOut``
(reply text as it streams), ``CallRun`` (an approved call, before it runs),
``CallDone`` (its result, or its denial), ``Notice`` (one line) and
``StepDone`` (each generation's stats).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from localllm.chat import untrusted
from localllm.chat.session import ChatSession
from localllm.engine_api import GenerationStats
from localllm.mcp.hub import Hub, PendingCall
from localllm.mcp.tools import Tool, ToolResult, cut, offered
from localllm.serve import tools as formats

DEFAULT_MAX_STEPS = 10
MAX_STEP_BYTES = 512 * 1024  # all the results of one step together (each is bounded by the hub too)


class Decision(enum.Enum):
    ONCE = "once"  # run this call
    ALWAYS = "always"  # run it, and every later call of this tool in the session
    DENY = "deny"  # do not run it; the model is told
    REFUSE = "refuse"  # nobody can be asked (not interactive): not run, and the turn ends


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for."""

    id: str
    name: str
    server: str
    arguments: dict[str, Any]

    def pretty_arguments(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False, indent=2)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "server": self.server, "arguments": self.arguments}


@dataclass(frozen=True)
class TextOut:
    text: str


@dataclass(frozen=True)
class CallRun:
    call: ToolCall
    decision: Decision


@dataclass(frozen=True)
class CallDone:
    call: ToolCall
    decision: Decision
    result: ToolResult


@dataclass(frozen=True)
class Notice:
    line: str


@dataclass(frozen=True)
class StepDone:
    stats: GenerationStats | None
    calls: int  # calls the reply asked for


Event = TextOut | CallRun | CallDone | Notice | StepDone


class ToolChat:
    """``session``'s chat with ``hub``'s tools offered to its model."""

    def __init__(self, session: ChatSession, hub: Hub, *, approve: Callable[[ToolCall], Decision],
                 max_steps: int = DEFAULT_MAX_STEPS, choice: str = "auto", allowed: Iterable[str] = (),
                 off: Iterable[str] = ()) -> None:
        self.session, self.hub, self.approve, self.max_steps = session, hub, approve, max_steps
        self.fmt = formats.detect(session.backend.template_source)
        self.notices: list[str] = []  # one line per tool left out
        self.always: set[str] = set(allowed) | {f"{s.config.name}/{t}" for s in hub.servers.values() for t in s.config.allow}
        self.running: PendingCall | None = None  # the call in flight, for ``cancel``
        off = set(off)  # "server/tool": switched off by the user (the cockpit's settings), not offered
        self.tools = self._offer([t for t in hub.tools if f"{t.server}/{t.name}" not in off], choice)

    def cancel(self) -> None:
        """Stop the call in flight (from another thread: the cockpit's Esc): the
        server is told to cancel, and the model gets "the call was cancelled"."""
        running = self.running
        if running is not None:
            running.cancel()

    def _offer(self, listed: list[Tool], choice: str) -> list[Tool]:
        """The tools the model sees: the hub's (at most 128, one of each name),
        less those whose text holds the model's special tokens (they would reach
        the prompt as control tokens) or whose schema no grammar takes."""
        tools, lines = offered(listed)
        kept = []
        for t in tools:
            if untrusted.holds_special(self.session.backend, json.dumps(t.function(), ensure_ascii=False)):
                lines.append(f"{t.server}: tool {t.name} is left out: its description or schema holds the text of one of the "
                             "model's special tokens")
            else:
                kept.append(t)
        request = None
        while kept:
            try:
                request = formats.parse_request({"tools": [t.openai() for t in kept], "tool_choice": choice}, self.fmt)
                break
            except formats.ToolsError as exc:
                bad = _index(exc.field)
                if bad is None:
                    lines.append(f"no tools are offered: {exc}")
                    kept = []
                    break
                t = kept.pop(bad)
                lines.append(f"{t.server}: tool {t.name} is left out: {exc.why}")
        self.notices += lines
        self.request = request
        s = self.session
        if request is not None:
            s.tools = request.template_tools
            s.prepare = lambda messages: formats.for_template(messages, self.fmt, request)
            s.sampling = replace(s.sampling, grammar=request.grammar, grammar_triggers=request.triggers)
        return kept

    def send(self, text: str, start_ns: int | None = None) -> Iterator[Event]:
        """The reply to ``text``, calls and results included, as events."""
        new: list[dict[str, str]] = [{"role": "user", "content": text}]
        step = 0
        while True:
            calls = yield from self._generate(new, start_ns)
            start_ns = None
            if not calls:
                return
            if step >= self.max_steps:
                yield Notice(f"stopped: the model asked for more tool calls after {self.max_steps} steps (the step limit)")
                return
            step += 1
            new = []
            budget = MAX_STEP_BYTES
            for raw in calls:
                call = self._call(raw)
                done = yield from self._run(call)
                if done is None:
                    return
                text_out, _, _ = cut(done.text, max(budget, 1024))
                budget -= len(text_out.encode("utf-8", "replace"))
                new.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text_out})

    def _generate(self, new: list[dict[str, str]], start_ns: int | None) -> Generator[Event, None, list[dict[str, Any]]]:
        request = self.request
        splitter = formats.ReplySplitter(request) if request is not None else None
        with self.session.send_messages(new, start_ns=start_ns) as gen:
            for event in gen:
                out = splitter.feed(event.text) if splitter is not None else event.text
                if out:
                    yield TextOut(out)
        calls: list[dict[str, Any]] = []
        if splitter is not None:
            rest, calls = splitter.finish()
            if rest:
                yield TextOut(rest)
        yield StepDone(gen.stats, len(calls))
        return calls

    def _call(self, raw: dict[str, Any]) -> ToolCall:
        fn = raw["function"]
        tool = next((t for t in self.tools if t.name == fn["name"]), None)
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = {}
        return ToolCall(raw["id"], fn["name"], tool.server if tool else "?", args if isinstance(args, dict) else {})

    def _run(self, call: ToolCall) -> Generator[Event, None, ToolResult | None]:
        key = f"{call.server}/{call.name}"
        decision = Decision.ALWAYS if key in self.always else self.approve(call)
        if decision is Decision.REFUSE:
            yield Notice(f"not calling {call.server}/{call.name}: nobody can be asked (not interactive); --yes-tools allows tool calls")
            return None
        if decision is Decision.DENY:
            result = ToolResult(call.server, call.name, "The user denied this tool call.", is_error=True, failed=True)
        else:
            if decision is Decision.ALWAYS:
                self.always.add(key)
            yield CallRun(call, decision)
            self.running = self.hub.submit(call.name, call.arguments, server=call.server)
            try:
                result = self.running.result()
            except BaseException:  # Ctrl+C: the server is told, and it goes on up
                self.running.cancel()
                raise
            finally:
                self.running = None
        done = CallDone(call, decision, result)
        yield done
        return result

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]


def _index(field: str) -> int | None:
    """``tools[3].function...``'s 3."""
    if field.startswith("tools[") and "]" in field:
        try:
            return int(field[6:field.index("]")])
        except ValueError:
            return None
    return None

"""``--tools`` for ``chat`` and ``run``: the configured MCP servers started, the
calls approved on the terminal, the events of ``localllm.mcp``'s ``ToolChat``
printed.

An approval is asked on stderr and answered on stdin (a terminal): allow once,
always (this tool, for the rest of the session) or deny. ``--yes-tools`` allows
every call without asking; without it a run whose stdin is not a terminal
refuses each call with one line (nobody could answer).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from localllm.chat.session import ChatSession
from localllm.mcp.agent import CallDone, CallRun, Decision, Notice, TextOut, ToolCall, ToolChat
from localllm.mcp.hub import Hub, start_configured
from localllm.util import fmt
from localllm.util.fmt import safe

if TYPE_CHECKING:
    from localllm.flags import Tools

CHOICE = "auto"  # tool_choice: the model calls when it wants to (a test sets "required": a grammar-forced call)


def say(line: str) -> None:
    print(f"localllm: {safe(line)}", file=sys.stderr, flush=True)


def start_hub(spec: str) -> Hub:
    """The servers ``--tools NAME,...`` (or ``all``) names, started; a line for each that fails."""
    return start_configured(spec, say)[0]


def approver(tools: Tools) -> Callable[[ToolCall], Decision]:
    """``--yes-tools``: allow; a terminal: ask; else refuse."""
    if tools.yes_tools:
        return lambda call: Decision.ONCE
    if sys.stdin is None or not sys.stdin.isatty():
        return lambda call: Decision.REFUSE
    return ask


_ANSWERS = {"o": Decision.ONCE, "once": Decision.ONCE, "y": Decision.ONCE, "yes": Decision.ONCE, "a": Decision.ALWAYS,
            "always": Decision.ALWAYS, "d": Decision.DENY, "deny": Decision.DENY, "n": Decision.DENY, "no": Decision.DENY}


def ask(call: ToolCall) -> Decision:
    """The call shown (server, tool, arguments), and the choice read from stdin."""
    print(f"\n[tool call] {safe(call.server)}/{safe(call.name)}", file=sys.stderr)
    for line in call.pretty_arguments().splitlines()[:40]:
        print(f"  {safe(line)}", file=sys.stderr)
    while True:
        print("allow it? [o]nce, [a]lways for this session, [d]eny: ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline()
        if not answer:  # end of input: nobody to say yes
            return Decision.DENY
        decision = _ANSWERS.get(answer.strip().lower())
        if decision is not None:
            return decision


def tool_chat(session: ChatSession, hub: Hub, tools: Tools) -> ToolChat:
    chat = ToolChat(session, hub, approve=approver(tools), max_steps=tools.max_tool_steps, choice=CHOICE)
    for line in chat.notices:
        say(line)
    if not chat.tools:
        say("no tools to offer: the chat goes on without them")
    return chat


def turn(chat: ToolChat, text: str, *, start_ns: int | None, quiet: bool) -> tuple[str, list[dict[str, Any]]]:
    """One user turn, calls included, printed as it goes (unless ``quiet``, for
    --json): (the reply's text, the calls with their results)."""
    pieces: list[str] = []
    calls: list[dict[str, Any]] = []
    for event in chat.send(text, start_ns=start_ns):
        if isinstance(event, TextOut):
            pieces.append(event.text)
            if not quiet:
                sys.stdout.write(event.text)
                sys.stdout.flush()
        elif isinstance(event, CallRun):
            if not quiet:
                print(f"\n[running {safe(event.call.server)}/{safe(event.call.name)}]", file=sys.stderr, flush=True)
        elif isinstance(event, CallDone):
            r = event.result
            calls.append({**event.call.to_dict(), "decision": event.decision.value, "result": r.to_dict()})
            if not quiet:
                status = "denied" if event.decision is Decision.DENY else "failed" if r.failed else "error" if r.is_error else "ok"
                first = r.text.strip().splitlines()[0] if r.text.strip() else ""
                print(f"[{safe(event.call.name)}: {status}, {fmt.size(r.size)}{', cut' if r.truncated else ''}, "
                      f"{r.elapsed_ms:.0f} ms] {safe(first[:120])}", file=sys.stderr, flush=True)
        elif isinstance(event, Notice):
            say(event.line)
    return "".join(pieces), calls


def dump(calls: list[dict[str, Any]]) -> str:
    return json.dumps(calls, ensure_ascii=False)

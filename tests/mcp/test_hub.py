"""The MCP client against real servers: tools listed, calls made, and every
bound of issue 48's item 6 held (a server that crashes, hangs, floods or
speaks invalid JSON-RPC fails that call with one line; the others go on)."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from localllm.mcp import Hub, Limits
from localllm.mcp.tools import MAX_RESULT_BYTES
from tests.mcp.conftest import rogue, tiny

pytestmark = pytest.mark.slow  # MCP servers are processes (the SDK's start in ~1.5 s); SmolLM2


def test_tools_are_listed_with_their_schemas(hub: Hub) -> None:
    add = hub.tool("add")
    assert add is not None and add.server == "tiny" and add.description == "Add two whole numbers."
    assert add.schema["properties"]["a"]["type"] == "integer"
    assert add.openai()["function"]["name"] == "add"
    assert {t.name for t in hub.tools if t.server == "time"} >= {"get_current_time", "convert_time"}


def test_a_call_and_a_third_party_server(hub: Hub) -> None:
    r = hub.call("add", {"a": 2, "b": 40})
    assert (r.text, r.is_error, r.failed) == ("42", False, False)
    r = hub.call("get_current_time", {"timezone": "UTC"})
    assert json.loads(r.text)["timezone"] == "UTC" and not r.is_error


def test_a_failing_tool_is_an_error_result(hub: Hub) -> None:
    r = hub.call("fail", {"why": "boom"})
    assert r.is_error and not r.failed


def test_a_large_result_is_cut_with_a_note(hub: Hub) -> None:
    r = hub.call("flood", {"n": 1_000_000})
    assert r.truncated and r.size == 1_000_000
    assert len(r.text.encode()) < MAX_RESULT_BYTES + 200 and "cut: the result is 1000000 bytes" in r.text


def test_a_slow_call_times_out_and_the_server_goes_on(hub: Hub) -> None:
    t0 = time.perf_counter()
    r = hub.call("sleep", {"seconds": 30})
    assert r.failed and "timed out after 2 s" in r.text and time.perf_counter() - t0 < 5
    assert hub.call("add", {"a": 1, "b": 1}).text == "2"


def test_a_running_call_is_cancelled(hub: Hub) -> None:
    pending = hub.submit("sleep", {"seconds": 30})
    time.sleep(0.2)
    t0 = time.perf_counter()
    pending.cancel()
    r = pending.result()
    assert r.failed and "cancelled" in r.text and time.perf_counter() - t0 < 1
    assert hub.call("add", {"a": 2, "b": 2}).text == "4"


def test_a_tool_that_ignores_cancellation_is_cut_off() -> None:
    """Esc (``PendingCall.cancel``): the server is told, and a tool that goes on
    regardless is not waited for; one never cancelled ends at the call's bound."""
    with Hub([rogue("deaf"), rogue("chatty")], limits=Limits(call_timeout=2, start_timeout=20)) as h:
        assert h.start() == []
        pending = h.submit("go", {}, server="deaf")
        time.sleep(0.3)
        t0 = time.perf_counter()
        pending.cancel()
        r = pending.result()
        assert r.failed and "cancelled" in r.text and time.perf_counter() - t0 < 1
        r = h.call("go", {}, server="deaf")
        assert r.failed and "timed out after 2 s" in r.text
        assert h.call("go", {}, server="chatty").text == "went"  # the other server goes on


def test_a_server_sees_only_the_default_variables_and_its_own(hub: Hub) -> None:
    seen = json.loads(hub.call("environment", {}).text)
    assert seen["key"] is None
    assert "LOCALLLM_API_KEY" not in seen["names"] and "SOME_PRIVATE_TOKEN" not in seen["names"]
    assert "TINY_SETTING" in seen["names"] and "PATH" in seen["names"]


def test_a_100_mb_result_fails_its_call_in_bounded_memory(hub: Hub) -> None:
    tracemalloc.start()
    try:
        r = hub.call("go", {}, server="flood")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.failed and "floods its output (over 32 MiB without a newline): no longer read" in r.text
    assert peak < 48 * 2**20, peak
    again = hub.call("go", {}, server="flood")
    assert again.failed and "flooded its output" in again.text


def test_an_answer_over_the_message_bound_fails_its_call(hub: Hub) -> None:
    r = hub.call("go", {}, server="big")
    assert r.failed and "larger than 8 MiB: dropped" in r.text
    assert hub.call("go", {}, server="big").failed  # still there, and still too big


def test_endless_output_without_a_newline_is_cut_off(hub: Hub) -> None:
    t0 = time.perf_counter()
    r = hub.call("go", {}, server="nonl")
    assert r.failed and "flooded its output" in r.text and time.perf_counter() - t0 < 2


def test_invalid_json_rpc_fails_the_call_at_once(hub: Hub) -> None:
    t0 = time.perf_counter()
    r = hub.call("go", {}, server="garbage")
    assert r.failed and "not valid JSON-RPC" in r.text and time.perf_counter() - t0 < 1


def test_log_lines_on_stdout_are_skipped(hub: Hub) -> None:
    r = hub.call("go", {}, server="chatty")
    assert r.text == "went" and hub.servers["chatty"].log.skipped_lines >= 1


def test_a_crash_fails_the_call_with_its_stderr(hub: Hub) -> None:
    r = hub.call("go", {}, server="crash")
    assert r.failed and "closed the connection" in r.text and "crashing on purpose" in r.text
    assert hub.call("add", {"a": 3, "b": 3}).text == "6"  # the others go on


def test_bad_tools_are_left_out_with_one_line_each(hub: Hub) -> None:
    notes = "\n".join(hub.notices)
    assert "bigschema: tool big is left out: its input schema is 1155 KiB, over 64 KiB" in notes
    assert "many: lists 10000 tools: the first 128 are kept" in notes
    assert sum(1 for t in hub.tools if t.server == "many") == 128
    assert "a tool named 'bad\\\\x1b[31mname' is left out" in notes and "'new\\\\nline' is left out" in notes
    assert "recursive: tool tree is left out: its input schema refers to itself" in notes
    assert {t.name for t in hub.tools if t.server in ("bigschema", "badnames", "recursive")} == {"ok"}
    assert all("\x1b" not in line and "\n" not in line for line in hub.notices)


def test_a_server_that_never_answers_initialize_fails_alone() -> None:
    t0 = time.perf_counter()
    with Hub([rogue("hang"), rogue("chatty"), tiny().__class__("gone", command="/nonexistent/server")],
             limits=Limits(start_timeout=1)) as h:
        failed = {s.config.name: s.error for s in h.start()}
        assert failed.keys() == {"hang", "gone"}
        assert "did not answer within 1 s" in (failed["hang"] or "")
        assert "no such program" in (failed["gone"] or "")
        assert h.call("go", {}, server="chatty").text == "went"
    assert time.perf_counter() - t0 < 8

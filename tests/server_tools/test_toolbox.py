"""llama-server's built-in tools (``localllm.server_tools``) called directly: the
answers of its own tests (test_tools_builtin.py), and the bounds a hostile
caller meets (a runtime header that is an option, a backtracking pattern, a
FIFO, a command that outlives its shell)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from localllm.server_tools import BadParams, Context, RuntimeRefused, Toolbox, UnknownTool, choose, search
from localllm.server_tools.files import normalize
from localllm.server_tools.search import glob_match, path_glob_match

BOX = Toolbox(choose("all"))


def call(name: str, params: dict, ctx: Context | None = None) -> dict:
    out = BOX.call(name, params, ctx or Context())
    assert out is not None
    return out


def test_choose_takes_names_or_all_and_names_the_tools_there_are() -> None:
    assert choose("all") == ("read_file", "file_glob_search", "grep_search", "exec_shell_command", "write_file", "edit_file", "get_info")
    assert choose("edit_file, read_file") == ("read_file", "edit_file")  # llama-server's order, whatever the flag's
    with pytest.raises(ValueError, match=r'unknown tool "rm_rf". available tools: read_file, '):
        choose("read_file,rm_rf")
    with pytest.raises(ValueError, match="tool names"):
        choose(" , ")


def test_listing_has_llama_servers_shape_and_only_the_chosen() -> None:
    box = Toolbox(choose("read_file,exec_shell_command"))
    listed = box.listing()
    assert [t["tool"] for t in listed] == ["read_file", "exec_shell_command"]
    shell = listed[1]
    assert shell["type"] == "builtin" and shell["permissions"] == {"write": True} and shell["uses_cwd"] is True
    assert shell["definition"]["function"]["parameters"]["required"] == ["command"]
    with pytest.raises(UnknownTool, match='unknown tool "write_file"'):
        box.call("write_file", {"path": "x", "content": "y"}, Context())
    with pytest.raises(UnknownTool, match="does not support stream"):
        box.call("read_file", {"path": "x"}, Context(), push=lambda s: True)


def test_glob_is_llama_cpps_and_cannot_be_made_slow() -> None:
    assert glob_match("*.py", "a.py") and not glob_match("*.py", "a/b.py")
    assert glob_match("**/*.py", "a/b.py") and glob_match("**", "x/y/z")
    assert glob_match("[a-c]x", "bx") and not glob_match("[!a-c]x", "bx") and glob_match("[]]", "]")
    assert glob_match("?", "a") and not glob_match("?", "/") and glob_match("a[b", "a[b")
    assert path_glob_match("test_x.py", "deep/down/test_x.py")  # no '/': the basename at any depth
    assert path_glob_match("src/*.cpp", "lib/src/a.cpp") and not path_glob_match("src/*.cpp", "src/a.cpp")  # '**/' put in front, as upstream
    t0 = time.monotonic()
    assert not glob_match("**a" * 40 + "b", "a" * 5000)
    assert time.monotonic() - t0 < 2


def test_write_read_and_edit_answer_as_llama_server(tmp_path: Path) -> None:
    log = str(tmp_path / "sub" / "test.log")
    assert call("write_file", {"path": log, "content": "line1\nline2\nline3\n"}) == {"result": "file written successfully", "path": log,
                                                                                     "bytes": 18}
    assert call("read_file", {"path": log}) == {"plain_text_response": "line1\nline2\nline3\n"}
    assert call("read_file", {"path": log, "start_line": 2, "end_line": 2, "append_loc": True}) == {"plain_text_response": "2\u2192line2\n"}
    done = call("edit_file", {"path": log, "edits": [{"old_text": "line2", "new_text": "line2-edited"},
                                                     {"old_text": "line3\n", "new_text": "line3\nline4\n"}]})
    assert done == {"result": "file edited successfully", "path": log, "edits_applied": 2}
    assert Path(log).read_text() == "line1\nline2-edited\nline3\nline4\n"
    Path(log).write_text("dup\ndup\n")
    assert "it must be unique" in call("edit_file", {"path": log, "edits": [{"old_text": "dup", "new_text": "x"}]})["error"]
    Path(log).write_text("line1\nline2\n")
    err = call("edit_file", {"path": log, "edits": [{"old_text": "line1\nline2", "new_text": "a"}, {"old_text": "line2", "new_text": "b"}]})["error"]
    assert "edits[0] and edits[1] overlap" in err
    assert "could not find edits[0]" in call("edit_file", {"path": log, "edits": [{"old_text": "nope", "new_text": "x"}]})["error"]
    assert call("edit_file", {"path": log, "edits": []}) == {"error": "\"edits\" must be a non-empty array"}
    assert call("edit_file", {"path": log, "edits": [{"old_text": "line1", "new_text": "line1"}]})["error"].startswith("no changes made")


def test_a_fuzzy_edit_keeps_the_lines_it_does_not_touch(tmp_path: Path) -> None:
    f = tmp_path / "q.txt"
    f.write_bytes("keep \u201cthis\u201d  \nsay \u2018hi\u2019\u2014now\t\nlast\r\n".encode())
    assert normalize("a \u2018b\u2019\u00a0c\u2014 \t") == "a 'b' c-"
    done = call("edit_file", {"path": str(f), "edits": [{"old_text": "say 'hi'-now", "new_text": "say bye"}]})
    assert done["edits_applied"] == 1
    assert f.read_bytes() == "keep \u201cthis\u201d  \nsay bye\nlast\r\n".encode()


def test_read_refuses_what_is_too_large_or_no_file(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("x" * 100 + "\n" + "y" * 20000 + "\n")
    assert call("read_file", {"path": str(big)})["error"].startswith("file too large (20102 bytes, max 16384). Use start_line/end_line")
    assert call("read_file", {"path": str(big), "start_line": 1, "end_line": 1}) == {"plain_text_response": "x" * 100 + "\n"}
    assert call("read_file", {"path": str(big), "end_line": 2})["plain_text_response"].endswith("[output truncated]")
    assert call("read_file", {"path": str(tmp_path / "none")}) == {"error": f"cannot stat file: {tmp_path / 'none'}"}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    assert "error" in call("read_file", {"path": str(fifo)}) and "error" in call("write_file", {"path": str(fifo), "content": "x"})
    assert time.monotonic() - t0 < 2  # a FIFO with no writer would block a plain open for ever
    assert call("read_file", {"path": "/dev/zero", "end_line": 1})["error"].startswith("cannot stat file")
    b64 = BOX.call("read_file", {"path": str(big)}, Context(resp_type="base64"))
    assert b64 is not None and b64["size_bytes"] == 20102


def test_bad_params_are_400s_naming_the_parameter() -> None:
    for name, params, param in (("read_file", {}, "path"), ("read_file", {"path": 7}, "path"), ("write_file", {"path": "x"}, "content"),
                                ("grep_search", {"path": "."}, "pattern"), ("exec_shell_command", {"command": ["ls"]}, "command"),
                                ("read_file", {"path": "a\x00b"}, "path"), ("edit_file", {"path": "x"}, "edits")):
        with pytest.raises(BadParams) as e:
            BOX.call(name, params, Context())
        assert e.value.status == 400 and e.value.param == param


@pytest.mark.slow  # commands and processes
def test_file_glob_search_types_depth_limit_and_junk(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "build" / "nested").mkdir(parents=True)
    for rel in ("top.txt", "a/mid.txt", "a/b/deep.txt", "build/artifact.txt"):
        (tmp_path / rel).write_text(rel)
    res = call("file_glob_search", {"path": str(tmp_path), "limit": 1})
    assert len(res["entries"]) == 1 and "Total matches: 3" in res["plain_text_response"] and res["base"] == str(tmp_path)
    assert "[1 results limit reached (3 total matches)." in res["plain_text_response"]
    one = call("file_glob_search", {"path": str(tmp_path), "max_depth": 1})["plain_text_response"]
    assert "top.txt" in one and "mid.txt" not in one
    dirs = {e["path"]: e["type"] for e in call("file_glob_search", {"path": str(tmp_path), "type": "dir"})["entries"]}
    assert dirs == {"a": "dir", "a/b": "dir", "build": "dir"}  # build is listed, never walked
    everything = [e["path"] for e in call("file_glob_search", {"path": str(tmp_path), "type": "all", "exclude": "*.txt"})["entries"]]
    assert "build/nested" not in everything and "a/b" in everything
    assert call("file_glob_search", {"path": str(tmp_path), "type": "bogus"})["error"].startswith("invalid type: bogus")
    assert call("file_glob_search", {"path": str(tmp_path), "limit": 0})["error"] == "invalid limit: 0 (expected 1 or more)"
    assert call("file_glob_search", {"path": str(tmp_path / "no")})["error"].startswith("path does not exist or is not a directory")
    here = call("file_glob_search", {"path": ".", "include": "*.txt", "max_depth": 1}, Context(cwd=str(tmp_path / "a")))
    assert [e["path"] for e in here["entries"]] == ["mid.txt"]


@pytest.mark.slow  # commands and processes
def test_grep_search_answers_as_llama_server_and_a_backtracking_pattern_is_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("one\nmarker_here\nthree\n")
    (tmp_path / "b.txt").write_text("MARKER_HERE too\n")
    res = call("grep_search", {"path": str(tmp_path), "pattern": "marker_here", "include": "*.py", "return_line_numbers": True})
    assert res == {"plain_text_response": "src/a.py:2:marker_here\n\n---\nTotal matches: 1\n"}
    ctx = call("grep_search", {"path": str(tmp_path / "src" / "a.py"), "pattern": "marker", "context_lines": 1})["plain_text_response"]
    assert ctx.startswith(f"{tmp_path / 'src' / 'a.py'}-1-one\n{tmp_path / 'src' / 'a.py'}:2:marker_here\n")
    assert "Total matches: 2" in call("grep_search", {"path": str(tmp_path), "pattern": "marker_here", "ignore_case": True})["plain_text_response"]
    assert "Total matches: 0" in call("grep_search", {"path": str(tmp_path), "pattern": "a.py", "literal": True})["plain_text_response"]
    assert call("grep_search", {"path": str(tmp_path), "pattern": "(unclosed"})["error"].startswith("invalid regex: ")
    assert call("grep_search", {"path": str(tmp_path / "nope"), "pattern": "x"}) == {"error": f"path does not exist: {tmp_path / 'nope'}"}
    (tmp_path / "evil.txt").write_text("a" * 40 + "!\n")
    monkeypatch.setattr(search, "GREP_TIMEOUT_S", 1.0)
    t0 = time.monotonic()
    err = call("grep_search", {"path": str(tmp_path / "evil.txt"), "pattern": "^(a+)+$"})["error"]
    assert "took longer than 1 s" in err and time.monotonic() - t0 < 5


@pytest.mark.slow  # commands and processes
def test_exec_bounds_time_output_and_what_the_command_leaves_running(tmp_path: Path) -> None:
    assert call("exec_shell_command", {"command": "echo hello; echo oops >&2"}) == {"plain_text_response": "hello\noops\n\n[exit code: 0]"}
    assert call("exec_shell_command", {"command": "exit 3"})["plain_text_response"] == "\n[exit code: 3]"
    t0 = time.monotonic()
    slow = call("exec_shell_command", {"command": "echo start; sleep 30", "timeout": 1})["plain_text_response"]
    assert slow.startswith("start\n") and slow.endswith("[exit due to timed out]") and time.monotonic() - t0 < 5
    big = call("exec_shell_command", {"command": "yes | head -c 100000", "max_output_size": 100})["plain_text_response"]
    assert big.startswith("y\ny\n") and "[output truncated]" in big and len(big) < 200
    marker = tmp_path / "survived"
    t0 = time.monotonic()
    call("exec_shell_command", {"command": f"(sleep 2; touch {marker}) & echo bg"})
    assert time.monotonic() - t0 < 2
    time.sleep(2.5)
    assert not marker.exists()  # what the command started went with it
    here = call("exec_shell_command", {"command": "pwd"}, Context(cwd=str(tmp_path)))["plain_text_response"]
    assert here.startswith(str(tmp_path))
    pieces: list[str] = []

    def push(text: str) -> bool:
        pieces.append(text)
        return True

    assert BOX.call("exec_shell_command", {"command": "echo one; sleep 0.2; echo two"}, Context(), push=push) is None
    assert "".join(pieces) == "one\ntwo\n\n[exit code: 0]" and len(pieces) >= 2


def test_runtime_headers_are_checked_as_llama_server_checks_them() -> None:
    for runtime, why in (("fake:does-not-exist", "unknown tool runtime: fake:does-not-exist"),
                         ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target: -oProxyCommand=touch /tmp/pwned"),
                         ("ssh:host;rm -rf /", "invalid ssh target"), ("docker-container:--privileged", "invalid container id: --privileged"),
                         ("podman-container:-v/:/host", "invalid container id"), ("docker:busybox", "must name a running container")):
        with pytest.raises(RuntimeRefused) as e:
            BOX.call("exec_shell_command", {"command": "echo hi"}, Context(runtime=runtime))
        assert why in e.value.message and e.value.status == 500


@pytest.mark.slow  # commands and processes
def test_stop_kills_a_running_command_and_refuses_new_calls() -> None:
    box = Toolbox(choose("exec_shell_command"))
    t0 = time.monotonic()
    running = box.submit("exec_shell_command", {"command": "sleep 30", "timeout": 60}, Context())
    time.sleep(0.3)
    box.stop()
    out = running.result(timeout=10)
    assert out is not None and "[exit code: -9]" in out["plain_text_response"] and time.monotonic() - t0 < 5
    with pytest.raises(Exception, match="stopping"):
        box.submit("exec_shell_command", {"command": "true"}, Context())

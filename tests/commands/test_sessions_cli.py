"""``chat`` saves its conversation with the KV cache kept, ``chat --resume`` goes on
with it without reading it again, and ``list --sessions`` shows what is kept
against the disk budget (issue 61)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import cli, one_line

CHAT = ("--ctx", "1024", "-n", "8", "--temp", "0", "--threads", "1", "--json")
MARK = {"text_sha256": "ab" * 32, "cells": 40, "images": []}


def _session(home: Path, sid: str, *, kv: bool, state: int | None, updated: float) -> None:
    d = home / "sessions"
    d.mkdir(parents=True, exist_ok=True)
    data = {"id": sid, "model": "/m/SmolLM2.gguf", "created": updated, "updated": updated,
            "messages": [{"role": "user", "content": f"question {sid}"}, {"role": "assistant", "content": "answer"}],
            "kv": MARK if kv else None}
    (d / f"{sid}.json").write_text(json.dumps(data))
    if state is not None:
        (d / f"{sid}.state").write_bytes(b"\0" * state)


def test_list_sessions_shows_each_kept_state_and_the_total_against_the_budget(_isolated_home: Path) -> None:
    r = cli("list", "--sessions")
    assert r.returncode == 0 and r.stdout.startswith("no saved sessions") and "kept KV state: 0 B of a 2.00 GiB budget" in r.stdout
    _session(_isolated_home, "kept", kv=True, state=3 * 2**20, updated=1_700_000_300)
    _session(_isolated_home, "dropped", kv=True, state=None, updated=1_700_000_200)
    _session(_isolated_home, "plain", kv=False, state=None, updated=1_700_000_100)
    _session(_isolated_home, "moved-on", kv=False, state=2**20, updated=1_700_000_000)
    (_isolated_home / "sessions" / "orphan.state").write_bytes(b"\0" * 2**20)  # its session deleted by hand: still on disk
    (_isolated_home / "config.toml").write_text('[sessions]\nkv-budget = "1GiB"\n')

    r = cli("list", "--sessions", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {s["id"]: s for s in out["sessions"]}
    assert [s["id"] for s in out["sessions"]] == ["kept", "dropped", "plain", "moved-on"]  # newest first
    assert (rows["kept"]["kv_state"], rows["kept"]["kv_state_bytes"], rows["kept"]["kv_cells"]) == ("kept", 3 * 2**20, 40)
    assert (rows["dropped"]["kv_state"], rows["dropped"]["kv_state_bytes"], rows["dropped"]["kv_cells"]) == ("dropped", None, None)
    assert (rows["plain"]["kv_state"], rows["plain"]["kv_state_bytes"]) == ("none", None)  # not known: null, never 0
    assert (rows["moved-on"]["kv_state"], rows["moved-on"]["kv_state_bytes"]) == ("outdated", 2**20)
    assert out["kv_state_bytes"] == 5 * 2**20 and out["kv_budget_bytes"] == 2**30
    assert rows["kept"]["turns"] == 1 and rows["kept"]["title"] == "question kept"

    text = cli("list", "--sessions").stdout
    lines = {line.split()[0]: line for line in text.splitlines()[1:-1]}  # the table's rows: not its head, not the total
    assert "3.00 MiB" in lines["kept"] and "dropped" in lines["dropped"] and "1.00 MiB (outdated)" in lines["moved-on"]
    assert "kept KV state: 5.00 MiB of a 1.00 GiB budget" in text


def test_list_sessions_with_catalog_and_a_bad_budget_are_one_line(_isolated_home: Path) -> None:
    one_line(cli("list", "--sessions", "--catalog"), 2, "--catalog or --sessions, not both")
    _isolated_home.mkdir(parents=True, exist_ok=True)
    (_isolated_home / "config.toml").write_text('[sessions]\nkv-budget = "lots"\n')
    one_line(cli("list", "--sessions"), 2, "config.toml: [sessions] kv-budget:", "is not a size")
    one_line(cli("plan"), 2, "config.toml: [sessions] kv-budget:")  # checked as the rest of the file is, by every command
    (_isolated_home / "config.toml").write_text('[sessions]\nkv-budget = "1GiB"\n')
    shown = cli("config")
    assert shown.returncode == 0 and "saved sessions' KV state budget (list --sessions): 1GiB" in shown.stdout, shown.stdout


def test_chat_resume_with_a_bad_id_says_why_before_loading(_isolated_home: Path) -> None:
    one_line(cli("chat", "--resume", "nope", "--no-pull"), 2, "--resume nope: no saved session has that ID", "list --sessions")
    one_line(cli("chat", "--resume", "../registry", "--no-pull"), 2, "no saved session has that ID")
    _session(_isolated_home, "pictures", kv=False, state=None, updated=1_700_000_000)
    raw = json.loads((_isolated_home / "sessions" / "pictures.json").read_text())
    raw["images"] = [{"name": "a.png"}]
    (_isolated_home / "sessions" / "pictures.json").write_text(json.dumps(raw))
    one_line(cli("chat", "--resume", "pictures", "--no-pull"), 2, "holds images", "localllm tui")


@pytest.mark.slow
def test_chat_saves_and_resume_goes_on_without_reading_the_conversation_again(smollm2: Path, _isolated_home: Path) -> None:
    first = cli("chat", str(smollm2), *CHAT, stdin="Name a colour.\nAnd another one?\n")
    assert first.returncode == 0, first.stderr
    before = [json.loads(line) for line in first.stdout.splitlines()]
    listed = json.loads(cli("list", "--sessions", "--json").stdout)
    (saved,) = listed["sessions"]
    assert saved["kv_state"] == "kept" and saved["kv_state_bytes"] > 0 and saved["turns"] == 2
    assert saved["kv_cells"] == before[-1]["context_used"] and listed["kv_state_bytes"] == saved["kv_state_bytes"]

    # no ID: this model's newest; its cache is loaded, so the next turn reads only its own message
    again = cli("chat", str(smollm2), "--resume", *CHAT, stdin="Which is brighter?\n")
    assert again.returncode == 0, again.stderr
    assert f"resumed {saved['id']} (2 turns): its KV cache was reused, nothing is read again" in again.stderr
    (turn,) = [json.loads(line) for line in again.stdout.splitlines()]
    assert turn["prompt_tokens"] < 40 < saved["kv_cells"] < turn["context_used"]
    after = json.loads(cli("list", "--sessions", "--json").stdout)["sessions"]
    assert [(s["id"], s["turns"], s["kv_state"]) for s in after] == [(saved["id"], 3, "kept")]  # the same session, written over

    # by ID, no model named: the session's; its state file gone, the conversation is read again
    (_isolated_home / "sessions" / f"{saved['id']}.state").unlink()
    gone = cli("chat", "--resume", saved["id"], *CHAT, "--no-save", stdin="And the darkest?\n")
    assert gone.returncode == 0, gone.stderr
    assert "its KV cache is not reused (its state file is gone): the next message reads the conversation again" in gone.stderr
    (turn,) = [json.loads(line) for line in gone.stdout.splitlines()]
    assert turn["prompt_tokens"] > saved["kv_cells"]  # all of it read again
    assert json.loads(cli("list", "--sessions", "--json").stdout)["sessions"][0]["kv_state"] == "dropped"  # --no-save: untouched

    one_line(cli("chat", str(smollm2), "--resume", saved["id"], "--system", "be terse", *CHAT), 2, "--system with --resume")

"""``chat``'s compaction on SmolLM2: ``/compact`` replaces the older turns with the
model's summary and says so in one line (a JSON line with --json), ``--compact-at``
does it after a reply once the context is that full, and a bad fraction is one
line naming the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.cli import cli, one_line

CHAT = ("--ctx", "512", "-n", "16", "--temp", "0", "--threads", "1", "--no-save", "--no-stats")
LINES = "My locker code is 4817.\nName a colour.\nName a fruit.\nName a tree.\n"
SAID = r"localllm: compacted: [\d,]+ → [\d,]+ tokens in [\d.]+ s \(\d+ messages summarized, the last 2 turns kept\)"


@pytest.mark.slow
def test_typed_compact_says_tokens_before_and_after_and_the_time(smollm2: Path) -> None:
    r = cli("chat", str(smollm2), *CHAT, stdin="/compact\n" + LINES + "/compact\nWhat is my locker code?\n")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert "localllm: nothing to compact: the conversation is no longer than the 2 turns kept whole" in lines
    said = [line for line in lines if "compacted:" in line]
    assert len(said) == 1 and re.fullmatch(SAID, said[0]), lines
    m = re.search(r"compacted: ([\d,]+) → ([\d,]+) tokens", said[0])
    assert m is not None and int(m[2].replace(",", "")) < int(m[1].replace(",", ""))


@pytest.mark.slow
def test_json_gives_the_compaction_as_a_line_of_its_own(smollm2: Path) -> None:
    r = cli("chat", str(smollm2), *CHAT, "--json", stdin=LINES + "/compact\n")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    (c,) = [row["compaction"] for row in rows if "compaction" in row]
    assert c["tokens_after"] < c["tokens_before"] and c["seconds"] > 0 and c["summary"] and c["auto"] is False
    assert c["summarized"] == 4 and c["kept_turns"] == 2 and c["role"] == "system"  # SmolLM2's ChatML takes a second system message


@pytest.mark.slow
def test_compact_at_compacts_after_the_reply_that_fills_it(smollm2: Path) -> None:
    r = cli("chat", str(smollm2), *CHAT, "--compact-at", "40%", stdin=LINES * 2)
    assert r.returncode == 0, r.stderr
    auto = [line for line in r.stderr.splitlines() if "compacted:" in line]
    assert auto and all(re.fullmatch(SAID + r" \(auto at 40% of the context\)", line) for line in auto), r.stderr


def test_a_bad_fraction_is_one_line() -> None:
    one_line(cli("chat", "--compact-at", "2", "--no-pull"), 2, "--compact-at", "above 0 and at most 1")
    one_line(cli("tui", "--compact-at", "most", "--no-pull"), 2, "'most' is not a fraction of the context: give e.g. 0.85, 85% or off")

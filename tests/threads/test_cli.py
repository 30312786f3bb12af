"""What users see of the thread counts: ``run -v`` and ``run --json`` report
them and why; ``--threads`` fixes them, and a count out of range is one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers.cli import cli


@pytest.mark.slow
def test_run_json_reports_the_threads(smollm2: Path) -> None:
    proc = cli("run", str(smollm2), "--json", "-n", "24", "--temp", "0", "-p", "Count to ten.")
    assert proc.returncode == 0, proc.stderr
    threads = json.loads(proc.stdout)["threads"]
    assert threads["mode"] == "adaptive" and threads["start"] >= 1 and threads["why_start"]
    assert set(threads["now"]) <= {"token", "prefill"} and threads["now"]["token"] >= 1
    assert isinstance(threads["changes"], list) and threads["probes"] is not None


@pytest.mark.slow
def test_run_verbose_says_the_threads_and_threads_fixes_them(smollm2: Path) -> None:
    proc = cli("-v", "run", str(smollm2), "-n", "8", "--temp", "0", "-p", "Hi", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "threads: token 1, fixed by --threads" in proc.stderr or "threads: prefill 1, token 1, fixed by --threads" in proc.stderr
    fixed = json.loads(cli("run", str(smollm2), "--json", "-n", "4", "--temp", "0", "-p", "Hi", "--threads", "1").stdout)["threads"]
    assert fixed["mode"] == "fixed" and fixed["probes"] is None and set(fixed["now"].values()) == {1}


@pytest.mark.parametrize("value", ["0", "10000"])
def test_a_thread_count_out_of_range_is_one_line(value: str) -> None:
    proc = cli("run", "smollm2", "-p", "hi", "--threads", value)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--threads must be" in lines[0], proc.stderr
    limit = "at least 1" if value == "0" else f"at most {max(1, min(os.cpu_count() or 1, 512))}"
    assert limit in lines[0]

"""--cpu-moe and --n-cpu-moe on every loading command: a dense model, or a count
past the layers, is one line and exit 2 before anything loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import cli

COMMANDS = [("run", "-p", "hi", "-n", "1"), ("chat",), ("serve", "--port", "0"), ("bench", "--prompt-tokens", "8", "--gen-tokens", "2", "--reps", "1"),
            ("plan",), ("doctor",)]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("flag", [("--cpu-moe",), ("-ncmoe", "1")], ids=["cpu-moe", "n-cpu-moe"])
def test_dense_model_is_refused_in_one_line(command: tuple[str, ...], flag: tuple[str, ...], synth_model: Path) -> None:
    r = cli(command[0], str(synth_model), *command[1:], *flag, "--threads", "1")
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines == ["localllm: error: --n-cpu-moe/--cpu-moe: this model (llama) has no expert tensors to keep in RAM: it is not a mixture "
                     "of experts"], r.stderr
    assert "Traceback" not in r.stderr

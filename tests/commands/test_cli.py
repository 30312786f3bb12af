"""The CLI as a user meets it: real child processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli


def _one_line_error(proc: subprocess.CompletedProcess[str], code: int, needle: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert needle in lines[0], lines[0]
    assert proc.stdout == ""


def test_help_is_light() -> None:
    """--help must not pay for llama.cpp, gguf/numpy or textual."""
    code = (
        "import sys\n"
        "from localllm.cli import build_parser\n"
        "build_parser().format_help()\n"
        "print(sorted(m for m in ('llama_cpp', 'gguf', 'numpy', 'textual') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_command_typed_by_name_builds_its_own_parser_alone() -> None:
    """Every start of ``serve``, ``run`` or a router's child paid for all 19 command
    modules and their flags (19 ms measured); one typed by name imports its own, and
    ``--help`` (and a name that is no command) still gets every command."""
    code = (
        "import sys\n"
        "from localllm import cli\n"
        "try:\n"
        "    cli.main(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('localllm.commands.') and m.count('.') == 2))"
    )

    def commands(*argv: str) -> set[str]:
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True).stdout
        return set(json.loads(out.strip().splitlines()[-1].replace("'", '"')))

    one = commands("-v", "ps", "--json", "--url", "http://127.0.0.1:9")
    assert "ps" in one and not one & {"serve", "run", "chat", "doctor", "list_models", "tune"}, one
    assert {"serve", "run", "chat", "doctor", "list_models", "tune", "ps"} <= commands("--help")
    assert "serve" in commands("frobnicate")


def test_help_and_version() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0 and "inspect" in proc.stdout and "bench" in proc.stdout
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("localllm ")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "--ctx", "0", "-p", "x"], "--ctx must be at least 1"),
        (["run", "--ctx", "abc", "-p", "x"], "'abc' is not a whole number"),
        (["run", "--kv-type", "q3_k", "-p", "x"], "invalid choice: 'q3_k'"),
        (["run", "--temp", "-1", "-p", "x"], "must be 0 or more"),
        (["run", "-n", "0", "-p", "x"], "-n must be -1"),
        (["run", "--threads", "0", "-p", "x"], "--threads must be at least 1"),
        (["bench", "--prompt-tokens", "a,b"], "'a' is not a whole number"),
        (["bench", "--reps", "-3"], "--reps must be at least 1"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_nonsense_options_are_usage_errors(args: list[str], needle: str) -> None:
    _one_line_error(run_cli(*args), 2, needle)


@pytest.mark.slow
def test_no_prompt_is_usage_error(synth_model: Path) -> None:
    _one_line_error(run_cli("run", str(synth_model)), 2, "the prompt is empty")


@pytest.mark.slow
@pytest.mark.parametrize("command", [["inspect"], ["run", "-p", "hi"], ["bench"]])
def test_bad_files(command: list[str], tmp_path: Path, synth_model: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("hello\n" * 100)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(synth_model.read_bytes()[:200_000])
    cases = [
        (tmp_path / "missing.gguf", "model file not found"),
        (tmp_path, "is a directory"),
        (text, "is not a GGUF file"),
        (cut, "truncated GGUF file"),
    ]
    for path, needle in cases:
        cmd = [command[0], str(path), *command[1:]]
        _one_line_error(run_cli(*cmd), 1, needle)
    assert text.read_text() == "hello\n" * 100  # nothing the user had is touched


def test_unknown_model_name() -> None:
    _one_line_error(run_cli("inspect", "llama-9000"), 1, "unknown model 'llama-9000'")


def test_inspect_json(synth_model: Path) -> None:
    proc = run_cli("inspect", str(synth_model), "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["architecture"] == "llama" and d["n_head_kv"] == 2 and d["n_head"] == 4


def test_python_dash_m_and_console_script_agree() -> None:
    import shutil

    exe = shutil.which("localllm") or str(Path(sys.executable).parent / "localllm")
    a = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert a.returncode == 0 and a.stdout == run_cli("--version").stdout


@pytest.mark.slow
def test_unknown_architecture_is_one_line(tmp_path: Path) -> None:
    """A well-formed GGUF that llama.cpp cannot build: its reason, in one line, exit 1."""
    import gguf
    import numpy as np

    p = tmp_path / "alien.gguf"
    w = gguf.GGUFWriter(str(p), "alienformer")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _one_line_error(run_cli("run", str(p), "-p", "hi"), 1, "unknown model architecture: 'alienformer'")

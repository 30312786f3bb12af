"""The habits users bring from llama.cpp: its flag spellings as aliases, defaults
in a config file (untrusted: one line for anything wrong in it), and options
without a command opening the cockpit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localllm.cli import build_parser, cockpit_by_default
from tests.helpers.cli import cli, one_line


def test_llama_cpp_spellings_are_aliases() -> None:
    p = build_parser()
    ours = p.parse_args("run x.gguf --ctx 1024 --ngl 0 --k-type q8_0 --v-type q8_0 --flash-attn on --threads 1 --batch 256 --ubatch 128 "
                        "--seed 3 -n 5 --template chatml".split())
    theirs = p.parse_args("run -m x.gguf -c 1024 -ngl 0 -ctk q8_0 -ctv q8_0 -fa on -t 1 -b 256 -ub 128 -s 3 --n-predict 5 "
                          "--chat-template-file chatml".split())
    long = p.parse_args("run --model x.gguf --ctx-size 1024 --n-gpu-layers 0 --cache-type-k q8_0 --cache-type-v q8_0 -fa on -t 1 "
                        "--batch-size 256 --ubatch-size 128 -s 3 -n 5 --chat-template chatml".split())
    keys = ("ctx", "ngl", "k_type", "v_type", "flash_attn", "threads", "batch", "ubatch", "seed", "n_predict", "template")
    assert [getattr(theirs, k) for k in keys] == [getattr(ours, k) for k in keys] == [getattr(long, k) for k in keys]
    assert theirs.model_flag == long.model_flag == ours.model == "x.gguf"
    assert p.parse_args(["chat", "-sys", "be brief"]).system == "be brief"


def test_two_models_are_one_line() -> None:
    r = cli("plan", "a.gguf", "-m", "b.gguf")
    assert r.returncode == 2 and r.stderr.strip() == "localllm: error: two models given (a.gguf and -m b.gguf): give one"


def test_options_without_a_command_open_the_cockpit() -> None:
    assert cockpit_by_default(["--threads", "1"]) == ["tui", "--threads", "1"]
    assert cockpit_by_default(["--debug", "-c", "2048"]) == ["--debug", "tui", "-c", "2048"]
    assert cockpit_by_default(["--version"]) == ["--version"] and cockpit_by_default(["plan"]) == ["plan"]
    args = build_parser().parse_args(cockpit_by_default(["--threads", "1", "--temp", "0.2"]))
    assert args.command == "tui" and args.threads == 1 and args.temp == 0.2


@pytest.fixture
def config(tmp_path: Path) -> Path:
    home = Path(os.environ["LOCALLLM_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    return home / "config.toml"


def test_the_config_file_sets_defaults_and_a_typed_flag_wins(config: Path, smollm2: Path) -> None:
    config.write_text('ctx = 1024\nkv-type = "q8_0"\n[plan]\nctx = 2048\n')
    d = json.loads(cli("plan", str(smollm2), "--json", "--no-dry-run").stdout)
    assert d["n_ctx"] == 2048 and d["type_k"] == "q8_0"  # [plan] wins over the top level
    d = json.loads(cli("plan", str(smollm2), "--json", "--no-dry-run", "--ctx", "512").stdout)
    assert d["n_ctx"] == 512  # typed wins
    shown = json.loads(cli("config", "--json").stdout)
    assert shown["path"] == str(config) and shown["flags"]["plan"] == ["--ctx", "2048", "--kv-type", "q8_0"]
    assert shown["flags"]["run"] == ["--ctx", "1024", "--kv-type", "q8_0"]


@pytest.mark.parametrize(("text", "says"), [
    ("ctx = [", "not valid TOML"),
    ("contxt = 4096", "'contxt' is no localllm option"),
    ("[run]\nport = 1", "[run] has no option 'port'"),
    ("[runn]\nctx = 1", "[runn] is not a localllm command"),
    ("ctx = 0", "ctx = 0: --ctx must be at least 1, got 0"),
    ('kv-type = "q3"', "kv-type = 'q3': choose one of"),
    ("swa-full = 1", "swa-full = 1: give true or false"),
])
def test_a_bad_config_is_one_line_naming_the_file_and_the_key(config: Path, text: str, says: str) -> None:
    config.write_text(text)
    r = cli("plan", "--no-dry-run")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith(f"localllm: error: {config}") and says in r.stderr, r.stderr


def test_bash_completes_commands_flags_and_model_names(tmp_path: Path) -> None:
    """The script in a real bash: the command, a flag, and a model name (asked
    from ``localllm completion --names`` at completion time)."""
    import subprocess
    import sys

    script = tmp_path / "c.bash"
    script.write_text(cli("completion", "bash").stdout)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "localllm").write_text(f"#!/bin/sh\nexec {sys.executable} -m localllm \"$@\"\n")
    (shim / "localllm").chmod(0o755)

    def complete(*words: str) -> list[str]:
        line = " ".join(words)
        out = subprocess.run(["bash", "-c", f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _localllm; "
                              'printf "%s\\n" "${COMPREPLY[@]}"'],
                             capture_output=True, text=True, env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}, cwd=tmp_path,
                             check=True)
        return out.stdout.split()

    assert complete("localllm", "pl") == ["plan"]
    assert "--ctx-size" in complete("localllm", "run", "--ctx")
    assert {"smollm2", "llama-3.2-1b-instruct", "llama-3.2-1b-instruct:q8_0"} <= set(complete("localllm", "run", "l")) | set(
        complete("localllm", "run", "s"))


def test_zsh_and_fish_scripts_name_every_command() -> None:
    for shell in ("zsh", "fish"):
        text = cli("completion", shell).stdout
        assert all(name in text for name in ("plan", "run", "quantize", "completion")) and "completion --names" in text
    assert cli("completion").returncode == 2


@pytest.mark.parametrize("kind", ["deep", "fifo", "dev-zero", "directory", "huge"])
def test_the_config_file_is_read_like_any_untrusted_file(config: Path, kind: str) -> None:
    """Issue 45 item 4: a TOML array 1,000 deep gave a 3,000-line RecursionError on
    every command, a FIFO hung every command, a link to /dev/zero read until
    MemoryError. Each is one line naming the file, exit 2, at once."""
    import time

    if kind == "deep":
        config.write_text("x = " + "[" * 1000 + "]" * 1000)
    elif kind == "fifo":
        os.mkfifo(config)
    elif kind == "dev-zero":
        config.symlink_to("/dev/zero")
    elif kind == "directory":
        config.mkdir()
    else:
        config.write_text("# " + "x" * (2 * 1024 * 1024) + "\n")
    t0 = time.monotonic()
    r = cli("list")
    assert time.monotonic() - t0 < 10
    line = one_line(r, 2, str(config))
    assert {"deep": "nested too deep", "fifo": "not a regular file", "dev-zero": "not a regular file", "directory": "not a regular file",
            "huge": "larger than 1024 KiB"}[kind] in line


def test_a_models_table_applies_where_that_model_loads(config: Path, smollm2: Path) -> None:
    """Issue 46: [models."NAME"] holds one model's settings; every command that loads
    that model applies them (over the top level and the command's table), a typed
    flag still wins, another model is untouched, and an option of the server, or
    one no command has, is one line."""
    config.write_text('ctx = 1024\n[plan]\nctx = 2048\n[models."SmolLM2-135M-Instruct.Q4_1"]\nctx = 768\nkv-type = "q8_0"\nparallel = 2\n'
                      '[models.smollm2]\nctx = 1280\n')
    d = json.loads(cli("plan", str(smollm2), "--json", "--no-dry-run").stdout)  # a path: its file name
    assert d["n_ctx"] == 768 and d["type_k"] == "q8_0"
    d = json.loads(cli("plan", "--json", "--no-dry-run").stdout)  # no model named: the default, smollm2
    assert d["n_ctx"] == 1280 and d["type_k"] == "f16"
    d = json.loads(cli("plan", "SMOLLM2", "--json", "--no-dry-run", "--ctx", "512").stdout)
    assert d["n_ctx"] == 512  # typed wins
    shown = json.loads(cli("config", "--json").stdout)
    assert shown["flags"]["plan"] == ["--ctx", "2048"]  # the per-model tables apply to a model, not to a command
    config.write_text("[models.smollm2]\nctx = 512\nthreads = 1\n")  # where run loads it too
    r = cli("run", "smollm2", "-p", "hi", "-n", "1", "--temp", "0", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["n_ctx"] == 512 and d["threads"]["mode"] == "fixed" and d["threads"]["start"] == 1, d
    for text, says in (('[models.smollm2]\nport = 1\n', "[models.\"smollm2\"] has no option 'port'"),
                       ('[models.smollm2]\nnope = 1\n', "has no option 'nope'"),
                       ('models.smollm2 = 3\n', "must be a table")):
        config.write_text(text)
        r = cli("plan", "--no-dry-run")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr

"""The model's section of the config file: written without touching the rest,
replaced on the next run, the user's own keys kept, read back by ``plan``, and
every file shape it cannot write refused in one line before anything is measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from localllm.errors import UsageError
from localllm.tune import section
from tests.helpers.cli import cli, one_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DATE = "2026-12-03 14:02"
USER = """# my settings: kept byte for byte
ctx = 2048   # a comment after a value

[run]
temp = 0.5

[models.'SmolLM2']  # the user's own table for the model
ctx = 1024
kv-type = "q8_0"

[mcp.servers.time]
command = "uvx"
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    monkeypatch.setenv("LOCALLLM_CONFIG", str(path))
    return path


def test_a_new_file_gets_the_section(config: Path) -> None:
    assert section.write(config, "smollm2", {"ubatch": 256, "flash-attn": "on"}, DATE) == "smollm2"
    table = tomllib.loads(config.read_text())
    assert table == {"models": {"smollm2": {"ubatch": 256, "flash-attn": "on",
                                            "tuned": {"date": DATE, "ubatch": 256, "flash-attn": "on"}}}}
    assert config.read_text().startswith('[models."smollm2"]\n# localllm tune, 2026-12-03 14:02:')


def test_the_rest_of_the_file_is_kept(config: Path) -> None:
    config.write_text(USER)
    name = section.write(config, "smollm2", {"ubatch": 256, "threads": 1}, DATE)
    text = config.read_text()
    assert name == "SmolLM2"  # the table the file has, matched as every command matches it (case does not matter)
    assert text.replace("".join(line for line in text.splitlines(keepends=True)
                                if line.startswith(("# localllm tune", "ubatch =", "threads =", "tuned ="))), "") == USER
    t = tomllib.loads(text)
    assert t["models"]["SmolLM2"] == {"ctx": 1024, "kv-type": "q8_0", "ubatch": 256, "threads": 1,
                                      "tuned": {"date": DATE, "ubatch": 256, "threads": 1}}
    assert t["run"] == {"temp": 0.5} and t["mcp"]["servers"]["time"] == {"command": "uvx"}


def test_a_second_run_replaces_its_own_keys_and_keeps_the_users(config: Path) -> None:
    config.write_text(USER)
    section.write(config, "SmolLM2", {"ubatch": 256, "threads": 1}, DATE)
    config.write_text(config.read_text().replace("\nthreads = 1\n", "\nthreads = 2\n"))  # the user's edit: the key is the user's now
    got = section.user_settings(tomllib.loads(config.read_text()), "smollm2")
    assert got == {"kv-type": ("q8_0", 'kv-type in [models."SmolLM2"]'), "threads": (2, 'threads in [models."SmolLM2"]')}
    section.write(config, "smollm2", {"ubatch": 128}, "2026-12-04 09:00", partial=True)
    t = tomllib.loads(config.read_text())["models"]["SmolLM2"]
    assert t == {"ctx": 1024, "kv-type": "q8_0", "threads": 2, "ubatch": 128,
                 "tuned": {"date": "2026-12-04 09:00", "ubatch": 128, "partial": True}}
    assert config.read_text().count("# localllm tune") == 1


def test_a_path_names_the_table_by_its_file(config: Path) -> None:
    assert section.write(config, "/models/Qwen3-0.6B-Q8_0.gguf", {"ubatch": 512}, DATE) == "Qwen3-0.6B-Q8_0"
    assert section.model_entry(tomllib.loads(config.read_text()), "qwen3-0.6b-q8_0") is not None


@pytest.mark.parametrize("text, says", [
    ('models.smollm2.ctx = 1024\n', 'is not a table of its own'),
    ('[models]\nsmollm2 = { ctx = 1024 }\n', 'is not a table of its own'),
    ('models = "all"\n', "leaves no room for tune's [models.\"smollm2\"]"),
])
def test_a_file_it_cannot_write_is_refused_whole(config: Path, text: str, says: str) -> None:
    config.write_text(text)
    with pytest.raises(UsageError, match=says.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        section.check_writable(config, "smollm2")
    assert config.read_text() == text


def test_from_tune_names_what_a_command_runs_with(config: Path) -> None:
    section.write(config, "smollm2", {"ubatch": 256, "kv-type": "q8_0"}, DATE)
    table = tomllib.loads(config.read_text())
    got = section.from_tune(table, "smollm2", {"ubatch": 256, "kv-type": "q8_0", "flash-attn": "auto", "threads": None})
    assert got is not None and got.line() == "ubatch 256, kv-type q8_0 (from tune, 2026-12-03 14:02)"
    typed = section.from_tune(table, "SMOLLM2", {"ubatch": 512, "kv-type": "q8_0"})  # --ubatch 512 typed: not tune's
    assert typed is not None and typed.settings == {"kv-type": "q8_0"}
    assert section.from_tune(table, "gemma3-270m", {"ubatch": 256}) is None


def test_plan_shows_what_came_from_tune_and_a_typed_flag_wins(config: Path, smollm2: Path) -> None:
    """Later runs use the section unless a flag says otherwise; plan says which settings came from tune."""
    section.write(config, "smollm2", {"ubatch": 256, "kv-type": "q8_0", "flash-attn": "on"}, DATE)
    r = cli("plan", "smollm2", "--no-dry-run")
    assert r.returncode == 0 and "settings ubatch 256, kv-type q8_0, flash-attn on (from tune, 2026-12-03 14:02)" in r.stdout
    assert "KV cache q8_0/q8_0" in r.stdout
    d = json.loads(cli("plan", "smollm2", "--no-dry-run", "--json").stdout)
    assert d["type_k"] == "q8_0"
    assert d["from_tune"] == {"date": DATE, "settings": {"ubatch": 256, "kv-type": "q8_0", "flash-attn": "on"}, "partial": False}
    typed = json.loads(cli("plan", "smollm2", "--no-dry-run", "--json", "--ubatch", "512").stdout)
    assert typed["compute_cpu_bytes"] > d["compute_cpu_bytes"]  # the compute buffer is sized by the ubatch: 512 typed, 256 tuned
    assert typed["from_tune"]["settings"] == {"kv-type": "q8_0", "flash-attn": "on"}


@pytest.mark.parametrize("text, says", [
    ('[models.smollm2]\ntuned = 3\n', "[models.\"smollm2\"] tuned = 3: not what localllm tune writes"),
    ('[models.smollm2]\ntuned = { date = "x", nope = 1 }\n', "tuned = {'date': 'x', 'nope': 1}: not what localllm tune writes"),
    ('models.smollm2 = 3\n', "must be a table"),
])
def test_a_section_of_the_wrong_shape_is_one_line(config: Path, text: str, says: str) -> None:
    """Every command reads the file: a bad section is one line naming the file and the key, exit 2, and tune measures nothing."""
    config.write_text(text)
    for command in (("plan", "--no-dry-run"), ("tune", "--quick", "--force")):
        line = one_line(cli(*command), 2, str(config), says)
        assert "delete the key" in line or "must be a table" in line
    assert config.read_text() == text

"""``list`` fits the terminal (80 columns here), and ``plan`` names the output layer. The path column of ``list`` takes what the
others leave, with the home folder as ``~`` and an ellipsis keeping the file
name; ``--json`` keeps the full path."""

from __future__ import annotations

import json
import os
from pathlib import Path

from localllm.commands.list_models import Row, render
from tests.helpers.cli import cli


def _row(path: str) -> Row:
    return Row("qwen2.5-1.5b-instruct:q4_k_m", "huggingface", "", path, "qwen2", "Q4_K_M", 986_000_000, 32768, True,
               "yes: ctx 4096", "bartowski/Qwen2.5-1.5B-Instruct-GGUF")


def test_eighty_columns_shorten_the_path_keeping_the_file_name() -> None:
    home = os.path.expanduser("~")
    long = f"{home}/.cache/huggingface/hub/models--bartowski--Qwen2.5-1.5B-Instruct-GGUF/snapshots/0123/Qwen2.5-1.5B-Instruct-Q4_K_M.gguf"
    lines = render([_row(long)], "(4.00 GiB GPU)", columns=80).splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    # a long name leaves too little room: the path goes on a line of its own, under its row
    assert lines[1].startswith("qwen2.5-1.5b-instruct:q4_k_m") and lines[2].startswith("  …") and lines[2].endswith("-Q4_K_M.gguf")
    short = f"{home}/m/a.gguf"
    assert render([_row(short)], "(RAM)", columns=80).splitlines()[2] == "  ~/m/a.gguf"
    wide = render([_row(long)], "(RAM)", columns=250).splitlines()
    assert "ARCH" in wide[0] and wide[1].endswith("~" + long[len(home):])


def test_the_cli_fits_eighty_columns_and_json_keeps_the_path(tmp_path: Path, synth_model: Path) -> None:
    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "model.gguf"
    deep.parent.mkdir(parents=True)
    deep.write_bytes(synth_model.read_bytes())
    assert cli("add", str(deep)).returncode == 0
    text = cli("list", env={"COLUMNS": "80"}).stdout
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert str(deep) in [e["path"] for e in json.loads(cli("list", "--json").stdout)]


def test_plan_names_the_output_layer() -> None:
    from localllm.plan.planner import layers_phrase

    assert [layers_phrase(n, 31) for n in (31, 99, 12, 1, 0)] == [
        "all 30 layers + output", "all 30 layers + output", "11 of 30 layers + output", "the output layer only", "no layer"]
    text = cli("plan", "--vram", "4GiB", "--ngl", "12", "--no-dry-run").stdout
    assert "11 of 30 layers + output on the GPU" in text.splitlines()[0]


def test_plan_says_fits_once_and_head_room_means_the_margin() -> None:
    text = cli("plan", "--vram", "4GiB", "--no-dry-run").stdout
    assert "fits as asked" in text.splitlines() and "fits: fits" not in text
    line = next(x for x in text.splitlines() if x.startswith("GPU budget"))
    assert "kept free as head-room" in line and line.endswith("left over")
    reduced = cli("plan", "--vram", "200MiB", "--no-dry-run").stdout
    assert any(x.startswith("fits: KV cache q4_0/q4_0") and x.endswith("11 of 30 layers + output on the GPU")
               for x in reduced.splitlines()), reduced

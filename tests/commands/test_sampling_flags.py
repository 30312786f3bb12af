"""The sampling flags of run, chat and tui: one set of defaults (llama.cpp's),
every flag reaching the config, and a bad value one line with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.cli import build_parser
from localllm.engine_api import SamplingConfig
from localllm.flags import Sampling
from localllm.serve.protocol import parse_gen
from localllm.tui.cli import settings_from_args
from tests.helpers.cli import cli, one_line

# llama.cpp's defaults (common/common.h: common_params_sampling; n_predict -1)
LLAMA_CPP = SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, seed=None, max_tokens=-1)
FLAGS = ["--temp", "0.3", "--top-k", "7", "--top-p", "0.5", "--min-p", "0.2", "--repeat-penalty", "1.3", "--seed", "42", "-n", "99"]
ASKED = SamplingConfig(temperature=0.3, top_k=7, top_p=0.5, min_p=0.2, repeat_penalty=1.3, seed=42, max_tokens=99)


def _parse(command: str, *argv: str):
    return build_parser().parse_args([command, *(["-p", "x"] if command == "run" else []), *argv])


def test_one_set_of_defaults_everywhere() -> None:
    assert SamplingConfig() == LLAMA_CPP
    assert Sampling.from_args(_parse("run")).config() == LLAMA_CPP
    assert Sampling.from_args(_parse("chat")).config() == LLAMA_CPP
    assert settings_from_args(_parse("tui")).sampling() == LLAMA_CPP
    body = parse_gen({"messages": [{"role": "user", "content": "hi"}]}, chat=True, n_vocab=100)
    assert (body.temperature, body.top_p) == (LLAMA_CPP.temperature, LLAMA_CPP.top_p)


@pytest.mark.parametrize("command", ["run", "chat"])
def test_every_flag_reaches_the_sampling(command: str) -> None:
    assert Sampling.from_args(_parse(command, *FLAGS)).config() == ASKED
    assert Sampling.from_args(_parse(command, "--max-tokens", "5")).config().max_tokens == 5


def test_tui_flags_reach_the_settings() -> None:
    assert settings_from_args(_parse("tui", *FLAGS)).sampling() == ASKED


@pytest.mark.parametrize("command", ["run", "chat", "tui"])
@pytest.mark.parametrize(
    "args, needle",
    [
        (["--top-k", "-1"], "--top-k must be at least 0, got -1"),
        (["--top-k", "2.5"], "'2.5' is not a whole number"),
        (["--top-p", "1.5"], "--top-p must be from 0 to 1, got 1.5"),
        (["--min-p", "nan"], "--min-p must be a finite number"),
        (["--min-p", "-0.1"], "--min-p must be from 0 to 1"),
        (["--repeat-penalty", "0"], "--repeat-penalty must be above 0, got 0"),
        (["--repeat-penalty", "x"], "'x' is not a number"),
        (["--seed", "-3"], "--seed must be at least 0"),
        (["--max-tokens", "0"], "-n must be -1 (until the model stops) or at least 1"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(synth_model: Path, command: str, args: list[str], needle: str) -> None:
    argv = [command, str(synth_model), *(["-p", "x"] if command == "run" else []), *args]
    one_line(cli(*argv), 2, needle, "--help")

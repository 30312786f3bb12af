"""The engine's errors name the cause; the CLI words them with its flags."""

from __future__ import annotations

import ast
import re

import pytest

from localllm.commands.advice import FLAGS, cli_message
from localllm.engine_api import LoadConfig
from localllm.engine_api.errors import LIBRARY_NAMES, ContextFull, InvalidSetting
from localllm.errors import EXIT_ERROR, EXIT_USAGE, UsageError
from tests.helpers.paths import REPO


def test_a_setting_is_named_for_the_library_and_for_the_cli() -> None:
    exc = InvalidSetting("the prompt is 5000 tokens but the context holds 4096: try {n_ctx} 5376")
    assert str(exc) == "the prompt is 5000 tokens but the context holds 4096: try n_ctx 5376"
    assert cli_message(exc) == "the prompt is 5000 tokens but the context holds 4096: try --ctx 5376"
    assert exc.settings == ("n_ctx",) and exc.exit_code == EXIT_USAGE and isinstance(exc, UsageError)
    assert ContextFull("raise {n_ctx}").exit_code == EXIT_ERROR


def test_other_braces_are_left_alone() -> None:
    exc = InvalidSetting("{template} {weird}.jinja: no such file")
    assert str(exc) == "the template {weird}.jinja: no such file"
    assert cli_message(exc) == "--template {weird}.jinja: no such file"


def test_every_setting_has_a_flag_or_says_it_has_none() -> None:
    """A setting the engine can name has a CLI flag, except the ones only the library sets."""
    assert set(LIBRARY_NAMES) - set(FLAGS) == {"n_outputs_max"}


def test_check_config_names_the_field() -> None:
    from localllm.engine.model import check_config

    with pytest.raises(InvalidSetting) as info:
        check_config(LoadConfig(n_ctx=0))
    assert info.value.settings == ("n_ctx",) and str(info.value).startswith("n_ctx must be between 1 and")
    assert cli_message(info.value).startswith("--ctx must be between 1 and")


def test_the_engine_speaks_no_cli_flags() -> None:
    """No string in the engine or its boundary (docstrings and comments aside)
    names a command-line flag: the CLI translates (``commands.advice``)."""
    flag = re.compile(r"(?<![\w-])--[a-z][a-z-]+")
    bad = []
    for folder in ("engine", "engine_api"):
        for p in sorted((REPO / "localllm" / folder).glob("*.py")):
            tree = ast.parse(p.read_text(encoding="utf-8"))
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                    and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs and flag.search(node.value):
                    bad.append(f"{p.relative_to(REPO)}:{node.lineno}: {node.value[:60]!r}")
    assert bad == []

"""The router finds models by name only: a path, control characters or a name
past 256 characters are refused before the registry is asked; ``:latest`` (as
Ollama lists a name without a tag) finds the name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from localllm.errors import InputError
from localllm.router import catalog
from localllm.store.registry import ModelEntry

ENTRIES = [ModelEntry("smollm2", Path("/m/smol.gguf"), "embedded", ("smollm2-135m",)),
           ModelEntry("llama-3.2-1b-instruct:q4_k_m", Path("/m/llama.gguf"), "pulled", ("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",))]


@pytest.mark.parametrize("name", ["../../etc/passwd", "/tmp/x.gguf", "./x.gguf", "~/x.gguf", "a\\b", "x/../y", "a\nb", "a\x00b",
                                  "\u202eab", "x" * 257, "", "  "])
def test_names_no_model_has_are_refused(name: str) -> None:
    with pytest.raises(catalog.BadName):
        catalog.check_name(name)


@pytest.mark.parametrize("value", [7, None, ["smollm2"], {"name": "x"}])
def test_a_model_field_that_is_not_a_string_is_refused(value: object) -> None:
    with pytest.raises(catalog.BadName, match="must be a string"):
        catalog.check_name(value)


def find(name: str, only=None) -> ModelEntry:
    async def go() -> ModelEntry:
        return await catalog.Catalog(only, discover=lambda: ENTRIES).find(name)

    return asyncio.run(go())


def test_names_aliases_and_ollamas_latest_find_the_model() -> None:
    assert find("smollm2").name == find("SmolLM2").name == find("smollm2:latest").name == find("smollm2-135m").name == "smollm2"
    assert find("llama-3.2-1b-instruct").name == "llama-3.2-1b-instruct:q4_k_m"
    assert find("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M").name == "llama-3.2-1b-instruct:q4_k_m"  # an alias with a slash is a name


def test_an_unknown_name_says_where_the_names_are() -> None:
    with pytest.raises(catalog.Unknown, match="localllm list.*localllm pull"):
        find("gpt-4")
    with pytest.raises(catalog.Unknown, match="--models"):
        find("llama-3.2-1b-instruct", only=["smollm2"])


def test_models_flag_names_resolve_or_fail_in_one_line() -> None:
    assert catalog.served_names(["smollm2-135m", "llama-3.2-1b-instruct", "smollm2"], ENTRIES) == ["smollm2", "llama-3.2-1b-instruct:q4_k_m"]
    with pytest.raises(InputError, match="'nope' not found: localllm list"):
        catalog.served_names(["smollm2", "nope"], ENTRIES)

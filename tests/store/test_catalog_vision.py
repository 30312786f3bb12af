"""The catalog's vision models: their projector is listed, pulled beside them
and counted against the GPU budget in their verdicts."""

from __future__ import annotations

import dataclasses

from localllm.store import curated
from localllm.util.units import GB


def _model(name: str) -> curated.CatalogModel:
    return next(m for m in curated.load() if m.name == name)


def test_vision_models_carry_a_projector_that_the_verdict_counts() -> None:
    vision = [m for m in curated.load() if m.mmproj is not None]
    assert len(vision) >= 2 and all(m.architecture != "qwen2vl" for m in vision)  # M-RoPE projectors are not driven
    gemma = _model("gemma-3-4b-it")
    assert gemma.mmproj is not None
    reserved = gemma.mmproj.reserved_bytes()
    # the weights plus a compute buffer for 896 px / 14 px patches: tens of MiB at least, less than the weights
    assert int(gemma.mmproj.size_gb * GB) + 50 * 2**20 < reserved < 2 * int(gemma.mmproj.size_gb * GB)
    q8 = next(f for f in gemma.files if f.quant == "Q8_0")
    with_projector = curated.judge(gemma, q8, "4gib")
    text_only = curated.judge(dataclasses.replace(gemma, mmproj=None), q8, "4gib")
    assert with_projector.text != text_only.text  # the projector's GiB leave fewer layers (or less context) on a 4 GiB GPU


def test_list_catalog_marks_vision_models() -> None:
    rows = [r for r in curated.rows() if r["vision"]]
    assert {r["name"] for r in rows} >= {"gemma-3-4b-it", "smolvlm2-2.2b-instruct"}
    assert all(r["mmproj_file"].startswith("mmproj") and r["mmproj_size_bytes"] > 0 for r in rows)
    assert not any(r["mmproj_file"] for r in curated.rows() if not r["vision"])


def test_the_cockpits_tool_hint_names_catalog_models() -> None:
    from localllm.tui.tools import BETTER

    assert set(BETTER) <= {m.name for m in curated.load()}


def test_sizes_are_approximate_until_pull_has_stored_the_files(tmp_path, monkeypatch) -> None:
    """The Hub listing's rounded figure (≈) until the model and its projector are here; then the files' own."""
    import json

    from localllm.store import registry
    from tests.helpers.cli import cli

    row = next(r for r in curated.rows() if r["name"] == "gemma-3-4b-it")
    model = tmp_path / row["file"]
    model.write_bytes(b"\0" * 12345)
    (tmp_path / row["mmproj_file"]).write_bytes(b"\0" * 678)
    entry = registry.ModelEntry(name="gemma-3-4b-it", path=model, source="hf", repo=row["repo"], filename=row["file"])
    before = {(r["name"], r["quant"]): r for r in json.loads(cli("list", "--catalog", "--json").stdout)}
    assert before[(row["name"], row["quant"])]["size_approximate"] is True and before[(row["name"], row["quant"])]["here"] is False
    monkeypatch.setattr(registry, "discover", lambda: [entry])
    after = {(r["name"], r["quant"]): r for r in json.loads(cli("list", "--catalog", "--json").stdout)}
    got = after[(row["name"], row["quant"])]
    assert got["here"] and (got["size_bytes"], got["size_approximate"]) == (12345, False)
    assert (got["mmproj_size_bytes"], got["mmproj_size_approximate"]) == (678, False)
    others = [r for k, r in after.items() if k != (row["name"], row["quant"])]
    assert all(r["size_approximate"] for r in others) and all(r["mmproj_size_approximate"] is None for r in others if not r["vision"])
    line = next(x for x in cli("list", "--catalog").stdout.splitlines() if x.startswith("gemma-3-4b-it (vision)") and "yes" in x)
    assert "≈" not in line and "0.00 GiB + 0.00 GiB mmproj" in line, line  # the files' sizes, not the listing's ≈3.x GiB

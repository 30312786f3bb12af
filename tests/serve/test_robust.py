"""``localllm serve`` against hostile or unlucky clients and operators: an empty
API key, half-sent requests, the model still loading, repeated signals."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.cli import cli


def test_empty_api_key_is_a_usage_error(tmp_path: Path) -> None:
    """``--api-key ""`` would otherwise run with no authentication at all."""
    for key in ("", "  "):
        proc = cli("serve", str(tmp_path / "missing.gguf"), "--api-key", key)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "--api-key is empty" in lines[0] and "leave --api-key out" in lines[0]

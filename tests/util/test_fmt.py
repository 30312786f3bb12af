"""Names made safe to print."""

from __future__ import annotations


def test_fmt_safe() -> None:
    from localllm.util.fmt import safe, table

    assert safe("plain name: q4_k_m") == "plain name: q4_k_m"
    assert safe("a\nb\tc\x1b[0m\x7f\u202e\x00") == "a\\nb\\tc\\x1b[0m\\x7f\\u202e\\x00"
    assert safe("caf\udce9") == "caf\\udce9"  # an undecodable byte of a file name
    assert "\n" not in table(("A", "B"), [("x\ny", "z\r")]).splitlines()[1]

"""Where an image goes in a prompt's text: libmtmd's media marker.

``mtmd_tokenize`` puts the n-th image where the n-th ``<__media__>`` stands
(``mtmd_default_marker``, ``$V/tools/mtmd/mtmd.cpp``), so typed text must never
carry the marker itself: it would claim an image slot.
"""

from __future__ import annotations

MARKER = "<__media__>"


def strip_marker(text: str) -> str:
    """Typed text with the media marker taken out."""
    return text.replace(MARKER, "")


def with_images(text: str, n_images: int) -> str:
    """``text`` after one marker line per image (images first, as Ollama and LM Studio place them)."""
    return "".join(MARKER + "\n" for _ in range(n_images)) + strip_marker(text)

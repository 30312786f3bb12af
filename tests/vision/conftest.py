"""The synthetic vision model (scripts/make_vision_model.py), written once per module."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from scripts.make_vision_model import write_vision_model


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(text model of n_embd 64, its gemma3-type projector of 4 tokens an image), side by side."""
    return write_vision_model(tmp_path_factory.mktemp("vision"))


def noise_png(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    """A PNG of random pixels: two seeds, two pictures that share nothing."""
    import numpy as np

    a = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()

"""Images through the router: a vision model's child takes a request of several
MiB (base64 pictures), which the router must pass on whole rather than cut at a
text model's 1 MiB (serve.media.MEDIA_BODY bounds both)."""

from __future__ import annotations

import base64
import io
import shutil
from pathlib import Path

import pytest

from tests.helpers import router as rt
from tests.helpers.server import openai_client

pytestmark = pytest.mark.slow


def _noise_png(side: int, seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def test_a_vision_model_behind_the_router_takes_a_picture_of_several_mib(tmp_path: Path) -> None:
    from scripts.make_vision_model import write_vision_model

    env = rt.isolated_env(tmp_path)
    made = tmp_path / "made"
    made.mkdir()
    model, proj = write_vision_model(made)
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copyfile(model, folder / "eye.gguf")
    shutil.copyfile(proj, folder / "mmproj-eye.gguf")  # beside the model: the child finds it as run does
    name = rt.add(env, folder / "eye.gguf")
    picture = _noise_png(900, 3)
    assert len(picture) > 2 * 1024 * 1024  # over a text model's body bound once in base64
    uri = "data:image/png;base64," + base64.b64encode(picture).decode()
    s = rt.start(env, "--template", "chatml")
    try:
        client = openai_client(s)
        r = client.chat.completions.create(model=name, max_tokens=2, temperature=0, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": "what is it?"}]}])
        assert r.model_extra["timings"]["images"] == 1 and r.model_extra["timings"]["encode_n"] == 1
    finally:
        s.stop()

"""``file://`` pictures under ``--media-path`` only, as llama-server reads them
(its tools/server/tests/unit/test_security.py::test_local_media_file): a
synthetic vision model served in-process, llama.cpp's own test-1.jpeg."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from localllm import runtime
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.serve import ServeOptions, Server
from localllm.serve.media import ImageError, ImagePart, picture_bytes

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)


def _picture(tmp: Path) -> Path:
    """A JPEG under ``tmp/mtmd`` (llama.cpp's test-1.jpeg where the build left it, else one drawn here)."""
    (tmp / "mtmd").mkdir(parents=True, exist_ok=True)
    out = tmp / "mtmd" / "test-1.jpeg"
    from scripts import llama_tools

    try:
        src = llama_tools.source_dir() / "tools" / "mtmd" / "test-1.jpeg"
    except Exception:  # noqa: BLE001 - no vendored source here: draw one
        src = None
    if src is not None and src.is_file():
        shutil.copyfile(src, out)
    else:
        from PIL import Image

        Image.new("RGB", (64, 48), (200, 30, 30)).save(out, "JPEG")
    return out


def test_file_urls_are_read_under_the_media_path_only(tmp_path: Path) -> None:
    picture = _picture(tmp_path / "media")
    (tmp_path / "secret.jpeg").write_bytes(picture.read_bytes())
    root = tmp_path / "media"
    assert picture_bytes(ImagePart("p", "file://mtmd/test-1.jpeg", "m"), root) == picture.read_bytes()
    assert picture_bytes(ImagePart("p", "file:////mtmd//test-1.jpeg", "m"), root) == picture.read_bytes()
    for url, words in (("file://../secret.jpeg", "not allowed"), ("file://mtmd/../../secret.jpeg", "not allowed"),
                       ("file://mtmd/notfound.jpeg", "does not exist"), ("file://mtmd", "does not exist"), ("file://", "not allowed")):
        with pytest.raises(ImageError, match=words):
            picture_bytes(ImagePart("p", url, "m"), root)
    with pytest.raises(ImageError, match="--media-path"):
        picture_bytes(ImagePart("p", "file://mtmd/test-1.jpeg", "m"), None)


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from scripts.make_vision_model import write_vision_model

    d = tmp_path_factory.mktemp("media-path")
    write_vision_model(d)
    media = d / "tools"
    _picture(media)
    request = runtime.LoadRequest(model=d / "model.gguf", options=fitting.LoadOptions(threads=1, n_gpu_layers=0), hardware=ROOMY,
                                  serving=True, projector=d / "mmproj-model.gguf")
    with runtime.open_model(request) as loaded:
        with Server(loaded, ServeOptions(port=0, media_path=media), say=lambda _: None).start() as server:
            yield server.url


@pytest.mark.slow
@pytest.mark.parametrize("url,ok", [("file://mtmd/test-1.jpeg", True), ("file:////mtmd//test-1.jpeg", True),
                                    ("file://mtmd/notfound.jpeg", False), ("file://../mtmd/test-1.jpeg", False)])
def test_a_chat_reads_a_file_url_as_llama_server_does(vision: str, url: str, ok: bool) -> None:
    body = {"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "test"},
                                                                       {"type": "image_url", "image_url": {"url": url}}]}]}
    r = httpx.post(f"{vision}/chat/completions", json=body, timeout=120)
    assert r.status_code == (200 if ok else 400), r.text
    if not ok:
        assert r.json()["error"]["param"] == "messages[0].content[1]"

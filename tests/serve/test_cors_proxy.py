"""``/cors-proxy`` (``--ui-mcp-proxy``), as llama.cpp's tools/server/tests/unit/
test_proxy.py and test_security.py call it: off is a 403; on, a page's request
reaches the URL with only the headers it names, and the answer comes back as it
was (a 204 included); a loopback target server captures what arrives."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx2
import pytest

from localllm import runtime
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.serve import ServeOptions, Server

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)
pytestmark = pytest.mark.slow


class _Target(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.captured = dict(self.headers)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"Example Domain")

    def do_POST(self) -> None:  # noqa: N802
        self.server.body = self.rfile.read(int(self.headers.get("Content-Length", 0)))  # type: ignore[attr-defined]
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def servers(smollm2: Path) -> Iterator[tuple[str, str, ThreadingHTTPServer]]:
    target = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    request = runtime.LoadRequest(model=smollm2, options=fitting.LoadOptions(n_ctx=512, threads=1, n_gpu_layers=0), hardware=ROOMY,
                                  serving=True)
    try:
        with runtime.open_model(request) as loaded:
            with Server(loaded, ServeOptions(port=0, api_key="k", ui_mcp_proxy=True), say=lambda _: None).start() as on:
                yield f"http://127.0.0.1:{on.port}", f"http://127.0.0.1:{target.server_port}", target
    finally:
        target.shutdown()
        target.server_close()


def test_only_the_headers_a_page_names_reach_the_target(servers: tuple[str, str, ThreadingHTTPServer]) -> None:
    base, target_url, target = servers
    r = httpx2.get(f"{base}/cors-proxy", params={"url": f"{target_url}/capture"}, headers={
        "Authorization": "Bearer k", "Proxy-Authorization": "Basic secret", "X-Api-Key": "k", "Cookie": "session=secret",
        "x-llama-server-proxy-header-accept": "application/json", "x-llama-server-proxy-header-authorization": "Bearer explicit"})
    assert r.status_code == 200 and r.text == "Example Domain"
    got = {k.lower(): v for k, v in target.captured.items()}  # type: ignore[attr-defined]
    assert got["accept"] == "application/json" and got["authorization"] == "Bearer explicit"
    assert not {"proxy-authorization", "x-api-key", "cookie"} & set(got)


def test_a_post_and_its_204_pass_through_and_bad_urls_are_400s(servers: tuple[str, str, ThreadingHTTPServer]) -> None:
    base, target_url, target = servers
    h = {"Authorization": "Bearer k"}
    r = httpx2.post(f"{base}/cors-proxy", params={"url": f"{target_url}/"}, headers=h, json={"a": 1})
    assert r.status_code == 204 and r.content == b"" and target.body == b'{"a":1}'  # type: ignore[attr-defined]
    own = httpx2.get(f"{base}/cors-proxy", params={"url": f"{base}/models"},
                     headers={**h, "x-llama-server-proxy-header-authorization": "Bearer k"})
    assert own.status_code == 200 and "data" in own.json()  # the server's own API, through the proxy (llama-server's test)
    for url in ("file:///etc/passwd", "http://user:pw@127.0.0.1/", "http:///x", ""):
        assert httpx2.get(f"{base}/cors-proxy", params={"url": url}, headers=h).status_code == 400, url
    assert httpx2.get(f"{base}/cors-proxy", params={"url": f"{target_url}/"}).status_code == 401  # behind the key


def test_without_the_flag_it_is_a_403(smollm2: Path) -> None:
    request = runtime.LoadRequest(model=smollm2, options=fitting.LoadOptions(n_ctx=256, threads=1, n_gpu_layers=0), hardware=ROOMY,
                                  serving=True, parallel=1)
    with runtime.open_model(request) as loaded, Server(loaded, ServeOptions(port=0), say=lambda _: None).start() as off:
        r = httpx2.get(f"http://127.0.0.1:{off.port}/cors-proxy", params={"url": "http://127.0.0.1:9/"})
    assert r.status_code == 403 and "--ui-mcp-proxy" in r.json()["error"]["message"]

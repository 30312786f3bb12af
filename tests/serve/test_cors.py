"""CORS as llama-server's tests state it (tools/server/tests/unit/test_security.py:
--cors-origins localhost reflects this machine's pages on any port and refuses
look-alikes; a refused preflight is a 200 with no Allow-Origin), on a real
Starlette app through its test client."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from localllm.serve.cors import origins_of, with_cors

PRE = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}


def _client(*origins: str) -> TestClient:
    app = Starlette(routes=[Route("/completions", lambda r: JSONResponse({"ok": True}), methods=["POST", "GET"])])
    return TestClient(with_cors(app, origins_of(list(origins))))


@pytest.mark.parametrize("origin", ["http://localhost", "http://localhost:8080", "http://127.0.0.1", "http://127.0.0.1:3000",
                                    "http://[::1]", "http://[::1]:3000", "https://localhost:5173"])
def test_localhost_reflects_this_machines_pages(origin: str) -> None:
    r = _client("localhost").options("/completions", headers={"Origin": origin, **PRE})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    assert r.headers["access-control-allow-credentials"] == "true"
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert r.headers["access-control-allow-headers"] == "Authorization"  # what the page asks for: "*" would not cover it
    assert b"Access-Control-Allow-Origin" in [k for k, _ in r.headers.raw]  # in llama-server's case: some clients look it up so


@pytest.mark.parametrize("origin", ["http://web.mydomain.fr", "http://evil.com", "http://notlocalhost", "http://localhost.evil.com",
                                    "http://localhost@evil.com", "file://localhost", "http://localhost:99999", "null"])
def test_localhost_refuses_look_alikes(origin: str) -> None:
    c = _client("localhost")
    r = c.options("/completions", headers={"Origin": origin, **PRE})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    r = c.post("/completions", headers={"Origin": origin})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_a_list_a_star_and_none() -> None:
    c = _client("http://a.example,http://b.example")
    for origin, allowed in (("http://a.example", True), ("http://B.example", True), ("http://c.example", False)):
        r = c.post("/completions", headers={"Origin": origin})
        assert (r.headers.get("access-control-allow-origin") == origin) is allowed
    r = _client("*").get("/completions", headers={"Origin": "http://anywhere.example"})
    assert r.headers["access-control-allow-origin"] == "http://anywhere.example"  # echoed, as llama-server with credentials
    r = _client().options("/completions", headers={"Origin": "http://localhost", **PRE})
    assert r.status_code == 405 and not [h for h in r.headers if h.startswith("access-control-")]  # no --cors: no CORS at all


def test_the_default_allows_any_page_only_where_a_key_is_asked() -> None:
    """serve without --cors: any origin with an API key (llama-server's default; a page
    needs the key to get in), this machine's pages with --tools, else no CORS at all."""
    from localllm.commands.serve import default_cors

    assert default_cors((), (), "k") == ("*",)
    assert default_cors((), ("read_file",), "k") == default_cors((), ("read_file",), None) == ("localhost",)
    assert default_cors((), (), None) == ()
    assert default_cors(("http://a.example",), (), "k") == ("http://a.example",)
    keyed = _client(*default_cors((), (), "k"))
    r = keyed.options("/completions", headers={"Origin": "web.mydomain.fr", **PRE})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "web.mydomain.fr"
    assert r.headers["Access-Control-Allow-Credentials"] == "true" and r.headers["Access-Control-Allow-Headers"] == "Authorization"
    open_server = _client(*default_cors((), (), None))
    assert "Access-Control-Allow-Origin" not in open_server.options("/completions", headers={"Origin": "http://evil.com", **PRE}).headers

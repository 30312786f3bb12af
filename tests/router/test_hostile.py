"""A real router under a flood of bad input (issue 46): 1,000 requests at once
naming 50 models, most unknown, some shaped like paths to files that exist,
some with control characters, 10,000 characters long or not strings at all,
and a few naming a real model. Each gets a clear 4xx, or 200 / 503 with
Retry-After for the real one; the router stays up, small and quiet, and never
loads anything but the model named."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import pytest

from tests.helpers import router as rt
from tests.helpers.server import KEY, http_client

pytestmark = pytest.mark.slow

REQUESTS = 1000
REAL = "smollm2"


def names(secret: Path) -> list[object]:
    """The 50 ``model`` values of the flood."""
    up = "../" * 12 + str(secret).lstrip("/")
    rel = os.path.relpath(secret, Path.cwd())
    bad: list[object] = [
        "../../etc/passwd", "/etc/passwd", str(secret), up, rel if rel.startswith("..") else "../" + rel, "./secret.gguf",
        "~/secret.gguf", "..\\..\\windows\\win.ini", "x/../../etc/passwd", "a\x00b", "smollm2\n", "red\x1b[31m", "tab\tname",
        "a" * 10_000, "", "   ", 123, 1.5, True, ["smollm2"], {"name": "smollm2"},
    ]
    unknown: list[object] = ["%2e%2e/x", "secret.gguf", "secret", "etc/passwd", "llama3.2:1b", "nosuch:latest",
                             "owner/repo", "hf.co/x/y:Q4_K_M", "Ünïcödé-模型"]
    unknown += [f"nosuch-{i}" for i in range(17)]
    out = bad + unknown + [REAL] * 3
    assert len(out) == 50 and len({repr(n) for n in out}) == 48
    return out


def is_unknown(name: object) -> bool:
    return isinstance(name, str) and name not in ("", "   ") and name.isprintable() and len(name) <= 256 and not (
        name.startswith(("/", ".", "~", "\\")) or "\\" in name or ".." in name) and name != REAL


def extras(secret: Path) -> list[tuple[str, str, dict, tuple[int, ...]]]:
    """Other bad shapes, one at a time: bodies that are not objects, names in the
    query, the management routes given paths (none may touch the file)."""
    chat = "/v1/chat/completions"
    up = "../" * 12 + str(secret).lstrip("/")
    out: list[tuple[str, str, dict, tuple[int, ...]]] = [
        ("POST", chat, {"content": b"{not json"}, (400,)),
        ("POST", chat, {"json": ["smollm2"]}, (400,)),
        ("POST", chat, {"json": "smollm2"}, (400,)),
        ("POST", chat, {"content": b"\xff\xfe"}, (400,)),
        ("POST", chat, {"json": {"model": "../../etc/passwd", "messages": []}, "params": {"model": "smollm2"}}, (400,)),
        ("GET", "/v1/models/../../etc/passwd", {}, (404,)),
        ("POST", "/api/chat", {"json": {"model": REAL, "messages": [], "keep_alive": "forever and a day"}}, (400,)),
        ("POST", "/api/chat", {"json": {"model": REAL, "messages": [], "keep_alive": [1]}}, (400,)),
    ]
    for name in (str(secret), up, "../../etc/passwd", "nosuch", 7):
        want = (404,) if name == "nosuch" else (400,)
        out += [("POST", "/models/load", {"json": {"model": name}}, want),
                ("POST", "/models/unload", {"json": {"model": name}}, want),
                ("DELETE", "/api/delete", {"json": {"model": name}}, want + (404,))]
    return out


async def flood(base: str, values: list[object]) -> list[tuple[object, str, int, dict, str]]:
    import httpx2

    routes = ("/v1/chat/completions", "/api/chat", "/v1/completions", "/api/generate")
    limits = httpx2.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx2.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=300, limits=limits,
                                  trust_env=False) as client:
        async def one(i: int) -> tuple[object, str, int, dict, str]:
            name = values[i % len(values)]
            route = routes[i % len(routes)]
            if route in ("/v1/chat/completions", "/api/chat"):
                body: dict = {"model": name, "messages": [{"role": "user", "content": "Hi"}]}
            else:
                body = {"model": name, "prompt": "Hi"}
            body.update({"max_tokens": 1, "stream": False} if route.startswith("/v1") else {"options": {"num_predict": 1}, "stream": False})
            r = await client.post(route, json=body)
            return name, route, r.status_code, dict(r.headers), r.text

        return await asyncio.gather(*(one(i) for i in range(REQUESTS)))


def test_a_flood_of_bad_names_gets_clear_answers_and_loads_nothing_else(tmp_path: Path, smollm2: Path) -> None:
    import psutil

    env = rt.isolated_env(tmp_path)
    secret = rt.copy_of(smollm2, tmp_path / "outside", "secret.gguf")  # a loadable model outside every store
    router = rt.start(env)
    try:
        with http_client(router) as http:
            warm = http.post("/v1/chat/completions", json={"model": REAL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
            assert warm.status_code == 200, warm.text
        proc = psutil.Process(router.proc.pid)
        before = proc.memory_info().rss
        values = names(secret)
        t0 = time.monotonic()
        results = asyncio.run(flood(router.base, values))
        took = time.monotonic() - t0
        after = proc.memory_info().rss
        statuses: dict[int, int] = {}
        wrong: list[str] = []
        for name, route, status, headers, text in results:
            statuses[status] = statuses.get(status, 0) + 1
            where = f"{route} {name!r:.80}: {status} {text[:300]}"
            if name in (REAL, ""):  # "" names no model: the only loaded one answers (the router's rule)
                ok = status == 200 or (status == 503 and "retry-after" in headers)
            elif is_unknown(name):
                ok = status == 404 and "localllm list" in text
            else:
                ok = status == 400
            if not ok:
                wrong.append(where)
        print(f"\nflood: {REQUESTS} requests in {took:.2f} s, statuses {dict(sorted(statuses.items()))}, "
              f"RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB")
        assert not wrong, "\n".join(sorted(set(wrong))[:40])
        assert after - before < 100 * 2**20
        assert router.proc.poll() is None
        with http_client(router) as http:
            for method, path, kw, want in extras(secret):
                r = http.request(method, path, **kw)
                if r.status_code not in want:
                    wrong.append(f"{method} {path} {kw!r:.100}: {r.status_code} {r.text[:200]}")
            assert not wrong, "\n".join(wrong)
            assert secret.exists()
            assert http.get("/health").json() == {"status": "ok"}
            chat = http.post("/v1/chat/completions", json={"model": REAL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
            assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"], chat.text
            ps = http.get("/api/ps").json()
        assert [m["name"].split(":")[0] for m in ps["models"]] == [REAL]
        loading = {m.group(1) for line in router.lines for m in [re.search(r"^localllm: (?:loading|loaded) (\S+)", line)] if m}
        assert loading == {REAL}, loading
        assert rt.count(router, r"^localllm: loaded smollm2 in ") == 1
        assert "Traceback" not in router.log
        assert str(secret) not in router.log or all("loading" not in ln for ln in router.lines if str(secret) in ln)
    finally:
        router.stop()


def test_the_routers_timeout_closes_a_half_sent_request(tmp_path: Path) -> None:
    """``serve --timeout`` in router mode bounds a request's head on the router's own
    socket, as ``serve MODEL`` does (tests/serve/test_robust.py): 408, then closed."""
    import socket

    router = rt.start(rt.isolated_env(tmp_path), "--timeout", "1")
    try:
        host, port = router.base.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            t0 = time.monotonic()
            answer = s.recv(1000)
            waited = time.monotonic() - t0
    finally:
        router.stop()
    assert answer.startswith(b"HTTP/1.1 408 ") and 0.5 < waited < 6, (answer, waited)

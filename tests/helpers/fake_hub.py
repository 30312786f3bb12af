"""A loopback HTTP server that answers the Hub endpoints huggingface_hub calls.

- ``GET /api/models/<repo>/tree/<rev>?recursive=True``: the file list (path, size,
  git oid, LFS sha256), as ``HfApi.list_repo_tree`` reads it;
- ``HEAD|GET /<repo>/resolve/<rev>/<file>``: 302 to a "CDN" on another host name
  (``localhost`` when the endpoint is ``127.0.0.1``), with ``X-Repo-Commit``,
  ``X-Linked-Etag`` and ``X-Linked-Size``, as the real Hub answers for LFS files;
- ``GET /cdn/<sha256>``: the bytes, with ``Range`` support (206).

Knobs for the tests: ``trickle`` (seconds between 64 KiB chunks, so a client can
be interrupted mid-file), ``corrupt`` (serve wrong bytes for a file), ``cut_after``
(drop the connection after N bytes, once), ``stall_after`` (stop sending after N
bytes and keep the connection open until ``stop()``; from then on no request
is answered: a server that stopped). Every request is logged in ``requests``.

A hostile hub, for the tests that hold that its answers cannot write outside the
cache: ``commit`` can be any string (a traversal), ``extra_tree`` adds raw entries
to the listing (traversal or escape-sequence names), ``size_delta`` announces a
size other than what is served, ``redirect_loop`` makes the CDN (``"cdn"``) or the
resolve endpoint (``"resolve"``, a relative redirect) point at itself forever.

``hf_hub_from_env`` points huggingface_hub, imported once in the test process,
at the endpoint in the environment, for in-process ``cli()`` calls.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import threading
import time
import types
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    import pytest


@dataclass
class Served:
    repo_id: str
    filename: str
    path: Path
    sha256: str
    size: int


@dataclass
class FakeHub:
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    files: dict[tuple[str, str], Served] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Range)
    authorized: list[tuple[str, bool]] = field(default_factory=list)  # (path, sent an Authorization header)
    trickle: float = 0.0
    corrupt: set[str] = field(default_factory=set)
    cut_after: int | None = None
    stall_after: int | None = None  # stop sending a CDN body after this many bytes, keeping the connection open (until stop())
    dead: bool = False  # set when the stall happened: from then on no request is answered (a server that stopped)
    released: threading.Event = field(default_factory=threading.Event)
    extra_tree: list[dict] = field(default_factory=list)
    size_delta: int = 0
    redirect_loop: str | None = None
    server: ThreadingHTTPServer | None = None

    def add(self, repo_id: str, filename: str, path: Path) -> Served:
        data = path.read_bytes()
        s = Served(repo_id, filename, path, hashlib.sha256(data).hexdigest(), len(data))
        self.files[(repo_id, filename)] = s
        return s

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._route(head=True)

            def do_GET(self) -> None:
                self._route(head=False)

            def _route(self, head: bool) -> None:
                if hub.dead:  # it stopped answering: the connection stays open, nothing comes
                    hub.released.wait()
                    return
                url = urlparse(self.path)
                hub.requests.append((self.command, url.path, self.headers.get("Range")))
                hub.authorized.append((url.path, "Authorization" in self.headers))
                path = unquote(url.path)
                m = re.fullmatch(r"/api/models/(.+)/tree/([^/]+)", path)
                if m:
                    return self._tree(m.group(1), head)
                m = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
                if m:
                    return self._cdn(m.group(1), head)
                m = re.fullmatch(r"/(.+?/.+?)/resolve/([^/]+)/(.+)", path) or re.fullmatch(r"/([^/]+)/resolve/([^/]+)/(.+)", path)
                if m:
                    return self._resolve(m.group(1), m.group(3), head)
                self._send(404, {"X-Error-Code": "RepoNotFound"}, b'{"error":"not found"}', head)

            def _send(self, status: int, headers: dict[str, str], body: bytes, head: bool) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _tree(self, repo_id: str, head: bool) -> None:
                items = [
                    {"type": "file", "oid": hashlib.sha1(s.sha256.encode()).hexdigest(), "size": s.size, "path": s.filename,
                     "lfs": {"oid": s.sha256, "size": s.size, "pointerSize": 134}}
                    for (r, _), s in hub.files.items() if r == repo_id
                ] + list(hub.extra_tree)
                if not items:
                    return self._send(404, {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"}, b'{"error":"Repository not found"}', head)
                self._send(200, {"Content-Type": "application/json"}, json.dumps(items).encode(), head)

            def _resolve(self, repo_id: str, filename: str, head: bool) -> None:
                s = hub.files.get((repo_id, filename))
                if s is None:
                    known = any(r == repo_id for r, _ in hub.files)
                    code = "EntryNotFound" if known else "RepoNotFound"
                    return self._send(404, {"X-Error-Code": code, "X-Repo-Commit": hub.commit}, b"{}", head)
                if hub.redirect_loop == "resolve":
                    return self._send(302, {"Location": self.path}, b"", head)
                cdn = f"http://localhost:{hub.port}/cdn/{s.sha256}"
                self._send(302, {
                    "Location": cdn, "X-Repo-Commit": hub.commit, "X-Linked-Etag": f'"{s.sha256}"',
                    "X-Linked-Size": str(s.size + hub.size_delta), "ETag": '"a-git-oid"',
                }, b"", head)

            def _cdn(self, sha: str, head: bool) -> None:
                s = next((f for f in hub.files.values() if f.sha256 == sha), None)
                if s is None:
                    return self._send(404, {}, b"", head)
                if hub.redirect_loop == "cdn":
                    return self._send(302, {"Location": self.path}, b"", head)
                data = s.path.read_bytes()
                if s.filename in hub.corrupt:
                    data = bytes(len(data))
                start, end = 0, len(data) - 1
                rng = self.headers.get("Range")
                status = 200
                if rng:
                    m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
                    if m:
                        start = int(m.group(1))
                        end = min(int(m.group(2)), end) if m.group(2) else end
                        status = 206
                body = data[start : end + 1]
                headers = {"Content-Length": str(len(body)), "Accept-Ranges": "bytes", "ETag": f'"{sha}"'}
                if status == 206:
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if head:
                    return
                sent = 0
                step = 64 * 1024
                try:
                    for i in range(0, len(body), step):
                        if hub.stall_after is not None and sent >= hub.stall_after:
                            hub.dead = True
                            hub.released.wait()  # a server that stops answering mid-body
                            self.close_connection = True
                            return
                        if hub.cut_after is not None and sent >= hub.cut_after:
                            hub.cut_after = None
                            self.close_connection = True
                            return
                        self.wfile.write(body[i : i + step])
                        self.wfile.flush()
                        sent += step
                        if hub.trickle:
                            time.sleep(hub.trickle)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def ranges(self) -> list[str]:
        return [r for m, p, r in self.requests if p.startswith("/cdn/") and r]


def hf_hub_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's settings read again from ``os.environ`` as it is now, as a
    ``localllm`` process started now would read them.

    huggingface_hub reads HF_ENDPOINT (and the URL template and trusted hosts made
    from it), HF_HOME (the token file), HF_HUB_OFFLINE and its time-outs once, into
    ``huggingface_hub.constants``, when it is first imported: in the test process,
    by whichever test came first. This runs that module's code again against the
    environment and sets each value that differs; ``monkeypatch`` puts them back
    when the test ends. ``localllm.store.hub`` reads them from the module at each
    call (``constants.ENDPOINT``, ``constants.HF_HUB_DOWNLOAD_TIMEOUT``), as does
    huggingface_hub (``hf_hub_url``, ``is_offline_mode``, the token path).

    Not reached: what was copied out of the module at import, such as
    ``get_hf_file_metadata``'s default ``timeout=HF_HUB_ETAG_TIMEOUT``: a test of
    such a setting runs ``localllm`` in a child process (``run_cli``)."""
    from huggingface_hub import constants

    spec = importlib.util.find_spec("huggingface_hub.constants")
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)  # not put in sys.modules: only its values are used
    spec.loader.exec_module(fresh)
    missing = object()
    for name, value in vars(fresh).items():
        if name.startswith("__") or callable(value) or isinstance(value, types.ModuleType):
            continue  # the module's functions read its (patched) globals
        if getattr(constants, name, missing) != value:
            monkeypatch.setattr(constants, name, value, raising=False)

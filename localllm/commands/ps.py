"""``localllm ps``: what a running server has loaded, from its ``GET /api/ps``.

``localllm serve`` (the router, or ``serve MODEL``) answers it, and so does
Ollama; the table is ``ollama ps``'s: the name, the bytes its load holds, how
they split between the CPU and the GPU ("100% GPU", "48%/52% CPU/GPU"), the
context a request may use (and why, where localllm's serve says: "32768 (trained)"),
and when the model will be unloaded. The router
answers with its memory plan's figures (``localllm.router.listing``).

The answer is another process's, so it is read as untrusted: at most
``MAX_BYTES``, each field checked for its type, every string shown through
``fmt.safe``; anything else is one line naming the URL, as is a server that is
not there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from localllm.errors import InputError, UsageError
from localllm.util import fmt
from localllm.util.net import is_loopback

if TYPE_CHECKING:
    from localllm.flags import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser("ps", help="the models a running server (localllm serve, Ollama) has loaded: memory, CPU/GPU split, until when")
    p.add_argument("--url", default="http://127.0.0.1:8080", metavar="URL", help="the server (default: http://127.0.0.1:8080, serve's)")
    p.add_argument("--api-key", default=None, metavar="KEY", help="the server's key, sent as 'Authorization: Bearer KEY' (also: LOCALLLM_API_KEY)")
    p.add_argument("--json", action="store_true", help="one JSON object")


@dataclass(frozen=True)
class Options:
    url: str
    api_key: str | None
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(url=ns.url, api_key=ns.api_key, json=ns.json)


DEFAULT_URL = "http://127.0.0.1:8080"
MAX_BYTES = 1 << 20  # an answer past this is not a list of loaded models
MAX_MODELS = 1000
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Row:
    """One loaded model, as the server described it (types checked)."""

    name: str
    size: int | None
    size_vram: int | None
    context_length: int | None
    expires_at: str | None
    localllm: dict[str, Any] | None = None  # the router's per-device figures, as it gave them

    @property
    def processor(self) -> str:
        """``ollama ps``'s PROCESSOR column."""
        if self.size is None or self.size_vram is None:
            return "-"
        if self.size_vram == 0:
            return "100% CPU"
        if self.size_vram == self.size:
            return "100% GPU"
        if self.size_vram > self.size or self.size <= 0:
            return "unknown"
        cpu = round((self.size - self.size_vram) / self.size * 100)
        return f"{cpu}%/{100 - cpu}% CPU/GPU"

    @property
    def context(self) -> str:
        """The CONTEXT column: a request's context, and why where localllm's
        serve said it ("32768 (trained)", "12288 (largest that fits; trained
        32768)": ``plan.fitting.context_why``); the bare count from Ollama."""
        why = (self.localllm or {}).get("context")
        if isinstance(why, str) and why:
            return fmt.safe(why[:80])
        return str(self.context_length) if self.context_length is not None else "-"


def run(args: argparse.Namespace) -> int:
    opts = Options.from_args(args)
    base = base_url(opts.url)
    key = opts.api_key or os.environ.get("LOCALLLM_API_KEY") or None
    rows = parse(fetch(base, key), base)
    if opts.json:
        fmt.print_json({"url": base, "models": [{**asdict(r), "processor": r.processor, "context": r.context} for r in rows]})
        return 0
    if not rows:
        print(f"localllm: no model loaded ({fmt.safe(base)})", file=sys.stderr)  # not commands._common.say: its module loads the planner (~0.4 s)
        return 0
    now = dt.datetime.now(dt.timezone.utc)
    body = [(r.name, fmt.size(r.size) if r.size is not None else "-", r.processor,
             r.context, until(r.expires_at, now)) for r in rows]
    print(fmt.table(("NAME", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"), body, right=(1, 3)))
    return 0


def base_url(url: str) -> str:
    """``http://HOST:PORT`` from what the user typed: a scheme added where there is
    none, a trailing ``/`` or ``/v1`` dropped (the OpenAI base URL works too)."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url {url}: give the server's address, e.g. {DEFAULT_URL}")
    path = parts.path.rstrip("/")
    path = path.removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


def _loopback(base: str) -> bool:
    return is_loopback(urlsplit(base).hostname or "")


def fetch(base: str, key: str | None) -> Any:
    """The decoded JSON of ``GET base/api/ps``, read up to ``MAX_BYTES``; an
    ``InputError`` (one line, exit 1) for anything but a JSON answer with 200."""
    import httpx2  # lazy: the HTTP client (~60 ms), for ps alone among the commands that load no model

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{base}/api/ps"
    try:
        with (httpx2.Client(timeout=TIMEOUT_S, trust_env=not _loopback(base)) as client,
              client.stream("GET", url, headers=headers) as resp):
            status = resp.status_code
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > MAX_BYTES:
                    raise InputError(f"{base} answered /api/ps with over {MAX_BYTES // 2**20} MiB: not a list of loaded models")
    except httpx2.ConnectError:
        raise InputError(f"no server at {base}: start one with localllm serve (or give ps --url)") from None
    except httpx2.TimeoutException:
        raise InputError(f"{base} did not answer /api/ps within {TIMEOUT_S:g} s") from None
    except httpx2.HTTPError as exc:
        raise InputError(f"cannot ask {base}: {type(exc).__name__}: {fmt.safe(str(exc))[:200]}") from None
    if status == 401:
        raise InputError(f"{base} wants an API key: pass ps --api-key KEY (or set LOCALLLM_API_KEY)")
    if status == 404:
        raise InputError(f"{base} has no /api/ps: is it localllm serve (or Ollama)?")
    if status != 200:
        raise InputError(f"{base} answered /api/ps with HTTP {status}")
    try:
        return json.loads(bytes(body))
    except (ValueError, RecursionError):
        raise InputError(f"{base} answered /api/ps with something that is not JSON") from None


def parse(data: Any, base: str) -> list[Row]:
    """The rows of an ``/api/ps`` answer (``{"models": [...]}``); ``InputError`` for another shape."""
    def bad(what: str) -> InputError:
        return InputError(f"{base} answered /api/ps in a shape that is not Ollama's: {what}")

    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, list):
        raise bad("no 'models' list")
    if len(models) > MAX_MODELS:
        raise bad(f"over {MAX_MODELS} models")
    rows = []
    for m in models:
        if not isinstance(m, dict):
            raise bad("a model that is not an object")
        name = m.get("name", m.get("model"))
        if not isinstance(name, str) or not name:
            raise bad("a model without a name")
        extra = m.get("localllm")
        rows.append(Row(name[:256], _count(m, "size", bad), _count(m, "size_vram", bad), _count(m, "context_length", bad),
                        _text(m, "expires_at", bad), extra if isinstance(extra, dict) else None))
    return rows


def _count(m: dict, field: str, bad: Callable[[str], InputError]) -> int | None:
    value = m.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad(f"'{field}' is not a count")
    return value


def _text(m: dict, field: str, bad: Callable[[str], InputError]) -> str | None:
    value = m.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad(f"'{field}' is not a string")
    return value[:64]


def until(expires_at: str | None, now: dt.datetime) -> str:
    """``ollama ps``'s UNTIL: "4 minutes from now", "forever" (no expiry), "-" when unreadable."""
    if expires_at is None:
        return "forever"
    try:
        when = dt.datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    left = (when - now).total_seconds()
    if left > 10 * 365 * 86400:  # Ollama's "never" is a date far ahead
        return "forever"
    if left < 1:
        return "now"
    for unit, seconds in (("day", 86400), ("hour", 3600), ("minute", 60)):
        n = math.floor(left / seconds)
        if n >= 2 or (n == 1 and seconds == 60):
            return f"{n} {unit}{'s' if n > 1 else ''} from now"
    return f"{math.floor(left)} seconds from now"

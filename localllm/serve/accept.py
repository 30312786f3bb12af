"""Connections from outside, bounded: the HTTP protocol ``serve`` gives uvicorn.

uvicorn 0.54 has no time limit on reading a request (its keep-alive timer starts
only after a response, and stops at the first byte of the next request) and its
``limit_concurrency`` counts idle sockets, so 511 half-sent requests (slowloris)
made every request, ``/health`` included, answer 503 for as long as they stayed
open. This subclass of its h11 protocol, passed as ``Config(http=...)``, adds:

- a deadline for each request's head (``HEADER_TIMEOUT_S``) and for the whole
  request, head and body (``REQUEST_TIMEOUT_S``), from the moment the
  connection is ready for it (accepted, or its previous response sent); a
  connection past it is closed (a 408 when part of a request came);
- a cap on the size of a request's head (``MAX_HEAD_BYTES``, then 431);
- a cap on the connections one client address holds (``PER_CLIENT``) and on all
  of them (``MAX_CONNECTIONS``): a new connection over a cap closes the
  connection that has waited longest for its request to arrive, so slow or idle
  sockets make room for the newcomer. Only a connection that has sent part of a
  request, was kept alive after an answer, or has waited ``FRESH_S`` is closed so:
  a connection just opened has its request on the way (200 requests at once from
  one client closed 7 of those before they arrived, as resets). When nothing can
  be closed, the newcomer is refused: its request head is read, then answered
  with a 503 naming the cause and ``Retry-After``, and its socket drained for
  ``LINGER_S`` before it closes (closed at once, the kernel answered the
  request's bytes with a reset that lost the 503: 136 of 136 refused clients
  read nothing).

A connection whose request has arrived is never closed here: generating may
take as long as it takes, and the client's going away is noticed by the app.
"""

from __future__ import annotations

import asyncio
import json
import re

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 60.0
PER_CLIENT = 64
MAX_CONNECTIONS = 1024
MAX_HEAD_BYTES = 32 * 1024  # a request line and headers; larger gets 431
FRESH_S = 1.0  # a connection that has sent nothing yet is not closed to make room before this
LINGER_S = 2.0  # a refused connection is read (and what comes dropped) this long after its 503, then closed
RETRY_AFTER_S = 1

_TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_TOO_LARGE_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_HEAD_END = re.compile(rb"\n\r?\n")


def bounded(header_timeout: float | None = None) -> type[BoundedH11Protocol]:
    """The protocol class for uvicorn's ``Config(http=...)``, with ``header_timeout``
    seconds for a request's head (``serve --timeout``; None: ``HEADER_TIMEOUT_S``).
    The whole request keeps at least ``REQUEST_TIMEOUT_S``: a longer head deadline
    raises it with it."""
    if header_timeout is None or header_timeout == HEADER_TIMEOUT_S:
        return BoundedH11Protocol
    return type("BoundedH11Protocol", (BoundedH11Protocol,),
                {"header_timeout": header_timeout, "request_timeout": max(REQUEST_TIMEOUT_S, header_timeout)})


def _refusal(message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": "too_many_connections"}}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
            + f"retry-after: {RETRY_AFTER_S}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with request deadlines and per-client caps."""

    header_timeout = HEADER_TIMEOUT_S
    request_timeout = REQUEST_TIMEOUT_S
    per_client = PER_CLIENT
    max_connections = MAX_CONNECTIONS

    _phase = "busy"  # "head": waiting for a request's head, "body": for its body, "busy": it arrived
    _since = 0.0  # when the connection became ready for the request it waits for
    _got_bytes = False
    _head = b""  # the start of the head being read, to bound its size
    _timer: asyncio.TimerHandle | None = None
    _answered = 0  # responses sent on this connection
    _refused: bytes | None = None  # the 503 for a connection refused: sent once its request head has come
    refusing = 0  # connections refused and not yet closed, all together

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._follow()
        if not self._make_room():
            self._refuse(_refusal(f"too many connections from {self._host()} are busy with requests: retry later"))

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if self._refused is not None:
            self._read_refused(data)
            return
        if self._phase == "head":
            # h11 bounds a head that arrives in pieces, not one that arrives whole
            self._head = (self._head + data)[:MAX_HEAD_BYTES + 4]
            if len(self._head) > MAX_HEAD_BYTES and not _HEAD_END.search(self._head):
                self.transport.write(_TOO_LARGE_431)
                self._close(late=False)
                return
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._answered += 1
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._refused is not None:
            self._refused = None
            BoundedH11Protocol.refusing -= 1
        super().connection_lost(exc)

    # -- refusals ---------------------------------------------------------------------
    def _refuse(self, answer: bytes) -> None:
        """Answer ``answer`` once the request's head has come (or its deadline passed),
        then drain and close. Past ``max_connections`` refusals pending, closed at once."""
        if BoundedH11Protocol.refusing >= self.max_connections:
            self.transport.write(answer)
            self.transport.close()
            return
        BoundedH11Protocol.refusing += 1
        self._refused, self._phase, self._head = answer, "refused", b""
        self._arm(self.loop.time() + self.header_timeout)

    def _read_refused(self, data: bytes) -> None:
        if self._phase != "refused":
            return  # answered: what else comes is dropped until the linger ends
        self._head = (self._head + data)[-(MAX_HEAD_BYTES + 4):]
        if _HEAD_END.search(self._head) or len(self._head) > MAX_HEAD_BYTES:
            self._send_refusal()

    def _send_refusal(self) -> None:
        assert self._refused is not None
        self._phase = "lingering"
        self.transport.write(self._refused)
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client reads the 503, then its end of file
        self._arm(self.loop.time() + LINGER_S)

    # -- deadlines --------------------------------------------------------------------
    def _follow(self) -> None:
        """Track where the request stands after whatever just happened."""
        if self.transport.is_closing():
            self._cancel_timer()
            return
        if self._refused is not None:
            return
        state = self.conn.their_state
        now = self.loop.time()
        if state is h11.IDLE and self._phase != "head":
            self._phase, self._since, self._got_bytes, self._head = "head", now, False, b""
            self._arm(now + self.header_timeout)
        elif state is h11.SEND_BODY and self._phase != "body":
            self._phase = "body"
            self._arm(self._since + self.request_timeout)
        elif state not in (h11.IDLE, h11.SEND_BODY):
            self._phase = "busy"
            self._cancel_timer()

    def _arm(self, when: float) -> None:
        self._cancel_timer()
        self._timer = self.loop.call_at(when, self._expire)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._phase == "refused":  # its head never came: answered anyway
            self._send_refusal()
        elif self._phase == "lingering":
            self.transport.close()
        elif self._phase != "busy":
            self._close(late=True)

    def _close(self, *, late: bool) -> None:
        """Close a connection whose request has not (wholly) arrived."""
        if late and self._got_bytes:
            self.transport.write(_TIMEOUT_408)
        self._phase = "busy"
        self._cancel_timer()
        self.transport.close()

    # -- caps -------------------------------------------------------------------------
    def _host(self) -> str:
        return self.client[0] if self.client else "?"

    def _make_room(self) -> bool:
        """Close the longest-waiting idle or half-sent connections while a cap is
        exceeded; False when only busy ones are left to close."""
        live = [c for c in self.connections if isinstance(c, BoundedH11Protocol) and c is not self and not c.transport.is_closing()
                and c._refused is None]
        host = self._host()
        mine = [c for c in live if c._host() == host]
        now = self.loop.time()
        for group, cap in ((mine, self.per_client), (live, self.max_connections)):
            excess = len(group) + 1 - cap
            if excess <= 0:
                continue
            waiting = sorted((c for c in group if c._closable(now)), key=lambda c: c._since)
            for c in waiting[:excess]:
                c._close(late=False)
                live.remove(c)
                if c in mine:
                    mine.remove(c)
            if len(waiting) < excess:
                return False
        return True

    def _closable(self, now: float) -> bool:
        """May this connection be closed to make room: it waits for a request that
        is late in coming (part of it came, or it was kept alive after an answer, or
        ``FRESH_S`` passed); one just opened has its request on the way."""
        return self._phase in ("head", "body") and (self._got_bytes or self._answered > 0 or now - self._since >= FRESH_S)

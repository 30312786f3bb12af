"""llama.cpp RPC workers, seen from the client: parse ``--rpc``, probe a worker.

Pure Python (sockets and struct; no llama_cpp): the CLI and the planner ask a
worker for its devices and their free memory before anything loads. llama.cpp's
own client aborts the whole process when a worker is down or speaks another
protocol (ggml-rpc.cpp ``rpc_dispatcher::start``: ``GGML_ABORT("Failed to
connect ...")``), and it connects without a timeout; so every worker is probed
here first, with a timeout, and a bad one is one line and exit 1.

The wire format is ggml-rpc.cpp's (protocol 7.x of llama.cpp's vendored copy in
llama-cpp-python 0.3.36): a request is ``cmd (u8) | size (u64) | payload``, a
reply ``size (u64) | payload``, little-endian. The first command of a connection
must be HELLO (14): 24 bytes of transport capabilities (all zero: plain TCP),
answered by ``major, minor, patch, pad`` and 24 capability bytes.
DEVICE_COUNT (15) answers a u32; GET_DEVICE_MEMORY (11) takes a u32 device
index and answers ``free, total`` as two u64.

A worker serves one client at a time (``ggml_backend_rpc_start_server`` accepts,
serves until the client hangs up, then accepts the next), so a probe of a worker
busy with another client times out: the message says so.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass, field

from localllm.errors import InputError, UsageError

PROTO_MAJOR = 7  # ggml-rpc.h RPC_PROTO_MAJOR_VERSION
PROTO_MINOR = 0
CONN_CAPS_SIZE = 24  # transport.h RPC_CONN_CAPS_SIZE
MAX_SERVERS = 16  # ggml-rpc.h GGML_RPC_MAX_SERVERS
DEFAULT_PORT = 50052  # rpc-server's default
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class RemoteDevice:
    """One device a worker serves, named as llama.cpp names its buffers in the log
    (``RPC<index on the worker>[host:port]``, ggml-rpc.cpp ``ggml_backend_rpc_buffer_type``)."""

    endpoint: Endpoint
    index: int  # on the worker
    name: str
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class Worker:
    endpoint: Endpoint
    version: tuple[int, int, int]
    devices: list[RemoteDevice] = field(default_factory=list)


def parse_endpoints(text: str) -> list[Endpoint]:
    """``HOST:PORT[,HOST:PORT...]`` -> endpoints. Raises UsageError (exit 2).

    llama.cpp splits an endpoint at its first ':' and resolves the host with
    gethostbyname (IPv4 only), so an IPv6 literal cannot work: refused here."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise UsageError(f"--rpc '{text}': give HOST:PORT[,HOST:PORT...], e.g. --rpc 192.168.1.20:{DEFAULT_PORT}")
    out: list[Endpoint] = []
    for p in parts:
        host, sep, port_text = p.rpartition(":")
        if not sep or not host or not port_text:
            raise UsageError(f"--rpc '{p}' is not HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT})")
        if ":" in host or host.startswith("["):
            raise UsageError(f"--rpc '{p}': llama.cpp's RPC client takes IPv4 addresses or host names, not IPv6")
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise UsageError(f"--rpc '{p}': the port must be a number from 1 to 65535")
        if any(c.isspace() for c in host) or len(host) > 253:
            raise UsageError(f"--rpc '{p}': '{host}' is not a host name")
        ep = Endpoint(host, int(port_text))
        if ep in out:
            raise UsageError(f"--rpc names {ep} twice")
        out.append(ep)
    if len(out) > MAX_SERVERS:
        raise UsageError(f"--rpc names {len(out)} workers; llama.cpp takes at most {MAX_SERVERS}")
    return out


def check_bind_host(host: str, open_ok: bool) -> str:
    """The address a worker may listen on. llama.cpp's server takes a dotted IPv4
    address (``inet_addr``). Anything but loopback needs ``open_ok``."""
    try:
        addr = ipaddress.IPv4Address(host)
    except ValueError:
        raise UsageError(f"--host '{host}' is not an IPv4 address (llama.cpp's RPC server listens on IPv4 only), e.g. 127.0.0.1 or 192.168.1.20") from None
    if not addr.is_loopback and not open_ok:
        raise UsageError(
            f"--host {host} would let anyone who can reach this port run code on this machine's devices and read or write their memory "
            "(llama.cpp's RPC has no authentication): add --i-understand-this-is-open to do it anyway, on a network you trust"
        )
    return str(addr)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        buf += chunk
    return buf


def _call(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != reply_size:
        raise ConnectionError(f"unexpected reply of {size} bytes to command {cmd}")
    return _recv_exact(sock, size)


def probe(ep: Endpoint, *, timeout: float = PROBE_TIMEOUT_S) -> Worker:
    """Connect, say HELLO, and read the worker's devices and their free memory.
    Every failure is an InputError (exit 1) naming the worker and the fix."""
    try:
        sock = socket.create_connection((ep.host, ep.port), timeout=timeout)
    except socket.gaierror:
        raise InputError(f"worker {ep}: cannot resolve host '{ep.host}'") from None
    except ConnectionRefusedError:
        raise InputError(f"worker {ep} refused the connection: is `localllm worker --port {ep.port}` running there?") from None
    except TimeoutError:
        raise InputError(f"worker {ep} did not accept a connection within {timeout:g} s: is it up, and is the port open?") from None
    except OSError as exc:
        raise InputError(f"worker {ep} is not reachable: {exc.strerror or exc}") from None
    try:
        with sock:
            sock.settimeout(timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rsp = _call(sock, CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
            major, minor, patch = rsp[0], rsp[1], rsp[2]
            if major != PROTO_MAJOR or minor > PROTO_MINOR:
                raise InputError(
                    f"worker {ep} speaks llama.cpp RPC protocol {major}.{minor}.{patch}, this client {PROTO_MAJOR}.{PROTO_MINOR}: "
                    "install the same localllm version on both machines"
                )
            (count,) = struct.unpack("<I", _call(sock, CMD_DEVICE_COUNT, b"", 4))
            if count == 0 or count > 64:
                raise InputError(f"worker {ep} reports {count} devices")
            devices = []
            for i in range(count):
                free, total = struct.unpack("<QQ", _call(sock, CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), 16))
                devices.append(RemoteDevice(ep, i, f"RPC{i}[{ep}]", free, total))
            return Worker(ep, (major, minor, patch), devices)
    except TimeoutError:
        raise InputError(
            f"worker {ep} accepted the connection but did not answer within {timeout:g} s "
            "(a worker serves one client at a time: is another one using it?)"
        ) from None
    except (ConnectionError, OSError) as exc:
        raise InputError(f"worker {ep} is not a llama.cpp RPC worker, or it hung up: {exc}") from None


def probe_all(endpoints: list[Endpoint], *, timeout: float = PROBE_TIMEOUT_S) -> list[Worker]:
    """Probe each worker in order (the first bad one raises)."""
    return [probe(ep, timeout=timeout) for ep in endpoints]

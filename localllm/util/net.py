"""Addresses: one loopback check for serve (which warns when it listens elsewhere
without a key) and ps (which lets no proxy from the environment stand between it
and a loopback server)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

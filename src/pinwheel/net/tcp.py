"""The TCP probe and connect every pinwheel client opens a plain socket with.

:func:`probe` answers "is anything listening at host:port" in one of four states
(open, unresolved, refused, unreachable) for the compiler cache's remote check and
qualify's wait for a server it did not start; :func:`connect` is the one place a raw
socket is opened (the Redis client), its failure an :class:`pinwheel.net.Unavailable`.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Literal

from pinwheel.net import Unavailable

State = Literal["open", "unresolved", "refused", "unreachable"]


@dataclass(frozen=True)
class Probe:
    """What one connection attempt found; ``reason``: the OS's words when not open."""

    state: State
    reason: str = ""

    @property
    def open(self) -> bool:
        return self.state == "open"


def probe(host: str, port: int, timeout: float) -> Probe:
    """Connect to ``host:port`` and close at once; the outcome, never an exception."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.gaierror as exc:
        return Probe("unresolved", str(exc.strerror or exc))
    except ConnectionRefusedError as exc:
        return Probe("refused", str(exc.strerror or exc))
    except OSError as exc:  # a timeout, no route
        return Probe("unreachable", str(exc.strerror or exc))
    return Probe("open")


def connect(host: str, port: int, timeout: float, *, where: str, next: str) -> socket.socket:
    """A connected socket (``timeout`` for the connect and each later operation)."""
    try:
        return socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise Unavailable(
            f"cannot connect: {exc.strerror or exc}", where=where, next=next
        ) from None

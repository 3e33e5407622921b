"""A free TCP port on 127.0.0.1 and the wait for a server to listen on it: what the tests
that start a real server (redis-server, moto_server) share."""

from __future__ import annotations

import socket
import time


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now (the kernel's choice, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, seconds: float, what: str) -> None:
    """Return once something accepts a connection on 127.0.0.1:``port``; after ``seconds``
    a ``RuntimeError`` naming ``what``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what}: nothing listens on 127.0.0.1:{port}")

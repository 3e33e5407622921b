"""A real ``redis-server`` on 127.0.0.1 for the tests of the compiler cache and the object
store: started on a free port, waited for, stopped. A missing binary is a skip (a declared
test dependency: under ``PINWHEEL_CI=1`` the skip fails, tests/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tcpport import free_port, wait_listening


@contextmanager
def running_redis(*extra: str) -> Iterator[int]:
    """A redis-server with nothing saved, ``extra`` arguments after pinwheel's; its port."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("no redis-server binary (Debian: apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_listening(port, 10, "redis-server")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)

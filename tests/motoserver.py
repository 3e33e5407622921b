"""A real ``moto_server`` on 127.0.0.1 for the tests of the compiler cache and the object
store on S3: moto's S3-compatible HTTP server, a stand-in for S3 (no S3 store is reachable
here; moto does not check request signatures). Started on a free port with one bucket made,
waited for, stopped. A missing ``moto_server`` is a skip (a declared test dependency: under
``PINWHEEL_CI=1`` the skip fails, tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tcpport import free_port, wait_listening

# moto accepts any credentials; these are the stand-in ones the tests sign with
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def _moto_server() -> str | None:
    """The ``moto_server`` beside this Python (its venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "moto_server"
    return str(beside) if beside.is_file() else shutil.which("moto_server")


@contextmanager
def running_moto(bucket: str, *, free_actions: int | None = None) -> Iterator[str]:
    """A moto_server holding the empty ``bucket``; its endpoint, ``http://127.0.0.1:PORT``.

    ``free_actions``: moto checks every request's signature against the IAM users, keys
    and roles made in it (``INITIAL_NO_AUTH_ACTION_COUNT``) after that many requests
    (making the bucket is the first); None: moto checks none."""
    server = _moto_server()
    if server is None:
        pytest.skip("no moto_server (pip install 'moto[s3]' flask flask-cors)")
    port = free_port()
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=None if free_actions is None else {
            **os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(free_actions)},
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_listening(port, 30, "moto_server")
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"))
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)

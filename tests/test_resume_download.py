"""A toolkit download interrupted and run again continues where it stopped (HTTP Range),
verified by its sha256 at the end (compile/toolchain/download.py).

Real HTTP servers on loopback: one that honours ``Range`` (as Debian's mirrors do), one
that always sends the whole file (the download starts again from zero and still
verifies). The first request of a run can be cut after N bytes: the client sees the
connection drop mid-body, as a Ctrl-C or a lost network leaves it.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pinwheel.compile.toolchain.apt import printed_uris
from pinwheel.compile.toolchain.download import fetch_resumable, partial_of
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.progress import SILENT

BODY = bytes(range(256)) * 4096  # 1 MiB, every byte position distinct mod 256
SHA = hashlib.sha256(BODY).hexdigest()


class _Server(http.server.ThreadingHTTPServer):
    ranges: bool
    cut_after: int | None  # the next answer stops after this many body bytes
    seen: list[str | None]  # each request's Range header
    body: bytes


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        srv = self.server
        asked = self.headers.get("Range")
        srv.seen.append(asked)
        body, start = srv.body, 0
        if asked and srv.ranges:
            start = int(asked.removeprefix("bytes=").rstrip("-"))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        rest = body[start:]
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        cut, srv.cut_after = srv.cut_after, None
        if cut is not None:
            self.wfile.write(rest[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # the body ends early: the client's read fails
            return
        self.wfile.write(rest)


@contextmanager
def serving(*, ranges: bool, body: bytes = BODY) -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.ranges, srv.cut_after, srv.seen, srv.body = ranges, None, [], body
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


class Bytes:
    """A reporter that records each transfer's (total, done at start) and the bytes moved."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.transfers: list[tuple[int | None, int]] = []
        self.moved = 0

    def info(self, message: str) -> None:
        self.lines.append(message)

    def detail(self, message: str) -> None:
        return None

    @contextmanager
    def status(self, message: str) -> Iterator[None]:
        yield

    @contextmanager
    def transfer(self, name: str, total: int | None, done: int = 0) -> Iterator:  # type: ignore[type-arg]
        self.transfers.append((total, done))

        def advance(n: int) -> None:
            self.moved += n

        yield advance


def _url(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/pool/cuda.deb"


def test_an_interrupted_download_resumes_where_it_stopped(tmp_path: Path) -> None:
    dest = tmp_path / "downloads" / "cuda.deb"
    with serving(ranges=True) as srv:
        srv.cut_after = 300_000
        with pytest.raises(ToolchainError) as err:
            fetch_resumable(_url(srv), dest, SHA, len(BODY), SILENT)
        assert "the bytes already downloaded are kept" in (err.value.next or "")
        assert partial_of(dest).stat().st_size == 300_000 and not dest.exists()
        seen = Bytes()
        got = fetch_resumable(_url(srv), dest, SHA, len(BODY), seen)
    assert srv.seen == [None, "bytes=300000-"]
    assert (got.resumed_from, got.received) == (300_000, len(BODY) - 300_000)
    assert seen.transfers == [(len(BODY), 300_000)] and seen.moved == len(BODY) - 300_000
    assert any("resuming at" in line for line in seen.lines)
    assert dest.read_bytes() == BODY and not partial_of(dest).exists()


def test_a_server_without_range_support_downloads_again_from_the_start(tmp_path: Path) -> None:
    dest = tmp_path / "cuda.deb"
    with serving(ranges=False) as srv:
        srv.cut_after = 500_000
        with pytest.raises(ToolchainError):
            fetch_resumable(_url(srv), dest, SHA, len(BODY), SILENT)
        assert partial_of(dest).stat().st_size == 500_000
        seen = Bytes()
        got = fetch_resumable(_url(srv), dest, SHA, len(BODY), seen)
    assert srv.seen == [None, "bytes=500000-"]  # asked, and answered with the whole file
    assert (got.resumed_from, got.received) == (0, len(BODY))
    assert any("does not resume" in line for line in seen.lines)
    assert dest.read_bytes() == BODY


def test_a_resumed_file_that_does_not_hash_is_removed_not_kept(tmp_path: Path) -> None:
    """The partial bytes were another file's (the mirror changed it meanwhile): the whole
    file is hashed at the end, it fails, and the next run starts from zero."""
    dest = tmp_path / "cuda.deb"
    partial_of(dest).write_bytes(b"\xff" * 1000)  # not a prefix of BODY
    with serving(ranges=True) as srv:
        with pytest.raises(ToolchainError, match="the lock pins") as err:
            fetch_resumable(_url(srv), dest, SHA, len(BODY), SILENT)
        assert "resumed at byte 1000" in err.value.what
        assert not partial_of(dest).exists() and not dest.exists()
        assert fetch_resumable(_url(srv), dest, SHA, len(BODY), SILENT).resumed_from == 0
    assert dest.read_bytes() == BODY


def test_a_complete_partial_file_is_asked_again_from_zero(tmp_path: Path) -> None:
    """A partial as long as the file (the run stopped before the rename): the server says
    416 for a range past the end; the client starts again instead of failing."""
    dest = tmp_path / "cuda.deb"
    partial_of(dest).write_bytes(BODY)
    with serving(ranges=True) as srv:
        got = fetch_resumable(_url(srv), dest, SHA, None, SILENT)
    assert srv.seen == [f"bytes={len(BODY)}-", None] and got.resumed_from == 0
    assert dest.read_bytes() == BODY


def test_a_verified_file_is_not_downloaded_again(tmp_path: Path) -> None:
    dest = tmp_path / "cuda.deb"
    dest.write_bytes(BODY)
    with serving(ranges=True) as srv:
        assert fetch_resumable(_url(srv), dest, SHA, len(BODY), SILENT).received == 0
    assert srv.seen == []


def test_apts_print_uris_lines_are_read() -> None:
    text = (
        "'http://deb.example/debian/pool/non-free/n/nvidia-cuda-toolkit/"
        "nvidia-cuda-dev_12.4.127~12.4.1-2_amd64.deb' nvidia-cuda-dev_12.4.127~12.4.1-2_amd64.deb "
        f"933853452 SHA256:{'a' * 64}\n"
    )
    assert printed_uris(text) == {
        "nvidia-cuda-dev_12.4.127~12.4.1-2_amd64.deb": (
            "http://deb.example/debian/pool/non-free/n/nvidia-cuda-toolkit/"
            "nvidia-cuda-dev_12.4.127~12.4.1-2_amd64.deb",
            933853452,
        )
    }

"""A real HTTP server on 127.0.0.1 whose answers a test scripts, path by path.

Each route is a function ``(handler) -> None`` that writes the raw answer itself
(status line, headers, body), so a test can send what a hostile or broken
server sends: a wrong Content-Length, a body without end, bytes trickling in.
"""

from __future__ import annotations

import http.server
import time
from collections.abc import Callable
from typing import Any

from localhttp import LocalHTTP

Route = Callable[[http.server.BaseHTTPRequestHandler], None]


def answer(body: bytes, status: int = 200, ctype: str = "application/json") -> Route:
    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return route


def raw_headers(headers: list[tuple[str, str]], body: bytes = b"", status: int = 200) -> Route:
    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        for k, v in headers:
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    return route


def endless(chunk: bytes, *, pause: float = 0.0, limit: float = 30.0) -> Route:
    """A body with no Content-Length that never ends (until the client leaves or ``limit``
    seconds pass, so a test that regressed does not hang the suite for ever)."""

    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        stop = time.monotonic() + limit
        try:
            while time.monotonic() < stop:
                h.wfile.write(chunk)
                h.wfile.flush()
                if pause:
                    time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):
            pass
        h.close_connection = True

    return route


class Server(LocalHTTP):
    url_suffix = ""  # URLs are built as url + path

    def __init__(self, routes: dict[str, Route]):
        self.routes = routes
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _route(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                route = outer.routes.get(self.path.split("?")[0])
                if route is None:
                    answer(b"not here", 404, "text/plain")(self)
                else:
                    route(self)

            do_GET = do_POST = _route  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self._serve(Handler)

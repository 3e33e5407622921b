"""A real HTTP server on 127.0.0.1 in a daemon thread: the lifecycle the tests' servers share."""

from __future__ import annotations

import http.server
import threading
from typing import Self


class LocalHTTP:
    """Subclasses build their handler and call :meth:`_serve`; ``with`` runs the server."""

    url_suffix = "/"  # what :attr:`url` ends with after the port

    def _serve(
        self,
        handler: type[http.server.BaseHTTPRequestHandler],
        server_class: type[http.server.ThreadingHTTPServer] = http.server.ThreadingHTTPServer,
        *,
        daemon_threads: bool = True,
    ) -> None:
        self.httpd = server_class(("127.0.0.1", 0), handler)
        if daemon_threads:
            self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{self.url_suffix}"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

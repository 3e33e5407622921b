"""The Redis protocol (RESP2): commands out, replies read bounded.

Moved from ``compile.objbackends``: the object store's Redis backend speaks through it.
"""

from __future__ import annotations

import socket
import time
from typing import BinaryIO

from pinwheel import validate
from pinwheel.net import Unavailable, httpget

TIMEOUT = 10.0  # seconds one socket operation may wait
DEADLINE = 600.0  # seconds one transfer may take (a wheel of a few hundred MB)
MAX_LINE = 64 * 1024  # a RESP status, error or length line
_SERVER = "check the server; the build goes on without the object store"


def _fail(where: str) -> httpget.Fail:
    return lambda what, next: Unavailable(what, where=where, next=next)


def _encode(*parts: str | bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class _Resp:
    """One RESP2 connection: commands out, replies read bounded (a length checked before
    anything is read, a byte cap, a deadline)."""

    def __init__(self, sock: socket.socket, where: str):
        self.sock, self.where = sock, where
        self.reader = sock.makefile("rb")

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def _bounds(self, what: str, cap: int) -> httpget.Bounds:
        return httpget.Bounds(what, cap, _fail(self.where), time.monotonic() + DEADLINE)

    def _sendall(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise Unavailable(
                f"cut off while sending: {exc}", where=self.where, next=_SERVER
            ) from None

    def command(self, *parts: str | bytes) -> None:
        self._sendall(_encode(*parts))

    def command_file(self, verb: str, key: str, src: BinaryIO, size: int) -> None:
        head = _encode(verb, key)
        self._sendall(b"*3" + head[2:] + b"$%d\r\n" % size)
        while block := src.read(1024 * 1024):
            self._sendall(block)
        self._sendall(b"\r\n")

    def _line(self, bounds: httpget.Bounds) -> bytes:
        self.sock.settimeout(min(TIMEOUT, bounds.left() or TIMEOUT))
        try:
            line = self.reader.readline(MAX_LINE + 1)
        except OSError as exc:
            raise Unavailable(f"cut off: {exc}", where=self.where, next=_SERVER) from None
        if not line.endswith(b"\r\n") or len(line) > MAX_LINE:
            raise Unavailable(
                "the reply is no RESP line (cut off, or longer than "
                f"{MAX_LINE} bytes)", where=self.where, next="check the endpoint is a Redis server",
            )  # fmt: skip
        return line[:-2]

    def _reply_head(self, bounds: httpget.Bounds) -> tuple[bytes, bytes]:
        line = self._line(bounds)
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            text = rest.decode(errors="replace")[:200]
            raise Unavailable(f"the server answered an error: {text}", where=self.where,
                              next="check the credentials (SCCACHE_REDIS_PASSWORD) and "
                              "the server's limits")  # fmt: skip
        return kind, rest

    def simple(self, *parts: str | bytes) -> None:
        self.command(*parts)
        self.status()

    def status(self) -> None:
        kind, _ = self._reply_head(self._bounds("redis reply", MAX_LINE))
        if kind != b"+":
            raise Unavailable("the reply is not a status", where=self.where,
                              next="check the endpoint is a Redis server")  # fmt: skip

    def _bulk_len(self, bounds: httpget.Bounds) -> int | None:
        kind, rest = self._reply_head(bounds)
        if kind != b"$":
            raise Unavailable("the reply to GET is not a bulk string", where=self.where,
                              next="check the endpoint is a Redis server")  # fmt: skip
        if rest == b"-1":
            return None
        try:
            n = validate.content_length(rest.decode("ascii", errors="replace"))  # digits only
        except ValueError as exc:
            raise Unavailable(f"a bad value length: {exc}", where=self.where,
                              next="check the endpoint is a Redis server") from None  # fmt: skip
        if n > bounds.cap:
            raise Unavailable(
                f"a value of {n} bytes, more than the {bounds.cap} it may have",
                where=self.where, next=_SERVER,
            )  # fmt: skip
        return n

    def _exactly(self, n: int, bounds: httpget.Bounds, out: BinaryIO | None) -> bytes:
        got: list[bytes] = []
        while n > 0:
            self.sock.settimeout(min(TIMEOUT, bounds.left() or TIMEOUT))
            try:
                block = self.reader.read1(min(n, 1024 * 1024))
            except OSError as exc:
                raise Unavailable(f"cut off: {exc}", where=self.where,
                                  next="check the server") from None  # fmt: skip
            if not block:
                raise Unavailable("cut off before the value's end", where=self.where,
                                  next="check the server")  # fmt: skip
            n -= len(block)
            if out is not None:
                out.write(block)
            else:
                got.append(block)
        return b"".join(got)

    def bulk(self, cap: int) -> bytes | None:
        bounds = self._bounds("redis GET", cap)
        n = self._bulk_len(bounds)
        if n is None:
            return None
        data = self._exactly(n, bounds, None)
        if self._exactly(2, bounds, None) != b"\r\n":
            raise Unavailable("the value does not end where its length says", where=self.where,
                              next="check the endpoint is a Redis server")  # fmt: skip
        return data

    def bulk_into(self, out: BinaryIO, cap: int) -> bool:
        bounds = self._bounds("redis GET", cap)
        n = self._bulk_len(bounds)
        if n is None:
            return False
        self._exactly(n, bounds, out)
        if self._exactly(2, bounds, None) != b"\r\n":
            raise Unavailable("the value does not end where its length says", where=self.where,
                              next="check the endpoint is a Redis server")  # fmt: skip
        return True

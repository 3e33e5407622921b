"""The Redis protocol (RESP2): one connection, commands out, replies read bounded.

:func:`open_connection` connects (:func:`pinwheel.net.tcp.connect`), wraps TLS for
``rediss://``, sends ``AUTH`` and ``SELECT``; :class:`Connection` sends commands and reads
their replies. Every reply is untrusted: a status, error or length line is at most
:data:`MAX_LINE` bytes and complete within ``line_deadline`` seconds however slowly its
bytes come (a length line trickled one digit every 1.5 s ends there, not days later); a
value is at most its cap and complete within ``deadline``. The bytes are read with
``recv`` under a socket timeout that never exceeds what is left of the reply's deadline.
A server's error text is shown with the configured secrets (user name, password)
replaced by ``***`` (:func:`pinwheel.urls.redact`): an ``AUTH`` error that echoes the
password never prints it. Every failure is :class:`pinwheel.net.Unavailable`.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import BinaryIO

from pinwheel import validate
from pinwheel.net import Unavailable, tcp
from pinwheel.urls import redact

TIMEOUT = 10.0  # seconds one socket operation may wait
DEADLINE = 600.0  # seconds one value may take (a wheel of a few hundred MB)
LINE_DEADLINE = 30.0  # seconds one status, error or length line may take, whole
MAX_LINE = 64 * 1024  # a RESP status, error or length line
BLOCK = 1024 * 1024
_SERVER = "check the server; the build goes on without the object store"
_NOT_REDIS = "check the endpoint is a Redis server"


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to connect; ``username``/``password`` never shown."""

    host: str
    port: int
    tls: bool = False
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    db: int = 0
    timeout: float = TIMEOUT
    deadline: float = DEADLINE
    line_deadline: float = LINE_DEADLINE

    @property
    def where(self) -> str:
        return f"redis {self.host}:{self.port}"

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.password, self.username) if s)


def _encode(*parts: str | bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def open_connection(end: Endpoint) -> Connection:
    """A connection to ``end``, authenticated and on its database."""
    sock = tcp.connect(
        end.host, end.port, end.timeout, where=end.where,
        next="check the server is up ([build.cache] endpoint); the build compiles",
    )  # fmt: skip
    if end.tls:
        try:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=end.host)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise Unavailable(
                f"TLS: {redact(str(exc), end.secrets)}", where=end.where, next="check rediss://"
            ) from None
    conn = Connection(sock, end)
    try:
        if end.password:
            conn.simple("AUTH", *([end.username] if end.username else []), end.password)
        if end.db:
            conn.simple("SELECT", str(end.db))
    except BaseException:
        conn.close()
        raise
    return conn


class _Reply:
    """One reply's limits: its deadline (monotonic) and byte cap."""

    def __init__(self, conn: Connection, what: str, cap: int, seconds: float):
        self.conn, self.what, self.cap = conn, what, cap
        self.until = time.monotonic() + seconds

    def left(self) -> float:
        left = self.until - time.monotonic()
        if left <= 0:
            raise Unavailable(
                f"{self.what}: not complete before its deadline (the server trickles it)",
                where=self.conn.where, next=_SERVER,
            )  # fmt: skip
        return left


class Connection:
    """One RESP2 connection: commands out, replies read bounded (a length checked before
    anything is read, a byte cap, a whole-reply deadline)."""

    def __init__(self, sock: socket.socket, end: Endpoint):
        self.sock, self.end, self.where = sock, end, end.where
        self.buf = bytearray()

    def close(self) -> None:
        self.sock.close()

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
        while block := src.read(BLOCK):
            self._sendall(block)
        self._sendall(b"\r\n")

    # -- reading: recv under a timeout never past the reply's deadline -------------------
    def _fill(self, reply: _Reply, size: int) -> None:
        self.sock.settimeout(min(self.end.timeout, reply.left()))
        try:
            block = self.sock.recv(size)
        except TimeoutError:
            reply.left()  # past the deadline: that error; else a silent server
            silent = f"{reply.what}: the server went silent for {self.end.timeout:g} s"
            raise Unavailable(silent, where=self.where, next=_SERVER) from None
        except OSError as exc:
            raise Unavailable(f"cut off: {exc}", where=self.where, next=_SERVER) from None
        if not block:
            raise Unavailable(f"cut off before {reply.what}'s end", where=self.where,
                              next=_SERVER)  # fmt: skip
        self.buf += block

    def _line(self, reply: _Reply) -> bytes:
        seen = 0
        while (end := self.buf.find(b"\r\n", seen)) < 0:
            seen = max(0, len(self.buf) - 1)
            if len(self.buf) > MAX_LINE:
                raise Unavailable(f"the reply is no RESP line (longer than {MAX_LINE} bytes)",
                                  where=self.where, next=_NOT_REDIS)  # fmt: skip
            self._fill(reply, MAX_LINE)
        if end > MAX_LINE:
            raise Unavailable(f"the reply is no RESP line (longer than {MAX_LINE} bytes)",
                              where=self.where, next=_NOT_REDIS)  # fmt: skip
        line = bytes(self.buf[:end])
        del self.buf[: end + 2]
        return line

    def _reply_head(self, reply: _Reply) -> tuple[bytes, bytes]:
        line = self._line(reply)
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            text = redact(rest.decode(errors="replace"), self.end.secrets)[:200]
            raise Unavailable(f"the server answered an error: {text}", where=self.where,
                              next="check the credentials (SCCACHE_REDIS_PASSWORD) and "
                              "the server's limits")  # fmt: skip
        return kind, rest

    def simple(self, *parts: str | bytes) -> None:
        self.command(*parts)
        self.status()

    def status(self) -> None:
        kind, _ = self._reply_head(_Reply(self, "the reply", MAX_LINE, self.end.line_deadline))
        if kind != b"+":
            raise Unavailable("the reply is not a status", where=self.where, next=_NOT_REDIS)

    def _bulk_len(self, cap: int) -> int | None:
        kind, rest = self._reply_head(_Reply(self, "the reply", MAX_LINE, self.end.line_deadline))
        if kind != b"$":
            raise Unavailable("the reply to GET is not a bulk string", where=self.where,
                              next=_NOT_REDIS)  # fmt: skip
        if rest == b"-1":
            return None
        try:
            n = validate.content_length(rest.decode("ascii", errors="replace"))  # digits only
        except ValueError as exc:
            raise Unavailable(f"a bad value length: {exc}", where=self.where,
                              next=_NOT_REDIS) from None  # fmt: skip
        if n > cap:
            raise Unavailable(
                f"a value of {n} bytes, more than the {cap} it may have",
                where=self.where, next=_SERVER,
            )  # fmt: skip
        return n

    def _exactly(self, n: int, reply: _Reply, out: BinaryIO | None) -> bytes:
        got: list[bytes] = []
        while n > 0:
            if not self.buf:
                self._fill(reply, min(n, BLOCK))
            block = bytes(self.buf[:n])
            del self.buf[: len(block)]
            n -= len(block)
            if out is not None:
                out.write(block)
            else:
                got.append(block)
        return b"".join(got)

    def _value(self, cap: int, out: BinaryIO | None) -> bytes | None:
        n = self._bulk_len(cap)
        if n is None:
            return None
        reply = _Reply(self, "the value", cap, self.end.deadline)
        data = self._exactly(n, reply, out)
        if self._exactly(2, reply, None) != b"\r\n":
            raise Unavailable("the value does not end where its length says", where=self.where,
                              next=_NOT_REDIS)  # fmt: skip
        return data

    def bulk(self, cap: int) -> bytes | None:
        return self._value(cap, None)

    def bulk_into(self, out: BinaryIO, cap: int) -> bool:
        return self._value(cap, out) is not None


__all__ = ["DEADLINE", "LINE_DEADLINE", "MAX_LINE", "TIMEOUT", "Connection", "Endpoint",
           "open_connection"]  # fmt: skip

"""Bounded HTTP GETs for stages before ``release`` (``--reuse-from`` in build).

Every read has a byte cap and a deadline: a server that sends without end hits
the cap, one that trickles bytes (never silent long enough for the socket
timeout) hits the deadline. A bad Content-Length, an HTTP error, a name that
does not resolve: each is a :class:`FetchFailed` naming the URL and the next
step. ``release.download`` is the full fetcher (resume, retries, signatures);
this is the small one a build stage may import.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pinwheel import confine, validate
from pinwheel.errors import PinwheelError, VerifyError

USER_AGENT = "pinwheel/1"


class FetchFailed(PinwheelError):
    """The GET did not complete (exit 1)."""


def _open(url: str, what: str, timeout: float) -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        return urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 - http(s) only
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the error answer and its socket
        found = "not found " if exc.code in (404, 410) else ""
        raise FetchFailed(
            f"{what}: {found}(HTTP {exc.code} {exc.reason})",
            where=url,
            next="check the URL: it must name a pinwheel build or release directory",
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FetchFailed(
            f"{what}: cannot connect: {reason}",
            where=url,
            next="check the host name and that the server is up, then run again",
        ) from None


def _blocks(resp: Any, url: str, what: str, cap: int, until: float) -> Any:
    length = resp.headers.get("Content-Length")
    if length is not None:
        try:
            announced = validate.content_length(length)
        except ValueError as exc:
            raise FetchFailed(
                f"{what}: the server sent a bad Content-Length: {exc}",
                where=url,
                next="the server is broken or not a release host; use another source",
            ) from None
        if announced > cap:
            raise FetchFailed(
                f"{what}: {announced} bytes, more than the {cap} it may have",
                where=url,
                next="check the URL: it should name the file pinwheel asked for",
            )
    got = 0
    read = getattr(resp, "read1", resp.read)
    while True:
        if time.monotonic() > until:
            raise FetchFailed(
                f"{what}: no complete answer before the deadline ({got} bytes received)",
                where=url,
                next="the server is too slow or never ends its answer; use another source",
            )
        try:
            block = read(64 * 1024)
        except (TimeoutError, OSError) as exc:
            raise FetchFailed(
                f"{what}: the transfer stalled: {exc}",
                where=url,
                next="check the server, then run again",
            ) from None
        if not block:
            return
        got += len(block)
        if got > cap:
            raise FetchFailed(
                f"{what}: more than the {cap} bytes it may have",
                where=url,
                next="check the URL: it should name the file pinwheel asked for",
            )
        yield block


def get_bytes(url: str, *, what: str, cap: int, deadline: float, timeout: float = 30.0) -> bytes:
    """The whole body of ``url``, at most ``cap`` bytes, within ``deadline`` seconds."""
    until = time.monotonic() + deadline
    with _open(url, what, timeout) as resp:
        return b"".join(_blocks(resp, url, what, cap, until))


def get_file(
    url: str,
    dest: Path,
    *,
    sha256: str,
    cap: int,
    deadline: float,
    timeout: float = 30.0,
) -> Path:
    """``url`` into ``dest``, hashed as it streams; renamed into place only if it matches."""
    until = time.monotonic() + deadline
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part")
    # A symlink planted at the partial's name is removed, never written through.
    if part.is_symlink() or part.exists():
        confine.remove(dest.parent, part)
    digest = hashlib.sha256()
    try:
        with _open(url, dest.name, timeout) as resp, confine.open_append(dest.parent, part) as out:
            for block in _blocks(resp, url, dest.name, cap, until):
                out.write(block)
                digest.update(block)
        if digest.hexdigest() != sha256:
            raise VerifyError(
                f"{dest.name}: sha256 {digest.hexdigest()}, SHA256SUMS lists {sha256}",
                where=url,
                next="do not reuse from this source; fetch the release again",
            )
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return dest

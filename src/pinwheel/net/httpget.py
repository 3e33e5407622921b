"""The one bounded HTTP reader, and bounded GETs for stages before ``release``.

Every answer pinwheel reads is read through :class:`Bounds`: its Content-Length
checked (digits only, within the cap) and its body taken in blocks up to a byte
cap and a deadline. A server that sends without end hits the cap, one that
trickles bytes (never silent long enough for the socket timeout) hits the
deadline. The three clients are profiles over it, each raising its own error:

- :func:`get_bytes` / :func:`get_file` here: one GET, cap and deadline, for
  ``--reuse-from`` in build (:class:`FetchFailed`);
- ``release.download``: resumable, retried downloads, paced by a minimum rate;
- ``serve.client``: a persistent connection to the server being qualified, every
  read waiting at most what is left of the request's deadline.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import confine, validate
from pinwheel.errors import PinwheelError, VerifyError
from pinwheel.urls import redact

USER_AGENT = "pinwheel/1"


class FetchFailed(PinwheelError):
    """The GET did not complete (exit 1)."""


#: Builds the caller's error from (what went wrong, what to do next).
Fail = Callable[[str, str], PinwheelError]


@dataclass
class Bounds:
    """One answer's limits: at most ``cap`` bytes, complete before ``until`` (monotonic;
    None: the caller paces it), errors built by ``fail`` and prefixed with ``what``."""

    what: str  # "SHA256SUMS", "GET /v1/models": first words of every error
    cap: int
    fail: Fail
    until: float | None = None

    def announced(self, value: str | None) -> int | None:
        """The answer's Content-Length, checked (digits only, within the cap); None if absent."""
        if value is None:
            return None
        try:
            n = validate.content_length(value)
        except ValueError as exc:
            raise self.fail(
                f"{self.what}: the server sent a bad Content-Length: {exc}",
                "the server is broken or not the server pinwheel expects; use another source",
            ) from None
        if n > self.cap:
            raise self.fail(
                f"{self.what}: Content-Length {n}, more than the {self.cap} bytes it may have",
                "check the URL: it should name what pinwheel asked for",
            )
        return n

    def left(self) -> float | None:
        """Seconds before the deadline (None: no deadline); past it, the deadline error."""
        if self.until is None:
            return None
        left = self.until - time.monotonic()
        if left <= 0:
            raise self.fail(
                f"{self.what}: no complete answer before the deadline",
                "the server is too slow or never ends its answer; use another source",
            )
        return left

    def blocks(
        self, resp: Any, *, size: int = 64 * 1024, before: Callable[[], None] | None = None
    ) -> Iterator[bytes]:
        """The body in blocks as they arrive, until its end, the cap or the deadline.

        ``before`` runs before each read (a client sets its socket's timeout there).
        """
        got = 0
        read = getattr(resp, "read1", resp.read)
        while True:
            self.left()
            if before is not None:
                before()
            block = read(size)
            if not block:
                return
            got += len(block)
            if got > self.cap:
                raise self.fail(
                    f"{self.what}: more than the {self.cap} bytes it may have",
                    "check the URL: it should name what pinwheel asked for",
                )
            yield block


# --------------------------------------------------------------------------- redirects

REDIRECT_SCHEMES = ("https", "http")


def redirect_problem(old: str, new: str) -> str | None:
    """The one redirect rule for every pinwheel HTTP client: a redirect keeps its scheme,
    and that scheme is https or http (never ftp://, file://, data:, nor https -> http)."""
    was = urllib.parse.urlsplit(old).scheme.lower()
    now = urllib.parse.urlsplit(new).scheme.lower()
    if now not in REDIRECT_SCHEMES:
        return f"a redirect to a {now or 'scheme-less'}: URL (http(s) only)"
    if now != was:
        return f"a redirect from {was}: to {now}: (the scheme must stay the same)"
    return None


class RedirectRefused(urllib.error.URLError):
    """A redirect :func:`redirect_problem` refuses; raised before anything is opened."""

    def __init__(self, new: str, problem: str):
        super().__init__(f"{problem}: {redact(new)[:200]}")
        self.url, self.problem = new, problem


#: Request headers that carry a credential: never sent on to another origin.
CREDENTIAL_HEADERS = ("Authorization", "Proxy-Authorization", "Cookie", "X-Amz-Security-Token")


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) as a browser compares origins; the scheme's port filled in."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"https": 443, "http": 80}.get(scheme)
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handler with the rule checked first, on the Location as sent;
    a redirect to another origin carries none of :data:`CREDENTIAL_HEADERS`."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and origin(newurl) != origin(req.full_url):
            for name in CREDENTIAL_HEADERS:
                new.remove_header(name.capitalize())
        return new

    def http_error_302(self, req, fp, code, msg, headers):  # type: ignore[no-untyped-def]
        location = headers.get("location") or headers.get("uri")
        if location is not None:
            newurl = urllib.parse.urljoin(req.full_url, location)
            problem = redirect_problem(req.full_url, newurl)
            if problem is not None:
                fp.close()
                raise RedirectRefused(newurl, problem)
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


# http(s) only: no ftp, file or data handler in the opener at all
_OPENER = urllib.request.OpenerDirector()
for _handler in (
    urllib.request.ProxyHandler(),
    urllib.request.UnknownHandler(),
    urllib.request.HTTPHandler(),
    urllib.request.HTTPSHandler(),
    urllib.request.HTTPDefaultErrorHandler(),
    _Redirects(),
    urllib.request.HTTPErrorProcessor(),
):
    _OPENER.add_handler(_handler)


def urlopen(req: urllib.request.Request, timeout: float) -> Any:
    """``urllib.request.urlopen`` under the redirect rule (:func:`redirect_problem`): the
    opener every pinwheel client that uses urllib goes through."""
    scheme = urllib.parse.urlsplit(req.full_url).scheme.lower()
    if scheme not in REDIRECT_SCHEMES:
        raise RedirectRefused(req.full_url, f"a {scheme or 'scheme-less'}: URL (http(s) only)")
    return _OPENER.open(req, timeout=timeout)


def _failed(url: str) -> Fail:
    return lambda what, next: FetchFailed(what, where=url, next=next)


def _open(url: str, what: str, timeout: float) -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        return urlopen(req, timeout=timeout)
    except RedirectRefused as exc:
        raise FetchFailed(
            f"{what}: {exc.problem}: {redact(exc.url)[:200]}",
            where=url,
            next="check the URL: it must serve the file itself, over the same http(s) scheme",
        ) from None
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


def _blocks(resp: Any, url: str, what: str, cap: int, until: float) -> Iterator[bytes]:
    bounds = Bounds(what, cap, _failed(url), until)
    bounds.announced(resp.headers.get("Content-Length"))
    try:
        yield from bounds.blocks(resp)
    except (TimeoutError, OSError) as exc:
        raise FetchFailed(
            f"{what}: the transfer stalled: {exc}",
            where=url,
            next="check the server, then run again",
        ) from None


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

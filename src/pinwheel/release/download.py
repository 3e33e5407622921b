"""``pinwheel fetch``: a release from a URL, a directory or a package index, verified.

Order of trust: SHA256SUMS first (and its signature when allowed_signers is
configured), then each listed file. Every file is hashed while it streams
(one pass), written as ``.NAME.part``, resumed with an HTTP Range request after
an interruption, and renamed to NAME only once its sha256 matches. A mismatch
deletes the partial file. A wheel the source offers that SHA256SUMS does not
list is refused.

A server cannot hold a fetch forever: besides the stall timeout (silence), every
transfer must keep ``min_rate`` bytes/s over each ``rate_window`` seconds, and the
whole fetch ends at ``deadline`` seconds; either names the file, the bytes so far
and the flag to change.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import html.parser
import http.client
import os
import re
import shutil
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from pinwheel import confine, untrusted
from pinwheel.checksums import SIG, SUMS, parse_sums, sha256_file
from pinwheel.errors import PinwheelError, VerifyError
from pinwheel.fsutil import atomic_write_bytes
from pinwheel.heartbeat import human_seconds
from pinwheel.net import httpget
from pinwheel.progress import SILENT, Advance, Reporter
from pinwheel.release import attest, signing, sigstorebundle
from pinwheel.urls import redact

USER_AGENT = "pinwheel-fetch/1"
# the attestation and Sigstore bundles a directory source carries: regular files, bounded
_EXTRA = untrusted.Kind(
    "release signature file", 16 * 1024 * 1024, 0, VerifyError,
    "do not install this release; fetch it from the publisher again",
)  # fmt: skip


class FetchError(PinwheelError):
    """Network or disk trouble: the download did not complete (exit 1)."""


class TooSlow(FetchError):
    """A server too slow to finish (min rate or deadline): not retried; its ``next`` stands."""


class _Pace:
    """Enforces ``min_rate`` over ``rate_window`` and the fetch's deadline on one transfer."""

    def __init__(self, opts: FetchOptions, what: str, where: str, done: int, total: int | None):
        self.opts, self.what, self.where = opts, what, where
        self.done, self.total = done, total
        self.window_start = opts.clock()
        self.window_bytes = 0

    def add(self, n: int) -> None:
        self.done += n
        self.window_bytes += n
        self.check()

    def check(self) -> None:
        opts = self.opts
        now = opts.clock()
        got = f"{self.done} of {self.total if self.total is not None else '?'} bytes"
        if opts.deadline_at is not None and now > opts.deadline_at:
            raise TooSlow(
                f"{self.what}: the fetch ran past its {opts.deadline:g} s deadline "
                f"({got} received)",
                where=self.where,
                next="rerun the same `pinwheel fetch` (it resumes), or raise --deadline SECONDS "
                "on a slow link",
            )
        if opts.min_rate and now - self.window_start >= opts.rate_window:
            rate = self.window_bytes / (now - self.window_start)
            if rate < opts.min_rate:
                raise TooSlow(
                    f"{self.what}: server too slow: {rate:.0f} bytes/s over the last "
                    f"{now - self.window_start:.0f} s, minimum {opts.min_rate:g} ({got} received)",
                    where=self.where,
                    next="rerun the same `pinwheel fetch` later (it resumes), try another "
                    "mirror, or lower --min-rate BYTES_PER_S (0 turns the check off)",
                )
            self.window_start, self.window_bytes = now, 0


@dataclass(frozen=True)
class FetchOptions:
    timeout: float = 30.0  # connect timeout and longest silence mid-body (a stall)
    min_rate: float = 10 * 1024  # bytes/s a transfer must average over each rate_window (0: off)
    rate_window: float = 60.0
    deadline: float = 6 * 3600.0  # seconds for the whole fetch (0: none)
    deadline_at: float | None = None  # time.monotonic() when it ends; set by fetch_release
    max_small: int = 16 * 1024 * 1024  # SHA256SUMS, signature, index page
    retries: int = 5  # extra attempts per request after the first
    backoff: float = 1.0  # first wait; doubles each retry, capped at max_backoff
    max_backoff: float = 30.0
    chunk: int = 1024 * 1024
    allowed_signers: Path | None = None
    principal: str | None = None
    allow_unsigned: bool = False  # no allowed_signers accepted: the user said so (stated)
    sums: str | None = None  # SHA256SUMS location for an index source
    # who must have signed a Sigstore bundle beside the release (None: reported, not checked)
    sigstore_policy: Any = field(default=None, compare=False)
    command: str = "pinwheel fetch"  # the command a refusal names
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    # Bytes as they arrive, and a line before each retry wait (what failed, which
    # attempt, how long so far): the caller's one progress channel.
    reporter: Reporter = field(default=SILENT, repr=False, compare=False)

    def started(self) -> FetchOptions:
        """These options with the deadline clock running (once per fetch)."""
        if self.deadline_at is not None or not self.deadline:
            return self
        return dataclasses.replace(self, deadline_at=self.clock() + self.deadline)


@dataclass(frozen=True)
class Source:
    kind: str  # "dir" | "url" | "index"
    location: str  # a directory path, a base URL ending in "/", or a PEP 503 project page

    def describe(self) -> str:
        return f"{self.kind} {self.location}"


@dataclass(frozen=True)
class FetchedFile:
    name: str
    sha256: str
    size: int
    resumed_from: int  # bytes kept from an earlier attempt (0 = fresh)
    attempts: int
    skipped: bool = False  # already present with the right hash


@dataclass(frozen=True)
class FetchResult:
    source: Source
    dest: Path
    files: tuple[FetchedFile, ...]
    signed_by: str | None
    signature: str = (
        "absent"  # "verified" | "present" (not verified: no allowed_signers) | "absent"
    )
    allow_unsigned: bool = False  # accepted without allowed_signers (--allow-unsigned)
    # the attestation and Sigstore bundles carried and checked (None: an unsigned release
    # without an attestation, fetched with --allow-unsigned)
    check: attest.ReleaseCheck | None = None


# --------------------------------------------------------------------------- sources


def resolve_source(text: str) -> Source:
    """URL (GitHub-release style base), DIR, or INDEX (a PEP 503 ``.../simple/<project>/``)."""
    if re.match(r"^https?://", text):
        url_path = urllib.parse.urlsplit(text).path
        base = text if text.endswith("/") else text + "/"
        return Source("index" if "/simple/" in url_path else "url", base)
    if text.startswith("file://"):
        text = urllib.parse.unquote(urllib.parse.urlsplit(text).path)
    path = Path(text)
    if not path.is_dir():
        raise PinwheelError(
            f"{text} is neither an http(s) URL nor a directory",
            where="pinwheel fetch SOURCE",
            next="pass a release base URL, a directory, or an index project URL",
        )
    return Source("dir", str(path.resolve()))


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def _links(page: bytes, base: str) -> dict[str, str]:
    """{file name: absolute URL (with any #sha256= fragment)} for the page's links."""
    parser = _Links()
    parser.feed(page.decode("utf-8", errors="replace"))
    out = {}
    scheme = urllib.parse.urlsplit(base).scheme.lower()
    for href in parser.hrefs:
        url = urllib.parse.urljoin(base, href.strip())
        # A remote page may only point at its own scheme: never file://, data:, ftp://,
        # and never an https page down to http.
        if urllib.parse.urlsplit(url).scheme.lower() != scheme:
            continue
        name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        if name:
            out[name] = url
    return out


# --------------------------------------------------------------------------- HTTP


def _retryable_status(code: int) -> bool:
    return code in (408, 425, 429) or code >= 500


def _request(url: str, opts: FetchOptions, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    if urllib.parse.urlsplit(url).scheme.lower() not in ("http", "https"):
        # urllib would also open file://, ftp:// and data: URLs: a download is http(s) only.
        raise FetchError(
            f"refusing to fetch a non-http(s) URL: {redact(url)[:200]}",
            where=redact(url)[:200],
            next="fetch only from an http(s) release, index or a local directory",
        )
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
    return httpget.urlopen(req, timeout=opts.timeout)  # the one redirect rule


_TRANSIENT = (
    urllib.error.URLError,
    TimeoutError,
    socket.timeout,
    ConnectionError,
    http.client.HTTPException,
)


def _describe(exc: BaseException, opts: FetchOptions) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, (TimeoutError, socket.timeout)) or "timed out" in str(exc):
        return f"stalled: no data for {opts.timeout:g} s"
    if isinstance(exc, urllib.error.URLError):
        return f"cannot connect: {exc.reason}"
    if isinstance(exc, http.client.IncompleteRead):
        return (
            f"the server closed the connection {exc.expected} bytes short of its "
            "Content-Length (wrong length or a dropped connection)"
        )
    return f"{type(exc).__name__}: {exc}"


def _with_retries(
    url: str, opts: FetchOptions, what: str, attempt_fn: Callable[[int], bytes]
) -> bytes:
    """Run ``attempt_fn`` until it succeeds; 404 and other 4xx fail at once."""
    attempt = 0
    began = opts.clock()
    while True:
        attempt += 1
        try:
            return attempt_fn(attempt)
        except httpget.RedirectRefused as exc:  # never retried: the answer will not change
            raise FetchError(
                f"{what}: {exc.problem}: {redact(exc.url)[:200]}",
                where=url,
                next="fetch from the release's own http(s) URL (no redirect to another scheme)",
            ) from None
        except urllib.error.HTTPError as exc:
            exc.close()  # its body holds the connection open
            if not _retryable_status(exc.code):
                raise _http_error(exc, url, what) from None
            last: BaseException = exc
        except _TRANSIENT as exc:
            last = exc
        if attempt > opts.retries:
            raise FetchError(
                f"{what}: {_describe(last, opts)} (gave up after {attempt} attempts)",
                where=url,
                next="check the server, then rerun the same `pinwheel fetch`",
            ) from None
        wait = min(opts.backoff * 2 ** (attempt - 1), opts.max_backoff)
        opts.reporter.info(
            f"{what}: {_describe(last, opts)}; retry {attempt} of {opts.retries} in "
            f"{wait:.0f} s ({human_seconds(opts.clock() - began)} so far)"
        )
        opts.sleep(wait)


def _http_error(exc: urllib.error.HTTPError, url: str, what: str) -> PinwheelError:
    if exc.code in (404, 410):
        return FetchError(
            f"{what}: not found (HTTP {exc.code})",
            where=url,
            next="check the release URL and tag; the file must be uploaded",
        )
    return FetchError(
        f"{what}: HTTP {exc.code} {exc.reason}", where=url, next="check the URL and credentials"
    )


def get_small(url: str, opts: FetchOptions, what: str) -> bytes:
    """A small document (SHA256SUMS, signature, index page) into memory, with retries."""

    def once(_: int) -> bytes:
        with _request(url, opts) as resp:
            bounds = httpget.Bounds(what, opts.max_small, _failed(url))  # _Pace: the deadline
            total = bounds.announced(resp.headers.get("Content-Length"))
            pace = _Pace(opts, what, url, 0, total)
            data = bytearray()
            for block in bounds.blocks(resp):
                data += block
                pace.add(len(block))
            if total is not None and len(data) < total:
                raise http.client.IncompleteRead(bytes(data), total - len(data))
            return bytes(data)

    return _with_retries(url, opts, what, once)


# --------------------------------------------------------------------------- one file


class _Partial:
    """``.NAME.part`` beside the final name, with the running hash of what it holds."""

    def __init__(self, dest: Path, name: str):
        # Both names confined to --dest; a symlink or non-file planted at the partial's
        # name is removed, never written or read through.
        self.dest = dest
        self.final = confine.inside(dest, name, what="fetched file")
        self.path = confine.inside(dest, f".{name}.part", what="partial file")
        self.digest = hashlib.sha256()
        self.size = 0
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            confine.remove(dest, self.path)
        elif self.path.exists():  # left by an interrupted run: hash it once, then resume
            with confine.open_read(dest, self.path) as fh:
                while block := fh.read(8 * 1024 * 1024):
                    self.digest.update(block)
                    self.size += len(block)
        self.resumed_from = self.size

    def reset(self) -> None:
        confine.remove(self.dest, self.path)
        self.digest = hashlib.sha256()
        self.size = 0

    def append_from(
        self, stream: BinaryIO, chunk: int, advance: Advance, pace: _Pace | None = None
    ) -> None:
        with confine.open_append(self.dest, self.path) as fh:
            # read1: whatever has arrived (up to chunk), so bytes before a stall are kept.
            read = getattr(stream, "read1", stream.read)
            try:
                while block := read(chunk):
                    fh.write(block)
                    self.digest.update(block)
                    self.size += len(block)
                    advance(len(block))
                    if pace is not None:
                        pace.add(len(block))
            finally:
                fh.flush()
                os.fsync(fh.fileno())

    def commit(self, expected: str, where: str) -> str:
        actual = self.digest.hexdigest()
        if actual != expected:
            self.reset()
            raise VerifyError(
                f"sha256 mismatch for {self.final.name}: got {actual}, "
                f"SHA256SUMS lists {expected}; "
                "the partial file was deleted",
                where=where,
                next="do not use this source; fetch from the publisher again or report it",
            )
        confine.replace(self.dest, self.path, self.final)
        return actual


def _check_space(dest: Path, needed: int, name: str) -> None:
    free = shutil.disk_usage(dest).free
    if needed > free:
        raise FetchError(
            f"not enough space for {name}: needs {needed} more bytes, {free} free",
            where=str(dest),
            next="free space or pass --dest on a larger disk",
        )


def _disk_full(part: _Partial, dest: Path) -> FetchError:
    part.reset()
    return FetchError(
        f"disk full while writing {part.final.name}; the partial file was deleted",
        where=str(dest),
        next="free space or pass --dest on a larger disk, then rerun",
    )


def _already_there(final: Path, expected: str) -> bool:
    if final.is_symlink() or not final.is_file():
        return False  # a symlink is replaced by the verified file, never trusted
    return sha256_file(final) == expected


def download(
    url: str,
    dest: Path,
    name: str,
    expected: str,
    opts: FetchOptions,
) -> FetchedFile:
    """Stream ``url`` to ``dest/name``, hashing as it goes; resume with Range after a break."""
    opts = opts.started()
    if _already_there(dest / name, expected):
        return FetchedFile(name, expected, (dest / name).stat().st_size, 0, 0, skipped=True)
    part = _Partial(dest, name)
    resumed_from = part.resumed_from
    restarted_after_resume = False
    while True:
        attempts = 0

        def once(attempt: int) -> bytes:
            nonlocal attempts
            attempts = attempt
            headers = {"Range": f"bytes={part.size}-"} if part.size else {}
            try:
                resp = _request(url, opts, headers)
            except urllib.error.HTTPError as exc:
                if exc.code == 416 and part.size:  # the partial is longer than the file
                    exc.close()
                    part.reset()
                    raise ConnectionError("range not satisfiable; restarting from zero") from None
                raise
            with resp:
                if part.size and resp.status == 206:
                    start = _content_range_start(resp.headers.get("Content-Range", ""))
                    if start != part.size:
                        part.reset()
                        raise ConnectionError("server resumed at the wrong offset; restarting")
                elif part.size:  # 200: the server ignored Range, start over
                    part.reset()
                length = _length(resp, url, name)
                total = part.size + length if length is not None else None
                if length is not None:
                    _check_space(dest, length, name)
                pace = _Pace(opts, name, url, part.size, total)
                try:
                    with opts.reporter.transfer(name, total, part.size) as advance:
                        part.append_from(resp, opts.chunk, advance, pace)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise _disk_full(part, dest) from None
                    raise
                if total is not None and part.size < total:
                    raise http.client.IncompleteRead(b"", total - part.size)
            return b""

        try:
            _with_retries(url, opts, name, once)
        except TooSlow:
            raise
        except FetchError as err:
            if part.size:
                err.next = (
                    f"rerun the same `pinwheel fetch`: it resumes {name} from byte {part.size}"
                )
            raise
        try:
            digest = part.commit(expected, url)
        except VerifyError:
            if resumed_from and not restarted_after_resume:
                # The bytes kept from an earlier run may be the bad ones: one clean try.
                restarted_after_resume = True
                resumed_from = 0
                continue
            raise
        return FetchedFile(name, digest, part.size, resumed_from, attempts)


def _content_range_start(value: str) -> int | None:
    m = re.fullmatch(r"bytes ([0-9]{1,19})-[0-9]{1,19}/([0-9]{1,19}|\*)", value.strip())
    return int(m.group(1)) if m else None


def _failed(url: str) -> httpget.Fail:
    return lambda what, next: FetchError(what, where=url, next=next)


def _length(resp: Any, url: str, what: str) -> int | None:
    """The answer's Content-Length, checked (digits only), or None when it sent none."""
    # a wheel's size is whatever SHA256SUMS vouches for: the disk-space check bounds it
    bounds = httpget.Bounds(what, sys.maxsize, _failed(url))
    return bounds.announced(resp.headers.get("Content-Length"))


def copy_verified(
    src: Path, dest: Path, name: str, expected: str, reporter: Reporter = SILENT
) -> FetchedFile:
    """The directory-source twin of :func:`download`: copy, hash in the same pass, rename."""
    if _already_there(dest / name, expected):
        return FetchedFile(name, expected, (dest / name).stat().st_size, 0, 0, skipped=True)
    if not src.is_file():
        raise FetchError(
            f"{name} is listed in SHA256SUMS but missing",
            where=str(src.parent),
            next="the release directory is incomplete; copy it again",
        )
    part = _Partial(dest, name)
    part.reset()  # a local copy is cheap to redo: never trust an old partial
    _check_space(dest, src.stat().st_size, name)
    try:
        with open(src, "rb") as fh, reporter.transfer(name, src.stat().st_size) as advance:
            part.append_from(fh, 8 * 1024 * 1024, advance)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _disk_full(part, dest) from None
        raise
    digest = part.commit(expected, str(src))
    return FetchedFile(name, digest, part.size, 0, 1)


# --------------------------------------------------------------------------- a whole release


def _read_location(
    location: str, opts: FetchOptions, what: str, *, optional: bool = False
) -> bytes | None:
    if re.match(r"^https?://", location):
        try:
            return get_small(location, opts, what)
        except FetchError as err:
            if optional and "not found" in err.what:
                return None
            raise
    path = Path(location)
    if not path.is_file():
        if optional:
            return None
        raise FetchError(
            f"{what}: not found",
            where=str(path),
            next="check the path; a release directory holds SHA256SUMS",
        )
    return path.read_bytes()


def _index_files(source: Source) -> str:
    """Where ``pinwheel index`` put the signed release for the project page ``source``
    (``BASE/VARIANT/simple/NAME/`` -> ``BASE/files/``), said as a hint; empty otherwise."""
    from pinwheel.release.pyindex import FILES  # only on this refusal: it loads pylock

    parts = urllib.parse.urlsplit(source.location)
    segments = parts.path.rstrip("/").split("/")
    if len(segments) < 4 or segments[-2] != "simple":  # ['', ..., VARIANT, simple, NAME]
        return ""
    files = urllib.parse.urlunsplit(
        parts._replace(path="/".join(segments[:-3]) + f"/{FILES}/", query="", fragment="")
    )
    return (f"; an index pinwheel made keeps the signed release beside it: --sums "
            f"{files}SHA256SUMS, or give {files} itself as the source")  # fmt: skip


def _sums_location(source: Source, opts: FetchOptions) -> str:
    if source.kind == "index":
        if not opts.sums:
            raise PinwheelError(
                "an index does not carry SHA256SUMS: say where the release's SHA256SUMS is",
                where=source.location,
                next="pass --sums URL|PATH (the release's SHA256SUMS)" + _index_files(source),
            )
        return opts.sums
    if source.kind == "url":
        return source.location + SUMS
    return str(Path(source.location) / SUMS)


def _offered(source: Source, opts: FetchOptions) -> dict[str, str]:
    """Files the source offers beside SHA256SUMS: {name: URL or path}."""
    if source.kind == "dir":
        return {p.name: str(p) for p in Path(source.location).iterdir() if p.is_file()}
    if source.kind == "index":
        page = get_small(source.location, opts, "index project page")
        return _links(page, source.location)
    # A GitHub release has no listing; a plain web server's directory page has one.
    try:  # optional, so no retries: a GitHub release base answers 404 at once
        page = get_small(source.location, dataclasses.replace(opts, retries=0), "release listing")
    except FetchError:
        return {}
    return {n: u for n, u in _links(page, source.location).items() if "?" not in n}


_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,200}")


def _page_project(url: str) -> str:
    """The project a PEP 503 page is for: the path segment after ``/simple/``."""
    tail = urllib.parse.urlsplit(url).path.split("/simple/", 1)[-1]
    return str(canonicalize_name(urllib.parse.unquote(tail.strip("/").split("/")[0])))


def _project_of(wheel: str) -> str | None:
    try:
        return str(parse_wheel_filename(wheel)[0])
    except InvalidWheelFilename:
        return None


def _remote(location: str) -> bool:
    return re.match(r"^https?://", location) is not None


def _beside(source: Source, sums_at: str) -> str:
    """Where the release's files other than the index's wheels are: the source itself, or
    for an index the folder (or URL) SHA256SUMS is in."""
    if source.kind != "index":
        return source.location
    if re.match(r"^https?://", sums_at):
        return urllib.parse.urljoin(sums_at, ".")
    return str(Path(sums_at).resolve().parent)


def _carry(
    source: Source, beside: str, offered: dict[str, str], dest: Path, opts: FetchOptions
) -> list[str]:
    """The files that sign the release but are not listed in SHA256SUMS: the in-toto
    attestation and each Sigstore bundle (``SHA256SUMS.sigstore.json``, and any other
    ``*.sigstore[.json]`` the source lists), copied into ``dest`` as they are; they are
    checked there (:func:`pinwheel.release.attest.check_carried`). Returns their names."""
    names = {attest.FILENAME, f"{SUMS}.sigstore.json"}
    names |= {n for n in offered if n.endswith(sigstorebundle.SUFFIXES) and _PLAIN.fullmatch(n)}
    carried = []
    for name in sorted(names):
        target = confine.inside(dest, name, what="release file")
        if not _remote(beside):
            path = Path(beside) / name
            data = untrusted.read_bytes(path, _EXTRA) if os.path.lexists(path) else None
        else:
            data = _read_location(urllib.parse.urljoin(beside, urllib.parse.quote(name)),
                                  opts, name, optional=True)  # fmt: skip
        if data is None:
            if os.path.lexists(target) and not target.is_dir():
                target.unlink()  # a stale one from an earlier fetch never stands for this one
            continue
        atomic_write_bytes(target, data)
        carried.append(name)
    return carried


def _signature(
    sums_at: str, sums_bytes: bytes, opts: FetchOptions
) -> tuple[str | None, bytes | None]:
    """(who signed SHA256SUMS, the signature's bytes): verified with allowed_signers,
    required then; otherwise only looked for, to say whether there was one."""
    signed_by = None
    sig: bytes | None = None
    if opts.allowed_signers is None:
        # Not verified, but say whether there was a signature to verify.
        try:
            sig = _read_location(
                sums_at + ".sig", dataclasses.replace(opts, retries=0), SIG, optional=True
            )
        except FetchError:
            sig = None  # only a probe: the release is unverified either way
    else:
        sig = _read_location(sums_at + ".sig", opts, SIG, optional=True)
        if sig is None:
            raise VerifyError(
                f"{SIG} not found but allowed_signers is configured",
                where=sums_at + ".sig",
                next="the release is unsigned or incomplete: do not install it",
            )
        signed_by = signing.verify(sums_bytes, sig, opts.allowed_signers, opts.principal)
    return signed_by, sig


def _wanted(
    source: Source,
    sums: Mapping[str, str],
    offered: Mapping[str, str],
    sums_at: str,
    only: tuple[str, ...],
) -> list[str]:
    """The files to fetch: every one SHA256SUMS lists (``only`` those named, each listed).
    An index's hashes must agree and its project's listed wheels be there; a folder or
    base URL may offer no wheel SHA256SUMS does not list."""
    wheels_offered = {n for n in offered if n.endswith(".whl")}
    if source.kind == "index":
        # An index holds other versions too: take the listed ones, check its hashes agree.
        for name in wheels_offered & set(sums):
            frag = urllib.parse.urlsplit(offered[name]).fragment
            if frag.startswith("sha256=") and frag[7:] != sums[name]:
                raise VerifyError(
                    f"the index's sha256 for {name} differs from SHA256SUMS",
                    where=offered[name],
                    next="do not install from this index",
                )
        # the page's project's wheels from the index; every other file (other projects'
        # wheels, notes, provenance, the lock) from beside SHA256SUMS
        wanted = sorted(sums)
        project = _page_project(source.location)
        missing = [n for n in wanted if n.endswith(".whl") and n not in offered
                   and _project_of(n) == project]  # fmt: skip
        if missing:
            raise FetchError(
                f"not on the index: {', '.join(missing)}",
                where=source.location,
                next="upload them with `pinwheel publish --to index`",
            )
    else:
        stray = sorted(wheels_offered - set(sums))
        if stray:
            raise VerifyError(
                f"wheel not listed in SHA256SUMS, refused: {', '.join(stray)}",
                where=source.location,
                next="the release is inconsistent: ask the publisher to fix it",
            )
        wanted = sorted(sums)
    for name in only:
        if name not in sums:
            raise VerifyError(
                f"{name} is not listed in SHA256SUMS, refused",
                where=sums_at,
                next="pick a file that SHA256SUMS lists",
            )
    if only:
        wanted = sorted(only)
    return wanted


def fetch_release(
    source: Source,
    dest: Path,
    opts: FetchOptions,
    only: tuple[str, ...] = (),
) -> FetchResult:
    """Verify SHA256SUMS (and its signature), then fetch and verify every listed file.

    Every name is checked (plain file names only, listed once) before a file is placed.
    """
    signing.require_signers(opts.allowed_signers, opts.allow_unsigned, opts.command)
    opts = opts.started()
    sums_at = _sums_location(source, opts)
    sums_bytes = _read_location(sums_at, opts, SUMS)
    assert sums_bytes is not None
    signed_by, sig = _signature(sums_at, sums_bytes, opts)
    sums = parse_sums(sums_bytes, sums_at)

    offered = _offered(source, opts)
    wanted = _wanted(source, sums, offered, sums_at, only)

    dest.mkdir(parents=True, exist_ok=True)
    fetched = []
    beside = _beside(source, sums_at)
    for name in wanted:
        url = offered.get(name) if source.kind != "dir" and name.endswith(".whl") else None
        if url is None and not _remote(beside):
            fetched.append(copy_verified(Path(beside) / name, dest, name, sums[name],
                                         opts.reporter))  # fmt: skip
            continue
        url = url or urllib.parse.urljoin(beside, urllib.parse.quote(name))
        fetched.append(download(url.split("#", 1)[0], dest, name, sums[name], opts))
    carried = _carry(source, beside, offered, dest, opts)
    # The sums (and signature) last: a directory with SHA256SUMS is a complete one. They go
    # as they were signed, so `install` checks the signature again (a partial fetch, --file,
    # is installed with --allow-partial).
    atomic_write_bytes(dest / SUMS, sums_bytes)
    if sig is not None:
        atomic_write_bytes(dest / SIG, sig)
    else:
        (dest / SIG).unlink(missing_ok=True)
    try:
        check = attest.check_carried(
            dest, attest.SumsChecked(sums, signed_by), allowed_signers=opts.allowed_signers,
            principal=opts.principal, sigstore_policy=opts.sigstore_policy, partial=bool(only),
        )  # fmt: skip
    except PinwheelError:
        for name in (SUMS, SIG, *carried):  # never a folder `install` would take as complete
            (dest / name).unlink(missing_ok=True)
        raise
    return FetchResult(
        source=source,
        dest=dest,
        files=tuple(fetched),
        signed_by=signed_by,
        signature="verified" if signed_by else ("present" if sig is not None else "absent"),
        allow_unsigned=signed_by is None,
        check=check,
    )

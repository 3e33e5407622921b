"""Where the object store's entries live: a local directory, Redis or S3.

One small interface under :class:`pinwheel.compile.objstore.Store`: ``read`` (a bounded
small value, the index record), ``fetch`` (a bounded blob streamed into a file, the
wheel), ``write`` and ``send`` (the same two ways back). Keys are the store's relative
names (``v1/index/<identity>/<match>.json``, ``v1/wheels/<sha256>/wheel``).

- :class:`LocalDir`: ``<root>/<key>``, the layout the local store always had;
- :class:`Redis`: a minimal RESP client over one socket (``GET``/``SET``/``PING`` with
  binary values), keys ``<prefix>/pinwheel-objects/<key>``; ``AUTH`` from
  ``SCCACHE_REDIS_USERNAME``/``SCCACHE_REDIS_PASSWORD`` or the URL's user info (sccache's
  ``SCCACHE_REDIS`` form), ``SELECT`` from ``SCCACHE_REDIS_DB`` or the URL's path;
- :class:`S3`: HTTP ``GET``/``PUT`` signed with AWS Signature Version 4 from
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``; path-style
  (``<endpoint>/<bucket>/<key>``) for a custom endpoint, as sccache's ``SCCACHE_ENDPOINT``.

Everything a server answers is untrusted: every answer is read through
:class:`pinwheel.net.httpget.Bounds` (a length checked before anything is read, a byte cap,
a deadline); a reply that is not what the protocol promises, a dead server or a transfer
cut off raises :class:`Unavailable`, which the store turns into "no store" (a miss, or
nothing stored), never a failed build. Redis ``SET`` and S3 ``PUT`` replace a value
whole or not at all: no reader sees half an entry.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from pinwheel import confine, untrusted, validate
from pinwheel.errors import PinwheelError
from pinwheel.net import Unavailable, httpget, resp, s3
from pinwheel.options import AwsCredentials, SccacheStore

SUBDIR = "pinwheel-objects"
TIMEOUT = 10.0  # seconds one socket operation may wait
DEADLINE = 600.0  # seconds one transfer may take (a wheel of a few hundred MB)
_SERVER = "check the server; the build goes on without the object store"


def _fail(where: str) -> httpget.Fail:
    return lambda what, next: Unavailable(what, where=where, next=next)


class Backend(Protocol):
    @property
    def name(self) -> str: ...

    def describe(self) -> str: ...

    def check(self) -> None: ...

    def read(self, key: str, cap: int) -> bytes | None: ...

    def fetch(self, key: str, out: BinaryIO, cap: int) -> bool: ...

    def write(self, key: str, data: bytes) -> None: ...

    def send(self, key: str, path: Path, sha256: str) -> None: ...


# --------------------------------------------------------------------------- local


@dataclass(frozen=True)
class LocalDir:
    """``<root>/<key>``: a directory beside sccache's (``<SCCACHE_DIR>/pinwheel-objects``)."""

    root: Path
    name: str = "local"

    def describe(self) -> str:
        return f"local ({SUBDIR} in the compiler cache's directory)"

    def check(self) -> None:
        return None

    def path(self, key: str) -> Path:
        return self.root / key

    # Every read and write goes through folders opened O_NOFOLLOW one by one from the
    # root (pinwheel.confine): a co-user who plants a link anywhere in the shared
    # directory (a folder, the entry, the temporary file) never leads one out.

    def read(self, key: str, cap: int) -> bytes | None:
        kind = untrusted.Kind("object store record", cap, 64, Unavailable, "")
        try:
            return untrusted.read_beneath(self.root, key, kind)
        except PinwheelError:  # absent, a link, a FIFO or device, too large: not an entry
            return None

    def fetch(self, key: str, out: BinaryIO, cap: int) -> bool:
        try:
            src = confine.open_beneath(self.root, key)
        except (OSError, confine.Escape):
            return False
        with src:
            size = os.fstat(src.fileno()).st_size
            if size > cap:
                raise Unavailable(f"a wheel of {size} bytes, more than the {cap} it may have",
                                  where=str(self.path(key)), next=_SERVER)  # fmt: skip
            shutil.copyfileobj(src, out, 1024 * 1024)
        return True

    def write(self, key: str, data: bytes) -> None:
        try:
            confine.write_beneath(self.root, key, data)
        except confine.Escape as exc:
            raise Unavailable(exc.what, where=str(self.path(key)), next=_SERVER) from None

    def send(self, key: str, path: Path, sha256: str) -> None:
        try:
            with confine.open_beneath(self.root, key) as held:
                digest = hashlib.sha256()
                for chunk in iter(lambda: held.read(1024 * 1024), b""):
                    digest.update(chunk)
                if digest.hexdigest() == sha256:
                    return
        except (OSError, confine.Escape):
            pass
        try:
            confine.copy_beneath(self.root, key, path)
        except confine.Escape as exc:
            raise Unavailable(exc.what, where=str(self.path(key)), next=_SERVER) from None


# --------------------------------------------------------------------------- redis


def _key(prefix: str, key: str) -> str:
    return f"{prefix.strip('/')}/{SUBDIR}/{key}" if prefix.strip("/") else f"{SUBDIR}/{key}"


@dataclass(frozen=True)
class Redis:
    """A Redis server (``redis://`` or ``rediss://``), one connection per operation."""

    host: str
    port: int
    tls: bool = False
    prefix: str = ""
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    db: int = 0
    name: str = "redis"
    line_deadline: float = resp.LINE_DEADLINE  # a reply's status or length line, whole

    def describe(self) -> str:
        where = f"{self.host}:{self.port}"
        return f"redis ({_key(self.prefix, '')} at {where})"

    @property
    def where(self) -> str:
        return f"redis {self.host}:{self.port}"

    def _connect(self) -> resp.Connection:
        return resp.open_connection(
            resp.Endpoint(
                self.host, self.port, self.tls, self.username, self.password, self.db,
                line_deadline=self.line_deadline,
            )
        )  # fmt: skip

    def check(self) -> None:
        conn = self._connect()
        try:
            conn.simple("PING")
        finally:
            conn.close()

    def read(self, key: str, cap: int) -> bytes | None:
        conn = self._connect()
        try:
            conn.command("GET", _key(self.prefix, key))
            return conn.bulk(cap)
        finally:
            conn.close()

    def fetch(self, key: str, out: BinaryIO, cap: int) -> bool:
        conn = self._connect()
        try:
            conn.command("GET", _key(self.prefix, key))
            return conn.bulk_into(out, cap)
        finally:
            conn.close()

    def write(self, key: str, data: bytes) -> None:
        conn = self._connect()
        try:
            conn.command("SET", _key(self.prefix, key), data)
            conn.status()
        finally:
            conn.close()

    def send(self, key: str, path: Path, sha256: str) -> None:
        conn = self._connect()
        try:
            with open(path, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                conn.command_file("SET", _key(self.prefix, key), src, size)
            conn.status()
        finally:
            conn.close()


def redis_from(store: SccacheStore, prefix: str) -> Redis:
    """The Redis of sccache's settings (typed by :class:`pinwheel.options.SccacheStore`):
    ``SCCACHE_REDIS_ENDPOINT`` (or the older ``SCCACHE_REDIS`` URL, which may carry
    ``user:password@`` and ``/db``), ``SCCACHE_REDIS_USERNAME``/``_PASSWORD``/``_DB``.
    ValueError when unreadable."""
    url = store.redis_endpoint or store.redis_url or ""
    parts = urllib.parse.urlsplit(url if "//" in url else f"redis://{url}")
    if parts.scheme not in ("redis", "rediss", "tcp"):
        raise ValueError(f"a {parts.scheme}: URL (redis:// or rediss://)")
    host = parts.hostname
    if not host or validate.line_problem(host):
        raise ValueError("no host in the endpoint URL")
    port = validate.port(parts.port or 6379)
    db_text = store.redis_db or parts.path.strip("/") or "0"
    if not db_text.isdigit() or len(db_text) > 4:
        raise ValueError(f"a database number, not {db_text[:20]!r}")
    password = store.redis_password or (
        urllib.parse.unquote(parts.password) if parts.password else None
    )
    username = store.redis_username or (
        urllib.parse.unquote(parts.username) if parts.username else None
    )
    return Redis(host, port, parts.scheme == "rediss", prefix, username, password, int(db_text))


# --------------------------------------------------------------------------- s3


@dataclass(frozen=True)
class S3:
    """An S3 bucket through :class:`pinwheel.net.s3.Client` (botocore: the standard AWS
    credential chain, SigV4, SSE; no redirect followed, every answer bounded)."""

    client: s3.Client
    prefix: str = ""
    name: str = "s3"

    @property
    def where(self) -> str:  # the endpoint and bucket, never a secret
        return self.client.where

    def describe(self) -> str:
        return f"s3 ({_key(self.prefix, '')} in {self.where})"

    def check(self) -> None:
        self.client.check(_key(self.prefix, "v1/ping"))

    def read(self, key: str, cap: int) -> bytes | None:
        return self.client.get(_key(self.prefix, key), cap, None)

    def fetch(self, key: str, out: BinaryIO, cap: int) -> bool:
        return self.client.get(_key(self.prefix, key), cap, out) is not None

    def write(self, key: str, data: bytes) -> None:
        self.client.put(_key(self.prefix, key), data, len(data))

    def send(self, key: str, path: Path, sha256: str) -> None:
        with open(path, "rb") as src:
            self.client.put(_key(self.prefix, key), src, os.fstat(src.fileno()).st_size)


def s3_from(store: SccacheStore, prefix: str, aws: AwsCredentials) -> S3:
    """The S3 of sccache's settings (typed by :class:`pinwheel.options.SccacheStore`):
    ``SCCACHE_BUCKET``, ``SCCACHE_REGION`` (else the AWS configuration's, else us-east-1),
    ``SCCACHE_ENDPOINT`` (path-style; without a scheme, https unless ``SCCACHE_S3_USE_SSL``
    is false), server-side encryption as sccache reads it
    (``SCCACHE_S3_SERVER_SIDE_ENCRYPTION_KMS_KEY_ID``, else
    ``SCCACHE_S3_SERVER_SIDE_ENCRYPTION_AWS_KMS`` for aws:kms, else
    ``SCCACHE_S3_SERVER_SIDE_ENCRYPTION`` for AES256). Credentials: ``aws`` (the AWS
    variables typed by :func:`pinwheel.options.host`) when set, else the standard AWS
    chain; none when ``SCCACHE_S3_NO_CREDENTIALS`` is true. ValueError when unreadable."""
    bucket = store.bucket or ""
    problem = validate.identifier_problem(bucket)
    if problem:
        raise ValueError(f"bucket {bucket[:80]!r}: {problem}")
    region = store.region or None
    if region is not None and validate.identifier_problem(region):
        raise ValueError(f"region {region[:80]!r}: {validate.identifier_problem(region)}")
    endpoint = store.endpoint or None
    if endpoint:
        if "://" not in endpoint:
            ssl_off = (store.s3_use_ssl or "true").lower() in ("false", "0", "off")
            endpoint = f"{'http' if ssl_off else 'https'}://{endpoint}"
        validate.http_url(endpoint, schemes=("http", "https"))
        region = "us-east-1" if region in (None, "auto") else region
    kms_key = store.sse_kms_key_id or None
    flag = SccacheStore.flag
    sse = ("aws:kms" if kms_key or flag(store.sse_aws_kms)
           else "AES256" if flag(store.sse) else None)  # fmt: skip
    settings = s3.Settings(
        bucket, region, endpoint, anonymous=flag(store.s3_no_credentials), sse=sse,
        kms_key_id=kms_key, access_key_id=aws.access_key_id,
        secret_access_key=aws.secret_access_key, session_token=aws.session_token,
    )  # fmt: skip
    return S3(s3.Client(settings), prefix)


def _local_from(store: SccacheStore, aws: AwsCredentials) -> Backend:
    if not store.dir:
        raise ValueError("no local cache directory")
    return LocalDir(Path(store.dir) / SUBDIR)


def _redis_of(store: SccacheStore, aws: AwsCredentials) -> Backend:
    return redis_from(store, store.redis_key_prefix or "")


def _s3_of(store: SccacheStore, aws: AwsCredentials) -> Backend:
    return s3_from(store, store.s3_key_prefix or "", aws)


# The object store's backends, by the compiler cache's backend name: one row each. A new
# store (GCS, say) is a module with a Backend and one row here; nothing else dispatches on
# the name. Each maker reads sccache's settings, typed (the server's: the environment's
# over the manifest's), and raises ValueError when they cannot be read.
BACKENDS: dict[str, Callable[[SccacheStore, AwsCredentials], Backend]] = {
    "local": _local_from,
    "redis": _redis_of,
    "s3": _s3_of,
}


__all__ = [
    "BACKENDS",
    "S3",
    "Backend",
    "LocalDir",
    "Redis",
    "Unavailable",
    "redis_from",
    "s3_from",
]

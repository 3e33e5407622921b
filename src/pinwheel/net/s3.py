"""S3 through botocore: the standard AWS credential chain, its signing and SSE; the bytes
over a bounded transport of pinwheel's own.

botocore resolves the credentials as every AWS tool does (and sccache too): the
explicit ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN`` of
:class:`pinwheel.options.AwsCredentials` when set, else its chain over the process
environment and the shared files (``AWS_PROFILE`` and ``~/.aws/config``/``credentials``,
a web identity token file with ``AWS_ROLE_ARN``, the container and instance roles); it
signs (SigV4) and parses. A store that finds no credentials, or whose credentials the
bucket refuses, raises :class:`pinwheel.net.Unavailable` saying "cannot authenticate"
and where the credentials came from: never an unsigned request that fails later.

Every request botocore makes to the bucket is sent by :meth:`Client._send` (botocore's
``before-send`` event): one connection, no redirect followed (a 3xx answer is an error
here, so a signature or token never reaches another origin; botocore's own region
redirect is never reached either), every answer read through
:class:`pinwheel.net.httpget.Bounds` (an error answer at most :data:`ERROR_CAP` bytes, a
value at most the caller's cap, each within the whole-answer deadline). Every message is
shown with the secret key and token replaced by ``***``.
"""

from __future__ import annotations

import http.client
import ssl
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from pinwheel.net import Unavailable, httpget
from pinwheel.urls import redact

TIMEOUT = 10.0  # seconds one socket operation may wait
DEADLINE = 600.0  # seconds one transfer may take (a wheel of a few hundred MB)
ERROR_CAP = 64 * 1024  # an error answer, or the answer to a PUT
BLOCK = 64 * 1024
_AUTH_CODES = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
               "InvalidToken", "TokenRefreshRequired", "AuthorizationHeaderMalformed")  # fmt: skip
_CHAIN = (
    "environment, shared config profile (AWS_PROFILE), web identity token file "
    "(AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN), container or instance role"
)


@dataclass(frozen=True)
class Settings:
    """One bucket and how to reach it. ``endpoint``: a custom endpoint (path-style), else
    AWS's; ``sse``: server-side encryption of every PUT (``AES256`` or ``aws:kms`` with
    ``kms_key_id``); ``anonymous``: unsigned requests (a public bucket)."""

    bucket: str
    region: str | None = None
    endpoint: str | None = None
    anonymous: bool = False
    sse: str | None = None
    kms_key_id: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    timeout: float = TIMEOUT
    deadline: float = DEADLINE

    @property
    def where(self) -> str:
        base = self.endpoint.rstrip("/") if self.endpoint else "s3:/"
        return redact(f"{base}/{self.bucket}")


class _Answer:
    """The raw side of one answer for botocore (``stream``, ``read``): bounded reads."""

    def __init__(self, conn: http.client.HTTPConnection, resp: Any, bounds: httpget.Bounds):
        self.conn, self.resp, self.bounds = conn, resp, bounds
        self.got = 0

    def _wait(self) -> None:
        if self.conn.sock is not None:
            left = self.bounds.left()
            self.conn.sock.settimeout(min(self.conn.timeout or TIMEOUT, left or TIMEOUT))

    def read(self, amt: int | None = None) -> bytes:
        self._wait()
        try:
            block = self.resp.read1(amt or BLOCK)
        except TimeoutError:
            if self.bounds.until is not None and self.bounds.until - time.monotonic() < 0.1:
                self.bounds.until = time.monotonic()  # the read waited out the deadline
                self.bounds.left()  # raises: no complete answer before the deadline
            raise
        self.got += len(block)
        if self.got > self.bounds.cap:
            raise self.bounds.fail(f"{self.bounds.what}: more than the {self.bounds.cap} "
                                   "bytes it may have", "check the server")  # fmt: skip
        return bytes(block)

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield from self.bounds.blocks(self.resp, before=self._wait)

    def close(self) -> None:
        self.resp.close()
        self.conn.close()


class _Read:
    """An answer already read whole (an error, the answer to a PUT)."""

    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.data

    def read(self, amt: int | None = None) -> bytes:
        block, self.data = self.data[: amt or len(self.data)], self.data[amt or len(self.data) :]
        return block

    def close(self) -> None:
        return None


class Client:
    """One bucket over botocore; ``get`` and ``put`` by key (the full object key)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.where = settings.where
        self._client: Any = None
        self._secrets: tuple[str, ...] = tuple(
            s for s in (settings.secret_access_key, settings.session_token) if s
        )
        self.source = "none (anonymous)" if settings.anonymous else "not resolved yet"

    def _fail(self, what: str, next: str) -> Unavailable:
        return Unavailable(redact(what, self._secrets), where=self.where, next=next)

    # -- botocore: credentials, the client ------------------------------------------------
    def _botocore(self) -> Any:
        if self._client is not None:
            return self._client
        try:
            import botocore.config
            import botocore.exceptions
            import botocore.session
            from botocore import UNSIGNED
        except ImportError:
            raise self._fail(
                "the S3 store needs botocore, which is not installed here",
                "pip install 'pinwheel-builds[build]' (or botocore), or use another backend",
            ) from None

        s = self.settings
        session = botocore.session.get_session()
        config = botocore.config.Config(
            connect_timeout=s.timeout, read_timeout=s.timeout,
            retries={"total_max_attempts": 1},
            s3={"addressing_style": "path" if s.endpoint else "auto"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            signature_version=UNSIGNED if s.anonymous else None,
            user_agent_extra=httpget.USER_AGENT,
        )  # fmt: skip
        if not s.anonymous:
            if s.access_key_id and s.secret_access_key:
                session.set_credentials(s.access_key_id, s.secret_access_key, s.session_token)
            try:
                creds = session.get_credentials()
                frozen = creds.get_frozen_credentials() if creds is not None else None
            except botocore.exceptions.BotoCoreError as exc:
                raise self._fail(
                    f"cannot authenticate: the AWS credential chain failed: {exc}",
                    "check the profile, role or token file the AWS_* settings name",
                ) from None
            if frozen is None or not frozen.access_key:
                raise self._fail(
                    f"cannot authenticate: no AWS credentials found ({_CHAIN})",
                    "set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a "
                    "web identity), or SCCACHE_S3_NO_CREDENTIALS=true for a public bucket",
                )
            self._secrets += tuple(x for x in (frozen.secret_key, frozen.token) if x)
            self.source = str(getattr(creds, "method", "") or "the AWS chain")
        try:
            client = session.create_client(
                "s3", region_name=s.region or session.get_config_variable("region") or "us-east-1",
                endpoint_url=s.endpoint, config=config,
            )  # fmt: skip
        except (botocore.exceptions.BotoCoreError, ValueError) as exc:
            raise self._fail(
                f"cannot set up the S3 client: {exc}", "check SCCACHE_ENDPOINT"
            ) from None
        client.meta.events.register_first("before-send.s3", self._send)
        self._client = client
        return client

    # -- the transport: one connection, no redirect, bounded answers ----------------------
    def _send(self, request: Any, **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse, HeadersDict

        s = self.settings
        parts = urllib.parse.urlsplit(request.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise self._fail(f"a {parts.scheme}: URL (http(s) only)", "check SCCACHE_ENDPOINT")
        cls: Any = http.client.HTTPSConnection if parts.scheme == "https" else (
            http.client.HTTPConnection)  # fmt: skip
        extra = {"context": ssl.create_default_context()} if parts.scheme == "https" else {}
        conn = cls(parts.hostname, parts.port, timeout=s.timeout, **extra)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() != "expect"}
            conn.request(request.method, target, body=request.body, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise self._fail(
                f"{request.method} failed: {exc!r}",
                "check [build.cache] endpoint and that the server is up",
            ) from None
        if 300 <= resp.status < 400:
            to = urllib.parse.urlsplit(resp.headers.get("Location") or "").netloc
            resp.close()
            conn.close()
            raise self._fail(
                f"{request.method} answered a redirect (HTTP {resp.status}"
                f"{' to ' + to[:100] if to else ''}): a signed request follows none",
                "set SCCACHE_ENDPOINT and SCCACHE_REGION to the bucket's own",
            )
        streaming = bool(request.stream_output) and resp.status < 300
        bounds = httpget.Bounds(
            f"{request.method} {parts.path[-80:]}", sys.maxsize if streaming else ERROR_CAP,
            lambda what, next: self._fail(what, next), time.monotonic() + s.deadline,
        )  # fmt: skip
        answer_headers = HeadersDict()
        for name, value in resp.getheaders():
            answer_headers[name] = value
        answer: _Answer | _Read = _Answer(conn, resp, bounds)
        if not streaming:  # read whole (bounded) and the connection closed here
            try:
                bounds.announced(resp.headers.get("Content-Length"))
                answer = _Read(b"".join(answer.stream()))
            except (OSError, http.client.HTTPException) as exc:
                raise self._fail(
                    f"{request.method}: cut off: {exc!r}", "check the server"
                ) from None
            finally:
                resp.close()
                conn.close()
        return AWSResponse(request.url, resp.status, answer_headers, answer)

    # -- operations -----------------------------------------------------------------------
    def _call(self, op: str, **params: Any) -> Any:
        import botocore.exceptions

        client = self._botocore()
        try:
            return getattr(client, op)(Bucket=self.settings.bucket, **params)
        except botocore.exceptions.ClientError as exc:
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if op == "get_object" and (status == 404 or code in ("NoSuchKey", "404")):
                return None
            if status == 403 or code in _AUTH_CODES:
                raise self._fail(
                    f"cannot authenticate: the bucket refused the credentials from "
                    f"{self.source} (HTTP {status} {code})",
                    "check the credentials and the bucket's policy (AWS_PROFILE, the role)",
                ) from None
            raise self._fail(
                f"{op} answered HTTP {status} {code}",
                "check the bucket, its region and the credentials",
            ) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._fail(
                f"{op} failed: {exc}", "check [build.cache] endpoint and that the server is up"
            ) from None

    def get(self, key: str, cap: int, out: BinaryIO | None) -> bytes | None:
        """The value at ``key`` (into ``out`` when given; then b""), None when absent."""
        answer = self._call("get_object", Key=key)
        if answer is None:
            return None
        body = answer["Body"]
        bounds = httpget.Bounds(f"GET {key}", cap, lambda w, n: self._fail(w, n))
        got: list[bytes] = []
        try:
            length = answer.get("ContentLength")
            bounds.announced(None if length is None else str(length))
            for block in bounds.blocks(body):
                if out is not None:
                    out.write(block)
                else:
                    got.append(block)
        except Unavailable:
            raise
        except Exception as exc:  # botocore's IncompleteReadError, a reset, a timeout
            raise self._fail(f"GET {key}: cut off: {exc}", "check the server") from None
        finally:
            body.close()
        return b"".join(got)

    def put(self, key: str, body: bytes | BinaryIO, size: int) -> None:
        """``body`` (``size`` bytes) at ``key``, whole or not at all, SSE as configured."""
        params: dict[str, Any] = {"Key": key, "Body": body, "ContentLength": size,
                                  "ContentType": "application/octet-stream"}  # fmt: skip
        if self.settings.sse:
            params["ServerSideEncryption"] = self.settings.sse
            if self.settings.kms_key_id:
                params["SSEKMSKeyId"] = self.settings.kms_key_id
        self._call("put_object", **params)

    def check(self, key: str) -> None:
        """Authenticate and reach the bucket once (a GET of ``key``; absent is fine)."""
        self.get(key, ERROR_CAP, None)


__all__ = ["DEADLINE", "ERROR_CAP", "TIMEOUT", "Client", "Settings"]

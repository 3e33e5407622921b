"""Credentials go only where they were configured, and every wire reader ends (issue 49
items 2 and 5, issue 52's S3 row), against real servers on 127.0.0.1.

- S3 through botocore against moto_server with moto's signature checks on: a store
  authenticated by a shared-config profile and by web-identity credentials (moto's STS
  ``AssumeRoleWithWebIdentity``), one with no credentials or refused ones says so, SSE
  as sccache's variables ask;
- a 307 from the S3 endpoint to another host: a real second HTTP server records every
  request it gets, and gets none;
- a Redis ``AUTH`` error that echoes the password, and a length line trickled one digit
  every 1.5 s, from a real TCP server;
- :func:`pinwheel.urls.redact` reads user info to the last ``@`` as urllib does.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from motoserver import CREDENTIALS as AWS
from motoserver import running_moto
from pinwheel.compile import compcache, objbackends, objstore
from pinwheel.manifest.build import CacheConfig
from pinwheel.net import httpget
from pinwheel.options import AwsCredentials
from pinwheel.options import host as host_of
from pinwheel.urls import redact
from test_objbackends import IDENT, MATCH, RECORD, _wheel

BUCKET = "pw-cache"
STORE_KEY = b"the-credential-tests-store-key-of-32-characters"  # signs store entries
ALLOW_ALL = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
)
ROLE = "arn:aws:iam::123456789012:role/ci-runner"


# --------------------------------------------------------------------------- urls


@pytest.mark.parametrize(
    ("url", "hidden", "shown"),
    [
        ("https://bot:p@SECRET@example.org/r.git", "SECRET", "https://bot:***@example.org/r.git"),
        ("https://bot:p@a@b@example.org", "p@a@b", "https://bot:***@example.org"),
        ("git clone https://x:tok@en@host/r failed", "en@host", "https://x:***@host/r"),
    ],
)
def test_redact_reads_user_info_to_the_last_at_as_urllib_does(url, hidden, shown) -> None:
    netloc = urllib.parse.urlsplit(url.split()[-2] if " " in url else url).netloc
    assert netloc.rpartition("@")[2] in shown  # urllib's host is the one kept
    out = redact(url)
    assert hidden not in out and shown in out


def test_redact_hides_the_configured_secrets_in_any_text() -> None:
    said = "WRONGPASS invalid password 'hunter2/secret' (hunter2%2Fsecret)"
    assert redact(said, ["hunter2/secret", None, ""]) == "WRONGPASS invalid password '***' (***)"


# --------------------------------------------------------------------------- redis


class _Line:
    """A TCP server that answers the first request of each connection with ``reply``,
    sent ``step`` bytes at a time every ``every`` seconds, then holds the line open."""

    def __init__(self, reply: bytes, step: int = 0, every: float = 0.0):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.reply, self.step, self.every = reply, step or len(reply), every
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            conn.recv(65536)
            for i in range(0, len(self.reply), self.step):
                if self.stop.wait(self.every if i else 0):
                    return
                try:
                    conn.sendall(self.reply[i : i + self.step])
                except OSError:
                    break

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            c.close()


def test_a_redis_auth_error_that_echoes_the_password_never_prints_it(tmp_path: Path) -> None:
    password = "hunter2-Sup3r/secret"
    server = _Line(f"-WRONGPASS invalid password '{password}' for user 'ci'\r\n".encode())
    try:
        env = {"SCCACHE_REDIS_ENDPOINT": f"redis://127.0.0.1:{server.port}",
               "SCCACHE_REDIS_PASSWORD": password, "SCCACHE_REDIS_USERNAME": "ci"}  # fmt: skip
        backend = objbackends.redis_from(host_of(env).sccache.store, "p")
        with pytest.raises(objbackends.Unavailable) as err:
            backend.check()
        assert "WRONGPASS invalid password '***'" in str(err.value)
        miss = objstore.Store(backend, STORE_KEY).lookup(IDENT, MATCH)  # the phase table's line
        assert isinstance(miss, objstore.Miss) and "'***'" in miss.why
        for said in (str(err.value), err.value.what, miss.why):
            assert password not in said
    finally:
        server.close()


def test_a_redis_length_line_trickled_a_digit_at_a_time_ends_at_its_deadline() -> None:
    """``$1234567890...`` one digit every 1.5 s (never silent for the 10 s socket timeout):
    the whole line has a deadline (2 s here, 30 s by default), not each read."""
    server = _Line(b"$" + b"1" * 60 + b"\r\n", step=1, every=1.5)
    try:
        backend = objbackends.Redis("127.0.0.1", server.port, line_deadline=2.0)
        with pytest.raises(objbackends.Unavailable, match="not complete before its deadline"):
            backend.read("v1/index/x.json", 1024)
    finally:
        server.close()


# --------------------------------------------------------------------------- s3


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records every request's method, path and headers; answers 200 with 4 bytes."""

    seen: list[tuple[str, str, dict[str, str]]]

    def _any(self) -> None:
        self.seen.append((self.command, self.path, dict(self.headers.items())))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"evil")

    do_GET = do_PUT = do_HEAD = _any

    def log_message(self, *args: object) -> None:
        return None


class _Redirector(http.server.BaseHTTPRequestHandler):
    """Answers every request with a 307 to the same path on ``to``."""

    to: str

    def _any(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(307)
        self.send_header("Location", f"{self.to}{self.path}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_PUT = do_HEAD = _any

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def redirect_pair() -> Iterator[tuple[str, list[tuple[str, str, dict[str, str]]]]]:
    """(the redirecting endpoint, what the other host got)."""
    seen: list[tuple[str, str, dict[str, str]]] = []
    other = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("Rec", (_Recorder,), {"seen": seen})
    )
    to = f"http://127.0.0.1:{other.server_address[1]}"
    first = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("Red", (_Redirector,), {"to": to})
    )
    for s in (other, first):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{first.server_address[1]}", seen
    finally:
        for s in (first, other):
            s.shutdown()
            s.server_close()


def test_a_307_to_another_host_carries_no_credentials(redirect_pair, tmp_path: Path) -> None:
    endpoint, seen = redirect_pair
    aws = AwsCredentials("AKIDEXAMPLE", "wJalr-SECRET-key", "the-session-token")
    env = {"SCCACHE_BUCKET": BUCKET, "SCCACHE_ENDPOINT": endpoint}
    backend = objbackends.s3_from(host_of(env).sccache.store, "p", aws)
    try:
        got: object = backend.read("v1/index/x.json", 1024)
    except objbackends.Unavailable as exc:
        got = exc
    leaked = [(m, p, h) for m, p, h in seen if {"authorization", "x-amz-security-token"}
              & {k.lower() for k in h}]  # fmt: skip
    assert leaked == []
    assert isinstance(got, objbackends.Unavailable), got
    assert "HTTP 307" in str(got) and "signed request follows none" in str(got)
    with pytest.raises(objbackends.Unavailable, match="redirect"):
        backend.write("v1/index/x.json", b"{}")
    stored, line = objstore.Store(backend, STORE_KEY).put(_wheel(tmp_path), RECORD, MATCH)
    assert not stored and "redirect" in line
    assert seen == []  # the other host got nothing at all


def test_the_one_redirect_rule_drops_credentials_for_another_origin(redirect_pair) -> None:
    """Every urllib client's opener (net.httpget.urlopen): a same-scheme redirect to
    another host or port is followed, without the request's credentials."""
    endpoint, seen = redirect_pair
    req = urllib.request.Request(f"{endpoint}/f.whl", headers={
        "Authorization": "Bearer the-token", "X-Amz-Security-Token": "the-session-token",
        "Cookie": "session=the-cookie", "User-Agent": "pinwheel/1"})  # fmt: skip
    with httpget.urlopen(req, timeout=10) as resp:
        assert resp.read() == b"evil"
    assert len(seen) == 1
    sent = {k.lower(): v for k, v in seen[0][2].items()}
    assert "user-agent" in sent
    assert not {"authorization", "x-amz-security-token", "cookie"} & set(sent), sent


def _iam(endpoint: str, service: str):  # type: ignore[no-untyped-def]
    boto3 = pytest.importorskip("boto3")
    return boto3.client(
        service, endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=AWS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=AWS["AWS_SECRET_ACCESS_KEY"],
    )  # fmt: skip


@pytest.fixture
def aws_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No AWS setting of this machine reaches botocore: no AWS_* variable, a HOME without
    ~/.aws, no instance metadata service."""
    import os

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "credentials"))
    return home


def _plan(cache: Path, endpoint: str, **env: str) -> compcache.Plan:
    config = CacheConfig(
        backend="s3", endpoint=endpoint, bucket=BUCKET, region="us-east-1", prefix="cu124"
    )
    return compcache.plan(config, cache, host_of({"PATH": "", **env}))


def _round_trip(store: objstore.Store, tmp: Path) -> None:
    wheel = _wheel(tmp)
    assert store.put(wheel, RECORD, MATCH) == (True, "stored in the object store")
    hit = store.lookup(IDENT, MATCH)
    assert isinstance(hit, objstore.Hit), hit
    got = store.take(hit, tmp / "dist")
    assert isinstance(got, Path) and got.read_bytes() == wheel.read_bytes()


def test_s3_authenticated_by_a_shared_config_profile(
    aws_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # moto checks signatures after 4 requests: the bucket, the user, its key, its policy
    with running_moto(BUCKET, free_actions=4) as endpoint:
        iam = _iam(endpoint, "iam")
        iam.create_user(UserName="ci")
        key = iam.create_access_key(UserName="ci")["AccessKey"]
        iam.put_user_policy(UserName="ci", PolicyName="all", PolicyDocument=ALLOW_ALL)
        iam.close()
        # No credentials anywhere: the store says it cannot authenticate (never unsigned).
        none, why = objstore.for_plan(_plan(tmp_path / "a", endpoint), cold=False)
        assert none is None and "cannot authenticate: no AWS credentials found" in why, why
        (aws_home / "config").write_text(
            "[profile ci]\nregion = us-east-1\n"
            f"aws_access_key_id = {key['AccessKeyId']}\n"
            f"aws_secret_access_key = {key['SecretAccessKey']}\n"
        )
        # A profile whose key the bucket refuses: said, with where the key came from.
        (aws_home / "config").write_text(
            (aws_home / "config").read_text() + "[profile wrong]\n"
            f"aws_access_key_id = {key['AccessKeyId']}\naws_secret_access_key = not-it\n"
        )
        monkeypatch.setenv("AWS_PROFILE", "wrong")
        none, why = objstore.for_plan(_plan(tmp_path / "b", endpoint), cold=False)
        assert none is None and "cannot authenticate: the bucket refused the credentials" in why
        assert "config-file" in why and "not-it" not in why, why
        monkeypatch.setenv("AWS_PROFILE", "ci")
        store, said = objstore.for_plan(_plan(tmp_path / "c", endpoint), cold=False)
        assert store is not None, said
        _round_trip(store, tmp_path)


def test_s3_authenticated_by_web_identity(
    aws_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 7 free requests: the bucket, the user, key and policy, the role and its policy, and
    # the runner's AssumeRoleWithWebIdentity (unsigned by its nature); then every request
    # is checked
    with running_moto(BUCKET, free_actions=7) as endpoint:
        iam = _iam(endpoint, "iam")
        iam.create_user(UserName="setup")
        iam.create_access_key(UserName="setup")
        iam.put_user_policy(UserName="setup", PolicyName="all", PolicyDocument=ALLOW_ALL)
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Federated": "token.actions.example"},
                    "Action": "sts:AssumeRoleWithWebIdentity",
                }
            ],
        }
        iam.create_role(RoleName="ci-runner", AssumeRolePolicyDocument=json.dumps(trust))
        iam.put_role_policy(RoleName="ci-runner", PolicyName="all", PolicyDocument=ALLOW_ALL)
        iam.close()
        token = aws_home / "token"
        token.write_text("the-runner-s-oidc-token")
        monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
        monkeypatch.setenv("AWS_ROLE_ARN", ROLE)
        monkeypatch.setenv("AWS_ROLE_SESSION_NAME", "pinwheel-ci")
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", endpoint)
        store, said = objstore.for_plan(_plan(tmp_path / "a", endpoint), cold=False)
        assert store is not None, said
        _round_trip(store, tmp_path)
        assert isinstance(store.backend, objbackends.S3)
        assert "web-identity" in store.backend.client.source


def test_s3_server_side_encryption_as_sccache_asks(
    aws_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_moto(BUCKET) as endpoint:
        plan = _plan(tmp_path, endpoint, **AWS, SCCACHE_S3_SERVER_SIDE_ENCRYPTION="true")
        store, said = objstore.for_plan(plan, cold=False, aws=host_of(AWS).sccache.aws)
        assert store is not None, said
        _round_trip(store, tmp_path)
        s3 = _iam(endpoint, "s3")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
        assert len(keys) == 2
        for key in keys:
            assert s3.head_object(Bucket=BUCKET, Key=key).get("ServerSideEncryption") == "AES256"
        s3.close()


def test_an_s3_answer_trickled_without_end_ends_at_the_deadline(tmp_path: Path) -> None:
    """An S3 endpoint that sends a value one byte a second (never silent for the socket
    timeout): the whole answer has a deadline."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    server = _Line(head + b"x" * 1000, step=len(head), every=0.5)
    try:
        from pinwheel.net import s3

        settings = s3.Settings(BUCKET, "us-east-1", f"http://127.0.0.1:{server.port}",
                               access_key_id="k", secret_access_key="s", deadline=2.0)  # fmt: skip
        backend = objbackends.S3(s3.Client(settings), "p")
        with pytest.raises(objbackends.Unavailable, match="before the deadline"):
            backend.read("v1/index/x.json", 4096)
    finally:
        server.close()

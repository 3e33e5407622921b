"""The object store over its three backends, against real servers.

Redis: a real ``redis-server`` on 127.0.0.1 (skipped, with the reason, where the binary
is missing; ``.ci/run`` installs it). S3: moto's S3-compatible HTTP server on 127.0.0.1,
a stand-in for S3 (no S3 store is reachable here); requests and objects go over real
HTTP, and the request signing is checked against botocore's own signer (moto does not
check signatures). A hostile Redis (lengths past the cap, replies cut off, an endless
line) is a real TCP server here that answers what a hostile one would.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import platform
import shutil
import socket
import subprocess
import threading
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from motoserver import CREDENTIALS as AWS
from motoserver import running_moto
from pinwheel.checksums import sha256_file
from pinwheel.compile import compcache, objbackends, objstore
from pinwheel.manifest.build import CacheConfig
from pinwheel.options import host as host_of
from redisserver import running_redis
from tcpport import free_port

TAG = f"cp311-cp311-linux_{platform.machine()}"
WHEEL = f"tiny-1.0-{TAG}.whl"
IDENT = {"builder": "engine", "nvcc": "12.4", "python": "3.11"}
MATCH = {"tree": "ab" * 32, "version": "1.0", "source_date_epoch": 1700000000, "flags": {}}
RECORD = {"identity": IDENT, "tree": "ab" * 20, "digest": "ef" * 32,
          "compiled_members": {"tiny/_C.so": "cd" * 32}}  # fmt: skip
KEY = "runners-that-share-a-store-share-this-key"  # PINWHEEL_STORE_KEY


def _wheel(tmp: Path, payload: bytes = b"\x7fELF" + bytes(range(256)) * 64) -> Path:
    path = tmp / "built" / WHEEL
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("tiny/_C.so", payload)
        zf.writestr("tiny-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n")
        zf.writestr("tiny-1.0.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {TAG}\n")
    return path


@pytest.fixture
def redis_port() -> Iterator[int]:
    with running_redis() as port:
        yield port


def _redis_plan(cache: Path, port: int, **env: str) -> compcache.Plan:
    config = CacheConfig(backend="redis", endpoint=f"redis://127.0.0.1:{port}", prefix="ci/cu124")
    return compcache.plan(config, cache, host_of({"PATH": "", "PINWHEEL_STORE_KEY": KEY, **env}))


def _round_trip(plan_a: compcache.Plan, plan_b: compcache.Plan, tmp: Path, aws=None):
    """Put from runner A, look up and take from runner B: (store B, the hit, the copy)."""
    store_a, why = objstore.for_plan(plan_a, cold=False, aws=aws)
    assert store_a is not None, why
    wheel = _wheel(tmp)
    assert store_a.put(wheel, RECORD, MATCH) == (True, "stored in the object store")
    store_b, _ = objstore.for_plan(plan_b, cold=False, aws=aws)
    assert store_b is not None
    hit = store_b.lookup(IDENT, MATCH)
    assert isinstance(hit, objstore.Hit), hit
    got = store_b.take(hit, tmp / "dist-b")
    assert isinstance(got, Path), got
    assert got.name == WHEEL and sha256_file(got) == sha256_file(wheel) == hit.sha256
    return store_b, hit


def test_redis_a_fresh_runner_hits_and_gets_the_same_bytes(redis_port: int, tmp_path) -> None:
    store_b, hit = _round_trip(
        _redis_plan(tmp_path / "cache-a", redis_port),
        _redis_plan(tmp_path / "cache-b", redis_port),
        tmp_path,
    )
    assert "redis (ci/cu124/pinwheel-objects/ at 127.0.0.1:" in store_b.backend.describe()
    cli = shutil.which("redis-cli")
    if cli is not None:  # the keys sit under the configured prefix
        keys = subprocess.run([cli, "-p", str(redis_port), "--raw", "KEYS", "*"],
                              capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
        assert sorted(k.split("/v2/")[0] for k in keys) == ["ci/cu124/pinwheel-objects"] * 2
    # Another match (another tree): a plain miss.
    other = store_b.lookup(IDENT, {**MATCH, "tree": "00" * 32})
    assert other == objstore.Miss("miss")


def test_redis_tampered_oversized_and_missing_blobs_are_misses(
    redis_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, hit = _round_trip(
        _redis_plan(tmp_path / "a", redis_port), _redis_plan(tmp_path / "b", redis_port), tmp_path
    )
    backend = store.backend
    good = sha256_file(_wheel(tmp_path))
    # Oversized: a wheel past the cap is refused before its bytes are read.
    monkeypatch.setattr(objstore, "MAX_WHEEL", 100)
    big = store.take(hit, tmp_path / "dist-big")
    assert isinstance(big, objstore.Miss) and "more than the 100 it may have" in big.why
    assert not list((tmp_path / "dist-big").iterdir())
    monkeypatch.undo()
    # Tampered: the server's blob replaced with other bytes under the same key.
    backend.write(hit.blob, _wheel(tmp_path / "other", b"planted").read_bytes())
    changed = store.take(hit, tmp_path / "dist-t")
    assert isinstance(changed, objstore.Miss) and "entry changed" in changed.why
    assert not list((tmp_path / "dist-t").iterdir())
    # An index record past its cap, and one that is not JSON: misses, said.
    index = f"v2/index/{objstore.identity_key(IDENT)}/{objstore.identity_key(MATCH)}.json"
    backend.write(index, b"{not json")
    bad = store.lookup(IDENT, MATCH)
    assert isinstance(bad, objstore.Miss) and "unusable record" in bad.why
    # A record whose blob is missing: a miss, nothing left in dist.
    entry = {"format": 2, "wheel": WHEEL, "sha256": "ef" * 32, "match": MATCH, "record": RECORD}
    backend.write(index, json.dumps(objstore.signed_entry(KEY.encode(), index, entry)).encode())
    hit2 = store.lookup(IDENT, MATCH)
    assert isinstance(hit2, objstore.Hit)
    gone = store.take(hit2, tmp_path / "dist-g")
    assert gone == objstore.Miss("miss: the record's wheel is not in the store")
    assert good == hit.sha256


def test_redis_password_from_sccache_s_variable_authenticates(tmp_path: Path) -> None:
    with running_redis("--requirepass", "hunter2") as port:
        none, why = objstore.for_plan(_redis_plan(tmp_path / "a", port), cold=False)
        assert none is None and ("NOAUTH" in why or "Authentication required" in why), why
        with_pw = _redis_plan(tmp_path / "a", port, SCCACHE_REDIS_PASSWORD="hunter2")
        _round_trip(with_pw, with_pw, tmp_path)


def test_a_dead_redis_is_no_store_and_a_miss_with_a_message(redis_port, tmp_path) -> None:
    plan = _redis_plan(tmp_path / "a", redis_port)
    store, _ = objstore.for_plan(plan, cold=False)
    assert store is not None
    port = free_port()
    dead = _redis_plan(tmp_path / "b", port)
    none, why = objstore.for_plan(dead, cold=False)
    assert none is None and why.startswith("the redis store is unreachable: ")
    assert f"redis 127.0.0.1:{port}: cannot connect" in why
    # The server gone between the check and the lookup or the put: a miss, not stored.
    dead_store = objstore.Store(objbackends.redis_from(dead.store, "p"), KEY.encode())
    miss = dead_store.lookup(IDENT, MATCH)
    assert isinstance(miss, objstore.Miss) and "cannot connect" in miss.why
    stored, line = dead_store.put(_wheel(tmp_path), RECORD, MATCH)
    assert not stored and line.startswith("not stored in the object store: redis 127.0.0.1:")


class _Hostile:
    """A TCP server on 127.0.0.1 that answers every connection with ``reply`` (after
    reading the request), then closes or, with ``hang``, keeps the line open."""

    def __init__(self, reply: bytes, hang: bool = False):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.reply, self.hang = reply, hang
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            conn.recv(65536)
            try:
                conn.sendall(self.reply)
            except OSError:
                pass
            if not self.hang:
                conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (b"$99999999999\r\n", "a value of 99999999999 bytes, more than the"),
        (b"$-5\r\n", "a bad value length"),
        (b"$10\r\nabc", "cut off before the value's end"),
        (b"$3\r\nabcXY", "does not end where its length says"),
        (b"+" + b"A" * 70000, "no RESP line"),
        (b"-ERR \x1b[31mred\r\n", "the server answered an error"),
        (b":1\r\n", "not a bulk string"),
    ],
)
def test_a_hostile_redis_reply_is_refused_bounded(reply: bytes, said: str) -> None:
    server = _Hostile(reply)
    try:
        backend = objbackends.Redis("127.0.0.1", server.port)
        with pytest.raises(objbackends.Unavailable, match=said.replace("[", r"\[")):
            backend.read("v1/index/x.json", 1024 * 1024)
        miss = objstore.Store(backend, KEY.encode()).lookup(IDENT, MATCH)
        assert isinstance(miss, objstore.Miss) and miss.why.startswith("miss: redis 127.0.0.1:")
    finally:
        server.close()


# --------------------------------------------------------------------------- s3


@pytest.fixture
def moto_endpoint() -> Iterator[str]:
    with running_moto("pw-cache") as endpoint:
        yield endpoint


def _s3_plan(cache: Path, endpoint: str) -> compcache.Plan:
    config = CacheConfig(
        backend="s3", endpoint=endpoint, bucket="pw-cache", region="us-east-1", prefix="cu124"
    )
    return compcache.plan(config, cache, host_of({"PATH": "", "PINWHEEL_STORE_KEY": KEY, **AWS}))


def _s3_backend(endpoint: str, **env: str) -> objbackends.S3:
    """The S3 backend of bucket ``b`` at ``endpoint``, signed with the stand-in keys."""
    settings = {"SCCACHE_BUCKET": "b", "SCCACHE_ENDPOINT": endpoint, **env}
    return objbackends.s3_from(host_of(settings).sccache.store, "p", host_of(AWS).sccache.aws)


def test_s3_a_fresh_runner_hits_and_tampered_or_oversized_is_refused(
    moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, hit = _round_trip(
        _s3_plan(tmp_path / "a", moto_endpoint), _s3_plan(tmp_path / "b", moto_endpoint),
        tmp_path, aws=host_of(AWS).sccache.aws,
    )  # fmt: skip
    listing = urllib.request.urlopen(f"{moto_endpoint}/pw-cache?list-type=2").read().decode()
    assert f"<Key>cu124/pinwheel-objects/v2/wheels/{hit.sha256}/wheel</Key>" in listing
    monkeypatch.setattr(objstore, "MAX_WHEEL", 100)
    big = store.take(hit, tmp_path / "dist-big")
    assert isinstance(big, objstore.Miss) and "more than the 100 bytes it may have" in big.why
    monkeypatch.undo()
    store.backend.write(hit.blob, b"PK planted")
    changed = store.take(hit, tmp_path / "dist-t")
    assert isinstance(changed, objstore.Miss) and "entry changed" in changed.why
    assert not list((tmp_path / "dist-t").iterdir())


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc", "cut off"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", "more than the 1024"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * 5000, "more than the 1024"),
        (b"\x1b[2Jnot http\r\n\r\n", "GET failed"),
        (b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n", "HTTP 500"),
    ],
)
def test_a_hostile_s3_answer_is_refused_bounded(reply: bytes, said: str) -> None:
    server = _Hostile(reply)
    try:
        backend = _s3_backend(f"http://127.0.0.1:{server.port}")
        with pytest.raises(objbackends.Unavailable, match=said):
            backend.read("v1/index/x.json", 1024)
        # The record's cap is larger (64 MiB): what is under it is no JSON record.
        miss = objstore.Store(backend, KEY.encode()).lookup(IDENT, MATCH)
        assert isinstance(miss, objstore.Miss) and miss.why.startswith("miss: ")
    finally:
        server.close()


def test_a_dead_s3_endpoint_is_no_store_with_a_message(tmp_path: Path) -> None:
    port = free_port()
    none, why = objstore.for_plan(
        _s3_plan(tmp_path, f"http://127.0.0.1:{port}"), cold=False, aws=host_of(AWS).sccache.aws
    )
    assert none is None and why.startswith("the s3 store is unreachable: ")
    assert f"http://127.0.0.1:{port}/pw-cache: GET failed" in why


def test_the_local_backend_writes_the_layout_it_always_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Byte for byte: <root>/v2/wheels/<sha256>/wheel is the wheel, and
    <root>/v2/index/<sha256 of the identity>/<sha256 of the match>.json is the entry,
    signed with the runner's key (HMAC-SHA256 over its index key and canonical JSON)."""
    root = tmp_path / "sccache" / objstore.SUBDIR
    wheel = _wheel(tmp_path)
    store = objstore.Store(objbackends.LocalDir(root), KEY.encode())
    assert store.put(wheel, RECORD, MATCH)[0]
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()

    def key(doc: object) -> str:
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    entry = {"format": 2, "wheel": WHEEL, "sha256": sha, "match": MATCH, "record": RECORD}
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    index = f"v2/index/{key(IDENT)}/{key(MATCH)}.json"
    assert files == sorted([f"v2/wheels/{sha}/wheel", index])
    body = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
    mac = hmac.new(KEY.encode(), b"pinwheel object store entry\0" + index.encode() + b"\0" + body,
                   hashlib.sha256).hexdigest()  # fmt: skip
    assert (root / index).read_text() == json.dumps({**entry, "signature": mac}, sort_keys=True)
    assert (root / f"v2/wheels/{sha}/wheel").read_bytes() == wheel.read_bytes()
    hit = store.lookup(IDENT, MATCH)
    assert isinstance(hit, objstore.Hit) and hit.blob == f"v2/wheels/{sha}/wheel"
    monkeypatch.setattr(objstore, "MAX_WHEEL", 100)
    big = store.take(hit, tmp_path / "dist-big")
    assert isinstance(big, objstore.Miss) and "more than the 100 it may have" in big.why
    monkeypatch.undo()
    (root / hit.blob).unlink()
    (root / hit.blob).symlink_to(wheel)  # a link where the wheel was: never followed
    assert store.take(hit, tmp_path / "dist") == objstore.Miss(
        "miss: the record's wheel is not in the store"
    )

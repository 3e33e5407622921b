"""Hostile input for check, fetch, release and install, one table per class.

Each case asserts the exit code, the message (what was wrong, where, and `next:`), and
that nothing was left under a final name (no wheel, SHA256SUMS, release dir or venv
a user could mistake for a verified result). Real parts: wheels zipped here and then
damaged byte by byte, a real http.server in a thread, the CLI's own main().
"""

from __future__ import annotations

import http.server
import shutil
import struct
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from localhttp import LocalHTTP
from pinwheel.checksums import format_sums, sha256_file, write_sums
from pinwheel.cli import main
from pinwheel.errors import PinwheelError
from pinwheel.release.download import FetchOptions, fetch_release, resolve_source
from releasekit import TREE, write_manifest, write_provenance
from wheelfactory import make_wheel

WHEEL = "demo-1.0-py3-none-any.whl"
BODY = b"def hello():\n    return 'hello'\n" * 400  # compressible: deflate really runs


# --------------------------------------------------------------------------- damaged wheels


def good_wheel(out: Path, extra: dict[str, bytes] | None = None) -> Path:
    files = {"demo/__init__.py": BODY, "demo/data.txt": b"plain data\n" * 200}
    files.update(extra or {})
    whl = make_wheel(out, files, tag="py3-none-any")
    deflated = whl.with_suffix(".tmp")
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(deflated, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            info.compress_type = zipfile.ZIP_DEFLATED  # wheelfactory stores; real wheels deflate
            dst.writestr(info, data)
    deflated.replace(whl)
    return whl


def _central(data: bytes, name: str) -> int:
    """Offset of ``name``'s central directory entry."""
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        n = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46 : at + 46 + n] == name.encode():
            return at
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"{name} not in the central directory")


def _patch_both(path: Path, name: str, local_at: int, central_at: int, value: bytes) -> None:
    """Write ``value`` at the same field of the local header and the central entry."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        local = zf.getinfo(name).header_offset
    central = _central(bytes(data), name)
    data[local + local_at : local + local_at + len(value)] = value
    data[central + central_at : central + central_at + len(value)] = value
    path.write_bytes(bytes(data))


def _data_offset(path: Path, name: str) -> int:
    data = path.read_bytes()
    with zipfile.ZipFile(path) as zf:
        local = zf.getinfo(name).header_offset
    n, m = struct.unpack_from("<HH", data, local + 26)
    return local + 30 + n + m


def bad_deflate(out: Path) -> Path:
    whl = good_wheel(out)
    at = _data_offset(whl, "demo/__init__.py")
    data = bytearray(whl.read_bytes())
    data[at] = 0xFF  # BTYPE 11: a reserved (invalid) deflate block type
    whl.write_bytes(bytes(data))
    return whl


def encrypted(out: Path) -> Path:
    whl = good_wheel(out)
    _patch_both(whl, "demo/__init__.py", 6, 8, struct.pack("<H", 0x1))
    return whl


def unknown_method(out: Path) -> Path:
    whl = good_wheel(out)
    _patch_both(whl, "demo/__init__.py", 8, 10, struct.pack("<H", 99))
    return whl


def crc_mismatch(out: Path) -> Path:
    whl = good_wheel(out)
    _patch_both(whl, "demo/data.txt", 14, 16, struct.pack("<I", 0xDEADBEEF))
    return whl


def size_lie(out: Path) -> Path:
    """The directory claims 100 bytes for a member whose deflate stream holds 12 KB."""
    whl = good_wheel(out)
    _patch_both(whl, "demo/__init__.py", 22, 24, struct.pack("<I", 100))
    return whl


def non_utf8_record(out: Path) -> Path:
    whl = good_wheel(out)
    rebuilt = out / "x" / whl.name
    rebuilt.parent.mkdir()
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("RECORD"):
                data = data.replace(b"demo/data.txt", b"demo/d\xe4ta.txt")
            dst.writestr(info, data)
    shutil.move(rebuilt, whl)
    return whl


def duplicate_member(out: Path) -> Path:
    whl = good_wheel(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns "Duplicate name": that is the point
        with zipfile.ZipFile(whl, "a") as zf:
            zf.writestr("demo/__init__.py", "import os; os.system('id')\n")
    return whl


def zip_slip(out: Path) -> Path:
    return good_wheel(out, {"../../evil.pth": b"import os\n"})


def zip_bomb(out: Path) -> Path:
    whl = good_wheel(out)
    with zipfile.ZipFile(whl, "a", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        zi = zipfile.ZipInfo("demo/zeros.bin")
        zi.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(zi, "w") as fh:
            block = b"\0" * (1 << 20)
            for _ in range(64):  # 64 MiB of zeros -> ~64 KiB: over 1000x
                fh.write(block)
    return whl


def truncated(out: Path) -> Path:
    whl = good_wheel(out)
    whl.write_bytes(whl.read_bytes()[:300])
    return whl


@dataclass(frozen=True)
class Damage:
    make: Callable[[Path], Path]
    member: str | None  # the member the message must name
    gist: str


DAMAGE = {
    "bad-deflate": Damage(bad_deflate, "demo/__init__.py", "bad deflate data"),
    "encrypted": Damage(encrypted, "demo/__init__.py", "encrypted member"),
    "unknown-compression": Damage(unknown_method, "demo/__init__.py", "compression method 99"),
    "crc-mismatch": Damage(crc_mismatch, "demo/data.txt", "CRC-32 mismatch"),
    "size-lie": Damage(size_lie, "demo/__init__.py", "damaged member, cannot be read"),
    "non-utf8-record": Damage(non_utf8_record, "demo-1.0.dist-info/RECORD", "not UTF-8"),
    "duplicate-member": Damage(duplicate_member, "demo/__init__.py", "duplicate zip member"),
    "zip-slip": Damage(zip_slip, "../../evil.pth", "'..' component"),
    "zip-bomb": Damage(zip_bomb, "demo/zeros.bin", "ratio limit (zip bomb?)"),
    "truncated": Damage(truncated, None, "not a readable wheel"),
}


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_wheel_check_is_exit_6_naming_the_member(case, tmp_path, capsys):
    damage = DAMAGE[case]
    whl = damage.make(tmp_path)
    code = main(["check", "--arch", "7.0", "--no-tools", "--allow-no-cuda", str(whl)])
    seen = capsys.readouterr()
    text = _flat(seen.out + seen.err)
    assert code == 6, text
    assert "Traceback" not in text
    assert damage.gist in text
    assert "next:" in text
    if damage.member:  # what + where: "error: WHEEL: MEMBER: message"
        assert f"{whl.name}: {damage.member}:" in text
        assert "next: do not install or release these wheels" in text
    else:
        assert str(whl) in text


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_install_refuses_a_damaged_wheel_before_making_the_venv(case, tmp_path, capsys):
    damage = DAMAGE[case]
    dist = tmp_path / "dist"
    whl = damage.make(dist)
    write_sums(dist, [whl.name])
    venv = tmp_path / "venv"
    code = main(["install", str(dist), "--venv", str(venv), "--no-deps", "--installer", "pip",
                 "--allow-unsigned"])
    text = _flat(capsys.readouterr().err)
    assert code == 6, text
    assert damage.gist in text and "next:" in text
    if damage.member:
        assert "nothing was installed" in text and damage.member in text
    assert not venv.exists()


def test_a_1_gib_member_is_refused_without_unpacking_it(tmp_path, capsys):
    """The issue's case at full size, from the central directory alone (fast, small RSS)."""
    whl = good_wheel(tmp_path)
    with zipfile.ZipFile(whl, "a") as zf:
        zi = zipfile.ZipInfo("demo/huge.bin")
        zi.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(zi, "w", force_zip64=True) as fh:
            block = b"\0" * (1 << 20)
            for _ in range(1024):
                fh.write(block)
    assert whl.stat().st_size < 2 * 1024 * 1024
    start = time.monotonic()
    code = main(["check", "--arch", "7.0", "--no-tools", "--allow-no-cuda", str(whl)])
    took = time.monotonic() - start
    text = _flat(capsys.readouterr().out)
    assert code == 6 and "demo/huge.bin: member unpacks" in text and "1.0 GiB" in text
    assert took < 5, f"took {took:.1f} s: the member was unpacked"


# --------------------------------------------------------------------------- hostile HTTP


class Hostile(LocalHTTP):
    """A real http.server serving ``files``; ``mode`` per path: drip, long-length, 404."""

    def __init__(self, files: dict[str, bytes], mode: dict[str, str] | None = None):
        self.files, self.mode = files, mode or {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                outer.handle(self)

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: object, client_address: object) -> None:
                pass  # the client hanging up on a drip is expected

        self._serve(Handler, Server)


    def handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        name = h.path.lstrip("/")
        mode = self.mode.get(name, "")
        body = self.files.get(name)
        if body is None or mode == "404":
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        promised = len(body) + 1000 if mode == "long-length" else len(body)
        h.send_header("Content-Length", str(promised))
        h.end_headers()
        if mode == "drip":  # one byte per 0.2 s: never silent long enough to "stall"
            for i in range(len(body)):
                h.wfile.write(body[i : i + 1])
                h.wfile.flush()
                time.sleep(0.2)
            return
        h.wfile.write(body)
        h.close_connection = mode == "long-length"


@dataclass(frozen=True)
class Net:
    sums: Callable[[str, bytes], bytes]  # (wheel name, wheel bytes) -> SHA256SUMS body
    mode: dict[str, str]
    code: int
    gist: tuple[str, ...]
    opts: dict[str, float] | None = None


def _sum(name: str, data: bytes, digest: str | None = None, sep: str = "  ") -> str:
    import hashlib

    return f"{digest or hashlib.sha256(data).hexdigest()}{sep}{name}\n"


NET = {
    "drip": Net(
        lambda n, d: _sum(n, d).encode(),
        {WHEEL: "drip"},
        1,
        (WHEEL, "server too slow", "bytes received", "--min-rate"),
        {"min_rate": 1000.0, "rate_window": 1.0},
    ),
    "drip-deadline": Net(
        lambda n, d: _sum(n, d).encode(),
        {WHEEL: "drip"},
        1,
        (WHEEL, "deadline", "bytes received", "--deadline"),
        {"min_rate": 0.0, "deadline": 1.5},
    ),
    "wrong-length": Net(
        lambda n, d: _sum(n, d).encode(),
        {WHEEL: "long-length"},
        1,
        (WHEEL, "bytes short of its Content-Length"),
    ),
    "wheel-404": Net(lambda n, d: _sum(n, d).encode(), {WHEEL: "404"}, 1, (WHEEL, "not found")),
    "sums-404": Net(lambda n, d: b"", {"SHA256SUMS": "404"}, 1, ("SHA256SUMS", "not found")),
    "sums-empty": Net(lambda n, d: b"\n\n", {}, 6, ("SHA256SUMS", "lists no files")),
    "sums-duplicate": Net(
        lambda n, d: (_sum(n, d) + _sum(n, d, "0" * 64)).encode(),
        {},
        6,
        ("SHA256SUMS:2", "listed twice with different hashes"),
    ),
    "sums-malformed": Net(lambda n, d: b"not a checksum line\n", {}, 6, ("malformed line",)),
    "sums-directory": Net(
        lambda n, d: _sum("sub/" + n, d).encode(), {}, 6, ("sub/", "directory part")
    ),
    "sums-dotdot": Net(lambda n, d: _sum("../" + n, d).encode(), {}, 6, ("'..' component",)),
    "sums-absolute": Net(lambda n, d: _sum("/tmp/" + n, d).encode(), {}, 6, ("absolute path",)),
    "sums-not-utf8": Net(lambda n, d: b"\xff\xfe" + _sum(n, d).encode(), {}, 6, ("not UTF-8",)),
    "hash-mismatch": Net(
        lambda n, d: _sum(n, d, "a" * 64).encode(), {}, 6, (WHEEL, "sha256 mismatch")
    ),
}


@pytest.mark.parametrize("case", sorted(NET))
def test_hostile_server_is_refused_and_nothing_lands_under_a_final_name(case, tmp_path):
    net = NET[case]
    data = good_wheel(tmp_path / "src").read_bytes()
    files = {WHEEL: data, "SHA256SUMS": net.sums(WHEEL, data)}
    dest = tmp_path / "dest"
    kw: dict = dict(timeout=5.0, retries=0, backoff=0.01, sleep=lambda s: None,
                    allow_unsigned=True)  # fmt: skip
    kw.update(net.opts or {})
    start = time.monotonic()
    with Hostile(files, net.mode) as srv, pytest.raises(PinwheelError) as err:
        fetch_release(resolve_source(srv.url), dest, FetchOptions(**kw))
    took = time.monotonic() - start
    text = _flat(str(err.value))
    assert err.value.exit_code == net.code, text
    for gist in net.gist:
        assert gist in text, (gist, text)
    assert "next:" in text and err.value.where  # what, where, next
    visible = (
        sorted(p.name for p in dest.iterdir() if not p.name.startswith("."))
        if dest.exists()
        else []
    )
    assert visible == [], visible
    assert took < 20


def test_uppercase_hex_and_binary_marker_read_as_sha256sum_does(tmp_path):
    data = good_wheel(tmp_path / "src").read_bytes()
    import hashlib

    sums = _sum(WHEEL, data, hashlib.sha256(data).hexdigest().upper(), sep=" *")
    with Hostile({WHEEL: data, "SHA256SUMS": sums.encode(), "SHA256SUMS.sig": b"sig"}) as srv:
        result = fetch_release(
            resolve_source(srv.url),
            tmp_path / "dest",
            FetchOptions(timeout=5.0, retries=0, allow_unsigned=True),
        )
    assert sha256_file(tmp_path / "dest" / WHEEL) == hashlib.sha256(data).hexdigest()
    assert result.signature == "present" and result.signed_by is None


def test_cli_says_signature_present_not_verified(tmp_path, capsys):
    data = good_wheel(tmp_path / "src").read_bytes()
    files = {WHEEL: data, "SHA256SUMS": _sum(WHEEL, data).encode(), "SHA256SUMS.sig": b"x"}
    with Hostile(files) as srv:
        code = main(["fetch", srv.url, "--dest", str(tmp_path / "dest"), "--retries", "0",
                     "--allow-unsigned"])  # fmt: skip
    text = _flat(capsys.readouterr().out)
    assert code == 0
    assert "SIGNATURE NOT VERIFIED (--allow-unsigned): a signature is present" in text
    assert "the release is unsigned" not in text


def test_cli_drip_ends_at_the_deadline_with_exit_1(tmp_path, capsys):
    data = good_wheel(tmp_path / "src").read_bytes()
    files = {WHEEL: data, "SHA256SUMS": _sum(WHEEL, data).encode()}
    start = time.monotonic()
    with Hostile(files, {WHEEL: "drip"}) as srv:
        code = main(
            ["fetch", srv.url, "--dest", str(tmp_path / "dest"), "--retries", "0",
             "--allow-unsigned"]
            + ["--deadline", "2", "--min-rate", "0"]
        )
    text = _flat(capsys.readouterr().err)
    assert code == 1 and time.monotonic() - start < 15
    assert f"{WHEEL}: the fetch ran past its 2 s deadline" in text and "next:" in text
    assert not (tmp_path / "dest" / WHEEL).exists()


# --------------------------------------------------------------------------- release, install


def _build(tmp_path: Path, wheels: list[Path], *, tree: str | None = TREE) -> Path:
    build = tmp_path / "wheels"
    build.mkdir(exist_ok=True)
    for w in wheels:
        if w.parent != build:
            shutil.copy(w, build / w.name)
    names = [w.name for w in wheels]
    write_sums(build, names)
    write_provenance(build, {n: sha256_file(build / n) for n in names})
    if tree != TREE:
        import json

        prov = json.loads((build / "provenance.json").read_text())
        prov["tree"] = tree
        (build / "provenance.json").write_text(json.dumps(prov))
    return build


def _release(tmp_path: Path, build: Path, *extra: str) -> int:
    manifest = write_manifest(tmp_path)
    return main(
        ["--manifest", str(manifest), "release", "--from", str(build)]
        + ["--out", str(tmp_path / "rel"), "--no-sign", *extra]
    )


@pytest.mark.parametrize(
    ("case", "gist"),
    [
        ("damaged-wheel", "pinwheel check: error: demo-1.0-py3-none-any.whl: demo/__init__.py"),
        ("unpinned-tree", "records no replayed tree"),
        ("other-tree", "differs from [result].tree"),
    ],
)
def test_release_refuses_an_unverified_build(case, gist, tmp_path, capsys):
    if case == "damaged-wheel":
        build = _build(tmp_path, [duplicate_member(tmp_path / "w")])
    else:
        tree = None if case == "unpinned-tree" else "7" * 40
        build = _build(tmp_path, [good_wheel(tmp_path / "w")], tree=tree)
    assert _release(tmp_path, build) == 6
    text = _flat(capsys.readouterr().err)
    assert "refusing to release an unverified build" in text and gist in text
    assert "next:" in text and "--allow-unverified" in text
    assert not (tmp_path / "rel").exists()
    assert _release(tmp_path, build, "--allow-unverified") == 0
    first = (tmp_path / "rel" / "RELEASE_NOTES.md").read_text().splitlines()[0]
    # the reasons are Markdown-escaped (they carry member names from the wheel)
    assert first.startswith("**UNVERIFIED RELEASE**") and gist in first.replace("\\", "")


def test_install_refuses_a_partial_set_unless_allowed(tmp_path, capsys):
    dist = tmp_path / "dist"
    a = good_wheel(dist)
    b = make_wheel(dist, {"other/__init__.py": b"x = 1\n"}, dist="other", tag="py3-none-any")
    write_sums(dist, [a.name, b.name])
    b.unlink()
    venv = tmp_path / "venv"
    code = main(["install", str(dist), "--venv", str(venv), "--no-deps", "--installer", "pip",
                 "--allow-unsigned"])
    text = _flat(capsys.readouterr().err)
    assert code == 6
    assert f"partial release: 1 of 2 wheels listed in SHA256SUMS are missing: {b.name}" in text
    assert "--allow-partial" in text and not venv.exists()


def test_install_refuses_a_listed_name_that_is_not_a_wheel_file_name(tmp_path, capsys):
    dist = tmp_path / "dist"
    whl = good_wheel(dist)
    odd = dist / "--index-url=x.whl"
    shutil.copy(whl, odd)
    (dist / "SHA256SUMS").write_text(format_sums({odd.name: sha256_file(odd)}))
    whl.unlink()
    venv = tmp_path / "venv"
    code = main(["install", str(dist), "--venv", str(venv), "--no-deps", "--installer", "pip",
                 "--allow-unsigned"])
    text = _flat(capsys.readouterr().err)
    assert code == 6 and "not a wheel file name" in text and "'--index-url=x.whl'" in text
    assert not venv.exists()

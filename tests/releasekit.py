"""Real parts for the release tests: wheels, ssh keys, a manifest, and an HTTP server.

The wheels are real (PEP 427 zip with METADATA, WHEEL and a hashed RECORD;
pip and uv install them). The server is the standard library's
ThreadingHTTPServer with real Range support, plus switchable misbehaviour per
file: 404, 500, 500 once, a stall, and a truncated body once.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import random
import subprocess
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from localhttp import LocalHTTP

SHA_BASE = "1" * 40
HEAD_A = "a" * 40
HEAD_B = "b" * 40


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    payload: int = 0,
    seed: int = 0,
    *,
    tag: str = "py3-none-any",
    requires_python: str | None = None,
    requires_dist: tuple[str, ...] = (),
) -> Path:
    """A pure-Python wheel with module ``name`` (VALUE = version) and ``payload`` random bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    # Requires-* go in the header, before the description (METADATA is an email message).
    header = "".join(f"Requires-Dist: {r}\n" for r in requires_dist) + (
        f"Requires-Python: {requires_python}\n" if requires_python else ""
    )
    files = {
        f"{name}/__init__.py": f'VALUE = "{name} {version}"\n'.encode(),
        f"{name}/blob.bin": random.Random(seed).randbytes(payload),
        # Summary and a Markdown description: what `twine check --strict` asks of a wheel.
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{header}"
            f"Summary: {name} test wheel\nDescription-Content-Type: text/markdown\n\n"
            f"# {name}\n\nA wheel the release tests build.\n"
        ).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: releasekit\nRoot-Is-Purelib: true\n"
        + f"Tag: {tag}\n".encode(),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    target = directory / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zf:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(2026, 10, 10, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return target


def make_key(directory: Path, principal: str = "release@pinwheel.test") -> tuple[Path, Path]:
    """(private key, allowed_signers) made with the real ssh-keygen."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "release_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", principal, "-f", str(key)], check=True
    )
    pub = (directory / "release_key.pub").read_text().split()
    signers = directory / "allowed_signers"
    # both namespaces: SHA256SUMS.sig ("pinwheel") and the DSSE attestation
    signers.write_text(f'{principal} namespaces="pinwheel,pinwheel-attestation" {pub[0]} {pub[1]}\n')
    return key, signers


TREE = "8" * 40  # the pinned [result].tree, and what provenance.json says was built


def write_manifest(directory: Path, release: str = "", model: str = "") -> Path:
    text = f"""
[manifest]
name = "kit"

[upstream]
url = "https://example.invalid/up.git"
commit = "{SHA_BASE}"

[[step]]
action = "pick"
pr = 11
head = "{HEAD_A}"
title = "Fix MTP init on SM70"

[[step]]
action = "merge"
pr = 12
head = "{HEAD_B}"
title = "EXL3 kernels for V100"

[result]
tag = "kit-20261010"
tree = "{TREE}"
{release}
{model}
"""
    path = directory / "manifest.toml"
    path.write_text(text)
    return path


def write_provenance(build: Path, wheels: dict[str, str]) -> None:
    import json

    data = {
        "schema": "pinwheel.provenance/1",
        "upstream": {"url": "https://example.invalid/up.git", "base": SHA_BASE},
        "steps": [
            {
                "number": 1,
                "action": "pick",
                "pr": 11,
                "head": HEAD_A,
                "commits": [{"original": "c" * 40, "replayed": "d" * 40, "author": "Ada <ada@x>"}],
            },
            {
                "number": 2,
                "action": "merge",
                "pr": 12,
                "head": HEAD_B,
                "commits": [{"original": "e" * 40, "replayed": "f" * 40, "author": "Lin <lin@x>"}],
            },
        ],
        "head": "9" * 40,
        "tree": TREE,
        "tag": "kit-20261010",
        "toolchain": {"cuda": "12.4.131", "gcc": "12.2.0", "torch": "2.9.1", "python": "3.11"},
        "arches": ["sm_70"],
        "wheels": wheels,
        "source_date_epoch": 1791590400,
    }
    (build / "provenance.json").write_text(json.dumps(data, indent=2))


# --------------------------------------------------------------------------- HTTP


@dataclass
class Behaviour:
    """Per-file misbehaviour. ``once`` kinds misbehave on the first request only."""

    kind: str  # "404" | "500" | "500-once" | "stall" | "truncate-once"
    used: int = 0


@dataclass
class ServerLog:
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, path: str, rng: str | None) -> None:
        with self.lock:
            self.requests.append((path, rng))

    def ranges(self, name: str) -> list[str]:
        return [r for p, r in self.requests if p.endswith("/" + name) and r]


class ReleaseServer(LocalHTTP):
    """Serve ``root`` on 127.0.0.1 with Range support and optional misbehaviour."""

    def __init__(self, root: Path, stall_seconds: float = 3.0):
        self.root = root
        self.behaviour: dict[str, Behaviour] = {}
        self.log = ServerLog()
        self.stall_seconds = stall_seconds
        self.listing = True
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                server._handle(self)

        self._serve(Handler)


    def _send(
        self,
        h: http.server.BaseHTTPRequestHandler,
        code: int,
        body: bytes,
        ctype: str = "text/plain",
    ) -> None:
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        rng = h.headers.get("Range")
        self.log.add(h.path, rng)
        name = h.path.lstrip("/")
        if name == "":
            if not self.listing:
                return self._send(h, 404, b"no listing")
            links = "".join(
                f'<a href="{html.escape(p.name)}">{html.escape(p.name)}</a>\n'
                for p in sorted(self.root.iterdir())
                if p.is_file()
            )
            return self._send(h, 200, f"<html><body>{links}</body></html>".encode(), "text/html")
        behaviour = self.behaviour.get(name)
        kind = behaviour.kind if behaviour else ""
        if behaviour:
            behaviour.used += 1
        if kind == "404" or not (self.root / name).is_file():
            return self._send(h, 404, b"not found")
        if kind == "500" or (kind == "500-once" and behaviour and behaviour.used == 1):
            return self._send(h, 500, b"boom")
        data = (self.root / name).read_bytes()
        start = 0
        if rng:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(data)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return None
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            h.send_response(200)
        body = data[start:]
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if kind == "stall":
            h.wfile.write(body[: len(body) // 3])
            h.wfile.flush()
            time.sleep(self.stall_seconds)
            h.close_connection = True
            return None
        if kind == "truncate-once" and behaviour and behaviour.used == 1:
            h.wfile.write(body[: len(body) // 2])  # then hang up: Content-Length promised more
            h.wfile.flush()
            h.close_connection = True
            return None
        h.wfile.write(body)
        return None

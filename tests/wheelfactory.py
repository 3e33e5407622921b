"""Real artifacts for the check tests: host .so files from gcc, fatbins written to NVIDIA's
layout and added with objcopy, and wheels zipped with a correct RECORD.

The fatbin payloads are placeholders (the check reads headers, never payloads);
tests that need NVIDIA-made fatbins compile with nvcc instead.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import subprocess
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xBA55ED50


@dataclass(frozen=True)
class FakeEntry:
    kind: str  # "sass" | "ptx"
    arch: int
    compressed: bool = False
    payload: bytes = b"\x7fELF-placeholder-device-code\0\0\0\0"


def fatbin(entries: Iterable[FakeEntry]) -> bytes:
    """One fatbin in the layout nvcc writes (see pinwheel.fatbin for the field list)."""
    body = b""
    for e in entries:
        payload = e.payload + b"\0" * (-len(e.payload) % 8)
        kind = 2 if e.kind == "sass" else 1
        header_size = 64 if kind == 2 else 80  # nvcc writes 80-byte PTX entry headers
        flags = 0x11 | (0x2000 if e.compressed else 0)
        csize = len(e.payload) if e.compressed else 0
        head = struct.pack(
            "<HHIQIIHHIIIQQQ",
            kind,
            0x0101,
            header_size,
            len(payload),
            csize,
            0,
            8 if kind == 2 else 0,
            1 if kind == 2 else 9,
            e.arch,
            0,
            0,
            flags,
            0,
            len(e.payload) * 2 if e.compressed else 0,
        )
        body += head + b"\0" * (header_size - 64) + payload
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


def section(*fatbins: bytes) -> bytes:
    """Several fatbins, 8-byte aligned with zero padding between, as the linker lays them out."""
    out = b""
    for fb in fatbins:
        out += fb + b"\0" * (-len(fb) % 8) + b"\0" * 8
    return out


def host_so(workdir: Path, name: str, *, rpath: str | None = None, runpath: bool = False) -> Path:
    """A real shared object from gcc (optionally with -Wl,-rpath)."""
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / f"{name}.c"
    src.write_text("int pinwheel_probe(int x) { return x * 3 + 1; }\n")
    out = workdir / f"{name}.so"
    cmd = ["gcc", "-shared", "-fPIC", "-o", str(out), str(src)]
    if rpath:
        cmd.append(f"-Wl,-rpath,{rpath}")
        cmd.append("-Wl,--enable-new-dtags" if runpath else "-Wl,--disable-new-dtags")
    subprocess.run(cmd, check=True)
    return out


def cuda_so(workdir: Path, name: str, fatbin_section: bytes, **kw: object) -> Path:
    """A gcc .so with a .nv_fatbin section added by objcopy."""
    so = host_so(workdir, name, **kw)  # type: ignore[arg-type]
    blob = workdir / f"{name}.fatbin"
    blob.write_bytes(fatbin_section)
    subprocess.run(
        ["objcopy", "--add-section", f".nv_fatbin={blob}", str(so)],
        check=True,
    )
    return so


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    out_dir: Path,
    files: Mapping[str, bytes],
    *,
    dist: str = "demo",
    version: str = "1.0",
    tag: str = "cp311-cp311-linux_x86_64",
    symlinks: Mapping[str, str] | None = None,
    record_override: Mapping[str, str] | None = None,
) -> Path:
    """A wheel with METADATA, WHEEL and a correct RECORD; ``record_override`` tampers rows."""
    out_dir.mkdir(parents=True, exist_ok=True)
    info = f"{dist}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    )
    members[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: pinwheel-tests\nRoot-Is-Purelib: false\nTag: {tag}\n"
    ).encode()
    rows = [f"{name},{_record_hash(data)},{len(data)}" for name, data in members.items()]
    for link in symlinks or {}:
        rows.append(f"{link},,")
    for name, row in (record_override or {}).items():
        rows = [r for r in rows if not r.startswith(name + ",")] + [row]
    rows.append(f"{info}/RECORD,,")
    members[f"{info}/RECORD"] = ("\n".join(rows) + "\n").encode()
    path = out_dir / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zi = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100644 if not name.endswith(".so") else 0o100755) << 16
            zf.writestr(zi, data)
        for link, target in (symlinks or {}).items():
            zi = zipfile.ZipInfo(link, date_time=(2026, 1, 1, 0, 0, 0))
            zi.external_attr = 0o120777 << 16
            zf.writestr(zi, target)
    return path

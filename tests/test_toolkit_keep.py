"""What provisioning a toolkit keeps, and what it says while it unpacks (issue 41, item 4).

Real parts: .debs built here with ``dpkg-deb`` and a wheel zipped with a correct RECORD,
put in ``toolchains/downloads`` with their sha256 pinned in a lock of their own (so no
apt or pip download runs); the one stand-in is the package's ``nvcc``, a shell script
that answers ``--version`` like NVIDIA's (no real nvcc belongs in a test .deb)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pinwheel.compile.toolchain.pins import MARKER, DebPin, ToolkitLock, WheelPin
from pinwheel.compile.toolchain.provision import kept, provision_toolkit
from pinwheel.progress import LineReporter, human_bytes
from wheelfactory import make_wheel

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="no dpkg-deb")

NVCC = """#!/bin/sh
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release 12.4, V12.4.131"
"""


def deb(out: Path, package: str, files: dict[str, bytes]) -> Path:
    """A real Debian package of ``files`` (path inside it -> bytes), built by dpkg-deb."""
    root = out / f"{package}-root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1.0-1\nArchitecture: amd64\n"
        "Maintainer: pinwheel tests <tests@invalid>\nDescription: test package\n"
    )
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        (root / rel).chmod(0o755 if rel.endswith("nvcc") else 0o644)
    path = out / f"{package}_1.0-1_amd64.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", "-Zgzip", str(root), str(path)],
                   check=True, capture_output=True)  # fmt: skip
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def lock(tmp_path: Path) -> tuple[ToolkitLock, Path]:
    """A lock of two real .debs and a real wheel, the files already in the cache's downloads."""
    built = tmp_path / "built"
    built.mkdir()
    tools = deb(built, "cuda-tools", {"usr/lib/tk/bin/nvcc": NVCC.encode()})
    dev = deb(built, "cuda-devel", {
        "usr/lib/x86_64-linux-gnu/libcudart_static.a": os.urandom(300_000),
        "usr/include/cublas_v2.h": b"/* cublas */\n" * 1000,
    })  # fmt: skip
    whl = make_wheel(built, {"nvidia/rt/include/cuda_runtime.h": b"/* rt */\n" * 500},
                     dist="cuda_rt", version="12.4", tag="py3-none-any")  # fmt: skip
    downloads = tmp_path / "cache" / "toolchains" / "downloads"
    downloads.mkdir(parents=True)
    for f in (tools, dev, whl):
        shutil.copy(f, downloads / f.name)
    pins = ToolkitLock(
        version="12.4.131", suite="trixie", component="non-free",
        debs=(
            DebPin("cuda-tools", "1.0-1", sha(tools), (("usr/lib/tk/bin/nvcc", "bin/nvcc"),),
                   size=tools.stat().st_size),
            DebPin("cuda-devel", "1.0-1", sha(dev), (
                ("usr/lib/x86_64-linux-gnu/libcudart_static.a", "lib64/libcudart_static.a"),),
                size=dev.stat().st_size),
        ),
        wheels=(WheelPin("cuda_rt", "12.4", whl.name, sha(whl),
                         (("nvidia/rt/include", "include"),), size=whl.stat().st_size),),
        dev=(("cuda-devel", (("usr/include/cublas_v2.h", "include/cublas_v2.h"),)),),
    )  # fmt: skip
    return pins, tmp_path / "cache"


def test_unpacking_says_each_package_and_its_bytes_and_the_downloads_go(lock) -> None:
    pins, cache = lock
    downloads = cache / "toolchains" / "downloads"
    fetched = {p.name: p.stat().st_size for p in downloads.iterdir()}
    out = io.StringIO()
    root = provision_toolkit(pins, cache, {"PATH": os.defpath}, LineReporter(out))
    said = out.getvalue()
    for name, size in fetched.items():  # each package by name and size, before and after
        assert f"CUDA 12.4.131: unpacking {name} ({human_bytes(size)}) ..." in said, said
        # the bytes read: a .deb's data.tar (until the pinned files are out), a whole wheel
        done = f"CUDA 12.4.131: unpacking {name}: " + ("" if name.endswith(".deb") else
                                                         f"{human_bytes(size)} in ")
        assert done in said, said
    assert said.index("unpacking cuda-tools") < said.index("unpacking cuda-devel")
    # Verified, then the downloads removed: the tree and the record of each file stay.
    assert (root / "bin" / "nvcc").is_file() and (root / "lib64" / "libcudart_static.a").is_file()
    assert not downloads.exists() and not (cache / "toolchains" / "apt").exists()
    record = json.loads((root / MARKER).read_text())
    assert record["debs"] == {p.filename: p.sha256 for p in pins.debs}
    assert record["wheels"] == {pins.wheels[0].filename: pins.wheels[0].sha256}
    assert record["sizes"] == fetched
    assert record["kept"]["tree_bytes"] > 300_000 and record["kept"]["shared_bytes"] == 0
    assert "removed the downloaded files" in said and str(root / MARKER) in said
    note = kept(root)
    assert note.startswith("keeps the assembled tree only") and "3 downloaded files" in note
    assert "still in" not in note


def test_the_dev_variant_hard_links_what_it_shares_with_the_plain_tree(lock) -> None:
    pins, cache = lock
    downloads = cache / "toolchains" / "downloads"
    saved = {p.name: p.read_bytes() for p in downloads.iterdir()}
    plain = provision_toolkit(pins, cache, {"PATH": os.defpath})
    for name, data in saved.items():  # the dev tree needs them again: downloaded again
        downloads.mkdir(parents=True, exist_ok=True)
        (downloads / name).write_bytes(data)
    out = io.StringIO()
    dev = provision_toolkit(pins.with_dev(), cache, {"PATH": os.defpath}, LineReporter(out))
    assert dev.name == "cuda-12.4.131-dev" and (dev / "include" / "cublas_v2.h").is_file()
    for rel in ("bin/nvcc", "lib64/libcudart_static.a", "include/cuda_runtime.h"):
        assert (dev / rel).stat().st_ino == (plain / rel).stat().st_ino, rel
    assert (dev / "include" / "cublas_v2.h").stat().st_nlink == 1
    record = json.loads((dev / MARKER).read_text())
    assert record["kept"]["shared_with"] == "cuda-12.4.131"
    assert record["kept"]["shared_bytes"] >= 300_000
    assert "hard-linked to cuda-12.4.131" in out.getvalue()
    assert "hard links to cuda-12.4.131" in kept(dev)


def test_a_twin_reached_through_a_link_or_with_other_bytes_is_never_linked(lock) -> None:
    """The sibling tree is cache data: a file with other bytes is not shared, and a folder
    replaced by a symlink to elsewhere is never gone through."""
    pins, cache = lock
    downloads = cache / "toolchains" / "downloads"
    saved = {p.name: p.read_bytes() for p in downloads.iterdir()}
    plain = provision_toolkit(pins, cache, {"PATH": os.defpath})
    outside = cache.parent / "outside"
    shutil.copytree(plain / "lib64", outside)
    shutil.rmtree(plain / "lib64")
    (plain / "lib64").symlink_to(outside)  # same bytes, reached through a link: not shared
    (plain / "bin" / "nvcc").chmod(0o755)
    data = (plain / "bin" / "nvcc").read_bytes()
    (plain / "bin" / "nvcc").unlink()
    (plain / "bin" / "nvcc").write_bytes(data.replace(b"12.4,", b"12.9,"))  # other bytes
    (plain / "bin" / "nvcc").chmod(0o755)
    downloads.mkdir()
    for name, blob in saved.items():
        (downloads / name).write_bytes(blob)
    dev = provision_toolkit(pins.with_dev(), cache, {"PATH": os.defpath})
    assert (dev / "bin" / "nvcc").stat().st_ino != (plain / "bin" / "nvcc").stat().st_ino
    libs = dev / "lib64" / "libcudart_static.a"
    assert libs.stat().st_ino != (outside / "libcudart_static.a").stat().st_ino
    assert (dev / "include" / "cuda_runtime.h").stat().st_ino == (
        plain / "include" / "cuda_runtime.h"
    ).stat().st_ino


def test_the_report_names_downloads_an_older_pinwheel_left(lock) -> None:
    pins, cache = lock
    root = provision_toolkit(pins, cache, {"PATH": os.defpath})
    downloads = cache / "toolchains" / "downloads"
    downloads.mkdir()
    (downloads / pins.debs[0].filename).write_bytes(b"x" * 4096)
    assert f"4.0 KiB of its downloaded files are still in {downloads}" in kept(root)
    record = json.loads((root / MARKER).read_text())
    del record["kept"]
    (root / MARKER).write_text(json.dumps(record))
    assert kept(root).startswith("provisioned by an earlier pinwheel")
    (root / MARKER).write_text("[" * 100)
    assert kept(root).startswith("its record is unreadable")


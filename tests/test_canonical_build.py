"""Slow: the in-tree selftest kernel, built cold through the CLI from two different caches
and two different HOMEs (one through the mount namespace, one through prefix maps),
gives one sha256; no cache path reaches the shared object; then the kept workspace
rebuilds incrementally to the same bytes.

Needs the pinned CUDA 12.4 toolkit: provisioned once into ``$PINWHEEL_CACHE`` (as
test_build_cuda does) and hard-linked into each test cache, so each cache holds its
own copy at its own path, as on two machines. The kernel is built from a checkout
copy with a components-only manifest of its own (CUDA 12.4, sm_70: what provisions
here), not the V100 card's manifest (CUDA 12.8, which this machine cannot have)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pinwheel.cli import default_cache
from pinwheel.compile import canonical
from pinwheel.compile.toolchain import MARKER, ToolkitRequest, resolve_toolkit
from pinwheel.manifest.build import BuildConfig
from pinwheel.options import host as host_of
from pinwheel.wheels.wheeldiff import diff_members

pytestmark = [pytest.mark.slow, pytest.mark.kernels]

REPO = Path(__file__).resolve().parent.parent
SO = "pinwheel_selftest/libpinwheel_selftest.so"
CONFIG = BuildConfig(python="3.11", cuda="12.4", arches=("7.0",), ptx=True, torch=None,
                     label=None, version=None)  # fmt: skip


@pytest.fixture(scope="module")
def toolkit_root() -> Path:
    env = {"PATH": os.defpath}  # not this machine's nvcc 13
    return resolve_toolkit(ToolkitRequest(CONFIG, default_cache(), host_of(env))).root


def make_cache(root: Path, toolkit_root: Path) -> Path:
    """A fresh cache holding its own copy of the provisioned toolkit."""
    dest = root / "toolchains" / toolkit_root.name
    dest.parent.mkdir(parents=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(toolkit_root, dest, symlinks=True, copy_function=link)
    assert (dest / MARKER).is_file()
    return root


# default: the toolkit that provisions here; the selftest as the card manifest declares it.
MANIFEST = (REPO / "recipes" / "examples" / "selftest-cuda124.toml").read_text()


def checkout(dest: Path) -> Path:
    """A checkout of the selftest kernel and its manifest at ``dest``."""
    shutil.copytree(REPO / "kernels" / "pinwheel-selftest", dest / "kernels" / "pinwheel-selftest")
    (dest / "manifest.toml").write_text(MANIFEST)
    return dest


def kernels(tree: Path, cache: Path, home: Path, out: Path, *args: str, **env: str) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    base.update(HOME=str(home), PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                     os.defpath]), **env)  # fmt: skip
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"),
                                                     base.get("PYTHONPATH")) if p)  # fmt: skip
    cmd = [sys.executable, "-m", "pinwheel", "--manifest", str(tree / "manifest.toml"),
           "--cache", str(cache), "--json", "kernels", "--name", "pinwheel-selftest",
           "--out", str(out), *args]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = json.loads(proc.stdout)["components"]
    built["path"] = out / built["wheel"]
    built["provenance"] = json.loads((out / "provenance.json").read_text())["components"][0]
    return built


def so_bytes(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(SO)


def test_selftest_bytes_do_not_depend_on_cache_or_home(toolkit_root: Path, tmp_path: Path) -> None:
    a = make_cache(tmp_path / "alice" / ".cache" / "pinwheel", toolkit_root)
    # a space in the path (a real user's "My Cache"): the prefix maps must stay one argument
    b = make_cache(tmp_path / "ci" / "data" / "pw cache b", toolkit_root)
    one, other = checkout(tmp_path / "alice" / "src"), checkout(tmp_path / "ci" / "checkout")
    first = kernels(one, a, tmp_path / "alice", tmp_path / "out-a", "--no-cache")
    # Another checkout, cache (with a space) and HOME, and the fallback method (prefix maps).
    second = kernels(other, b, tmp_path / "ci", tmp_path / "out-b", "--no-cache",
                     PINWHEEL_CANONICAL="prefix-map")  # fmt: skip
    # __FILE__ in the selftest's error messages is the canonical path, by either method.
    where = f"{canonical.CANONICAL_CACHE}/kernels/pinwheel-selftest/src/csrc/selftest.cu"
    for built in (first, second):
        so = so_bytes(built["path"])
        for cache in (a, b, tmp_path):
            assert str(cache).encode() not in so, cache
        assert where.encode() in so
    assert second["provenance"]["canonical"] == {
        "path": str(canonical.CANONICAL_CACHE), "method": "prefix-map",
        "front_end_pid": "the machine's (no PID namespace)"}  # fmt: skip
    assert first["provenance"]["canonical"]["path"] == str(canonical.CANONICAL_CACHE)
    assert str(a) not in json.dumps(first["provenance"]["env"])
    # Under prefix maps (no user namespace) nvcc's front end keeps the machine's pid, and
    # csrc/launches.cu (no plain external definition) names its internal entities after
    # it: the library differs there, and nothing else does.
    assert launches_suffix(so_bytes(first["path"])) == b"1"
    assert launches_suffix(so_bytes(second["path"])) not in (b"1", None)
    diffs = {d.member for d in diff_members(first["path"], second["path"])}
    assert diffs == {SO, f"{first['wheel'].split('-py3')[0]}.dist-info/RECORD"}, diffs


def launches_suffix(so: bytes) -> bytes | None:
    """What ends csrc/launches.cu's anonymous-namespace name in the library: the module id's
    pid part (the name is length-prefixed in its mangled form)."""
    found = re.search(rb"N(\d+)(_GLOBAL__N__[0-9a-f]{8}_\d+_launches_cu_[0-9a-f]{8})", so)
    if found is None:
        return None
    name = so[found.start(2) : found.start(2) + int(found.group(1))]
    tail = name[len(found.group(2)) :]
    return tail.lstrip(b"_") if tail else b""


def test_incremental_rebuild_equals_the_cold_bytes(toolkit_root: Path, tmp_path: Path) -> None:
    """A kept workspace: no change runs no builder (the last wheel is the build), a changed
    file that is not compiled compiles nothing, one edited .cu recompiles and gives the
    bytes a cold build of the edited source gives."""
    cache = make_cache(tmp_path / "cache", toolkit_root)
    home = tmp_path / "home"
    tree = checkout(tmp_path / "checkout")
    cold = kernels(tree, cache, home, tmp_path / "cold")
    log = cache / "kernels" / "pinwheel-selftest" / "build.log"
    stamp = log.stat().st_mtime_ns
    again = kernels(tree, cache, home, tmp_path / "again")
    assert again["sha256"] == cold["sha256"]
    assert log.stat().st_mtime_ns == stamp  # nothing changed: the builder did not even run
    # A file that is neither compiled nor packed changed: the builder runs, ninja compiles
    # nothing (README.md would change the wheel: it is the METADATA's description).
    (tree / "kernels" / "pinwheel-selftest" / "NOTES.txt").write_text("compiles nothing\n")
    docs = kernels(tree, cache, home, tmp_path / "docs")
    assert docs["sha256"] == cold["sha256"]
    assert log.stat().st_mtime_ns != stamp
    assert "Building CUDA object" not in log.read_text()  # ninja had nothing to compile
    assert "no work to do" in log.read_text()
    src = cache / "kernels" / "pinwheel-selftest" / "src"
    untouched = (src / "CMakeLists.txt").stat().st_mtime_ns
    # One line of code in the .cu.
    cu = tree / "kernels" / "pinwheel-selftest" / "csrc" / "selftest.cu"
    cu.write_text(cu.read_text().replace("need at least 4", "need 4 or more"))
    edited = kernels(tree, cache, home, tmp_path / "edited")
    assert (src / "CMakeLists.txt").stat().st_mtime_ns == untouched
    assert "Building CUDA object" in log.read_text()
    assert edited["sha256"] != cold["sha256"]
    fresh = make_cache(tmp_path / "fresh", toolkit_root)
    edited_cold = kernels(tree, fresh, home, tmp_path / "edited-cold", "--no-cache")
    assert edited["sha256"] == edited_cold["sha256"]

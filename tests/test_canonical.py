"""The canonical build path with a real gcc (same object bytes from two cache paths, by
either method), and the kept workspace's in-place export (only changed files written)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from pinwheel.compile import canonical, workspace
from pinwheel.options import host as host_of

SOURCE = (
    "#include <stdio.h>\n#include <tk.h>\n"
    "int where(void) { return puts(__FILE__) + puts(toolkit_where()); }\n"
)
# A header of a toolkit installed outside the cache: its inline code names its own path.
HEADER = "static inline const char* toolkit_where(void) { return __FILE__; }\n"
needs_gcc = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")


def compile_in(cache: Path, toolkit: Path, canon: canonical.Canonical) -> bytes:
    src = cache / "kernels" / "demo" / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "where.c").write_text(SOURCE)
    (toolkit / "include").mkdir(parents=True, exist_ok=True)
    (toolkit / "include" / "tk.h").write_text(HEADER)
    canon = canon.with_toolkit(toolkit)
    cmd = ["gcc", "-O2", f"-I{toolkit / 'include'}", "-c", str(src / "where.c"),
           "-o", str(src / "where.o")]  # fmt: skip
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    if canon.method == canonical.PREFIX_MAP:  # the build's CFLAGS, as a build system uses them
        cmd[1:1] = canon.env(env)["CFLAGS"].split()
    wrapped, cwd = canon.wrap(cmd, src)
    subprocess.run(wrapped, cwd=cwd, env=canon.env(env), check=True, capture_output=True)
    return (src / "where.o").read_bytes()


@needs_gcc
@pytest.mark.parametrize("method", [canonical.NAMESPACE, canonical.PREFIX_MAP])
def test_file_paths_are_canonical_from_any_cache(tmp_path: Path, method: str) -> None:
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    if method == canonical.PREFIX_MAP:
        env["PINWHEEL_CANONICAL"] = canonical.PREFIX_MAP
    a, b = tmp_path / "home" / "alice" / ".cache" / "pinwheel", tmp_path / "ci" / "cache-b"
    ca, cb = canonical.choose(a, host_of(env)), canonical.choose(b, host_of(env))
    if method == canonical.NAMESPACE and ca.method != method:
        pytest.skip(f"no mount namespace here: {ca.why}")
    assert ca.method == cb.method == method
    one = compile_in(a, tmp_path / "opt" / "cuda-a", ca)
    two = compile_in(b, tmp_path / "usr" / "local" / "cuda-b", cb)
    where = f"{canonical.CANONICAL_CACHE}/kernels/demo/src/where.c".encode()
    header = f"{canonical.CANONICAL_TOOLKIT}/include/tk.h".encode()
    assert where in one and header in one and str(tmp_path).encode() not in one
    assert one == two
    assert ca.record() == {"path": str(canonical.CANONICAL_CACHE), "method": method}
    assert ca.with_toolkit(tmp_path / "opt").record()["toolkit"] == str(canonical.CANONICAL_TOOLKIT)
    assert ca.with_toolkit(a / "toolchains" / "cuda").toolkit is None  # in the cache already


def test_paths_are_translated_for_the_build_and_recorded_canonically(tmp_path: Path) -> None:
    ns = canonical.Canonical(tmp_path / "c", canonical.NAMESPACE, unshare="unshare")
    pm = canonical.Canonical(tmp_path / "c", canonical.PREFIX_MAP)
    inside = str(tmp_path / "c" / "toolchains" / "bin")
    assert ns.to_build(inside) == f"{canonical.CANONICAL_CACHE}/toolchains/bin"
    assert ns.to_build(f"-DX={inside}:/usr/bin") == (
        f"-DX={canonical.CANONICAL_CACHE}/toolchains/bin:/usr/bin"
    )
    assert ns.to_build(str(tmp_path / "cache-other")) == str(tmp_path / "cache-other")
    assert pm.to_build(inside) == inside  # the maps rewrite it in the outputs
    assert pm.recorded(inside) == ns.recorded(inside) == ns.to_build(inside)
    flags = pm.env({"CFLAGS": "-O2"})
    assert flags["CFLAGS"] == f"-O2 -ffile-prefix-map={tmp_path / 'c'}={canonical.CANONICAL_CACHE}"
    assert flags["NVCC_APPEND_FLAGS"].startswith("-Xcompiler=-ffile-prefix-map=")


def test_a_cache_under_the_canonical_root_falls_back(tmp_path: Path) -> None:
    inside = canonical.CANONICAL_ROOT / "x"
    chosen = canonical.choose(inside, host_of({"PATH": os.defpath}))
    assert chosen.method == canonical.PREFIX_MAP and "under" in (chosen.why or "")


def test_sync_writes_only_changed_files_and_keeps_build_products(tmp_path: Path) -> None:
    checkout, dest, listing = tmp_path / "checkout", tmp_path / "ws" / "src", tmp_path / "l.json"
    (checkout / "csrc").mkdir(parents=True)
    (checkout / "csrc" / "a.cu").write_text("a\n")
    (checkout / "csrc" / "b.cu").write_text("b\n")
    (checkout / "gone.py").write_text("x\n")
    (checkout / "build").mkdir()
    (checkout / "build" / "junk.o").write_text("the checkout's own build output")
    first = workspace.sync(dest, workspace.dir_entries(checkout), listing)
    assert sorted(first.written) == ["csrc/a.cu", "csrc/b.cu", "gone.py"]
    assert not (dest / "build").exists()
    (dest / "build").mkdir()
    (dest / "build" / "a.o").write_text("object")  # what the builder left
    inode = {rel: (dest / rel).stat().st_ino for rel in ("csrc/a.cu", "csrc/b.cu")}
    (checkout / "csrc" / "b.cu").write_text("b changed\n")
    (checkout / "gone.py").unlink()
    second = workspace.sync(dest, workspace.dir_entries(checkout), listing)
    assert second.written == ("csrc/b.cu",) and second.removed == ("gone.py",)
    assert second.changed == ("csrc/b.cu", "gone.py") and second.kept == 1
    assert (dest / "csrc" / "a.cu").stat().st_ino == inode["csrc/a.cu"]  # not rewritten
    assert (dest / "csrc" / "b.cu").read_text() == "b changed\n"
    # Every exported file has the one fixed time, written or kept (compilers record it).
    assert {(dest / r).stat().st_mtime for r in ("csrc/a.cu", "csrc/b.cu")} == {
        workspace.SOURCE_MTIME
    }
    assert second.digest != first.digest
    assert (dest / "build" / "a.o").read_text() == "object" and not (dest / "gone.py").exists()


def test_prepare_keeps_a_workspace_only_for_the_same_key_and_never_when_cold(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ws"
    assert workspace.prepare(root, "k1", cold=False) is False
    (root / "build.ninja").write_text("kept")
    assert workspace.prepare(root, "k1", cold=False) is True
    assert (root / "build.ninja").is_file()
    assert workspace.prepare(root, "k2", cold=False) is False  # another toolchain/flags
    assert not (root / "build.ninja").exists()
    (root / "build.ninja").write_text("kept")
    assert workspace.prepare(root, "k2", cold=True) is False  # --no-cache: truly cold
    assert not (root / "build.ninja").exists()
    assert workspace.key_of({"a": 1}) != workspace.key_of({"a": 2})


def test_the_toolkit_front_end_runs_at_one_fixed_pid(tmp_path: Path) -> None:
    """nvcc's front end writes its getpid() into internal names (cudafe++'s module id): under
    the namespace every run of it, from any parent, is process 1 of its own PID namespace."""
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    cache = tmp_path / "cache"
    toolkit = cache / "toolchains" / "cuda-x"
    (toolkit / "bin").mkdir(parents=True)
    front = toolkit / "bin" / "cudafe++"  # a stand-in that reports the pid it runs at
    front.write_text('#!/bin/sh\necho "pid=$$ args=$* cwd=$(pwd -P)"; ls\n')
    front.chmod(0o755)
    canon = canonical.choose(cache, host_of(env))
    if canon.method != canonical.NAMESPACE:
        pytest.skip(f"no mount namespace here: {canon.why}")
    canon = canon.with_toolkit(toolkit)
    assert canon.front_ends == (  # covered where the build reaches it, and where it is
        f"{canonical.CANONICAL_CACHE}/toolchains/cuda-x/bin/cudafe++", str(front.resolve()))
    assert canon.record()["front_end_pid"] == canonical.FIXED_PID
    seen = set()
    for i in range(3):  # from a shell that spent pids first (as nvcc does), in other folders
        where = cache / f"work-{i}"  # (sccache runs it in a new temporary folder each time)
        where.mkdir()
        (where / "input.ii").write_text("")
        script = f'true; true; cd "{canon.to_build(where)}" && "{canon.to_build(front)}" a "b c"'
        cmd, cwd = canon.wrap(["sh", "-c", script], cache)
        out = subprocess.run(cmd, cwd=cwd, env=canon.env(env), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        seen.add(out.stdout.strip())
    fixed = canonical.CANONICAL_ROOT / ".pid" / "cwd"
    assert seen == {f"pid=1 args=a b c cwd={fixed}\ninput.ii"}  # its folder's files, seen there
    outside = subprocess.run([str(front)], capture_output=True, text=True).stdout
    assert outside.startswith("pid=") and not outside.startswith("pid=1 ")  # file untouched
    fallback = canonical.Canonical(cache.resolve(), canonical.PREFIX_MAP).with_toolkit(toolkit)
    assert fallback.front_ends == ()
    assert fallback.record()["front_end_pid"] == "the machine's (no PID namespace)"


@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc (the kernels session has it)")
def test_a_prefix_map_with_a_space_reaches_gcc_as_one_argument(tmp_path: Path) -> None:
    """nvcc splits NVCC_APPEND_FLAGS and -Xcompiler values at blanks, honouring only double
    quotes: a cache path with a space must reach the host compiler whole, by both routes."""
    pm = canonical.Canonical(tmp_path / "my cache", canonical.PREFIX_MAP)
    env = pm.env({"PATH": os.environ["PATH"]})
    want = f'"-ffile-prefix-map={tmp_path}/my cache={canonical.CANONICAL_CACHE}"'
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    base = ["nvcc", "-dryrun", "-c", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.o")]
    for extra, nvcc_env in (([], env), (shlex.split(env["CUDAFLAGS"]), {"PATH": env["PATH"]})):
        out = subprocess.run([*base, *extra], env=nvcc_env, capture_output=True, text=True)
        host = [ln for ln in out.stderr.splitlines() if " -E " in ln or " -c " in ln]
        assert host and all(want in ln for ln in host), out.stderr[-2000:]

"""Source file times do not reach the bytes; pinwheel, not file times, says what changed.

Compilers write source mtimes into what they make: ptxas with -lineinfo puts every
source's mtime in the cubin's .debug_line (two H200 builds of one exllamav3 tree
differed in 46 of 54 cubins by exactly that), gcc's ``__TIMESTAMP__`` in the object.
These tests use the real gcc and ninja: an export is stamped with one fixed mtime,
and :func:`pinwheel.compile.invalidate.invalidate` removes exactly the objects a
changed file reached, so an incremental build still equals a cold one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from pinwheel.compile import workspace
from pinwheel.compile.invalidate import invalidate, parse_deps

pytestmark = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("ninja")), reason="needs gcc and ninja"
)

# Relative paths: the objects name "../src/x.c", the same in every workspace.
BUILD_NINJA = """\
rule cc
  command = gcc -MD -MF $out.d -fPIC -O2 -c $in -o $out
  depfile = $out.d
  deps = gcc
rule link
  command = gcc -shared -o $out $in
build obj/a.o: cc ../src/a.c
build obj/b.o: cc ../src/b.c
build libx.so: link obj/a.o obj/b.o
"""

V1 = {
    "common.h": "#define SCALE 3\n",
    "a.c": '#include "common.h"\nint xa(int v) { return v * SCALE; }\n',
    "b.c": "const char xb_built[] = __TIMESTAMP__;\nint xb(int v) { return v + 1; }\n",
}
V2 = {**V1, "common.h": "#define SCALE 5\n"}


def entries(files: dict[str, str]) -> list[workspace.Entry]:
    return [workspace.Entry(rel, text.encode()) for rel, text in sorted(files.items())]


def export(root: Path, files: dict[str, str], mtime: int | None = workspace.SOURCE_MTIME):
    synced = workspace.sync(root / "src", entries(files), root / "export.json", mtime=mtime)
    (root / "build").mkdir(parents=True, exist_ok=True)
    (root / "build" / "build.ninja").write_text(BUILD_NINJA)
    return synced


def ninja(root: Path) -> str:
    out = subprocess.run(
        ["ninja", "-C", str(root / "build")], check=True, capture_output=True, text=True
    )
    return out.stdout


def cold(root: Path, files: dict[str, str], mtime: int | None = workspace.SOURCE_MTIME) -> bytes:
    export(root, files, mtime)
    ninja(root)
    return (root / "build" / "libx.so").read_bytes()


def test_exported_sources_carry_one_time_so_timestamps_do_not_reach_the_bytes(
    tmp_path: Path,
) -> None:
    first = cold(tmp_path / "one", V1)
    assert {p.stat().st_mtime for p in (tmp_path / "one" / "src").iterdir()} == {
        workspace.SOURCE_MTIME
    }
    time.sleep(1.1)  # __TIMESTAMP__ has one-second resolution
    assert cold(tmp_path / "two", V1) == first
    # The control: exported at the time of writing (before), the same tree gave other bytes.
    before = cold(tmp_path / "three", V1, mtime=None)
    time.sleep(1.1)
    assert cold(tmp_path / "four", V1, mtime=None) != before


def test_a_changed_header_recompiles_only_what_included_it_and_equals_a_cold_build(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    export(ws, V1)
    ninja(ws)
    kept = (ws / "build" / "obj" / "b.o").stat().st_mtime_ns
    time.sleep(1.1)
    synced = export(ws, V2)
    assert synced.changed == ("common.h",)
    assert "no work to do" in ninja(ws)  # file times alone no longer show the change ...
    gone = invalidate(
        (ws / "build",), synced.changed, roots=(ws / "src",), path=os.environ["PATH"]
    )
    assert gone.objects == ("obj/a.o",) and not gone.wiped  # ... pinwheel does
    log = ninja(ws)
    assert "-o obj/a.o" in log and "-o obj/b.o" not in log  # one compile, then the link
    assert (ws / "build" / "obj" / "b.o").stat().st_mtime_ns == kept
    assert (ws / "build" / "libx.so").read_bytes() == cold(tmp_path / "cold", V2)


def test_a_build_file_change_or_a_tree_without_ninja_deps_starts_the_tree_cold(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    export(ws, V1)
    ninja(ws)
    # A source no recorded dependency names (a rule without deps, a new file) may compile.
    gone = invalidate(
        (ws / "build",), ("c.c",), roots=(ws / "src",), path=os.environ["PATH"]
    )
    assert gone.wiped == ("build",) and "c.c" in (gone.why or "")
    export(ws, V1)
    ninja(ws)
    gone = invalidate((ws / "build",), ("CMakeLists.txt",), roots=(ws / "src",), path="")
    assert gone.wiped == ("build",) and "CMakeLists.txt" in (gone.why or "")
    assert not (ws / "build").exists() and (ws / "src" / "a.c").is_file()
    plain = tmp_path / "plain" / "build"
    (plain / "lib.linux").mkdir(parents=True)
    (plain / "temp.linux").mkdir()
    (plain / "temp.linux" / "a.o").write_bytes(b"stale")
    gone = invalidate((plain,), ("a.c",), roots=(tmp_path / "plain" / "src",), path="")
    assert gone.wiped and not plain.exists()
    assert invalidate((plain,), (), roots=(), path="").summary() == "0 object(s) to recompile"


def test_parse_deps_reads_ninja_output() -> None:
    text = (
        "obj/a.o: #deps 2, deps mtime 1 (VALID)\n    ../src/a.c\n    ../src/common.h\n\n"
        "obj/b.o: #deps 1, deps mtime 1 (STALE)\n    ../src/b.c\n\n"
    )
    assert parse_deps(text) == {
        "obj/a.o": ["../src/a.c", "../src/common.h"],
        "obj/b.o": ["../src/b.c"],
    }


def test_objects_recorded_at_the_canonical_path_are_found_at_the_real_one(
    tmp_path: Path,
) -> None:
    """Inside the mount namespace ninja records outputs and inputs at the canonical path,
    which does not exist outside it (found on the H200: the edited .cu's object was not
    removed, setuptools kept the old .so and the wheel shipped it beside the new source)."""
    real, seen = tmp_path / "ws", tmp_path / "canonical"
    seen.symlink_to(real, target_is_directory=True)  # the build's view, gone afterwards
    absolute = BUILD_NINJA.replace("../src/", f"{seen}/src/").replace(
        "build obj/", f"build {seen}/build/obj/"
    ).replace("libx.so: link obj/a.o obj/b.o", f"libx.so: link {seen}/build/obj/a.o "
              f"{seen}/build/obj/b.o")  # fmt: skip
    export(real, V1)
    (real / "build" / "build.ninja").write_text(absolute)
    ninja(real)
    seen.unlink()
    synced = export(real, V2)
    (real / "build" / "build.ninja").write_text(absolute)
    gone = invalidate(
        (real / "build",), synced.changed, roots=(real / "src", seen / "src"),
        path=os.environ["PATH"], build_dir_spellings=((real, str(seen)),),
    )  # fmt: skip
    assert gone.objects == ("obj/a.o",) and not (real / "build" / "obj" / "a.o").exists()
    assert (real / "build" / "obj" / "b.o").exists()


def test_unpacked_toolkit_files_keep_the_archives_times(tmp_path: Path) -> None:
    """A provisioned toolkit's headers get the time their archive records, not the time
    of unpacking: two machines provisioning at two times get the same header mtimes."""
    import io
    import tarfile
    import zipfile

    from pinwheel.archive import extract_tar, extract_zip

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, mtime in (("include/cuda_fp16.hpp", 1_700_000_000), ("bad.h", 2**40)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 4, mtime
            tar.addfile(info, io.BytesIO(b"x\ny\n"))
    raw.seek(0)
    with tarfile.open(fileobj=raw, mode="r:") as tar:
        extract_tar(tar, tmp_path / "t", "test.tar")
    assert (tmp_path / "t" / "include" / "cuda_fp16.hpp").stat().st_mtime == 1_700_000_000
    assert abs((tmp_path / "t" / "bad.h").stat().st_mtime - time.time()) < 600  # refused time
    packed = tmp_path / "w.zip"
    with zipfile.ZipFile(packed, "w") as zf:
        zf.writestr(zipfile.ZipInfo("nvidia/include/crt.h", (2024, 5, 6, 7, 8, 10)), "z\n")
    with zipfile.ZipFile(packed) as zf:
        extract_zip(zf, tmp_path / "z", "w.zip")
    got = (tmp_path / "z" / "nvidia" / "include" / "crt.h").stat().st_mtime
    assert time.gmtime(got)[:6] == (2024, 5, 6, 7, 8, 10)


def test_a_venvs_headers_get_the_fixed_time_and_nothing_else_does(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    headers = [site / "torch" / "include" / "c10" / "util" / "Half-inl.h",
               site / "nvidia" / "cuda_runtime" / "include" / "cuda_fp16.hpp"]  # fmt: skip
    other = site / "torch" / "__init__.py"
    for path in [*headers, other]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")
    assert workspace.fix_header_times(tmp_path / "venv") == 2
    assert {h.stat().st_mtime for h in headers} == {workspace.SOURCE_MTIME}
    assert other.stat().st_mtime != workspace.SOURCE_MTIME

"""Header views: fixed-time copies of header directories pinwheel did not install, bound over
the originals inside the build's mount namespace (real files, a real ``unshare``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel.compile import canonical, headerview
from pinwheel.compile.workspace import SOURCE_MTIME
from pinwheel.options import host as host_of


def _headers(root: Path, mtime: int) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.h").write_text("#define A 1\n")
    (root / "sub" / "b.hpp").write_text("inline int b() { return 2; }\n")
    (root / "link.h").symlink_to("a.h")
    for p in (root / "a.h", root / "sub" / "b.hpp"):
        os.utime(p, (mtime, mtime))
    return root


def test_the_copy_has_one_time_and_the_original_is_untouched(tmp_path: Path) -> None:
    src = _headers(tmp_path / "usr" / "include", 1_750_000_000)
    view = headerview.make(src, tmp_path / "cache")
    assert view.covers == src and view.files == 4  # a.h, sub, sub/b.hpp, link.h
    for rel in ("a.h", "sub/b.hpp", "sub"):
        assert (view.copy / rel).stat().st_mtime == SOURCE_MTIME
    assert (view.copy / "link.h").is_symlink()
    assert (src / "a.h").stat().st_mtime == 1_750_000_000  # never touched
    assert (view.copy / "sub" / "b.hpp").read_text() == "inline int b() { return 2; }\n"
    assert headerview.make(src, tmp_path / "cache").copy == view.copy  # made once


def test_a_changed_header_gets_a_new_copy_and_a_half_made_one_is_redone(tmp_path: Path) -> None:
    src = _headers(tmp_path / "inc", 1_750_000_000)
    first = headerview.make(src, tmp_path / "cache")
    os.utime(src / "a.h", (1_760_000_000, 1_760_000_000))  # another image: another key
    second = headerview.make(src, tmp_path / "cache")
    assert second.copy != first.copy
    (second.copy / headerview.READY).unlink()  # interrupted before its marker
    (second.copy / "a.h").unlink()
    again = headerview.make(src, tmp_path / "cache")
    assert (again.copy / "a.h").is_file() and (again.copy / headerview.READY).is_file()


def test_the_key_sees_every_entry_deep_down_and_follows_no_link(tmp_path: Path) -> None:
    """The walk lists what os.walk (top-down, sorted) lists, in that order; a link to a
    directory is an entry, never descended; a change three levels down is a new key."""
    src = _headers(tmp_path / "inc", 1_750_000_000)
    (src / "sub" / "deep" / "deeper").mkdir(parents=True)
    (src / "sub" / "deep" / "deeper" / "c.cuh").write_text("// c\n")
    (src / "sub" / "Z.h").write_text("// Z\n")
    (src / "dirlink").symlink_to("sub")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "x.h").write_text("// x\n")
    (src / "outlink").symlink_to(tmp_path / "outside")

    expected = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            expected.append((Path(dirpath) / name).relative_to(src).as_posix())
    assert [rel for rel, _ in headerview._walk(src)] == expected
    assert "dirlink/Z.h" not in expected and "outlink/x.h" not in expected

    before = headerview.key_of(src)
    (tmp_path / "outside" / "x.h").write_text("// changed outside\n")  # behind a link
    assert headerview.key_of(src) == before
    deep = src / "sub" / "deep" / "deeper" / "c.cuh"
    os.utime(deep, (1_760_000_000, 1_760_000_000))
    assert headerview.key_of(src) != before


def test_outside_drops_what_lies_in_the_cache(tmp_path: Path) -> None:
    cache, other = tmp_path / "cache", tmp_path / "sys" / "include"
    (cache / "venvs" / "x" / "include").mkdir(parents=True)
    other.mkdir(parents=True)
    dirs = [cache / "venvs" / "x" / "include", other, other]
    assert headerview.outside(dirs, cache) == [other.resolve()]


def test_torch_include_dirs_are_found_without_importing_torch(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "torch" / "include" / "ATen").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise SystemExit('imported torch')\n")
    (site / "nvidia" / "cublas" / "include").mkdir(parents=True)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    found = headerview.torch_include_dirs(python)
    assert found == [site / "torch" / "include", site / "nvidia" / "cublas" / "include"]


def test_the_record_says_whether_header_times_were_fixed(tmp_path: Path) -> None:
    src = _headers(tmp_path / "sys" / "include", 1_750_000_000)
    cache = tmp_path / "cache"
    cache.mkdir()
    plain = canonical.Canonical(cache.resolve(), canonical.PREFIX_MAP)
    assert "header_times" not in plain.record()  # nothing foreign: the record is as before
    mapped = plain.with_views(cache, [src])
    assert mapped.views == () and "the machine's" in mapped.record()["header_times"]
    ns = canonical.Canonical(cache.resolve(), canonical.NAMESPACE, unshare="unshare")
    viewed = ns.with_views(cache, [src])
    assert len(viewed.views) == 1 and viewed.record()["header_times"].startswith("fixed: 1")
    assert str(tmp_path) not in str(viewed.record())  # no machine path in provenance


def test_inside_the_namespace_the_build_reads_the_view(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    canon = canonical.choose(cache, host_of({"PATH": os.environ.get("PATH", os.defpath)}))
    if canon.method != canonical.NAMESPACE:
        pytest.skip(f"no mount namespace here: {canon.why}")
    src = _headers(tmp_path / "sys" / "include", 1_750_000_000)
    viewed = canon.with_views(cache, [src])
    probe = "import os, sys; print(int(os.stat(sys.argv[1]).st_mtime))"
    cmd, cwd = viewed.wrap([sys.executable, "-c", probe, str(src / "sub" / "b.hpp")], cache)
    seen = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True)
    assert int(seen.stdout) == SOURCE_MTIME
    outside = subprocess.run([sys.executable, "-c", probe, str(src / "sub" / "b.hpp")],
                             capture_output=True, text=True, check=True)  # fmt: skip
    assert int(outside.stdout) == 1_750_000_000  # the view exists in the namespace only

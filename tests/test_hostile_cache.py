"""The cache's own commands on a cache that is not as pinwheel left it (docs/SECURITY.md,
"Cache contents"): ``prune`` refuses an age that is not one, ``clean`` refuses a mount
point inside the cache before removing anything. Real folders; the mount is a real tmpfs
in a user and mount namespace of its own (``unshare -rm``), skipped where there is none."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pinwheel.errors import UsageError
from pinwheel.source import cache, cachetool


def _cache(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    cache.mark(root)
    (root / "repos" / "old.git").mkdir(parents=True)
    return root


@pytest.mark.parametrize("days", [-1.0, -0.001, float("nan"), float("inf"), float("-inf")])
def test_prune_refuses_an_age_that_is_not_one(tmp_path: Path, days: float) -> None:
    root = _cache(tmp_path)
    with pytest.raises(UsageError) as err:
        cachetool.prune(root, [], older_than_days=days, apply=True)
    assert "is not an age" in err.value.what and "--older-than 30" in (err.value.next or "")
    assert (root / "repos" / "old.git").is_dir()  # nothing removed


def test_prune_older_than_zero_days_is_an_age(tmp_path: Path) -> None:
    root = _cache(tmp_path)
    chosen = cachetool.prune(root, [], older_than_days=0, apply=False, now=4e9)
    assert [p.name for p in chosen.paths] == ["old.git"]


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare")
def test_clean_refuses_a_mount_point_inside_the_cache_before_removing_anything(
    tmp_path: Path,
) -> None:
    root = _cache(tmp_path)
    mnt = root / "build" / "mounted"
    mnt.mkdir(parents=True)
    (root / "build" / "a.txt").write_text("pinwheel's\n")
    probe = textwrap.dedent(f"""
        from pathlib import Path
        from pinwheel.errors import UsageError
        from pinwheel.source import cachetool
        Path({str(mnt)!r}, "theirs.txt").write_text("another file system's\\n")
        try:
            cachetool.clean(Path({str(root)!r}), apply=True)
        except UsageError as exc:
            print("REFUSED", exc.what, "|", exc.next)
        print("LEFT", Path({str(mnt)!r}, "theirs.txt").exists(),
              Path({str(root)!r}, "build", "a.txt").exists())
    """)
    can = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs none "$1"', "sh", str(mnt)],
                         capture_output=True, text=True)  # fmt: skip
    if can.returncode != 0:
        pytest.skip(f"no mount namespace here: {can.stderr.strip()[:200]}")
    script = 'mount -t tmpfs none "$1" && exec "$2" -c "$3"'
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(mnt), sys.executable,
                           probe], capture_output=True, text=True)  # fmt: skip
    assert f"REFUSED {mnt} is a mount point inside the cache" in proc.stdout, proc.stderr
    assert f"umount {mnt}" in proc.stdout
    assert "LEFT True True" in proc.stdout  # nothing removed, theirs or pinwheel's


# ---- every write under a kept cache goes folder by folder: a link planted at any level


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "victim").write_text("victim's\n")
    return outside


def _untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_text() == "victim's\n"


@pytest.mark.parametrize("level", ["memo", "memo/toolkit-probes"])
def test_a_toolkit_probe_record_is_never_written_through_a_planted_folder(
    tmp_path: Path, level: str
) -> None:
    from pinwheel.compile.toolchain import probememo

    root = _cache(tmp_path)
    outside = _outside(tmp_path)
    (root / level).parent.mkdir(parents=True, exist_ok=True)
    (root / level).symlink_to(outside)
    probememo.remember(root, "ab" * 32, ("7.0",))
    _untouched(outside)
    assert not probememo.passed(root, "ab" * 32)


def test_the_cache_lock_is_never_made_through_a_planted_locks_folder(tmp_path: Path) -> None:
    from pinwheel.errors import PinwheelError
    from pinwheel.source.cache import Cache

    root = _cache(tmp_path)
    outside = _outside(tmp_path)
    (root / "locks").symlink_to(outside)
    with pytest.raises(PinwheelError, match="symlink"):
        with Cache(root, {}).locked("https://example.invalid/x.git"):
            pass
    _untouched(outside)


def test_a_build_log_planted_as_a_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    from pinwheel import runner

    outside = _outside(tmp_path)
    log = tmp_path / "cache" / "build" / "engine" / "build.log"
    log.parent.mkdir(parents=True)
    log.symlink_to(outside / "victim")
    runner.run(runner.Command(("sh", "-c", "echo compiled"), output="log", log_file=log))
    _untouched(outside)
    assert not log.is_symlink() and "compiled" in log.read_text()


def test_a_check_memo_is_never_written_through_a_planted_folder(tmp_path: Path) -> None:
    """The tag and check memos (``<cache>/memo/...``): a folder of theirs planted as a link
    out of the cache gets nothing written into it."""
    from pinwheel.compile.checkmemo import Memo

    outside = _outside(tmp_path)
    root = tmp_path / "cache" / "memo" / "check"
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK wheel bytes")
    root.mkdir(parents=True)
    (root / "stamp").symlink_to(outside)  # where a wheel's file stamp is remembered
    assert Memo(root).sha(wheel).sha256 is not None
    _untouched(outside)

"""pinwheel.locking, the one file lock, on real files, real processes and real filelock.

The lock is the kernel's flock on the file filelock's FileLock takes: each sees the other
held, both ways, across processes. A lock path that is no regular file is refused at once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel import locking
from pinwheel.compile import workspace
from pinwheel.source.cache import Cache, slug

# A hang on a planted FIFO is the failure the hostile test guards against: it fails here.
pytestmark = pytest.mark.timeout(120)

FILELOCK_PROBE = """
import sys
from filelock import FileLock, Timeout
try:
    with FileLock(sys.argv[1], timeout=0):
        print("free")
except Timeout:
    print("held")
"""

FILELOCK_HOLDER = """
import os, sys
from filelock import FileLock
with FileLock(sys.argv[1]):
    print(os.getpid(), flush=True)
    sys.stdin.read()  # held until the test closes stdin
"""


def _probe(lock: Path) -> str:
    out = subprocess.run([sys.executable, "-c", FILELOCK_PROBE, str(lock)],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_filelock_in_another_process_sees_the_lock_held_and_then_free(tmp_path: Path) -> None:
    lock = tmp_path / "a.lock"
    with locking.held(lock, timeout_s=0):
        assert _probe(lock) == "held"
    assert _probe(lock) == "free"
    assert lock.read_bytes() == b""  # nothing is written into a lock file


def test_a_filelock_held_elsewhere_is_waited_for_then_named_with_its_holder(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "b.lock"
    with subprocess.Popen([sys.executable, "-c", FILELOCK_HOLDER, str(lock)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdin is not None
            pid = int(holder.stdout.readline())
            with pytest.raises(locking.LockBusy) as busy, locking.held(
                lock, timeout_s=0.3, what="another run has held the thing", next="wait for it"
            ):
                pytest.fail("took a lock another process holds")
            assert busy.value.what == f"another run has held the thing for 0.3s (pid {pid})"
            assert busy.value.where == str(lock)
            assert busy.value.next == (
                f"wait for it (`ps -o pid,etime,args -p {pid}` shows who holds it)"
            )
            holder.stdin.close()  # the holder lets go and exits
            assert holder.wait(timeout=60) == 0
            with locking.held(lock):  # no timeout: waits as long as it takes, here not at all
                assert _probe(lock) == "held"
        finally:
            holder.kill()


def test_one_try_says_busy_without_waiting_and_the_holder_keeps_it(tmp_path: Path) -> None:
    lock = tmp_path / "c.lock"
    with locking.held(lock):
        with pytest.raises(locking.LockBusy) as busy, locking.held(lock, timeout_s=0):
            pytest.fail("took a lock this process holds through another descriptor")
        assert busy.value.what.startswith("another pinwheel run has held this lock for 0s")
        assert f"pid {os.getpid()}" in busy.value.what
        assert _probe(lock) == "held"
    assert _probe(lock) == "free"


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return "a FIFO"


def _link_to_a_file(path: Path) -> str:
    target = path.with_name("target")
    target.write_bytes(b"precious")
    path.symlink_to(target)
    return "a symbolic link"


def _dangling_link(path: Path) -> str:
    path.symlink_to(path.with_name("made-through-the-link"))
    return "a symbolic link"


def _directory(path: Path) -> str:
    path.mkdir()
    return "a directory"


def _socket(path: Path) -> str:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return "a socket"


@pytest.mark.parametrize("plant", [_fifo, _link_to_a_file, _dangling_link, _directory, _socket])
def test_a_lock_path_that_is_no_regular_file_is_refused_not_waited_on(
    plant, tmp_path: Path
) -> None:
    lock = tmp_path / "d.lock"
    kind = plant(lock)
    with pytest.raises(locking.NotALockFile) as err, locking.held(lock, timeout_s=None):
        pytest.fail("locked through something that is no regular file")
    assert err.value.what == f"the lock file is {kind}, not a regular file: nothing was locked"
    assert err.value.where == str(lock) and f"`ls -la {lock}`" in (err.value.next or "")
    assert not (tmp_path / "made-through-the-link").exists()  # no file made through a link
    if (tmp_path / "target").exists():
        assert (tmp_path / "target").read_bytes() == b"precious"


def test_the_cache_and_workspace_locks_refuse_a_planted_fifo_or_link(tmp_path: Path) -> None:
    """Through their users: the cache's repository lock and a build's workspace lock."""
    url = "https://example.invalid/acme/engine.git"
    root = tmp_path / "cache"
    (root / "locks").mkdir(parents=True)
    os.mkfifo(root / "locks" / f"{slug(url)}.lock")
    with pytest.raises(locking.NotALockFile, match="is a FIFO"), Cache(root, {}).locked(url):
        pytest.fail("the cache lock went through a FIFO")
    work = root / "build" / "engine"
    work.parent.mkdir(parents=True)
    (work.parent / ".engine.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(locking.NotALockFile, match="is a symbolic link"), workspace.locked(work):
        pytest.fail("the workspace lock went through a link")
    assert not (tmp_path / "elsewhere").exists()

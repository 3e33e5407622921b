"""confine.TreeWriter: an archive written through folders opened once, never through a link.

The archive reader writes each member through :class:`pinwheel.confine.TreeWriter` (each
folder opened ``O_NOFOLLOW`` once) and falls back to the one-path-at-a-time route
(:func:`pinwheel.confine.inside`) for anything but the plain case. These cases hold the two
routes to the same outcome: the same bytes, modes and times, a planted link never written
through, a FIFO never waited on, a hard link never written through, many folders.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import threading
from pathlib import Path

import pytest

from pinwheel import confine
from pinwheel.archive import extract_tar, extract_zip
from pinwheel.errors import PinwheelError


def _tar(members: list[tuple[str, bytes, int]], mtime: int = 1_600_000_000) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
            else:
                info.size, info.mode = len(data), mode
            info.mtime = mtime
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _extract(raw: bytes, dest: Path) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return extract_tar(tar, dest, "t.tar", inner_links=True)


def test_a_tree_of_many_folders_is_written_whole_with_modes_and_times(tmp_path):
    """More folders than the writer keeps open (64), visited out of order: every file is
    there with its bytes, its mode (executable or not, whatever the umask) and its time."""
    members = []
    for i in range(150):
        mode = 0o755 if i % 3 else 0o600
        members.append((f"d{i % 97}/sub{i % 5}/f{i}.h", f"{i}\n".encode(), mode))
    members.append(("d1/sub1/ü name.txt", b"non-ASCII\n", 0o644))
    old = os.umask(0o077)
    try:
        written = _extract(_tar(members, mtime=1_234_567_890), tmp_path / "out")
    finally:
        os.umask(old)
    assert len(written) == len(members)
    for name, data, mode in members:
        path = tmp_path / "out" / name
        assert path.read_bytes() == data
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if mode & 0o111 else 0o644)
        assert path.stat().st_mtime == 1_234_567_890


def test_a_link_planted_on_the_way_out_is_refused_and_nothing_outside_changes(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "pkg").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PinwheelError, match="symlink"):
        _extract(_tar([("pkg/keep.txt", b"overwritten\n", 0o644)]), dest)
    assert (outside / "keep.txt").read_text() == "precious\n"


def test_a_link_on_the_way_that_stays_inside_is_gone_through_as_before(tmp_path):
    """The checked route allows a folder link that resolves inside the scope (a toolkit's
    ``lib64 -> targets/x86_64-linux/lib``): the writer hands it over, the file lands."""
    dest = tmp_path / "dest"
    (dest / "targets" / "lib").mkdir(parents=True)
    (dest / "lib64").symlink_to("targets/lib", target_is_directory=True)
    _extract(_tar([("lib64/libx.so", b"elf\n", 0o755)]), dest)
    assert (dest / "targets" / "lib" / "libx.so").read_bytes() == b"elf\n"
    assert (dest / "lib64").is_symlink()


def test_a_link_at_the_target_is_replaced_not_written_through(tmp_path):
    outside = tmp_path / "victim.txt"
    outside.write_text("precious\n")
    dest = tmp_path / "dest"
    (dest / "a").mkdir(parents=True)
    (dest / "a" / "f.txt").symlink_to(outside)
    _extract(_tar([("a/f.txt", b"new\n", 0o644)]), dest)
    assert outside.read_text() == "precious\n"
    assert not (dest / "a" / "f.txt").is_symlink()
    assert (dest / "a" / "f.txt").read_bytes() == b"new\n"


def test_a_fifo_at_the_target_is_replaced_without_waiting_for_a_reader(tmp_path):
    dest = tmp_path / "dest"
    (dest / "a").mkdir(parents=True)
    os.mkfifo(dest / "a" / "f.txt")
    done = threading.Event()

    def run() -> None:
        _extract(_tar([("a/f.txt", b"new\n", 0o644)]), dest)
        done.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(20)
    assert done.is_set(), "the writer waited on a FIFO"
    assert stat.S_ISREG(os.lstat(dest / "a" / "f.txt").st_mode)
    assert (dest / "a" / "f.txt").read_bytes() == b"new\n"


def test_a_hard_link_at_the_target_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    dest = tmp_path / "dest"
    (dest / "a").mkdir(parents=True)
    os.link(victim, dest / "a" / "f.txt")
    with pytest.raises(PinwheelError, match="plain file of its own"):
        _extract(_tar([("a/f.txt", b"new\n", 0o644)]), dest)
    assert victim.read_text() == "precious\n"


def test_a_file_where_a_folder_belongs_is_refused_by_name(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "a").write_text("a file\n")
    with pytest.raises(PinwheelError, match="a file is in the way of the folder") as err:
        _extract(_tar([("a/f.txt", b"new\n", 0o644)]), dest)
    assert err.value.next and (dest / "a").read_text() == "a file\n"


def test_the_writer_says_no_before_reading_a_byte(tmp_path):
    """write() returns False for a non-plain target with the source untouched, so the
    caller's checked route reads it whole."""
    (tmp_path / "x").symlink_to(tmp_path / "elsewhere")
    src = io.BytesIO(b"payload")
    with confine.TreeWriter(tmp_path) as writer:
        assert writer.write("x", src, 0o644) is False
        assert src.tell() == 0
        assert writer.write("y/z", src, 0o644) is True
    assert (tmp_path / "y" / "z").read_bytes() == b"payload"
    with pytest.raises(confine.Escape):
        confine.TreeWriter(tmp_path).write("../up", io.BytesIO(b""), 0o644)


def test_zip_members_take_the_same_route(tmp_path):
    import zipfile

    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w") as zf:
        for i in range(70):
            zf.writestr(f"p{i}/m.txt", f"{i}".encode())
    with zipfile.ZipFile(io.BytesIO(raw.getvalue())) as zf:
        written = extract_zip(zf, tmp_path / "z", "x.zip")
    assert len(written) == 70
    assert all((tmp_path / "z" / f"p{i}" / "m.txt").read_text() == str(i) for i in range(70))


@pytest.mark.parametrize("mtime", [2**40, -5, 2**32])
def test_a_time_outside_1970_to_2106_is_left_at_the_time_of_writing(tmp_path, mtime):
    """A hostile or broken header time never reaches utime, on either route (the writer's
    plain case, and the checked route a link on the way sends a member to)."""
    import time

    dest = tmp_path / "dest"
    (dest / "real").mkdir(parents=True)
    (dest / "via").symlink_to("real", target_is_directory=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("plain.txt", "via/checked.txt"):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = 2, 0o644, mtime
            tar.addfile(info, io.BytesIO(b"x\n"))
    before = time.time() - 60
    _extract(buf.getvalue(), dest)
    for path in (dest / "plain.txt", dest / "real" / "checked.txt"):
        assert path.read_bytes() == b"x\n"
        assert before <= path.stat().st_mtime <= time.time() + 60

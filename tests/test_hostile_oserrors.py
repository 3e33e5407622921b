"""Hostile input, class 4: OS errors the stages meet, each a message with the path and a
next step, mapped once in the CLI (pinwheel.oserrors.explain).

Where this machine can make the error for real (a directory opened as a file, a
path under a file, a link loop, a name too long, a directory not empty) the
test makes it. Tests run as root here, so permission and read-only errors
cannot be provoked, nor can a full disk without a mount: those cases raise the
OSError a failing write raises (errno + path) as a stand-in, and say so.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.oserrors import explain


def _raise(fn: Callable[[], object]) -> OSError:
    try:
        fn()
    except OSError as exc:
        return exc
    raise AssertionError("no OSError")


def _real_is_a_directory(tmp: Path) -> tuple[OSError, Path]:
    return _raise(lambda: open(tmp, "rb")), tmp


def _real_not_a_directory(tmp: Path) -> tuple[OSError, Path]:
    (tmp / "cache").write_text("a file where the cache should be")
    return _raise(lambda: (tmp / "cache" / "locks").mkdir(parents=True)), tmp / "cache"


def _real_exists(tmp: Path) -> tuple[OSError, Path]:
    (tmp / "out").write_text("x")
    return _raise(lambda: (tmp / "out").mkdir()), tmp / "out"


def _real_missing(tmp: Path) -> tuple[OSError, Path]:
    return _raise(lambda: open(tmp / "nope" / "manifest.toml", "rb")), tmp / "nope"


def _real_too_long(tmp: Path) -> tuple[OSError, Path]:
    return _raise(lambda: open(tmp / ("x" * 300), "wb")), tmp


def _real_loop(tmp: Path) -> tuple[OSError, Path]:
    (tmp / "a").symlink_to(tmp / "b")
    (tmp / "b").symlink_to(tmp / "a")
    return _raise(lambda: open(tmp / "a", "rb")), tmp / "a"


def _real_not_empty(tmp: Path) -> tuple[OSError, Path]:
    (tmp / "d").mkdir()
    (tmp / "d" / "f").write_text("x")
    return _raise(lambda: os.rmdir(tmp / "d")), tmp / "d"


def _stand_in(code: int) -> Callable[[Path], tuple[OSError, Path]]:
    """The OSError a write raises for ``code`` (not provokable here: root, no mounts)."""

    def make(tmp: Path) -> tuple[OSError, Path]:
        target = tmp / "wheels" / "x.whl"
        return OSError(code, os.strerror(code), str(target)), target

    return make


# case -> (how the error is made, what the message says, what `next:` says)
CASES: dict[str, tuple[Callable[[Path], tuple[OSError, Path]], str, str]] = {
    "is a directory (real)": (_real_is_a_directory, "a directory, where a file", "pass the file"),
    "not a directory (real)": (_real_not_a_directory, "this is a file, but", "move that file"),
    "exists as a file (real)": (_real_exists, "already exists as a file", "move it out"),
    "missing (real)": (_real_missing, "does not exist", "check the path"),
    "name too long (real)": (_real_too_long, "too long", "shorter"),
    "link loop (real)": (_real_loop, "symbolic links", "link loop"),
    "not empty (real)": (_real_not_empty, "not empty", "move it out"),
    "read-only (stand-in)": (_stand_in(errno.EROFS), "read-only file system", "writable"),
    "permission (stand-in)": (_stand_in(errno.EACCES), "permission denied", "ls -ld"),
    "not permitted (stand-in)": (_stand_in(errno.EPERM), "permission denied", "ls -ld"),
    "disk full (stand-in)": (_stand_in(errno.ENOSPC), "disk full", "free space"),
    "quota (stand-in)": (_stand_in(errno.EDQUOT), "disk full", "free space"),
    "cross-device (stand-in)": (_stand_in(errno.EXDEV), "across file systems", "one file system"),
    "too many files (stand-in)": (_stand_in(errno.EMFILE), "too many open files", "ulimit"),
    "i/o error (stand-in)": (_stand_in(errno.EIO), "input/output error", "dmesg"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_os_error_has_the_path_and_a_next_step(case, tmp_path):
    make, what, nxt = CASES[case]
    exc, path = make(tmp_path)
    err = explain(exc, tmp_path / "cache")
    assert what in err.what and nxt in (err.next or ""), str(err)
    assert str(path) in str(err), str(err)
    assert "[Errno" not in str(err)


def test_disk_full_names_the_file_system_the_write_went_to(tmp_path):
    exc = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "w.whl"))
    err = explain(exc, Path("/nonexistent-cache"))
    assert str(tmp_path / "out" / "w.whl") in str(err) and "free)" in err.what
    assert "nonexistent-cache" not in str(err)  # not the cache's free space


def test_disk_full_without_a_path_names_both_candidates(tmp_path):
    err = explain(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert f"cache {tmp_path}:" in err.what and "temporary directory" in err.what
    assert "TMPDIR" in (err.next or "")


UP = "https://github.com/1CatAI/1Cat-vLLM.git"  # the root manifest's upstream

# CLI runs that meet the error for real: argv (with {tmp}) -> what stderr says
CLI = {
    "a directory as the manifest": (["--manifest", "{tmp}", "plan", "--offline"],
                                    "is a directory"),
    "a cache that is a file": (["--cache", "{tmp}/afile", "plan"], "already exists as a file"),
    "a manifest under a file": (["--manifest", "{tmp}/afile/manifest.toml", "plan", "--offline"],
                                "afile"),
    "a mirror that is a file": (["--cache", "{tmp}/c", "--mirror", UP + "={tmp}/afile", "plan"],
                                "is not a git repository (a file)"),
    "a mirror that is no repository": (["--cache", "{tmp}/c", "--mirror", UP + "={tmp}", "plan"],
                                       "a directory without objects/"),
    "fetch --dest that is a file": (["fetch", "{tmp}/rel", "--dest", "{tmp}/afile", "--allow-unsigned"],
                                    "already exists as a file"),
    "fetch --dest under a file": (["fetch", "{tmp}/rel", "--dest", "{tmp}/afile/sub", "--allow-unsigned"],
                                  "this is a file, but"),
}  # fmt: skip


def _release_dir(tmp: Path) -> None:
    from pinwheel.checksums import write_sums
    from wheelfactory import make_wheel

    whl = make_wheel(tmp / "rel", {"demo/__init__.py": b"x = 1\n"}, tag="py3-none-any")
    write_sums(tmp / "rel", [whl.name])


@pytest.mark.parametrize("case", sorted(CLI))
def test_the_cli_prints_the_mapping_not_a_traceback(case, tmp_path, capsys):
    (tmp_path / "afile").write_text("not a directory")
    _release_dir(tmp_path)
    manifest = Path(__file__).parents[1] / "manifest.toml"
    argv, gist = CLI[case]
    argv = [a.format(tmp=tmp_path) for a in argv]
    if "--manifest" not in argv:
        argv = ["--manifest", str(manifest), *argv]
    rc = main(argv)
    err = " ".join(capsys.readouterr().err.split())
    assert rc in (1, 2) and gist in err and "next:" in err, err
    assert "Traceback" not in err and "[Errno" not in err

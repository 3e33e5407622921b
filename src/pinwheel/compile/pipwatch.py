"""A hashed ``pip install`` into a build venv that says what it costs and how far it got.

Before it starts: how many pinned packages, and their total size where the files are at
hand (a wheelhouse: the file of each pin, by name and version, and by the lock's sha256
where several match), and where pip's log goes. While it runs, at least every
``every_s`` (a :class:`~pinwheel.heartbeat.Heartbeat` line): the packages pip has
collected (resolved and downloaded) and installed of the total, the bytes downloaded of
those announced, the bytes written into the venv.

Nothing is read from pip's human log lines (a pip upgrade rewords them): the counts
come from pip's machine-readable outputs, ``--report`` (pip >= 22.2: the JSON
installation report, written once resolving and downloading are done) and
``--progress-bar raw`` (pip >= 24.1: ``Progress N of TOTAL`` lines per download), the
venv's ``*.dist-info`` folders and its bytes. An older pip gets only the flags it has
(the heartbeat then says what it cannot count). pip's output goes to the log file (a
failure's tail is read from it).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from pinwheel import runner
from pinwheel.checksums import feed
from pinwheel.heartbeat import DEFAULT_EVERY_S, Heartbeat, human_seconds, tree_bytes
from pinwheel.progress import Reporter, ended, human_bytes

Pins = Mapping[str, tuple[str, tuple[str, ...]]]  # name -> (version, sha256s)

# pip's machine-readable outputs and the pip that has each
REPORT_SINCE = (22, 2)  # --report FILE: the JSON installation report
RAW_SINCE = (24, 1)  # --progress-bar raw: "Progress N of TOTAL" lines on stdout
_RAW = re.compile(r"^Progress (\d+) of (\d+)$", re.M)


def pip_version() -> tuple[int, ...] | None:
    """The release of the pip pinwheel runs (``python -m pip`` of this interpreter)."""
    try:
        return Version(importlib.metadata.version("pip")).release
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return None


def watch_flags(report: Path, version: tuple[int, ...] | None) -> tuple[str, ...]:
    """The flags that make pip say its progress in a form meant to be read back."""
    flags: list[str] = []
    if version is not None and version >= REPORT_SINCE:
        flags += ["--report", str(report)]
    if version is not None and version >= RAW_SINCE:
        flags += ["--progress-bar", "raw"]
    return tuple(flags)


def downloaded(log_text: str) -> tuple[int, int]:
    """(bytes downloaded, bytes announced) from pip's ``Progress N of TOTAL`` lines: each
    download starts again from 0 (or at a lower count, or another total)."""
    done = announced = 0
    last: tuple[int, int] | None = None
    for m in _RAW.finditer(log_text):
        now, total = int(m.group(1)), int(m.group(2))
        if last is None or now < last[0] or total != last[1] or now == 0:
            if last is not None:
                done += last[0]
            announced += total
        last = (now, total)
    if last is not None:
        done += last[0]
    return done, announced


def reported(report: Path) -> int | None:
    """How many packages pip's installation report lists (None before it is written)."""
    try:
        return len(json.loads(report.read_text(encoding="utf-8")).get("install", []))
    except (OSError, ValueError, AttributeError, TypeError):
        return None


@dataclass(frozen=True)
class PipInstall:
    command: tuple[str, ...]  # the whole pip command line (no -q: its output is counted)
    env: Mapping[str, str]
    venv: Path  # the venv being filled: its bytes and dist-info folders are counted
    log: Path  # pip's output
    pins: Pins
    what: str  # "the build environment build-0123abcd"
    wheelhouse: Path | None = None


def wheelhouse_files(wheelhouse: Path, pins: Pins) -> dict[str, Path]:
    """The wheel of each pin in ``wheelhouse`` (name and version from the file name; where
    several match, the one whose sha256 the lock pins); pins without one are left out."""
    found: dict[str, list[Path]] = {}
    for path in sorted(wheelhouse.glob("*.whl")):
        try:
            dist, version, _build, _tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        pin = pins.get(canonicalize_name(dist))
        if pin is not None and str(version) == str(pin[0]) and path.is_file():
            found.setdefault(canonicalize_name(dist), []).append(path)
    out: dict[str, Path] = {}
    for name, paths in found.items():
        if len(paths) == 1:
            out[name] = paths[0]
            continue
        for path in paths:
            digest = hashlib.sha256()
            feed(digest, path)
            if digest.hexdigest() in pins[name][1]:
                out[name] = path
                break
    return out


def plan(req: PipInstall) -> str:
    """The line said before pip starts: packages, size, source and pip's log."""
    n = len(req.pins)
    if req.wheelhouse is not None:
        files = wheelhouse_files(req.wheelhouse, req.pins)
        size = sum(p.stat().st_size for p in files.values())
        missing = n - len(files)
        lacks = f"; {missing} of them not in it (pip will say which)" if missing else ""
        source = f"{human_bytes(size)} of wheels from {req.wheelhouse}{lacks}"
    else:
        source = "from the package index (each download's size is said as it starts)"
    return f"{req.what}: installing {n} pinned packages, {source}; pip's log: {req.log}"


def _dist_infos(venv: Path) -> int:
    return sum(1 for _ in venv.glob("lib/python3*/site-packages/*.dist-info"))


def progress(
    log_text: str, installed: int, total: int, written: int, collected: int | None = None
) -> str:
    """``3/31 packages collected, 1.2 GiB of 1.5 GiB downloaded, 3/31 installed, 2.0 GiB
    written``; ``collected`` from the report (None: not written yet, counted as 0)."""
    done, announced = downloaded(log_text)
    dl = f", {human_bytes(done)} of {human_bytes(announced)} downloaded" if announced else ""
    return (
        f"{min(collected or 0, total)}/{total} packages collected{dl}, "
        f"{min(installed, total)}/{total} installed, {human_bytes(written)} written"
    )


def run(
    req: PipInstall, reporter: Reporter, *, every_s: float = DEFAULT_EVERY_S
) -> tuple[int, list[str]]:
    """Run pip, saying the plan first and progress every ``every_s``; (exit code, the
    last lines of its log)."""
    reporter.info(plan(req))
    before_infos, before_bytes = _dist_infos(req.venv), tree_bytes(req.venv)
    total = len(req.pins)
    beat = Heartbeat(reporter, req.what, every_s=every_s)
    # unbuffered: pip's lines reach the log as it says them, not in 8 KiB blocks
    env = {**req.env, "PYTHONUNBUFFERED": "1"}
    report = req.log.with_name(req.log.name + ".report.json")
    report.unlink(missing_ok=True)
    flags = watch_flags(report, pip_version())
    cmd = runner.Command((*req.command, *flags), env=env, output="log", log_file=req.log,
                         what="pip install")  # fmt: skip

    def status() -> str:
        text = req.log.read_text(errors="replace") if req.log.is_file() else ""
        return progress(text, _dist_infos(req.venv) - before_infos, total,
                        max(tree_bytes(req.venv) - before_bytes, 0), reported(report))  # fmt: skip

    proc = runner.spawn(cmd, reporter)
    due = time.monotonic() + every_s  # the status reads the log and walks the venv: when due
    try:
        while proc.poll() is None:
            time.sleep(min(0.2, every_s / 4))
            if time.monotonic() >= due:
                beat.tick(status())
                due = time.monotonic() + every_s
    except BaseException as exc:
        proc.stop(grace_s=5)
        reporter.info(f"{req.what}: {ended(exc) or 'stopped'} after "
                      f"{human_seconds(beat.elapsed)}; pip's log: {req.log}")  # fmt: skip
        report.unlink(missing_ok=True)
        raise
    code = proc.returncode
    assert code is not None
    reporter.info(f"{req.what}: {status()} in {human_seconds(beat.elapsed)}")
    report.unlink(missing_ok=True)  # read for the counts only: nothing is left beside the venv
    return code, runner.tail_of(req.log)

"""A hashed ``pip install`` into a build venv that says what it costs and how far it got.

Before it starts: how many pinned packages, and their total size where the files are at
hand (a wheelhouse: the file of each pin, by name and version, and by the lock's sha256
where several match), and where pip's log goes. While it runs, at least every
``every_s`` (a :class:`~pinwheel.heartbeat.Heartbeat` line): the packages pip has
collected and installed of the total, the bytes its downloads announced, the bytes
written into the venv. pip runs without ``-q``, its output in the log file (the
packages are counted from it; a failure's tail is read from it).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from pinwheel import runner
from pinwheel.checksums import feed
from pinwheel.heartbeat import DEFAULT_EVERY_S, Heartbeat, human_seconds, tree_bytes
from pinwheel.progress import Reporter, ended, human_bytes

Pins = Mapping[str, tuple[str, tuple[str, ...]]]  # name -> (version, sha256s)

_COLLECTING = re.compile(r"^(?:Collecting|Processing) ", re.M)  # index | wheelhouse
_ANNOUNCED = re.compile(r"^\s*Downloading \S+ \((\d+(?:\.\d+)?) (B|kB|MB|GB|TB)\)", re.M)
_UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


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


def progress(log_text: str, installed: int, total: int, written: int) -> str:
    """``5/31 collected (1.2 GB announced), 3/31 installed, 2.0 GiB written``."""
    collected = len(_COLLECTING.findall(log_text))
    announced = sum(float(v) * _UNITS[u] for v, u in _ANNOUNCED.findall(log_text))
    dl = f" ({human_bytes(announced)} of downloads announced)" if announced else ""
    return (
        f"{min(collected, total)}/{total} packages collected{dl}, "
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
    cmd = runner.Command(req.command, env=env, output="log", log_file=req.log,
                         what="pip install")  # fmt: skip

    def status() -> str:
        text = req.log.read_text(errors="replace") if req.log.is_file() else ""
        return progress(text, _dist_infos(req.venv) - before_infos, total,
                        max(tree_bytes(req.venv) - before_bytes, 0))  # fmt: skip

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
        raise
    code = proc.returncode
    assert code is not None
    reporter.info(f"{req.what}: {status()} in {human_seconds(beat.elapsed)}")
    return code, runner.tail_of(req.log)

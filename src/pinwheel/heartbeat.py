"""Heartbeats for long waits: a line every so often with the elapsed time and the last status.

A wait that prints nothing for minutes (a health poll, retries against a dead
port, a download in a subprocess) looks hung. Stages pass their
:class:`~pinwheel.progress.Reporter` and call :meth:`Heartbeat.tick` on every poll with what
they saw last; a line comes out at most every ``every_s`` seconds, so a log
stays short. :func:`watch_bytes` does the same from a thread for a download that
runs in a subprocess: the bytes that arrived so far and the rate.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pinwheel.progress import Reporter, human_bytes

DEFAULT_EVERY_S = 10.0


def human_seconds(s: float) -> str:
    s = int(s)
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


class Heartbeat:
    """``what``: still waiting after N s (of LIMIT s); last: STATUS — at most every ``every_s``."""

    def __init__(
        self,
        reporter: Reporter,
        what: str,
        *,
        limit_s: float | None = None,
        every_s: float = DEFAULT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reporter = reporter
        self.what = what
        self.limit_s = limit_s
        self.every_s = every_s
        self.clock = clock
        self.start = clock()
        self._last_said = self.start
        self.last = ""

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def line(self) -> str:
        limit = f" of {human_seconds(self.limit_s)}" if self.limit_s else ""
        last = f"; last: {self.last}" if self.last else ""
        return f"{self.what}: still waiting after {human_seconds(self.elapsed)}{limit}{last}"

    def tick(self, status: str | None = None) -> bool:
        """Record the latest status; say the line when it is due. True when it was said."""
        if status is not None:
            self.last = status
        now = self.clock()
        if now - self._last_said < self.every_s:
            return False
        self._last_said = now
        self.reporter.info(self.line())
        return True


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (a file: its size); 0 when absent."""
    try:
        if path.is_file():
            return path.stat().st_size
    except OSError:
        return 0
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


@contextlib.contextmanager
def watch_bytes(
    reporter: Reporter,
    what: str,
    path: Path,
    *,
    expected: int | None = None,
    every_s: float = DEFAULT_EVERY_S,
) -> Iterator[None]:
    """While the body runs, say every ``every_s`` how many bytes have arrived under ``path``
    (of ``expected`` when known) and the rate; a closing line with the total."""
    start = time.monotonic()
    before = tree_bytes(path)
    stop = threading.Event()

    def arrived() -> int:
        return max(tree_bytes(path) - before, 0)

    def status() -> str:
        got = arrived()
        took = max(time.monotonic() - start, 1e-6)
        of = f" of ~{human_bytes(expected)}" if expected else ""
        return (
            f"{what}: {human_bytes(got)}{of} after {human_seconds(took)} "
            f"({human_bytes(got / took)}/s)"
        )

    def run() -> None:
        while not stop.wait(every_s):
            reporter.info(status())

    thread = threading.Thread(target=run, name="pinwheel-watch-bytes", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    reporter.info(f"{what}: {human_bytes(arrived())} in {human_seconds(time.monotonic() - start)}")

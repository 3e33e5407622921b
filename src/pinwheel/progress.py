"""Progress from a stage to whoever runs it: the one reporting channel stages may use.

Stages never print and never draw. They take a :class:`Reporter` (the CLI makes
one: rich on a terminal, plain lines otherwise, nothing with ``--json``) and call

* ``info`` for a line worth keeping,
* ``detail`` for a line only a verbose run shows (every subprocess the
  :mod:`pinwheel.runner` starts is logged here),
* ``status`` around a step that takes a while,
* ``transfer`` around a byte count that grows (downloads, copies): it yields a
  function the stage calls with each chunk's size.

Messages are literal text: no reporter interprets markup in them (a line with
``[build]`` in it prints ``[build]``). Library callers pass nothing and get
:data:`SILENT`. This module imports nothing beyond the standard library; rich
lives in ``pinwheel.cli``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Protocol, TextIO

from pinwheel.printable import shown

#: Called with the size of each chunk moved.
Advance = Callable[[int], None]


class Reporter(Protocol):
    def info(self, message: str) -> None:
        """One line of progress a person may want to read."""

    def detail(self, message: str) -> None:
        """One line for a verbose run (commands run, per-step minutiae)."""

    def status(self, message: str) -> contextlib.AbstractContextManager[None]:
        """Around a step that takes a while: shown while it runs."""

    def transfer(
        self, name: str, total: int | None, done: int = 0
    ) -> contextlib.AbstractContextManager[Advance]:
        """Around moving ``total`` bytes (``done`` already there): yields ``advance(n)``."""


def _ignore(n: int) -> None:
    return None


class _Silent:
    def info(self, message: str) -> None:
        return None

    def detail(self, message: str) -> None:
        return None

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def transfer(self, name: str, total: int | None, done: int = 0) -> Iterator[Advance]:
        yield _ignore


SILENT: Reporter = _Silent()


def ended(exc: BaseException) -> str:
    """How a step that raised ``exc`` ended, for its closing line: never "done". Empty for
    a generator being closed (nothing ended: the step was abandoned, not run out)."""
    if isinstance(exc, GeneratorExit):
        return ""
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"


BYTES_EVERY_S = 10.0  # how often a plain-line transfer says the bytes so far


def human_bytes(n: float) -> str:
    """The one byte-size spelling in messages: ``512 B``, ``3.0 MiB`` (powers of 1024)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class LineReporter:
    """Plain lines on a stream (stderr): logs, CI, pipes. Long steps get a closing line: "done
    in N s", or "failed" / "interrupted" when the step raised (never "done" before an error)."""

    def __init__(
        self, stream: TextIO | None = None, prefix: str = "", verbose: bool = False
    ) -> None:
        self.stream = stream or sys.stderr
        self.prefix = prefix
        self.verbose = verbose

    def info(self, message: str) -> None:
        # One redaction for every output: a URL's credentials never reach a log line.
        print(self.prefix + shown(message), file=self.stream, flush=True)

    def detail(self, message: str) -> None:
        if self.verbose:
            self.info(message)

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        started = time.monotonic()
        self.info(message + " ...")
        try:
            yield
        except BaseException as exc:
            ending = ended(exc)
            if ending:
                self.info(f"{message}: {ending} after {time.monotonic() - started:.1f} s")
            raise
        self.info(f"{message}: done in {time.monotonic() - started:.1f} s")

    @contextlib.contextmanager
    def transfer(self, name: str, total: int | None, done: int = 0) -> Iterator[Advance]:
        moved = [0]
        started = time.monotonic()
        said = [started]

        def advance(n: int) -> None:
            moved[0] += n
            now = time.monotonic()
            if now - said[0] >= BYTES_EVERY_S:  # a long transfer is never silent
                said[0] = now
                of = f" of {human_bytes(total)}" if total else ""
                rate = human_bytes(moved[0] / max(now - started, 1e-6))
                self.info(f"{name}: {human_bytes(moved[0])}{of} so far ({rate}/s)")

        size = f" ({human_bytes(total)})" if total is not None else ""
        resumed = f", resuming at {human_bytes(done)}" if done else ""
        self.info(f"{name}{size}{resumed} ...")
        yield advance
        seconds = max(time.monotonic() - started, 1e-6)
        rate = human_bytes(moved[0] / seconds)
        self.info(f"{name}: {human_bytes(moved[0])} in {seconds:.1f} s ({rate}/s)")

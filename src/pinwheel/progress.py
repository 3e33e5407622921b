"""Progress from a stage to whoever runs it: the one reporting interface stages may use.

Stages never print. They take a :class:`Reporter` (the CLI makes one: rich on a
terminal, plain lines otherwise, nothing with ``--json``) and call ``info`` for
a line worth keeping and ``status`` around a step that takes a while. Library
callers pass nothing and get :data:`SILENT`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Protocol, TextIO


class Reporter(Protocol):
    def info(self, message: str) -> None:
        """One line of progress a person may want to read."""

    def status(self, message: str) -> contextlib.AbstractContextManager[None]:
        """Around a step that takes a while: shown while it runs."""


class _Silent:
    def info(self, message: str) -> None:
        return None

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        yield


SILENT: Reporter = _Silent()


class LineReporter:
    """Plain lines on a stream (stderr): logs, CI, pipes. Long steps get a closing line."""

    def __init__(self, stream: TextIO | None = None, prefix: str = "") -> None:
        self.stream = stream or sys.stderr
        self.prefix = prefix

    def info(self, message: str) -> None:
        print(self.prefix + message, file=self.stream, flush=True)

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        started = time.monotonic()
        self.info(message + " ...")
        yield
        self.info(f"{message}: done in {time.monotonic() - started:.1f} s")


class CallbackReporter:
    """Adapts a ``Callable[[str], None]`` (a log function) to a Reporter."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log

    def info(self, message: str) -> None:
        self.log(message)

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        self.log(message)
        yield

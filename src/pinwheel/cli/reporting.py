"""The CLI's reporters and console: rich on a terminal, plain lines otherwise, nothing with --json.

Only ``pinwheel.cli`` imports rich, and only when a terminal is drawn on.
Every message is printed as literal text (``markup=False``): a line with
``[build]`` in it shows ``[build]``. Colour comes from ``style=`` only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pinwheel.printable import shown
from pinwheel.progress import Advance, ended

if TYPE_CHECKING:
    from rich.console import Console


def console() -> Console:
    """A rich console on stderr (rich costs ~50 ms to import: made on first use)."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True, highlight=False, markup=False)


class RichReporter:
    """A spinner while a step runs, a bar while bytes move, lines above them."""

    def __init__(self, out: Console, verbose: bool = False) -> None:
        self.console = out
        self.verbose = verbose
        self.depth = 0

    def info(self, message: str) -> None:
        self.console.print(shown(message), markup=False, highlight=False)

    def detail(self, message: str) -> None:
        if self.verbose:
            self.console.print(shown(message), markup=False, highlight=False, style="dim")

    @contextlib.contextmanager
    def status(self, message: str) -> Iterator[None]:
        from rich.text import Text

        if self.depth:  # one live display at a time: an inner step is a line
            self.info(message)
            yield
            return
        self.depth += 1
        try:
            with self.console.status(Text(shown(message))):
                yield
        except BaseException as exc:
            # The spinner goes with the step; a failed step leaves a line saying so.
            ending = ended(exc)
            if ending:
                self.info(f"{message}: {ending}")
            raise
        finally:
            self.depth -= 1

    @contextlib.contextmanager
    def transfer(self, name: str, total: int | None, done: int = 0) -> Iterator[Advance]:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        if self.depth:  # a live display is up already: no second one
            self.info(name)
            yield lambda n: None
            return
        bars = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.depth += 1
        try:
            with bars:
                task = bars.add_task(shown(name), total=total, completed=done)
                yield lambda n: bars.advance(task, n)
        finally:
            self.depth -= 1

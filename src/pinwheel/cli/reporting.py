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
        """A byte bar; inside a spinner (``status``) too: rich draws a live display started
        inside another one under it (nested live displays). A rich that refuses the second
        display (``LiveError``) gets the name as a line instead."""
        from rich.errors import LiveError
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        # Below NARROW columns the bar, speed and time give way: the name and the byte
        # figures stay on the line down to 24 columns.
        wide = self.console.width >= NARROW
        more = (BarColumn(bar_width=BAR_WIDTH), DownloadColumn(), TransferSpeedColumn(),
                TimeRemainingColumn()) if wide else (DownloadColumn(),)  # fmt: skip
        bars = Progress(
            TextColumn("{task.description}", markup=False),
            *more,
            console=self.console,
            transient=False,
        )
        label = fit(shown(name), self.console.width - (FIGURES_WIDTH if wide else BYTES_WIDTH))
        self.depth += 1
        try:
            try:
                bars.start()
            except LiveError:
                self.info(name)
                yield lambda n: None
                return
            try:
                task = bars.add_task(label, total=total, completed=done)
                yield lambda n: bars.advance(task, n)
            finally:
                bars.stop()
        finally:
            self.depth -= 1


# The bar and the byte figures of a transfer line ("123.4/890.6 MB 110.1 MB/s 0:00:04"):
# what the name leaves room for, so the figures stay on an 80-column line.
BAR_WIDTH = 10
FIGURES_WIDTH = BAR_WIDTH + 36  # "933.9/933.9 MB" 14, "110.1 MB/s" 10, "0:00:00" 7, 5 gaps
BYTES_WIDTH = 15  # a narrower terminal's line: the name, a gap, "933.9/933.9 MB"
NARROW = FIGURES_WIDTH + 16  # the width under which only the name and the bytes are drawn


def fit(text: str, width: int) -> str:
    """``text`` at most ``width`` characters (at least 8): the middle gives way to "…", so
    a wheel's name keeps its project and its tags."""
    width = max(width, 8)
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: keep - keep // 2] + "…" + text[len(text) - keep // 2 :]

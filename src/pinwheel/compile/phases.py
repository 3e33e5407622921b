"""The phases of one build command, timed, each saying what it did and what it skipped.

A :class:`Phases` collector is handed down a build; each step runs inside
``with phases.phase("check") as note:`` and calls ``note.skip(why)`` for work it
found it need not do (``"the wheel's sha256 equals the last checked one (stamp)"``)
or ``note.did(what)``. The outcome carries the frozen :class:`Phase` rows; the CLI
prints them (stages never print).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    did: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seconds": round(self.seconds, 3),
            "did": list(self.did),
            "skipped": list(self.skipped),
        }

    def line(self) -> str:
        parts = [*self.did, *(f"skipped: {s}" for s in self.skipped)]
        return f"{self.name:<16} {self.seconds:7.2f} s  {'; '.join(parts) or '-'}"


@dataclass
class Note:
    """What one running phase did and skipped."""

    did_: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def did(self, what: str) -> None:
        self.did_.append(what)

    def skip(self, why: str) -> None:
        self.skipped.append(why)


class Running:
    def __init__(self, phases: Phases, name: str) -> None:
        self.phases, self.name, self.note = phases, name, Note()
        self.started = time.monotonic()

    def end(self) -> None:
        self.phases.add(Phase(self.name, time.monotonic() - self.started,
                              tuple(self.note.did_), tuple(self.note.skipped)))  # fmt: skip


class Phases:
    """Collects :class:`Phase` rows in the order the phases ran."""

    def __init__(self) -> None:
        self._rows: list[Phase] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[Note]:
        running = self.start(name)
        try:
            yield running.note
        finally:
            running.end()

    def start(self, name: str) -> Running:
        """A phase that ends with :meth:`Running.end` (where a ``with`` block does not fit)."""
        return Running(self, name)

    def add(self, row: Phase) -> None:
        self._rows.append(row)

    def rows(self) -> tuple[Phase, ...]:
        return tuple(self._rows)


def human_lines(rows: tuple[Phase, ...]) -> list[str]:
    if not rows:
        return []
    total = sum(r.seconds for r in rows)
    return ["phases:", *(f"  {r.line()}" for r in rows), f"  {'total':<16} {total:7.2f} s"]


__all__ = ["Running", "Note", "Phase", "Phases", "human_lines"]

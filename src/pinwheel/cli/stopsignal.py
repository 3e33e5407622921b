"""SIGTERM and SIGHUP stop a run the way Ctrl-C does: children first, then pinwheel.

Python's default SIGTERM ends the interpreter at once: no ``finally`` runs, so a
build started by pinwheel (its own process group: the backend, CMake, ninja, nvcc)
and the compiler cache's server went on compiling, orphaned, after a CI cancel, a
``timeout`` or a ``kill``. Inside :func:`terminate_as_interrupt` both signals raise
:class:`Terminated`, a :class:`KeyboardInterrupt`, so every cleanup written for
Ctrl-C runs (the runner kills the child's group, the compiler cache stops, the
workspace keeps its interrupted mark). A signal the caller ignores stays ignored
(``nohup`` ignores SIGHUP).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """The run was told to stop by ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process the signal ended


def _raise(signum: int, _frame: object) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` in the main thread while inside."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue  # ignored by whoever started us: keep it so
        previous[sig] = signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""Waiting for a killed process to be gone (reaped), for tests that stop process trees."""

from __future__ import annotations

import os
import time


def gone(pid: int, *, tries: int = 50, every_s: float = 0.1) -> bool:
    """True once ``pid`` no longer exists (killed and reaped); False if it still does after
    ``tries`` looks ``every_s`` apart."""
    for _ in range(tries):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(every_s)
    return False

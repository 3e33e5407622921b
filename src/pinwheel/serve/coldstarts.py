"""The SM120 card's fidelity protocol: N cold server starts, one tokenwise hash across them.

The card scores "five cold runs" (eager, no MTP) and reports that all five "produced
the same tokenwise-KLD SHA-256". Here each start is a fresh server process (started
and stopped by the caller's ``start``), waited for, scored on the pinned panel
(in-process or from the rows), and stopped; the outcome keeps every run's hashes and
judges one gate: the per-position values' hash (``kld_f64_sha256``) and the
card-format text hash (``kld_sha256``) equal across all runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from pinwheel.errors import UsageError
from pinwheel.progress import SILENT, Reporter
from pinwheel.serve.receipt import FidelityResult, Gate


@dataclass(frozen=True)
class ColdRun:
    start: int  # 1-based
    health_wait_s: float
    kld_sha256: str
    kld_f64_sha256: str
    mean_kld: float
    top1: float
    positions: int
    scorer: str


@dataclass(frozen=True)
class ColdStartsOutcome:
    runs: tuple[ColdRun, ...]
    gate: Gate

    @property
    def ok(self) -> bool:
        return self.gate.status == "PASS"


def judge(runs: tuple[ColdRun, ...], wanted: int) -> Gate:
    name = f"fidelity tokenwise hash equal across {wanted} cold starts"
    hashes = {(r.kld_f64_sha256, r.kld_sha256) for r in runs}
    if len(runs) < wanted:
        return Gate(name, "FAIL", f"{len(runs)} of {wanted} starts scored", "every start")
    same = len(hashes) == 1
    return Gate(
        name,
        "PASS" if same else "FAIL",
        f"{len(hashes)} distinct hash(es) over {len(runs)} starts",
        "1 distinct hash",
        "kld_f64_sha256 " + ", ".join(sorted({r.kld_f64_sha256[:16] for r in runs})),
    )


def run(
    start: Callable[[int], AbstractContextManager[Any]],
    measure: Callable[[Any], FidelityResult],
    wait: Callable[[Any], float],
    starts: int,
    reporter: Reporter = SILENT,
) -> ColdStartsOutcome:
    """``start(i)`` yields a fresh server (a Target); ``wait(target)`` returns seconds to
    healthy; ``measure(target)`` scores the panel once."""
    if starts < 1:
        raise UsageError(f"{starts} cold starts", where="[qualify.fidelity].cold_starts")
    runs: list[ColdRun] = []
    for i in range(1, starts + 1):
        t0 = time.monotonic()
        with start(i) as target:
            waited = wait(target)
            f = measure(target)
        runs.append(
            ColdRun(
                i,
                round(waited, 2),
                f.kld_sha256,
                f.kld_f64_sha256,
                f.mean_kld,
                f.top1,
                f.positions,
                f.scorer,
            )  # fmt: skip
        )
        reporter.info(
            f"cold start {i}/{starts}: mean KLD {f.mean_kld!r}, kld_f64_sha256 "
            f"{f.kld_f64_sha256[:16]}, {time.monotonic() - t0:.0f} s"
        )
    return ColdStartsOutcome(tuple(runs), judge(tuple(runs), starts))

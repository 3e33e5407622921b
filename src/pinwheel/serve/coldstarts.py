"""The SM120 card's fidelity protocols: N cold server starts, judged as the card judges them.

Each start is a fresh server process (started and stopped by the caller's ``start``),
waited for, scored on the pinned panel (in-process or from the rows), and stopped; the
outcome keeps every run's figures and hashes, and names its protocol:

- ``mean`` (the card's served FP8 runs, card 004 lines 107-116 and 149-163): the runs
  DIFFER (population stddev 0.000160 and 0.000326); the gate is the five-run mean and
  every run below the KLD bound. The stddev is reported, never gated.
- ``hash`` (the card's NVFP4 served runs, lines 165-173, and the Transformers TP2
  panel, lines 5-17): one tokenwise hash across every run: the per-position values'
  hash (``kld_f64_sha256``) and the card-format text hash (``kld_sha256``); and, when
  ``[qualify.fidelity]`` sets a bound, the (common) mean within it (the card discloses
  its identical-hash v44 NVFP4 runs at 0.0605 as a failure of its < 0.06 gate).

Either needs at least :data:`MIN_STARTS` starts: one start shows nothing about cold starts.
The outcome carries the card's reference figures of the profile it judged (its
``[qualify.profile.NAME] reference``: the card's five-run mean, stddev and hash measured
under that same protocol) beside the verdict, never another profile's.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from pinwheel.errors import UsageError
from pinwheel.manifest.serve import MIN_COLD_STARTS as MIN_STARTS
from pinwheel.manifest.serve import PROTOCOLS, QualifyConfig
from pinwheel.progress import SILENT, Reporter
from pinwheel.serve.receipt import FidelityResult, Gate

__all__ = ["MIN_STARTS", "PROTOCOLS", "ColdRun", "ColdStartsOutcome", "Protocol"]
__all__ += ["judge", "outcome", "run"]


@dataclass(frozen=True)
class Protocol:
    """How the starts are judged: ``name`` in :data:`PROTOCOLS`, the bound for ``mean``;
    ``reference``: the judged profile's card figures, shown beside the verdict."""

    name: str
    starts: int
    max_mean_kld: float | None = None
    strict: bool = False
    reference: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, config: QualifyConfig, profile: str | None) -> Protocol:
        """``[qualify.fidelity]``'s protocol, or the qualify profile's ``cold_start_protocol``;
        the reference is that qualify profile's (none when no qualify profile has the name)."""
        fid = config.fidelity
        if fid is None:
            raise UsageError("no [qualify.fidelity] table", where="[qualify.fidelity]")
        name = fid.protocol
        reference: tuple[tuple[str, str], ...] = ()
        for p in config.profiles:
            if p.name == profile:
                name, reference = p.cold_start_protocol or name, p.reference
        return cls(name, fid.cold_starts, fid.max_mean_kld, fid.strict, reference)


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
    protocol: str = "hash"
    mean_kld: float = math.nan  # over the runs' means
    stddev: float = math.nan  # population stddev of the runs' means, as the card reports it
    reference: dict[str, str] = field(default_factory=dict)  # the card's, same protocol

    @property
    def ok(self) -> bool:
        return self.gate.status == "PASS"


def judge(runs: tuple[ColdRun, ...], protocol: Protocol) -> Gate:
    """The card's verdict over the starts under ``protocol`` (``mean`` or ``hash``)."""
    wanted = protocol.starts
    if protocol.name == "mean":
        name = f"fidelity mean protocol (the mean and every run in bound) over {wanted} starts"
    else:
        name = f"fidelity tokenwise hash equal across {wanted} cold starts"
    if wanted < MIN_STARTS or len(runs) < MIN_STARTS:
        return Gate(name, "FAIL", f"{len(runs)} start(s)", f">= {MIN_STARTS} starts",
                    f"not enough starts: {MIN_STARTS} needed for a verdict")  # fmt: skip
    if len(runs) < wanted:
        return Gate(name, "FAIL", f"{len(runs)} of {wanted} starts scored", "every start")
    if protocol.name == "mean":
        return _judge_mean(name, runs, protocol)
    hashes = {(r.kld_f64_sha256, r.kld_sha256) for r in runs}
    same = len(hashes) == 1
    bound = protocol.max_mean_kld
    op = "<" if protocol.strict else "<="
    mean = math.fsum(r.mean_kld for r in runs) / len(runs)
    within = bound is None or _within(mean, bound, protocol.strict)
    return Gate(
        name,
        "PASS" if same and within else "FAIL",
        f"{len(hashes)} distinct hash(es) over {len(runs)} starts"
        + ("" if bound is None else f", mean {mean:.12f}"),
        "1 distinct hash" + ("" if bound is None else f" and mean {op} {bound}"),
        "kld_f64_sha256 " + ", ".join(sorted({r.kld_f64_sha256[:16] for r in runs})),
    )


def _within(value: float, bound: float, strict: bool) -> bool:
    return math.isfinite(value) and (value < bound if strict else value <= bound)


def _judge_mean(name: str, runs: tuple[ColdRun, ...], protocol: Protocol) -> Gate:
    """The mean of the runs' means and every run's own mean within the bound."""
    bound = protocol.max_mean_kld
    op = "<" if protocol.strict else "<="
    if bound is None:
        return Gate(name, "FAIL", "no bound", "max_mean_kld", "[qualify.fidelity] sets none")
    values = [r.mean_kld for r in runs]
    mean = math.fsum(values) / len(values)
    sd = statistics.pstdev(values) if all(math.isfinite(v) for v in values) else math.nan

    over = [r.start for r in runs if not _within(r.mean_kld, bound, protocol.strict)]
    ok = _within(mean, bound, protocol.strict) and not over
    return Gate(
        name,
        "PASS" if ok else "FAIL",
        f"mean {mean:.12f}, population stddev {sd:.12f}, {len(runs) - len(over)} of "
        f"{len(runs)} runs {op} {bound}",
        f"mean {op} {bound} and every run {op} {bound}",
        "runs over the bound: " + ", ".join(map(str, over)) if over else "runs differ run to "
        "run (no hash equality is claimed under this protocol)",
    )


def run(
    start: Callable[[int], AbstractContextManager[Any]],
    measure: Callable[[Any], FidelityResult],
    wait: Callable[[Any], float],
    protocol: Protocol,
    reporter: Reporter = SILENT,
) -> ColdStartsOutcome:
    """``start(i)`` yields a fresh server (a Target); ``wait(target)`` returns seconds to
    healthy; ``measure(target)`` scores the panel once."""
    starts = protocol.starts
    if starts < MIN_STARTS:
        raise UsageError(
            f"{starts} cold start(s): not enough starts, {MIN_STARTS} needed for a verdict",
            where="[qualify.fidelity].cold_starts",
            next=f"set cold_starts = {MIN_STARTS} or more in [qualify.fidelity]",
        )
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
    return outcome(tuple(runs), protocol)


def outcome(runs: tuple[ColdRun, ...], protocol: Protocol) -> ColdStartsOutcome:
    """The verdict with the figures the card reports beside it (mean, population stddev)."""
    values = [r.mean_kld for r in runs]
    finite = bool(values) and all(math.isfinite(v) for v in values)
    return ColdStartsOutcome(
        runs,
        judge(runs, protocol),
        protocol.name,
        math.fsum(values) / len(values) if values else math.nan,
        statistics.pstdev(values) if finite else math.nan,
        dict(protocol.reference),
    )

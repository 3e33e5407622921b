"""Preflight across GPUs: an NCCL all-reduce over the profile's GPUs, checked and timed.

In: a frozen :class:`AllReduceRequest`. Out: a frozen :class:`AllReduceOutcome`
(every rank's sum checked element by element, the slowest rank's time, bus
bandwidth as nccl-tests reports it); :func:`pinwheel.serve.preflight.allreduce_check`
turns it into a preflight check gated by the profile's ``min_allreduce_gbps``.
One process per GPU (:mod:`pinwheel.serve.ranks`), in the engine's Python,
NVLink multicast off in every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pinwheel import documents, untrusted
from pinwheel.errors import PinwheelError
from pinwheel.serve.ranks import NVLS_OFF, WORKERS, RankRequest, RankResult, run_ranks

DEFAULT_BYTES = 256 << 20  # large enough that NVLink bandwidth, not latency, sets the time


@dataclass(frozen=True)
class AllReduceRequest:
    python: str
    devices: tuple[int, ...]  # physical GPUs, one rank each; () = two CPU ranks over gloo
    environ: Mapping[str, str] = field(default_factory=dict)
    nbytes: int = DEFAULT_BYTES
    iters: int = 20
    warmup: int = 5
    cpu_ranks: int = 2  # only when devices == ()
    timeout_s: float = 300.0


@dataclass(frozen=True)
class AllReduceOutcome:
    world: int
    backend: str
    nbytes: int
    sum_ok: bool  # every element right on every rank
    wrong: tuple[str, ...]  # "rank 1: 12 wrong, first at 40 (got 3.0, want 2.0)"
    failures: tuple[str, ...]  # ranks that crashed or printed nothing
    nvls_off: bool  # every rank saw NCCL_NVLS_ENABLE=0 and the other two
    seconds: float | None  # per all-reduce, slowest rank
    algbw_gbps: float | None
    busbw_gbps: float | None
    device: str | None  # GPU name as torch reports it
    nccl: str | None


def measure(req: AllReduceRequest) -> AllReduceOutcome:
    world = len(req.devices) or req.cpu_ranks
    results = run_ranks(
        RankRequest(
            python=req.python,
            script=WORKERS / "allreduce.py",
            args=(str(req.nbytes), str(req.iters), str(req.warmup)),
            devices=req.devices,
            world=world,
            environ=req.environ,
            timeout_s=req.timeout_s,
        )
    )
    return outcome_of(results, req.nbytes, "nccl" if req.devices else "gloo")


def _typed(r: RankResult) -> tuple[documents.AllReduceRank | None, str | None]:
    """A rank's result line as :class:`~pinwheel.documents.AllReduceRank`, or why not."""
    if not r.ok or r.payload is None:
        return None, r.why()
    try:
        return untrusted.decode(
            documents.AllReduceRank, r.payload, untrusted.WORKER, f"rank {r.rank}"
        ), None
    except PinwheelError as exc:
        return None, f"rank {r.rank}: malformed result: {exc.what}"


def outcome_of(results: tuple[RankResult, ...], nbytes: int, backend: str) -> AllReduceOutcome:
    typed = [_typed(r) for r in results]
    failures = tuple(why for _, why in typed if why)
    done = [p for p, _ in typed if p is not None]
    wrong = []
    for p in done:
        if not p.sum_ok:
            at = p.first_wrong or documents.AllReduceFirstWrong()
            wrong.append(
                f"rank {p.rank}: {p.wrong} wrong, first at {at.index} "
                f"(got {at.got}, want {at.want})"
            )
    want = dict(NVLS_OFF)
    nvls_off = bool(done) and all(
        all((p.env or {}).get(k) == v for k, v in want.items()) for p in done
    )
    complete = len(done) == len(results) and not failures
    first = done[0] if done else None
    return AllReduceOutcome(
        world=len(results),
        backend=backend,
        nbytes=first.bytes if first is not None and first.bytes is not None else nbytes,
        sum_ok=complete and not wrong,
        wrong=tuple(wrong),
        failures=failures,
        nvls_off=nvls_off,
        seconds=first.seconds if complete and first else None,
        algbw_gbps=first.algbw_gbps if complete and first else None,
        busbw_gbps=first.busbw_gbps if complete and first else None,
        device=first.device if first else None,
        nccl=first.nccl if first else None,
    )

"""A built component's tensor-parallel primitives, checked against torch.distributed.

In: a frozen :class:`TpRequest` (the engine's Python, the exllamav3 wheel pinwheel
built, the GPUs). Out: a frozen :class:`TpOutcome`: one :class:`Case` per
primitive and size (pg_barrier, pg_all_reduce, pg_all_reduce_cpu, pg_broadcast,
pg_broadcast_ll, pg_gather, pg_gather_small; the context from pg_init_context), each
compared bit for bit with NCCL's result in the same processes, and
:meth:`TpOutcome.checks` (one check per primitive). The set is what exllamav3's native TP
backend calls at the pinned commit (v0.0.43: all_reduce through pg_all_reduce_cpu,
broadcasts up to 2,048 bytes through pg_broadcast_ll, the sampler's gathers through
pg_gather_small), plus pg_all_reduce, which that backend no longer calls.

The wheel's extension module is unpacked alone into a scratch directory and
imported from there by the worker (``serve/workers/pg_primitives.py``), one
process per GPU, NVLink multicast off (:mod:`pinwheel.serve.ranks`). With one GPU
the degenerate cases run (a one-rank group: all-reduce and broadcast leave the
tensor as it is (pg_all_reduce_cpu: truncated to bfloat16), barrier returns, gather_small
gathers the rank's own column; pg_gather returns at once for one rank).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel import documents, untrusted
from pinwheel.archive import zip_kind
from pinwheel.errors import PinwheelError
from pinwheel.serve.preflight import FAIL, OK, SKIP, Check
from pinwheel.serve.ranks import WORKERS, RankRequest, RankResult, run_ranks
from pinwheel.validate import member_problem
from pinwheel.wheels.wheelfile import Limits, header_issues

EXT_MODULE = "exllamav3_ext"
PRIMITIVES = (
    "pg_init_context",
    "pg_barrier",
    "pg_all_reduce",
    "pg_all_reduce_cpu",
    "pg_broadcast",
    "pg_broadcast_ll",
    "pg_gather",
    "pg_gather_small",
)
# what "within the bound" means for a sum that is not bit for bit (the worker's rules)
BOUND_RULES = {
    "pg_all_reduce": "2 gamma(world-1) sum|x|, float32",
    "pg_all_reduce_cpu": "2 (world-1) (2^-7 + 2^-24) sum|t(x)|, bfloat16 truncated per addition",
}


@dataclass(frozen=True)
class TpRequest:
    python: str  # the engine's interpreter (torch with CUDA)
    wheel: Path  # the component wheel holding EXT_MODULE
    devices: tuple[int, ...]  # physical GPUs, one rank each
    environ: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0  # the two-GPU run takes well under a minute


@dataclass(frozen=True)
class Case:
    op: str
    case: str
    nbytes: int
    match: bool
    detail: str  # what differed (or the error), "" when it matched
    # every element bit-identical on every rank (False: a sum matched within the
    # order-aware bound of serve/workers/pg_primitives.py's sum_bound, or it differed)
    exact: bool = False


@dataclass(frozen=True)
class TpOutcome:
    world: int
    device: str | None
    init: Mapping[str, Any] | None  # the PGContext fields right after pg_init_context
    cases: tuple[Case, ...]
    failures: tuple[str, ...]  # ranks that crashed, stopped or printed nothing
    aborted: str | None  # the case during which exllamav3's sync timeout fired
    notes: tuple[str, ...]  # e.g. why gather was not run

    @classmethod
    def from_json(cls, o: Mapping[str, Any]) -> TpOutcome:
        """The outcome ``qualify tp --json`` wrote (``asdict``) read back."""
        return cls(
            world=o["world"],
            device=o["device"],
            init=o["init"],
            cases=tuple(Case(**c) for c in o["cases"]),
            failures=tuple(o["failures"]),
            aborted=o["aborted"],
            notes=tuple(o["notes"]),
        )

    @property
    def ok(self) -> bool:
        """Every primitive compared at least one case (gather: with two ranks or more) and
        every case matched: zero cases compared is no pass."""
        return (
            not self.failures and not self.aborted and all(c.status != FAIL for c in self.checks())
        )

    def checks(self) -> tuple[Check, ...]:
        out = []
        fix = "rebuild the component (`pinwheel kernels --name exllamav3`) and compare its stack"
        init_ok = (
            self.init is not None
            and self.init.get("sync_timeout") == 0
            and self.init.get("barrier_epoch") == 1
        )
        out.append(
            Check(
                "pg_init_context",
                OK if init_ok else FAIL,
                f"context {self.init}" if self.init else "no context (see the rank failures)",
                None if init_ok else fix,
            )
        )
        for op in PRIMITIVES[1:]:
            mine = [c for c in self.cases if c.op == op]
            if not mine:
                # Only gather on one rank has a reason not to run; anything else not
                # compared is a failure (a gate never passes on nothing).
                why = next((n for n in self.notes if op in n), None)
                if why is not None and op == "pg_gather" and self.world < 2:
                    out.append(Check(op, SKIP, why))
                else:
                    out.append(Check(op, FAIL, why or "not run: no case compared", fix))
                continue
            bad = [c for c in mine if not c.match]
            if bad:
                out.append(
                    Check(
                        op,
                        FAIL,
                        f"{len(bad)} of {len(mine)} cases differ from torch.distributed: "
                        + "; ".join(f"{c.case}: {c.detail}" for c in bad[:4]),
                        fix,
                    )
                )
            elif op == "pg_barrier":
                out.append(Check(op, OK, f"{len(mine)} cases held as torch.distributed's did"))
            elif all(c.exact for c in mine):
                out.append(
                    Check(op, OK, f"{len(mine)} cases equal torch.distributed's, bit for bit")
                )
            else:
                inexact = sum(1 for c in mine if not c.exact)
                out.append(
                    Check(
                        op,
                        OK,
                        f"{len(mine)} cases equal torch.distributed's: {len(mine) - inexact} "
                        f"bit for bit, {inexact} within the bound for a sum in another order "
                        f"({BOUND_RULES.get(op, 'the rank report says which')})",
                    )
                )
        if self.failures or self.aborted:
            out.append(
                Check(
                    "ranks",
                    FAIL,
                    "; ".join(self.failures) or f"exllamav3 sync timeout during {self.aborted}",
                    "rerun with one GPU (--devices 0) to separate a build fault from a link fault",
                )
            )
        return tuple(out)


def extract_extension(wheel: Path, dest: Path, module: str = EXT_MODULE) -> Path:
    """Unpack the wheel's top-level ``module.*.so`` (nothing else) into ``dest``."""
    where = str(wheel)
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise PinwheelError(
            f"not a readable wheel: {exc}",
            where=where,
            next="pass the .whl that `pinwheel kernels --name exllamav3` wrote",
        ) from None
    with zf:
        issues, _ = header_issues(zf, Limits())
        if issues:
            raise PinwheelError(
                f"unsafe wheel: {issues[0].message}",
                where=f"{where}: {issues[0].member}",
                next="rebuild it with `pinwheel kernels`",
            )
        pattern = re.compile(rf"{re.escape(module)}\.[A-Za-z0-9_.-]*\.so")
        members = [
            i
            for i in zf.infolist()
            if pattern.fullmatch(i.filename)
            and zip_kind(i) == "file"
            and member_problem(i.filename) is None
        ]
        if len(members) != 1:
            found = ", ".join(n for n in zf.namelist() if n.endswith(".so")) or "no .so"
            raise PinwheelError(
                f"expected one top-level {module}.*.so in the wheel, found: {found}",
                where=where,
                next="pass the exllamav3 wheel built by `pinwheel kernels --name exllamav3`",
            )
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / members[0].filename
        with zf.open(members[0]) as src, target.open("wb") as out:
            shutil.copyfileobj(src, out)
    return target


def run_tpcheck(req: TpRequest) -> TpOutcome:
    if not req.devices:
        raise PinwheelError(
            "no GPU to run the process-group primitives on",
            where="--devices",
            next="pass --devices 0,1 (two GPUs) or --devices 0 (the one-rank cases)",
        )
    with tempfile.TemporaryDirectory(prefix="pinwheel-tp-") as tmp:
        extract_extension(req.wheel, Path(tmp))
        results = run_ranks(
            RankRequest(
                python=req.python,
                script=WORKERS / "pg_primitives.py",
                args=("--", tmp),
                devices=req.devices,
                world=len(req.devices),
                environ=req.environ,
                timeout_s=req.timeout_s,
            )
        )
    return outcome_of(results)


def _payload(r: RankResult, failures: list[str]) -> Mapping[str, Any] | None:
    """The rank's report, its shape checked (:class:`pinwheel.documents.TpRank`); a report
    of the wrong shape is that rank's failure, never a traceback."""
    if r.payload is None:
        return None
    try:
        untrusted.decode(documents.TpRank, r.payload, untrusted.WORKER, f"rank {r.rank}")
    except PinwheelError as exc:
        failures.append(f"rank {r.rank}: malformed report: {exc.what}")
        return None
    return r.payload


def outcome_of(results: tuple[RankResult, ...]) -> TpOutcome:
    """Merge the ranks' reports: a case matches when it matched on every rank that compared."""
    failures = [r.why() for r in results if not r.ok]
    payloads = [p for r in results if (p := _payload(r, failures)) is not None]
    for p in payloads:
        if p.get("error"):
            failures.append(f"rank {p.get('rank')}: {str(p['error']).strip().splitlines()[-1]}")
    merged: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for p in payloads:
        for c in p.get("cases") or ():
            merged.setdefault((str(c["op"]), str(c["case"])), []).append(c)
    cases = []
    for (op, case), rows in merged.items():
        bad = [r for r in rows if not r.get("match")]
        # a match says nothing more, except the barrier's waits (what "held" means)
        shown = bad or [r for r in rows if "waited_s" in r and r.get("rank") == 0]
        cases.append(
            Case(
                op=op,
                case=case,
                nbytes=int(rows[0].get("bytes") or 0),
                match=not bad,
                detail="; ".join(_why(r) for r in shown),
                exact=_exact(rows),
            )
        )
    first = payloads[0] if payloads else {}
    init = next((p.get("init") for p in payloads if p.get("rank") == 0), None)
    notes = tuple(str(p["gather_skipped"]) for p in payloads[:1] if p.get("gather_skipped"))
    notes = tuple(f"pg_gather: {n}" for n in notes)
    aborted = next((str(p["aborted"]) for p in payloads if p.get("aborted")), None)
    return TpOutcome(
        world=len(results),
        device=first.get("device"),
        init=init,
        cases=tuple(cases),
        failures=tuple(failures),
        aborted=aborted,
        notes=notes,
    )


def _exact(rows: list[Mapping[str, Any]]) -> bool:
    """Bit for bit on every rank that compared bits (a gather's senders compare nothing)."""
    compared = [r for r in rows if "exact" in r]
    return bool(compared) and all(r["exact"] is True for r in compared)


def _why(row: Mapping[str, Any]) -> str:
    rank = f"rank {row.get('rank')}"
    if row.get("error"):
        return f"{rank}: {row['error']}"
    if "waited_s" in row:
        return (
            f"{rank} waited {row['waited_s']} s at pg_barrier, "
            f"{row.get('torch_waited_s')} s at dist.barrier"
        )
    text = f"{rank}: {row.get('wrong')} of {row.get('elements')} elements differ"
    if row.get("unwritten"):
        text += f", {row['unwritten']} never written"
    for part in row.get("by_source") or ():
        if part.get("wrong"):
            lo, hi = part["columns"]
            text += f"; rank {part['rank']}'s columns {lo}-{hi}: {part['wrong']} wrong"
            if part.get("unwritten"):
                text += f" ({part['unwritten']} never written)"
    return text


def table(outcomes: Mapping[str, TpOutcome]) -> list[str]:
    """Markdown rows: one per case, one column per build (``same`` / ``DIFFERS``)."""
    names = list(outcomes)
    keys: list[tuple[str, str]] = []
    for o in outcomes.values():
        for c in o.cases:
            if (c.op, c.case) not in keys:
                keys.append((c.op, c.case))
    lines = [
        "| primitive | case | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for op, case in keys:
        cells = []
        for name in names:
            hit = next((x for x in outcomes[name].cases if (x.op, x.case) == (op, case)), None)
            if hit is None:
                cells.append("not run")
            elif hit.match:
                cells.append("= torch.distributed")
            else:
                cells.append("DIFFERS: " + hit.detail.replace("|", "/"))
        lines.append(f"| {op} | {case} | " + " | ".join(cells) + " |")
    return lines

"""``pinwheel qualify verify-receipt``: recompute a fidelity receipt's hashes.

In: a ``receipt.json`` written by ``pinwheel qualify`` and the per-position values
beside it (``fidelity_kld.f64``); optionally the teacher file and a file of the served
rows (a teacher-format file captured from the same server with ``pinwheel qualify
teacher --url URL --top-k -1``). Out: one :class:`Check` per recomputed figure,
``match`` or ``mismatch`` (or ``skipped`` with the reason).

Recomputed: the sha256 of the float64 values (``kld_f64_sha256``), the card-format
text hash (``kld_sha256``: one ``printf("%.9f\\n")`` line per position), the mean;
with the teacher and served rows: the teacher's sha256, the served rows' digest and
every per-position value, bit for bit, by :mod:`pinwheel.serve.workers.detkl` (the
same bits on every CPU).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import untrusted
from pinwheel.errors import UsageError

F64 = "fidelity_kld.f64"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # match | mismatch | skipped
    detail: str


@dataclass(frozen=True)
class VerifyRequest:
    receipt: Path
    teacher: Path | None = None
    served: Path | None = None  # the served full rows, as a teacher-format file


@dataclass(frozen=True)
class VerifyOutcome:
    receipt: str
    positions: int
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.status != "mismatch" for c in self.checks)


def _fidelity(path: Path) -> dict[str, Any]:
    data = untrusted.read_json(path, untrusted.QUALIFICATION)
    fid = data.get("fidelity") if isinstance(data, dict) else None
    if not isinstance(fid, dict):
        raise UsageError(
            "the receipt holds no fidelity section",
            where=str(path),
            next="pass the receipt.json of a `pinwheel qualify` run with [qualify.fidelity]",
        )
    for key, kind in (("positions", int), ("kld_sha256", str), ("mean_kld", float)):
        if not isinstance(fid.get(key), kind) or isinstance(fid.get(key), bool):
            raise untrusted.fail(
                untrusted.QUALIFICATION, f"fidelity.{key} is not a {kind.__name__}", str(path)
            )
    if fid["positions"] < 1:
        raise untrusted.fail(untrusted.QUALIFICATION, "fidelity.positions < 1", str(path))
    return fid


def _check(name: str, got: str, want: Any) -> Check:
    if not isinstance(want, str) or not want:
        return Check(name, "skipped", "the receipt records none (written before it was kept)")
    return Check(name, "match" if got == want else "mismatch", f"recomputed {got}, receipt {want}")


def verify(req: VerifyRequest) -> VerifyOutcome:
    import numpy as np

    from pinwheel.serve import fidelity, kld
    from pinwheel.serve.workers import detkl

    fid = _fidelity(req.receipt)
    positions = int(fid["positions"])
    f64 = req.receipt.parent / F64
    raw = untrusted.read_bytes(f64, untrusted.QUALIFICATION, cap=positions * 8)
    if len(raw) != positions * 8:
        raise UsageError(
            f"{F64} holds {len(raw)} bytes, the receipt's {positions} positions need "
            f"{positions * 8}",
            where=str(f64),
            next="keep fidelity_kld.f64 beside the receipt it was written with",
        )
    values = np.frombuffer(raw, "<f8").astype(np.float64)
    checks = [
        _check("kld_f64_sha256 (fidelity_kld.f64)", hashlib.sha256(raw).hexdigest(),
               fid.get("kld_f64_sha256")),
        _check("kld_sha256 (printf %.9f text)", kld.kld_sha256(values), fid["kld_sha256"]),
    ]  # fmt: skip
    mean = float(values.mean())
    checks.append(
        Check(
            "mean_kld",
            "match" if mean == fid["mean_kld"] else "mismatch",
            f"recomputed {mean!r}, receipt {fid['mean_kld']!r}",
        )
    )
    if req.teacher is None or req.served is None:
        checks.append(
            Check(
                "per-position values from the rows",
                "skipped",
                "pass --teacher FILE and --served FILE to recompute them",
            )  # fmt: skip
        )
        return VerifyOutcome(str(req.receipt), positions, tuple(checks))
    teacher = fidelity.read_teacher(req.teacher, None)
    served = fidelity.read_teacher(req.served, None)
    checks.append(_check("teacher sha256", teacher.sha256, fid.get("teacher_sha256")))
    if teacher.full is None or served.full is None:
        raise UsageError(
            "recomputing per-position values needs full rows on both sides",
            where=f"{req.teacher}, {req.served}",
            next="capture them with `pinwheel qualify teacher --top-k -1`",
        )
    if teacher.full.shape != served.full.shape or teacher.positions != positions:
        raise UsageError(
            f"teacher rows {list(teacher.full.shape)}, served rows {list(served.full.shape)}, "
            f"receipt {positions} positions: not the same panel",
            where=str(req.served),
        )
    h = hashlib.sha256()
    for row in served.full:
        h.update(row.astype("<f8").tobytes())
    checks.append(_check("served_rows_sha256", h.hexdigest(), fid.get("served_rows_sha256")))
    rec = detkl.batch(teacher.full, served.full)
    again = detkl.canonical_bytes(rec["kl"])
    diff = np.flatnonzero(np.frombuffer(again, "<u8") != np.frombuffer(raw, "<u8"))
    checks.append(
        Check(
            "per-position values (detkl, bit for bit)",
            "match" if len(diff) == 0 else "mismatch",
            f"{positions} positions recomputed"
            + (f"; {len(diff)} differ, first at position {int(diff[0])}" if len(diff) else ""),
        )
    )
    return VerifyOutcome(str(req.receipt), positions, tuple(checks))

"""``pinwheel qualify verify-receipt``: every conclusion of a receipt re-derived.

In: a ``receipt.json`` written by ``pinwheel qualify`` and the per-position files beside
it (``fidelity_kld.f64``: the float64 values; ``fidelity_flags.u8``: one byte a
position, 1 top-1 agreement, 2 a tied maximum); optionally the teacher file and a
file of the served rows (a teacher-format file captured from the same server with
``pinwheel qualify teacher --url URL --top-k -1``). Out: one :class:`Check` per
recomputed figure, ``match`` or ``mismatch``; a receipt that lacks a hash or a field
its schema defines, or holds a NaN, is refused (:class:`~pinwheel.errors.VerifyError`).

Re-derived from the files: every hash (``kld_f64_sha256``, ``kld_sha256``,
``flags_sha256``), every summary figure (mean, CI, median, p99, max, top-1, ties:
:mod:`pinwheel.serve.kldsummary`, bit for bit), the spot-check's sample, each gate's
status by its row of the gate table (:mod:`pinwheel.serve.gates.table`: from its raw
value and limit, or from the receipt's needles, smoke replies and markers), and the
verdict from the gates. In-process receipts: the spot-check's rows
(``fidelity_spot_rows.f32``) against their hash, and with ``--teacher`` each sampled
row scored again, so its ``differ`` list is re-derived too. With the teacher and the
served rows: the teacher's sha256, the served rows' digest and every per-position
value and flag, bit for bit, by :mod:`pinwheel.serve.workers.detkl` (the parts that
read rows need numpy: the ``qualify`` extra). The rest is the standard library: it
runs from the plain install.

What it cannot re-derive: an INFO status (the manifest marks a card figure
informational; the receipt pins the manifest's sha256, not its text).
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import untrusted, validate
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.printable import shown
from pinwheel.serve import kldsummary
from pinwheel.serve.gates import table
from pinwheel.serve.gates.base import Reading
from pinwheel.serve.receipt import FAILING, SCHEMA, number

F64 = "fidelity_kld.f64"
FLAGS = "fidelity_flags.u8"
SPOT_ROWS = "fidelity_spot_rows.f32"  # the in-process spot-check's rows (float32 [size, V])
STATUSES = ("PASS", "FAIL", "SKIP", "INFO", "NOT PROVEN")
KIND = untrusted.QUALIFICATION


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


class _Doc:
    """Typed access to the receipt: a missing or mistyped field is a refusal naming it."""

    def __init__(self, where: str) -> None:
        self.where = where

    def refuse(self, what: str, field: str) -> PinwheelError:
        return untrusted.fail(KIND, what, self.where, field=field)

    def obj(self, data: Any, key: str, field: str) -> Mapping[str, Any]:
        got = data.get(key) if isinstance(data, Mapping) else None
        if not isinstance(got, Mapping):
            raise self.refuse("missing, or not an object", field)
        return got

    def integer(self, data: Mapping[str, Any], key: str, field: str, low: int, high: int) -> int:
        got = data.get(key)
        if not isinstance(got, int) or isinstance(got, bool) or not low <= got <= high:
            raise self.refuse(f"missing, or not an integer from {low} to {high}", field)
        return got

    def text(self, data: Mapping[str, Any], key: str, field: str) -> str:
        got = data.get(key)
        if not isinstance(got, str):
            raise self.refuse("missing, or not a string", field)
        return got

    def digest(self, data: Mapping[str, Any], key: str, field: str) -> str:
        got = data.get(key)
        if not validate.is_sha256(got):
            raise self.refuse("missing, or not a sha256 (64 lowercase hex digits)", field)
        return got

    def figure(self, data: Mapping[str, Any], key: str, field: str) -> float:
        got = number(data.get(key))
        if got is None:
            raise self.refuse('missing, NaN, or not a number (+inf is written "inf")', field)
        return got


def _same(name: str, got: Any, want: Any) -> Check:
    ok = got == want and (
        not isinstance(got, float) or struct.pack("<d", got) == struct.pack("<d", want)
    )
    return Check(name, "match" if ok else "mismatch", f"recomputed {got!r}, receipt {want!r}")


def canonical_text(values: list[float]) -> bytes:
    """:func:`pinwheel.serve.kld.canonical_text` without numpy: ``printf("%.9f\\n")``."""
    return "".join(
        "inf\n" if x == math.inf else f"{max(0.0, x) + 0.0:.9f}\n" for x in values
    ).encode()


def verify(req: VerifyRequest) -> VerifyOutcome:
    """Every check; a receipt that cannot be checked is refused (never a traceback)."""
    doc = _Doc(str(req.receipt))
    data = untrusted.read_json(req.receipt, KIND)
    try:
        return _verify(req, doc, data)
    except (
        TypeError,
        ValueError,
        KeyError,
        IndexError,
        AttributeError,
        OverflowError,
        ZeroDivisionError,
        RecursionError,
    ) as exc:
        raise untrusted.fail(KIND, f"malformed ({type(exc).__name__}: {exc})", doc.where) from None


def _verify(req: VerifyRequest, doc: _Doc, data: Any) -> VerifyOutcome:
    if not isinstance(data, Mapping):
        raise doc.refuse("not a JSON object", "(top level)")
    checks = [_same("schema", doc.text(data, "schema", "schema"), SCHEMA)]
    doc.digest(doc.obj(data, "manifest", "manifest"), "sha256", "manifest.sha256")
    if data.get("provenance") is not None:
        doc.digest(doc.obj(data, "provenance", "provenance"), "sha256", "provenance.sha256")
    fid: Mapping[str, Any] | None = None
    positions = 0
    if data.get("fidelity") is not None:
        fid = doc.obj(data, "fidelity", "fidelity")
        positions = doc.integer(fid, "positions", "fidelity.positions", 1, 2**40)
        checks += _fidelity(req, doc, fid, positions)
    gate_checks, statuses = _gates(doc, data, fid)
    checks += gate_checks
    failed = any(s in FAILING for s in statuses)  # the re-derived statuses, not the stored
    error = data.get("error")
    verdict = "ERROR" if error is not None else ("FAIL" if failed else "PASS")
    checks.append(_same("verdict (from the gates)", verdict, doc.text(data, "verdict", "verdict")))
    return VerifyOutcome(str(req.receipt), positions, tuple(checks))


def _files(req: VerifyRequest, doc: _Doc, positions: int) -> tuple[bytes, bytes]:
    out = []
    for name, width in ((F64, 8), (FLAGS, 1)):
        path = req.receipt.parent / name
        raw = untrusted.read_bytes(path, KIND, cap=positions * width)
        if len(raw) != positions * width:
            raise UsageError(
                f"{name} holds {len(raw)} bytes, the receipt's {positions} positions need "
                f"{positions * width}",
                where=str(path),
                next=f"keep {name} beside the receipt it was written with",
            )
        out.append(raw)
    return out[0], out[1]


def _fidelity(req: VerifyRequest, doc: _Doc, fid: Mapping[str, Any], positions: int) -> list[Check]:
    f = "fidelity."
    for key in ("kld_sha256", "kld_f64_sha256", "flags_sha256", "teacher_sha256", "panel_sha256"):
        doc.digest(fid, key, f + key)
    stats = doc.text(fid, "stats", f + "stats")
    if stats != kldsummary.METHOD:
        raise doc.refuse(f"{stats!r}: this pinwheel recomputes {kldsummary.METHOD}", f + "stats")
    bound = doc.text(fid, "bound", f + "bound")
    scorer = doc.text(fid, "scorer", f + "scorer")
    method = doc.text(fid, "method", f + "method")
    if bound not in ("exact", "lower") or scorer not in ("rows", "in-process"):
        raise doc.refuse(f"bound {bound!r} / scorer {scorer!r}", f + "bound, fidelity.scorer")
    if scorer == "rows" and method == "full":
        doc.digest(fid, "served_rows_sha256", f + "served_rows_sha256")
    lengths = fid.get("window_positions")
    if (
        not isinstance(lengths, list)
        or not lengths
        or not all(type(n) is int and n >= 1 for n in lengths)
        or sum(lengths) != positions
    ):
        raise doc.refuse(
            f"not a list of window sizes adding up to {positions}", f + "window_positions"
        )
    panel = doc.integer(fid, "panel_positions", f + "panel_positions", 0, 2**40)
    resamples = doc.integer(fid, "bootstrap_resamples", f + "bootstrap_resamples", 1, 10**6)
    seed = doc.integer(fid, "bootstrap_seed", f + "bootstrap_seed", 0, 2**64 - 1)
    raw, flags = _files(req, doc, positions)
    values = list(struct.unpack(f"<{positions}d", raw))
    bad = next((i for i, x in enumerate(values) if x != x or x < 0), None)
    if bad is not None:
        raise doc.refuse(f"position {bad} is {values[bad]!r}: a KLD is >= 0, never NaN", F64)
    odd = next((i for i, b in enumerate(flags) if b > 3), None)
    if odd is not None:
        raise doc.refuse(f"position {odd}: flags byte {flags[odd]} (only bits 1 and 2)", FLAGS)
    checks = [
        _same(f"{f}kld_f64_sha256 ({F64})", hashlib.sha256(raw).hexdigest(), fid["kld_f64_sha256"]),
        _same(
            f"{f}kld_sha256 (printf %.9f text)",
            hashlib.sha256(canonical_text(values)).hexdigest(),
            fid["kld_sha256"],
        ),
        _same(f"{f}flags_sha256 ({FLAGS})", hashlib.sha256(flags).hexdigest(), fid["flags_sha256"]),
    ]
    ci = _numpy_ci(values, lengths, resamples, seed)
    got = kldsummary.figures(values, list(flags), lengths, resamples, seed, ci)
    ci = fid.get("ci95")
    if not isinstance(ci, list) or len(ci) != 2:
        raise doc.refuse("not a pair [low, high]", f + "ci95")
    stored = [
        ("mean_kld", got.mean, doc.figure(fid, "mean_kld", f + "mean_kld")),
        ("ci95[0]", got.ci95[0], doc.figure({"v": ci[0]}, "v", f + "ci95[0]")),
        ("ci95[1]", got.ci95[1], doc.figure({"v": ci[1]}, "v", f + "ci95[1]")),
        ("median", got.median, doc.figure(fid, "median", f + "median")),
        ("p99", got.p99, doc.figure(fid, "p99", f + "p99")),
        ("max", got.max, doc.figure(fid, "max", f + "max")),
        ("top1", got.top1, doc.figure(fid, "top1", f + "top1")),
        ("top1_ties", got.ties, doc.integer(fid, "top1_ties", f + "top1_ties", 0, positions)),
    ]
    checks += [_same(f + name, mine, theirs) for name, mine, theirs in stored]
    if panel > positions:
        checks.append(
            Check(
                f + "positions", "match", f"{positions} of the panel's {panel}: the gates must FAIL"
            )
        )
    if scorer == "in-process":
        checks += _spot(req, doc, fid, raw, flags)
    checks += _rows(req, doc, fid, raw, flags, positions)
    return checks


def _spot(
    req: VerifyRequest, doc: _Doc, fid: Mapping[str, Any], raw: bytes, flags: bytes
) -> list[Check]:
    """The spot-check's sample is the one its seed gives (drawn after the engine
    answered), its rows file is the one it hashed; with ``--teacher``, each sampled row
    is scored again (detkl) against the engine's recorded value and flags."""
    f = "fidelity.spot_check."
    positions = len(flags)
    spot = doc.obj(fid, "spot_check", "fidelity.spot_check")
    seed = doc.integer(spot, "seed", f + "seed", 0, 2**63 - 1)
    size = doc.integer(spot, "size", f + "size", 0, positions)
    vocab = doc.integer(spot, "vocab", f + "vocab", 1, 2**24)
    doc.digest(spot, "rows_sha256", f + "rows_sha256")
    sample = spot.get("positions")
    differ = spot.get("differ")
    if not isinstance(differ, list) or not all(type(p) is int for p in differ):
        raise doc.refuse("not a list of positions", f + "differ")
    want = sorted(random.Random(seed).sample(range(positions), size))
    if sample != want or not set(differ) <= set(want):
        return [
            Check(f + "positions", "mismatch",
                  f"seed {seed} draws {want[:8]}..., the receipt lists {str(sample)[:80]}")
        ]  # fmt: skip
    checks = [Check(f + "positions", "match", f"{size} drawn by seed {seed}; {len(differ)} differ")]
    path = req.receipt.parent / SPOT_ROWS
    rows = untrusted.read_bytes(path, KIND, cap=size * vocab * 4)
    if len(rows) != size * vocab * 4:
        raise doc.refuse(f"{len(rows)} bytes, {size} rows of {vocab} float32 need "
                         f"{size * vocab * 4}", SPOT_ROWS)  # fmt: skip
    checks.append(_same(f + "rows_sha256", hashlib.sha256(rows).hexdigest(), spot["rows_sha256"]))
    if req.teacher is None:
        checks.append(Check(f + "differ (from the rows)", "skipped",
                            "pass --teacher FILE to score the sampled rows again"))  # fmt: skip
        return checks
    np = _numpy()
    from pinwheel.serve.teacherfile import read_teacher
    from pinwheel.serve.workers import detkl

    teacher = read_teacher(req.teacher, None)
    if teacher.full is None or teacher.positions != positions or teacher.full.shape[1] != vocab:
        raise UsageError("the teacher is not this receipt's (full rows, same positions and "
                         "vocabulary)", where=str(req.teacher))  # fmt: skip
    scorer = detkl.Scorer(vocab)
    found = []
    for i, p in enumerate(sample):
        row = np.frombuffer(rows, "<f4", vocab, i * vocab * 4)
        try:
            kl, fl, _, _ = scorer.one(teacher.full[p], row)
        except ValueError:
            found.append(p)
            continue
        mine = struct.pack("<d", kl + 0.0) + bytes([fl & 3])
        if mine != raw[p * 8 : p * 8 + 8] + flags[p : p + 1]:
            found.append(p)
    checks.append(_same(f + "differ (from the rows)", found, differ))
    return checks


FAST_CI_DRAWS = 10**7  # bootstrap draws above which numpy (when importable) computes the CI


def _numpy_ci(
    values: list[float], lengths: list[int], resamples: int, seed: int
) -> tuple[float, float] | None:
    """The CI by fidelity.bootstrap_ci (the same bits as the pure-Python definition,
    tests/test_receipt_verify.py) when numpy is there and the pure loop would be slow
    (one window of 51,175 positions x 2,000 resamples: 601 s in pure Python here)."""
    units = len(lengths) if len(lengths) >= 2 else len(values)
    if units * resamples <= FAST_CI_DRAWS:
        return None
    try:
        import numpy as np
    except ImportError:
        return None
    from pinwheel.serve import fidelity

    offsets = np.array([0, *lengths], np.int64).cumsum()
    return fidelity.bootstrap_ci(np.array(values, np.float64), offsets, resamples, seed)[0]


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise UsageError(
            "recomputing values from rows needs numpy",
            where="--teacher/--served",
            next="install the qualify extra (pip install 'pinwheel[qualify]'), or drop "
            "--teacher/--served",
        ) from None
    return numpy


def _rows(
    req: VerifyRequest, doc: _Doc, fid: Mapping[str, Any], raw: bytes, flags: bytes, positions: int
) -> list[Check]:
    """With ``--teacher`` and ``--served``: every value and flag from the rows (detkl)."""
    if req.teacher is None or req.served is None:
        return [
            Check(
                "per-position values from the rows",
                "skipped",
                "pass --teacher FILE and --served FILE to recompute them",
            )
        ]
    np = _numpy()
    from pinwheel.serve.teacherfile import read_teacher
    from pinwheel.serve.workers import detkl

    teacher = read_teacher(req.teacher, None)
    served = read_teacher(req.served, None)
    checks = [_same("fidelity.teacher_sha256", teacher.sha256, fid["teacher_sha256"])]
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
    if fid.get("scorer") == "rows" and fid.get("method") == "full":
        h = hashlib.sha256()
        for row in served.full:
            h.update(row.astype("<f8").tobytes())
        checks.append(
            _same("fidelity.served_rows_sha256", h.hexdigest(), fid["served_rows_sha256"])
        )
    try:
        rec = detkl.batch(teacher.full, served.full)
    except ValueError as exc:
        raise UsageError(f"the rows are not distributions: {exc}", where=str(req.served)) from None
    again = detkl.canonical_bytes(rec["kl"])
    diff = np.flatnonzero(np.frombuffer(again, "<u8") != np.frombuffer(raw, "<u8"))
    fl = np.frombuffer(flags, np.uint8) != (rec["flags"] & 3)
    for what, d in (("values", diff), ("flags (top-1, ties)", np.flatnonzero(fl))):
        checks.append(
            Check(
                f"per-position {what} (detkl, bit for bit)",
                "match" if len(d) == 0 else "mismatch",
                f"{positions} positions recomputed"
                + (f"; {len(d)} differ, first at position {int(d[0])}" if len(d) else ""),
            )
        )
    return checks


def _gates(
    doc: _Doc, data: Mapping[str, Any], fid: Mapping[str, Any] | None
) -> tuple[list[Check], list[str]]:
    """A check per gate, each gate's status re-derived by its row of the gate table
    (:func:`pinwheel.serve.gates.table.derive`), INFO kept where the row allows it."""
    gates = data.get("gates")
    if not isinstance(gates, list):
        raise doc.refuse("missing, or not a list", "gates")
    reading = Reading(doc, data, fid)
    checks = []
    statuses = []
    for i, g in enumerate(gates):
        field = f"gates[{i}]"
        if not isinstance(g, Mapping):
            raise doc.refuse("not an object", field)
        name = doc.text(g, "name", field + ".name")
        status = doc.text(g, "status", field + ".status")
        if status not in STATUSES:
            raise doc.refuse(f"status {shown(status)!r}", field + ".status")
        want, info_kept = table.derive(reading, g, name, field)
        label = f"{field} {shown(name)[:80]}: status"
        ok = status == want or (status == "INFO" and info_kept)
        checks.append(
            Check(
                label,
                "match" if ok else "mismatch",
                f"re-derived {want}, receipt {shown(status)}"
                + (" (INFO: informational by the manifest)" if ok and status != want else ""),
            )
        )
        statuses.append(status if ok else want)
    return checks, statuses

"""What qualification measured and judged: the results, the gates and the receipt.

In: raw measurements from :mod:`pinwheel.serve.qualify`. Out: frozen results, the
:class:`Gate` record (the gates themselves are rows of :mod:`pinwheel.serve.gates.table`,
judged on raw numbers: a miss is FAIL, never rounded), and the :class:`Receipt` that
:mod:`pinwheel.serve.report` writes out.
"""

from __future__ import annotations

import json
import math
import statistics
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pinwheel.checksums import sha256_file
from pinwheel.wheels.provenance import read_receipt

SCHEMA = "pinwheel.qualify/1"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class DecodeSample:
    prompt: int  # index into [qualify].prompts
    repeat: int
    tokens: int
    ttft_s: float
    decode_s: float
    tok_s: float
    passes: int | None  # forward passes after the first token
    passes_from: str  # which counter gave them
    ms_per_pass: float | None
    drafts: float | None
    draft_tokens: float | None
    accepted: float | None
    acceptance_length: float | None  # vLLM's mean acceptance length: 1 + accepted / drafts
    accepted_per_pos: Mapping[str, float] = field(default_factory=dict)  # counter deltas


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    n: int

    @property
    def relative(self) -> float:
        return (self.high - self.low) / self.median if self.median else 0.0


def spread(values: Sequence[float]) -> Spread | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return Spread(statistics.median(vals), min(vals), max(vals), len(vals))


@dataclass(frozen=True)
class ConcurrencyResult:
    streams: int
    total_tokens: int
    wall_s: float
    aggregate_tok_s: float
    per_stream_tok_s: tuple[float, ...]


@dataclass(frozen=True)
class NeedleResult:
    length: int
    depth: float
    prompt_tokens: int  # as the server counted them
    value: str
    status: str  # pass | miss | garbage | skipped
    reason: str
    answer: str
    seconds: float


@dataclass(frozen=True)
class MarkerResult:
    pattern: str
    status: str  # found | missing | unchecked
    line: str | None


@dataclass(frozen=True)
class FidelityResult:
    """KLD(teacher || student) over the panel (:mod:`pinwheel.serve.fidelity`)."""

    mean_kld: float  # nats, token mean
    ci95: tuple[float, float]
    median: float
    p99: float
    max: float
    top1: float  # fraction of positions where both argmaxes agree
    positions: int
    windows: int
    method: str  # "full" or "top-K+tail"
    kld_sha256: str  # sha256 of the canonical per-position text (kld.canonical_text)
    panel_sha256: str
    teacher_sha256: str
    teacher_source: str
    top_k: int
    ci_method: str
    kld: tuple[float, ...] = field(default=(), repr=False, compare=False)  # not in the JSON
    bound: str = "exact"  # "exact", or "lower": every figure above is a lower bound
    top1_ties: int = 0  # positions where either side's maximum was tied
    # sha256 of the per-position values as float64 little-endian (fidelity_kld.f64)
    kld_f64_sha256: str = ""
    math: str = ""  # the method that made the values ("pinwheel.detkl/1": same bits on any CPU)
    scorer: str = "rows"  # "rows" (served rows as JSON, the reference) or "in-process"
    served_rows_sha256: str | None = None  # rows path, full rows: float64 LE [P, V] by token id
    boundary_bytes_per_position: float | None = None  # in-process: bytes out of the engine
    engine_seconds: float | None = None  # in-process: time the engine spent scoring
    # per position, one byte: 1 top-1 agreement, 2 a tied maximum (fidelity_flags.u8)
    flags: bytes = field(default=b"", repr=False, compare=False)  # not in the JSON
    flags_sha256: str = ""
    stats: str = ""  # the definition of every figure above (pinwheel.serve.kldsummary)
    window_positions: tuple[int, ...] = ()  # the bootstrap's units
    panel_positions: int = 0  # the positions the panel holds: fewer scored fails the gate
    bootstrap_resamples: int = 0
    bootstrap_seed: int = 0
    # in-process: full rows of sampled positions recomputed by detkl (inprocess.spot_check)
    spot_check: Mapping[str, Any] | None = None
    # the spot-check's rows as the engine sent them (float32 LE [size, V], sample order):
    # fidelity_spot_rows.f32, hashed as spot_check.rows_sha256; not in the JSON
    spot_rows: bytes = field(default=b"", repr=False, compare=False)


NOT_MEASURABLE = "not measurable"
NOT_PROVEN_STATUS = "NOT PROVEN"
FAILING = ("FAIL", NOT_PROVEN_STATUS)  # gate statuses that fail the qualification


def fidelity_status(
    value: float | None, op: str, limit: float, bound: str, positions: int, panel: int
) -> str:
    """A fidelity gate's status from its raw figures (the writer and verify-receipt):
    fewer positions than the panel, no value or NaN: FAIL; a lower bound that meets the
    limit: NOT PROVEN (it can prove a FAIL, never a PASS)."""
    if positions < max(panel, 1) or not holds(value, op, limit):
        return "FAIL"
    return "PASS" if bound == "exact" else NOT_PROVEN_STATUS


def spot_status(spot: Mapping[str, Any] | None) -> str:
    """The in-process spot-check gate: PASS when at least one sampled position was
    recomputed from the engine's full rows and none differed."""
    if not isinstance(spot, Mapping):
        return "FAIL"
    size, differ, sampled = spot.get("size"), spot.get("differ"), spot.get("positions")
    ok = (
        isinstance(size, int) and not isinstance(size, bool) and size >= 1
        and isinstance(sampled, list) and len(sampled) == size
        and isinstance(differ, list) and not differ
    )  # fmt: skip
    return "PASS" if ok else "FAIL"


@dataclass(frozen=True)
class Gate:
    name: str
    # PASS | FAIL | SKIP | INFO (compared with the card's figure, never fails) |
    # NOT PROVEN (a failure: the figure cannot show the limit is met)
    status: str
    measured: str
    threshold: str
    detail: str = ""
    # the raw comparison the status was judged on: ``value op limit`` (op "<", "<=", ">=")
    value: float | None = None
    op: str = ""
    limit: float | None = None


OPS = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
}


def holds(value: float | None, op: str, limit: float | None) -> bool:
    """``value op limit`` on raw numbers; a missing or NaN value never holds."""
    if value is None or limit is None or value != value or op not in OPS:
        return False
    return bool(OPS[op](value, limit))


def shown(value: float, threshold: float) -> str:
    """Enough decimals that a miss never prints as the threshold (91.0 vs 90.996)."""
    for digits in range(1, 7):
        if f"{value:.{digits}f}" != f"{threshold:.{digits}f}":
            return f"{value:.{digits}f}"
    return repr(value)


@dataclass(frozen=True)
class SmokeResult:
    """One of the card's smoke prompts, sent greedy, and what came back."""

    prompt: str
    expect: str | None
    status: str  # pass | fail
    reply: str  # the first 300 characters
    finish_reason: str | None


@dataclass(frozen=True)
class Acceptance:
    """Speculative decoding over the decode phase, as vLLM names it (counter deltas)."""

    drafts: float  # verify passes that carried drafts
    draft_tokens: float
    accepted: float

    @property
    def mean_length(self) -> float | None:
        """vLLM's mean acceptance length: 1 + accepted / drafts (the bonus token counts)."""
        return 1 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def rate(self) -> float | None:
        """Accepted per drafted token (a fraction; vLLM prints it as a percentage)."""
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None


@dataclass(frozen=True)
class Provenance:
    path: str
    sha256: str
    head: str | None
    tree: str | None
    tag: str | None


def read_provenance(path: Path | None) -> Provenance | None:
    """The build's provenance receipt, read by the build stage's one reader."""
    if path is None or not path.is_file():
        return None
    data = read_receipt(path)
    return Provenance(str(path), sha256_file(path), data.head, data.tree, data.tag)


@dataclass(frozen=True)
class Receipt:
    schema: str
    verdict: str  # PASS | FAIL | ERROR
    profile: str
    manifest: Mapping[str, str]
    provenance: Provenance | None
    server: Mapping[str, Any]
    started: str
    seconds: float
    markers: tuple[MarkerResult, ...]
    decode: tuple[DecodeSample, ...]
    summary: Mapping[str, Any]
    concurrency: tuple[ConcurrencyResult, ...]
    needles: tuple[NeedleResult, ...]
    gates: tuple[Gate, ...]
    reference: Mapping[str, str]
    error: str | None = None
    fidelity: FidelityResult | None = None
    serving: Mapping[str, Any] = field(default_factory=dict)  # `vllm bench serve` names
    smoke: tuple[SmokeResult, ...] = ()
    known_issues: tuple[str, ...] = ()  # the card's warnings, carried into the report

    def to_json(self) -> str:
        """Strict JSON: a non-finite float is written as the string "inf", "-inf" or
        "nan" (never a bare Infinity/NaN token); :func:`number` reads them back."""
        data = asdict(self)
        if data.get("fidelity"):
            data["fidelity"].pop("kld", None)  # written beside it as fidelity_kld.f64
            data["fidelity"].pop("flags", None)  # and fidelity_flags.u8
            data["fidelity"].pop("spot_rows", None)  # and fidelity_spot_rows.f32
        return json.dumps(strict(data), indent=2, sort_keys=True, default=str,
                          allow_nan=False) + "\n"  # fmt: skip

    def files(self) -> dict[str, bytes]:
        """The per-position files written beside receipt.json (what its hashes cover)."""
        if self.fidelity is None or not self.fidelity.kld:
            return {}
        kld = self.fidelity.kld
        out = {
            "fidelity_kld.f64": struct.pack(f"<{len(kld)}d", *kld),
            "fidelity_flags.u8": bytes(self.fidelity.flags),
        }
        if self.fidelity.spot_check is not None:
            out["fidelity_spot_rows.f32"] = bytes(self.fidelity.spot_rows)
        return out


def strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its string ("inf", "-inf", "nan")."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def number(value: Any) -> float | None:
    """A figure as :meth:`Receipt.to_json` wrote it: an int or float, or "inf"/"-inf";
    None for anything else (NaN included: never a number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) < 2**1023 else None
    if isinstance(value, float):
        return value if value == value else None
    if value == "inf":
        return math.inf
    if value == "-inf":
        return -math.inf
    return None

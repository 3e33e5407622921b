"""What a gate row is (the :class:`GateRule` Protocol) and what it reads.

In: the measurements of one qualification (:class:`Measured`) or a stored receipt
(:class:`Reading`). Out: :class:`~pinwheel.serve.receipt.Gate` rows, and a status
re-derived from a stored gate's own figures. Standard library only: verify-receipt runs
from the plain install (no numpy).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pinwheel.manifest.serve import FidelityConfig, QualifyProfile
from pinwheel.printable import shown
from pinwheel.serve.receipt import (
    Acceptance,
    ConcurrencyResult,
    DecodeSample,
    FidelityResult,
    Gate,
    MarkerResult,
    NeedleResult,
    SmokeResult,
    Spread,
    holds,
)

OPS = ("<", "<=", ">=")  # the comparisons a stored gate may name (receipt.OPS)


@dataclass(frozen=True)
class Measured:
    """Everything one qualification measured that a gate may read. A gate whose
    manifest key is unset (``prof`` None, no ``fidelity_cfg``) yields no row."""

    prof: QualifyProfile | None = None
    decode: Sequence[DecodeSample] = ()  # every single-stream sample, as measured
    single: Spread | None = None  # single-stream tok/s
    ms_pass: Spread | None = None  # ms per forward pass
    ms_source: str = ""  # which counters gave the passes
    acceptance: Acceptance | None = None
    concurrency: Sequence[ConcurrencyResult] = ()
    needles: Sequence[NeedleResult] = ()
    markers: Sequence[MarkerResult] = ()
    smoke: Sequence[SmokeResult] = ()
    served: tuple[str | None, str | None] = (None, None)  # (manifest's name, server's id)
    fidelity_cfg: FidelityConfig | None = None
    fidelity: FidelityResult | None = None


class Fields(Protocol):
    """Typed reads of a stored receipt; a bad field is a refusal naming it
    (verify-receipt's reader)."""

    def refuse(self, what: str, field: str) -> Exception: ...

    def figure(self, data: Mapping[str, Any], key: str, field: str) -> float: ...


@dataclass(frozen=True)
class Reading:
    """A stored receipt as verify-receipt hands it to a row: the reader, the whole
    receipt and its ``fidelity`` object (None when it has none)."""

    doc: Fields
    data: Mapping[str, Any]
    fid: Mapping[str, Any] | None

    def records(self, key: str) -> list[Any]:
        """The receipt's list ``key`` (needles, smoke, markers); [] when absent."""
        got = self.data.get(key)
        return got if isinstance(got, list) else []


class GateRule(Protocol):
    """One row of the gate table.

    ``key``: the manifest key that turns the gate on (documentation and the table's
    test). ``informational``: the manifest may mark the gate INFO, which verify-receipt
    cannot re-derive (the receipt pins the manifest's hash, not its text) and so keeps.
    """

    @property
    def key(self) -> str: ...

    @property
    def informational(self) -> bool: ...

    def judge(self, m: Measured) -> Iterable[Gate]:
        """The gates this row gives for one qualification (none when its key is unset)."""
        ...

    def owns(self, name: str) -> bool:
        """Whether a stored gate of this name is this row's."""
        ...

    def derive(self, r: Reading, g: Mapping[str, Any], field: str) -> str:
        """The status the stored gate's own figures (or the receipt's records) give."""
        ...


def figure_status(r: Reading, g: Mapping[str, Any], field: str) -> str:
    """``value op limit`` on the stored raw numbers (no value: not measured, FAIL):
    the re-derivation of any gate judged on one figure against one limit."""
    op = g.get("op")
    if op not in OPS:
        raise r.doc.refuse(f"op {shown(op)!r}", field + ".op")
    lim = r.doc.figure(g, "limit", field + ".limit")
    card = None if g.get("value") is None else r.doc.figure(g, "value", field + ".value")
    return "PASS" if holds(card, str(op), lim) else "FAIL"


def same_bits(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b)

"""Gates on the card's own figures: tok/s, ms per pass, speculative acceptance,
aggregate tok/s. Each is ``measured op bound``, the bound widened by the profile's
``tolerance``, or INFO where the manifest marks the figure informational.

One class, one row per figure (``ROWS``): a row names its manifest key, the card
metric, which way is better and how it reads its value from :class:`Measured`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pinwheel.manifest.serve import QualifyProfile
from pinwheel.serve.gates.base import Measured, Reading, figure_status
from pinwheel.serve.receipt import NOT_MEASURABLE, Gate, holds, shown


@dataclass(frozen=True)
class Figure:
    """What a row read: the value (None: not measured) and how the report words it."""

    value: float | None
    detail: str = ""
    name: str = ""  # a name that depends on what was measured ("at 4 streams")


def card_gate(
    prof: QualifyProfile,
    name: str,
    metric: str,
    figure: float,
    measured: float | None,
    *,
    higher_is_better: bool,
    detail: str = "",
    missing: str = "not measured",
    missing_detail: str = "",
) -> Gate:
    """A gate on one of the card's own figures: widened by ``tolerance``, or INFO only."""
    tol = prof.tolerance
    bound = figure * (1 - tol) if higher_is_better else figure * (1 + tol)
    op = ">=" if higher_is_better else "<="
    needs = f"{op} {bound:.6g}" + (f" (card {figure:g}, {tol:.0%} margin)" if tol else "")
    why = prof.is_informational(metric)
    if measured is None or measured != measured:  # not measured, or NaN: never a PASS
        status = "INFO" if why else "FAIL"
        text = missing if measured is None else "NaN"
        return Gate(name, status, text, needs, "; ".join(x for x in (missing_detail, why) if x),
                    None, op, bound)  # fmt: skip
    ok = holds(measured, op, bound)
    status = "INFO" if why else ("PASS" if ok else "FAIL")
    if why:
        detail = f"informational ({'within' if ok else 'outside'} the card's figure): {why}" + (
            f"; {detail}" if detail else ""
        )
    return Gate(name, status, shown(measured, bound), needs, detail, measured, op, bound)


@dataclass(frozen=True)
class CardFigure:
    """One card figure as a gate row (:class:`~pinwheel.serve.gates.base.GateRule`)."""

    key: str  # the [qualify.profile.*] key holding the card's figure
    name: str
    metric: str  # the name `informational` uses
    higher_is_better: bool
    read: Callable[[Measured], Figure]
    missing: str = "not measured"
    missing_detail: str = ""
    informational: bool = True

    def judge(self, m: Measured) -> Iterable[Gate]:
        figure = getattr(m.prof, self.key, None) if m.prof is not None else None
        if m.prof is None or figure is None:
            return ()
        got = self.read(m)
        return (
            card_gate(m.prof, got.name or self.name, self.metric, figure, got.value,
                      higher_is_better=self.higher_is_better, detail=got.detail,
                      missing=self.missing, missing_detail=self.missing_detail),
        )  # fmt: skip

    def owns(self, name: str) -> bool:
        return name == self.name or name.startswith(self.name + " at ")

    def derive(self, r: Reading, g: Mapping[str, Any], field: str) -> str:
        return figure_status(r, g, field)


def _single(m: Measured) -> Figure:
    s = m.single
    return Figure(None) if s is None else Figure(
        s.median, f"median of {s.n}, {s.low:.2f}-{s.high:.2f}")  # fmt: skip


def _ms_pass(m: Measured) -> Figure:
    s = m.ms_pass
    if s is None:
        return Figure(None)
    source = f"; passes from {m.ms_source}" if m.ms_source else ""
    return Figure(s.median, f"median of {s.n}, {s.low:.2f}-{s.high:.2f}" + source)


def _spec_detail(m: Measured) -> str:
    a = m.acceptance
    if a is None:
        return ""
    return (f"{a.accepted:.0f} accepted / {a.drafts:.0f} drafts / "
            f"{a.draft_tokens:.0f} draft tokens")  # fmt: skip


def _acceptance_length(m: Measured) -> Figure:
    return Figure(m.acceptance.mean_length if m.acceptance else None, _spec_detail(m))


def _acceptance_rate(m: Measured) -> Figure:
    return Figure(m.acceptance.rate if m.acceptance else None, _spec_detail(m))


def _aggregate(m: Measured) -> Figure:
    top = max(m.concurrency, key=lambda c: c.streams, default=None)
    if top is None or top.streams < 2:
        return Figure(None)
    return Figure(top.aggregate_tok_s, name=f"aggregate tok/s at {top.streams} streams")


NO_SPEC = "the server exposed no spec-decode counters (vllm:spec_decode_*)"

TOK_S = CardFigure("min_tok_s", "single-stream tok/s", "tok_s", True, _single)
MS_PER_PASS = CardFigure(
    "max_ms_per_pass", "ms per forward pass", "ms_per_pass", False, _ms_pass,
    missing=NOT_MEASURABLE, missing_detail="the server exposed no step counter "
    "(vllm:iteration_tokens_total) and no spec-decode drafts",
)  # fmt: skip
ACCEPTANCE_LENGTH = CardFigure(
    "min_acceptance_length", "mean acceptance length (1 + accepted/drafts)",
    "acceptance_length", True, _acceptance_length, missing_detail=NO_SPEC,
)  # fmt: skip
ACCEPTANCE_RATE = CardFigure(
    "min_acceptance_rate", "draft acceptance rate (accepted/draft tokens)",
    "acceptance_rate", True, _acceptance_rate, missing_detail=NO_SPEC,
)  # fmt: skip
AGGREGATE = CardFigure("min_aggregate_tok_s", "aggregate tok/s", "aggregate_tok_s", True,
                       _aggregate)  # fmt: skip

"""The fidelity gates: mean KLD and top-1 agreement over the panel, and the in-process
scorer's spot-check (:mod:`pinwheel.serve.fidelity`, :mod:`pinwheel.serve.inprocess`).

``max_mean_kld`` PASSes only on the exact KLD: a lower bound FAILs it when the bound
already breaks the limit and leaves it NOT PROVEN (a failure) otherwise. ``tolerance``
widens a gate that is a card's own measurement (never a strict gate); without a pinned
panel (FILL IN) the gates SKIP with the reason: never PASS. No measurement, a NaN, or
fewer positions than the panel holds: FAIL (:func:`pinwheel.serve.receipt.fidelity_status`,
which verify-receipt also runs). No numpy here: verify-receipt imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pinwheel.manifest.serve import FidelityConfig
from pinwheel.printable import shown
from pinwheel.serve.gates.base import Measured, Reading, same_bits
from pinwheel.serve.receipt import FidelityResult, Gate, fidelity_status, spot_status

MEAN_GATE = "fidelity mean KLD (nats)"
TOP1_GATE = "fidelity top-1 agreement"
SPOT_GATE = "fidelity spot-check (engine values vs its full rows)"
FILL_IN = "FILL IN: the card's panel and teacher are not pinned in [qualify.fidelity]"


@dataclass(frozen=True)
class FidelityFigure:
    """Mean KLD (``<``/``<=``, exact figures only) or top-1 agreement (``>=``)."""

    key: str  # the [qualify.fidelity] key holding the card's figure
    name: str
    receipt_key: str  # the figure in the receipt's "fidelity" object
    ops: tuple[str, ...]  # the comparisons a stored gate of this row may name
    informational: bool = False

    @property
    def mean(self) -> bool:
        return self.receipt_key == "mean_kld"

    def judge(self, m: Measured) -> Iterable[Gate]:
        cfg = m.fidelity_cfg
        figure = getattr(cfg, self.key, None) if cfg is not None else None
        if cfg is None or figure is None:
            return ()
        if self.mean:
            t = figure if cfg.strict else figure * (1 + cfg.tolerance)
            op = "<" if cfg.strict else "<="
            needs = f"{op} {t:.6g}" + _card(figure, cfg.tolerance, cfg.strict)
        else:
            t, op = figure * (1 - cfg.tolerance), ">="
            needs = f">= {t:.6g}" + _card(figure, cfg.tolerance, False)
        return (self._gate(cfg, m.fidelity, op, t, needs),)

    def _gate(self, cfg: FidelityConfig, result: FidelityResult | None, op: str,
              limit: float, needs: str) -> Gate:  # fmt: skip
        if cfg.panel is None:
            return Gate(self.name, "SKIP", "not measured", needs, FILL_IN, None, op, limit)
        if result is None:
            return Gate(self.name, "FAIL", "not measured", needs, "", None, op, limit)
        value = result.mean_kld if self.mean else result.top1
        status = fidelity_status(value, op, limit, result.bound if self.mean else "exact",
                                 result.positions, result.panel_positions)  # fmt: skip
        measured, detail = repr(value), _detail(result, self.mean)
        if self.mean and result.bound != "exact":
            measured = f">= {value!r} (lower bound)"
            detail = (
                "the lower bound already breaks the limit; " if status == "FAIL" else
                "a top-K figure is only a lower bound of the KLD: it can prove a "
                "FAIL, never a PASS; score full-vocabulary rows (top_k = -1, a "
                "teacher with full rows; qualify starts vLLM with --max-logprobs -1); "
            ) + detail  # fmt: skip
        return Gate(self.name, status, measured, needs, detail, value, op, limit)

    def owns(self, name: str) -> bool:
        return name == self.name

    def derive(self, r: Reading, g: Mapping[str, Any], field: str) -> str:
        fid, op = r.fid, g.get("op")
        if fid is None:  # not measured: FAIL, or SKIP where the panel is not pinned
            return "SKIP" if g.get("status") == "SKIP" else "FAIL"
        lim = r.doc.figure(g, "limit", field + ".limit")
        if op not in self.ops:
            raise r.doc.refuse(f"op {shown(op)!r}", field + ".op")
        value = r.doc.figure(g, "value", field + ".value")
        mine = r.doc.figure(fid, self.receipt_key, field + ".value")
        if not same_bits(value, mine):
            return f"(value {value!r} is not the receipt's figure {mine!r})"
        bound = str(fid.get("bound")) if self.mean else "exact"
        return fidelity_status(value, str(op), lim, bound, int(fid["positions"]),
                               int(fid.get("panel_positions") or 0))  # fmt: skip


def _detail(result: FidelityResult, mean: bool) -> str:
    detail = (
        f"{result.method}, {result.positions} positions, 95% CI "
        f"{result.ci95[0]:.3e}-{result.ci95[1]:.3e}"
        if mean
        else f"{_agreeing(result)}/{result.positions} positions; "
        f"{result.top1_ties} with a tied maximum (ties go to the lowest token id)"
    )
    if result.positions < result.panel_positions:
        detail = f"{result.positions} of the panel's {result.panel_positions} positions; " + detail
    return detail


def _agreeing(result: FidelityResult) -> str:
    n = result.top1 * result.positions
    return str(round(n)) if n == n and abs(n) != float("inf") else repr(n)


def _card(figure: float, tolerance: float, strict: bool) -> str:
    if strict or not tolerance:
        return ""
    return f" (card {figure:g}, {tolerance:.0%} margin)"


def spot_gate(spot: Mapping[str, Any] | None) -> Gate:
    """PASS only when the engine's records equal detkl on the engine's own full rows at
    every sampled position (and at least one position was sampled)."""
    status = spot_status(spot)
    if spot is None:
        return Gate(SPOT_GATE, status, "not measured", "0 differences", "no spot-check ran")
    bad = spot.get("differ")
    size = spot.get("size")
    detail = (
        f"{size} positions sampled after the engine answered (seed {spot.get('seed')}); an "
        f"engine wrong at a fraction f of positions escapes with probability <= (1-f)^{size}"
    )
    if isinstance(bad, list) and bad:
        detail = f"differ at positions {bad[:10]}: tampering or a scorer bug; " + detail
    return Gate(SPOT_GATE, status, f"{len(bad) if isinstance(bad, list) else '?'} differences",
                "0 differences", detail)  # fmt: skip


class SpotCheck:
    """In-process scorer only: the engine's figures against detkl on its own full rows."""

    key = "[qualify.fidelity] scorer = \"in-process\""
    informational = False

    def judge(self, m: Measured) -> Iterable[Gate]:
        cfg = m.fidelity_cfg
        if cfg is None or cfg.scorer != "in-process" or cfg.panel is None:
            return ()
        return (spot_gate(m.fidelity.spot_check if m.fidelity is not None else None),)

    def owns(self, name: str) -> bool:
        return name == SPOT_GATE

    def derive(self, r: Reading, g: Mapping[str, Any], field: str) -> str:
        return spot_status(r.fid.get("spot_check") if r.fid is not None else None)


MEAN = FidelityFigure("max_mean_kld", MEAN_GATE, "mean_kld", ("<", "<="))
TOP1 = FidelityFigure("min_top1", TOP1_GATE, "top1", (">=",))
SPOT = SpotCheck()

"""The gate table and its one loop, for the writer and for verify-receipt.

``GATES`` lists every row in the order the receipt and report show them. A new gate
is a module with its row class (the :class:`~pinwheel.serve.gates.base.GateRule`
Protocol) and one row here; the receipt, the report's gate table, the verdict, the CLI's
exit code and verify-receipt's re-derivation all come from this loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pinwheel.printable import shown
from pinwheel.serve.gates import card, fidelity, records
from pinwheel.serve.gates.base import GateRule, Measured, Reading, figure_status
from pinwheel.serve.receipt import Gate

GATES: tuple[GateRule, ...] = (
    card.TOK_S,
    card.MS_PER_PASS,
    card.ACCEPTANCE_LENGTH,
    card.ACCEPTANCE_RATE,
    card.AGGREGATE,
    records.NEEDLE,
    records.SERVED_NAME,
    records.SMOKE,
    records.MARKER,
    fidelity.MEAN,
    fidelity.TOP1,
    fidelity.SPOT,
)


def judge(m: Measured) -> tuple[Gate, ...]:
    """Every row's gates on raw numbers (a miss is FAIL, never rounded); INFO gates
    never fail a run."""
    return tuple(gate for rule in GATES for gate in rule.judge(m))


def owner(name: str) -> GateRule | None:
    """The row a stored gate of this name belongs to."""
    return next((rule for rule in GATES if rule.owns(name)), None)


def derive(r: Reading, g: Mapping[str, Any], name: str, field: str) -> tuple[str, bool]:
    """(the status the stored gate's figures give, whether a stored INFO is kept).

    A gate no row owns that carries ``value op limit`` is re-derived from them (a card
    figure under an older name); any other is refused: verify-receipt cannot re-derive it.
    """
    rule = owner(name)
    if rule is not None:
        return rule.derive(r, g, field), rule.informational and bool(g.get("op"))
    if g.get("op"):
        return figure_status(r, g, field), True
    raise r.doc.refuse(f"{shown(name)[:80]!r}: a gate verify-receipt cannot re-derive", field)

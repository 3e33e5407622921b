"""Calibration of `pinwheel attribute`'s statistics on simulated runs with known effects.

For each scenario of bench/pairsim.py (no effect; a per-start offset of 1 sigma; 1/2/3
pairs; heavy tails; drift; order effects over four steps), over ``--seeds`` simulated runs:
how often comparison 1 reports an effect where there is none (nominal 5%), how often any
of the four steps does (family-wise), how often its interval holds the true effect
(nominal 95%, a true effect of 1 sigma), and how often the design is too small for a
verdict. ``--method before`` is the analysis before issue 50 (every sample a pair,
bootstrap over them, forward/reverse rounds), ``after`` today's (t over starts, Holm,
Williams order), ``cluster`` a bootstrap over rounds (the alternative measured),
``uncorrected`` today's without Holm; ``before-verbatim`` the old pure-Python code itself
(slow: the check of ``before``, which computes the same in numpy).

    python bench/attribute_calibration.py --method after --seeds 2000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]

from pairsim import (  # noqa: E402
    after,
    balanced,
    before,
    before_verbatim,
    cluster_bootstrap,
    forward_reverse,
    rates,
    scenarios,
    uncorrected,
)

METHODS = {
    "before": (before, forward_reverse, "before"),
    "before-verbatim": (before_verbatim, forward_reverse, "before"),
    "after": (after, balanced, "after"),
    "cluster": (cluster_bootstrap, balanced, "after"),
    "uncorrected": (uncorrected, balanced, "after"),
}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", choices=sorted(METHODS), default="after")
    ap.add_argument("--seeds", type=int, default=2000)
    ap.add_argument("--only", default=None, help="scenarios whose name contains this")
    args = ap.parse_args()
    analysis, order, design = METHODS[args.method]
    print(f"method {args.method}, {args.seeds} seeds per scenario and per rate")
    print("| scenario | design | effect reported, no effect | any of 4 steps | CI covers "
          "true effect | no verdict |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for sc in scenarios(design):
        if args.only and args.only not in sc.name:
            continue
        started = time.monotonic()
        r = rates(sc, analysis, order, args.seeds)
        print(
            f"| {sc.name} | {sc.variants} variants x {sc.rounds} rounds x {sc.samples} samples "
            f"| {pct(r.positive)} | {pct(r.familywise)} | {pct(r.coverage)} | "
            f"{pct(r.no_verdict)} |",
            flush=True,
        )
        print(f"<!-- {time.monotonic() - started:.1f} s -->", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

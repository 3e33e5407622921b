"""Serving statistics the way ``vllm bench serve`` reports them, from timed streams.

In: streamed replies (:class:`~pinwheel.serve.client.Stream`), the wall time
they ran in, optional SLOs and spec-decode counter deltas. Out: a flat dict
whose keys match ``vllm bench serve``'s result JSON where they mean the same
thing, computed as vLLM 0.32 computes them (``vllm/benchmarks/serve.py``
``calculate_metrics`` and ``benchmarks/lib/endpoint_request_func.py``):

- every chunk with a non-empty ``choices`` is timed (the role chunk and the
  finish chunk too, not the usage-only chunk): ``ttft`` = first such chunk -
  request sent; ``e2el`` = last such chunk - sent; ``itl`` = every gap between
  them; ``tpot`` per request = (e2el - ttft) / (output tokens - 1), only for
  requests with more than one output token;
- ``mean_X_ms`` = ``np.mean(seconds) * 1000``, likewise ``median``, ``std``
  (population), ``p90``/``p99`` (``np.percentile``, linear); an empty list counts
  as ``[0]``;
- a reply with no chunk carrying ``choices`` (a server error before the first
  token) is a failed request, as vLLM marks it (``success = False``, "Never
  received a valid chunk to calculate TTFT"): counted in ``failed``, left out of
  every latency list, of the throughputs and of goodput;
- ``duration``, ``completed``, ``failed``, ``total_output_tokens``, ``request_throughput``,
  ``output_throughput`` (tokens / duration), ``request_goodput`` (requests
  meeting every SLO / duration; None without SLOs);
- goodput: a request is good when ``slo_ms / 1000 >= value`` (seconds) for each
  SLO; a request with at most one output token has TPOT 0 there (vLLM's rule);
- ``spec_decode_acceptance_rate`` (percent), ``spec_decode_acceptance_length``
  (vLLM's "mean acceptance length": 1 + accepted / drafts),
  ``spec_decode_num_drafts``, ``spec_decode_draft_tokens``,
  ``spec_decode_accepted_tokens``, ``spec_decode_per_position_acceptance_rates``
  (accepted at draft position i / drafts).

numpy computes the figures when it is installed (the ``qualify`` extra), as vLLM
does; without it, the same formulas in Python agree to rounding (``statistics``
names which).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pinwheel.manifest.serve import Slo

PERCENTILES = (90, 99)
MS = 1000.0  # vLLM's MILLISECONDS_TO_SECONDS_CONVERSION


def percentile(values: Sequence[float], p: float) -> float:
    """numpy.percentile's default (linear interpolation between closest ranks)."""
    xs = sorted(values)
    if not xs:
        return 0.0
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def describe(name: str, seconds: Sequence[float]) -> dict[str, float]:
    """``np.mean(seconds or 0) * 1000`` and friends, exactly as vLLM computes them."""
    np = _numpy()
    xs: Sequence[float] = list(seconds) or [0.0]
    if np is not None:
        out = {
            f"mean_{name}_ms": float(np.mean(xs) * MS),
            f"median_{name}_ms": float(np.median(xs) * MS),
            f"std_{name}_ms": float(np.std(xs) * MS),
        }
        for p in PERCENTILES:
            out[f"p{p}_{name}_ms"] = float(np.percentile(xs, p) * MS)
        return out
    out = {
        f"mean_{name}_ms": statistics.fmean(xs) * MS,
        f"median_{name}_ms": statistics.median(xs) * MS,
        f"std_{name}_ms": statistics.pstdev(xs) * MS,
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = percentile(xs, p) * MS
    return out


def per_request(stream: Any) -> dict[str, Any]:
    """One request's figures as vLLM takes them from the same chunks."""
    tokens = int(stream.completion_tokens)
    ttft = float(stream.bench_ttft_s)
    e2el = float(stream.bench_latency_s)
    tpot = (e2el - ttft) / (tokens - 1) if tokens > 1 else None
    return {
        "ttft": ttft,
        "tpot": tpot,  # None: not in the TPOT statistics; 0 for goodput (vLLM)
        "e2el": e2el,
        "itl": list(stream.bench_itl_s),
        "output_tokens": tokens,
    }


def succeeded(stream: Any) -> bool:
    """vLLM's ``success``: at least one chunk with ``choices`` came."""
    return bool(stream.choice_times)


def serving_stats(
    streams: Sequence[Any],
    duration_s: float,
    slo: Slo | None = None,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    reqs = [per_request(s) for s in streams if succeeded(s)]
    total = sum(r["output_tokens"] for r in reqs)
    out: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(reqs),
        "failed": len(streams) - len(reqs),
        "total_output_tokens": total,
        "request_throughput": len(reqs) / duration_s if duration_s > 0 else 0.0,
        "output_throughput": total / duration_s if duration_s > 0 else 0.0,
    }
    out |= describe("ttft", [r["ttft"] for r in reqs])
    out |= describe("tpot", [r["tpot"] for r in reqs if r["tpot"] is not None])
    out |= describe("itl", [gap for r in reqs for gap in r["itl"]])
    out |= describe("e2el", [r["e2el"] for r in reqs])
    out["statistics"] = "numpy" if _numpy() is not None else "python"
    out["request_goodput"] = None
    if slo is not None and any(v is not None for v in vars(slo).values()):
        good = sum(1 for r in reqs if meets(r, slo))
        out["request_goodput"] = good / duration_s if duration_s > 0 else 0.0
        out["goodput_slo_ms"] = {k: v for k, v in vars(slo).items() if v is not None}
        out["good_requests"] = good
    if spec:
        out |= spec
    out["ttfts"] = [r["ttft"] for r in reqs]
    out["itls"] = [r["itl"] for r in reqs]
    out["latencies"] = [r["e2el"] for r in reqs]
    out["output_lens"] = [r["output_tokens"] for r in reqs]
    return out


def meets(req: Mapping[str, Any], slo: Slo) -> bool:
    """vLLM's goodput test: ``slo_ms / 1000 >= value`` in seconds; TPOT 0 for <= 1 token."""
    for key, limit in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2el", slo.e2el_ms)):
        if limit is None:
            continue
        value = req[key] if req[key] is not None else 0.0
        if not limit / MS >= value:
            return False
    return True


def spec_decode_stats(
    drafts: float, draft_tokens: float, accepted: float, per_pos: Mapping[str, float]
) -> dict[str, Any]:
    """vLLM's spec-decode summary from counter deltas (empty when nothing was drafted)."""
    if draft_tokens <= 0:
        return {}
    return {
        "spec_decode_acceptance_rate": accepted / draft_tokens * 100.0,
        "spec_decode_acceptance_length": 1 + accepted / drafts if drafts > 0 else 0.0,
        "spec_decode_num_drafts": int(drafts),
        "spec_decode_draft_tokens": int(draft_tokens),
        "spec_decode_accepted_tokens": int(accepted),
        "spec_decode_per_position_acceptance_rates": [
            per_pos[k] / drafts if drafts > 0 else 0.0
            for k in sorted(per_pos, key=lambda k: int(k) if k.isdigit() else k)
        ],
    }

"""Serving statistics the way ``vllm bench serve`` reports them, from timed streams.

In: streamed replies (:class:`~pinwheel.serve.client.Stream`), the wall time
they ran in, optional SLOs and spec-decode counter deltas. Out: a flat dict
whose keys match ``vllm bench serve``'s result JSON where they mean the same
thing (vLLM 0.32, ``vllm/benchmarks/serve.py``):

- ``ttft`` = first text chunk - request sent; ``e2el`` = last chunk - sent;
  ``tpot`` per request = (e2el - ttft) / (output tokens - 1);
  ``itl`` = every gap between text chunks (several tokens per chunk under
  spec decode, as vLLM counts them);
- ``mean_X_ms``, ``median_X_ms``, ``std_X_ms`` (population), ``p90_X_ms``,
  ``p99_X_ms`` (numpy's linear percentile, which vLLM uses);
- ``duration``, ``completed``, ``total_output_tokens``, ``request_throughput``,
  ``output_throughput`` (tokens / duration), ``request_goodput`` (requests
  meeting every SLO / duration; None without SLOs, as vLLM writes it);
- ``spec_decode_acceptance_rate`` (percent), ``spec_decode_acceptance_length``,
  ``spec_decode_num_drafts``, ``spec_decode_draft_tokens``,
  ``spec_decode_accepted_tokens``, ``spec_decode_per_position_acceptance_rates``.

Goodput: vLLM counts a request good when each SLO >= its value (ttft, tpot, e2el).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pinwheel.manifest.serve import Slo

PERCENTILES = (90, 99)


def percentile(values: Sequence[float], p: float) -> float:
    """numpy.percentile's default (linear interpolation between closest ranks)."""
    xs = sorted(values)
    if not xs:
        return 0.0
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def describe(name: str, seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000.0 for s in seconds] or [0.0]  # vLLM reports 0 for an empty list
    out = {
        f"mean_{name}_ms": statistics.fmean(ms),
        f"median_{name}_ms": statistics.median(ms),
        f"std_{name}_ms": statistics.pstdev(ms),
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = percentile(ms, p)
    return out


def per_request(stream: Any) -> dict[str, Any]:
    tokens = int(stream.completion_tokens)
    tpot = (stream.e2el_s - stream.ttft_s) / (tokens - 1) if tokens > 1 else None
    return {
        "ttft": stream.ttft_s,
        "tpot": tpot,
        "e2el": stream.e2el_s,
        "itl": list(stream.itl_s),
        "output_tokens": tokens,
    }


def serving_stats(
    streams: Sequence[Any],
    duration_s: float,
    slo: Slo | None = None,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    reqs = [per_request(s) for s in streams]
    total = sum(r["output_tokens"] for r in reqs)
    out: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(reqs),
        "total_output_tokens": total,
        "request_throughput": len(reqs) / duration_s if duration_s > 0 else 0.0,
        "output_throughput": total / duration_s if duration_s > 0 else 0.0,
    }
    out |= describe("ttft", [r["ttft"] for r in reqs])
    out |= describe("tpot", [r["tpot"] for r in reqs if r["tpot"] is not None])
    out |= describe("itl", [gap for r in reqs for gap in r["itl"]])
    out |= describe("e2el", [r["e2el"] for r in reqs])
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
    for key, limit in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2el", slo.e2el_ms)):
        if limit is None:
            continue
        value = req[key]
        if value is None or value * 1000.0 > limit:
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

"""Serving statistics as `vllm bench serve` computes them, from the same streamed chunks.

The chunks are a vLLM-shaped chat stream (role chunk, text chunks, a finish chunk,
a usage-only chunk, [DONE]) read by the real parser, ``client.read_stream``, with a
clock that ticks once per event so every timestamp is known. The expected values
follow vLLM 0.32's rules (vllm/benchmarks/lib/endpoint_request_func.py and
serve.py calculate_metrics), written out by hand below.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from pinwheel.manifest.serve import Slo
from pinwheel.serve import client, stats


def _sse(events: list[dict]) -> io.BytesIO:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return io.BytesIO(body + b"data: [DONE]\n\n")


def _chat(texts: list[str], tokens: int) -> list[dict]:
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    text = [{"choices": [{"index": 0, "delta": {"content": t}}]} for t in texts]
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}
    return [role, *text, finish, usage]


def _read(events: list[dict], start: float, monkeypatch) -> client.Stream:
    ticks = iter(float(start + 1 + i) for i in range(len(events)))  # event i at start + 1 + i
    monkeypatch.setattr(client.time, "perf_counter", lambda: next(ticks))
    return client.read_stream(_sse(events), start, on_error=RuntimeError, close=lambda: None)


def test_every_chunk_with_choices_is_timed_as_vllm_does(monkeypatch):
    # events: role @1, "a" @2, "b" @3, "c" @4, finish @5, usage @6 (no choices: not timed)
    s = _read(_chat(["a", "b", "c"], tokens=3), 0.0, monkeypatch)
    assert s.text == "abc" and s.completion_tokens == 3
    out = stats.serving_stats([s], 10.0)
    # vLLM: ttft = role chunk (1 s); latency = finish chunk (5 s); itl = 1,1,1,1 s
    assert out["ttfts"] == [1.0] and out["latencies"] == [5.0]
    assert out["itls"] == [[1.0, 1.0, 1.0, 1.0]]
    assert out["mean_tpot_ms"] == (5.0 - 1.0) / (3 - 1) * 1000  # old code: (4-2)/2 s
    assert out["mean_ttft_ms"] == 1000.0 and out["mean_e2el_ms"] == 5000.0


def test_a_request_with_one_output_token_is_good_with_tpot_zero(monkeypatch):
    one = _read(_chat(["a"], tokens=1), 0.0, monkeypatch)
    two = _read(_chat(["a", "b"], tokens=2), 10.0, monkeypatch)
    out = stats.serving_stats([one, two], 20.0, Slo(tpot_ms=5000.0))
    # vLLM: the 1-token request has TPOT 0 for goodput (old code: no TPOT -> not good),
    # and stays out of the TPOT statistics
    assert out["good_requests"] == 2 and out["request_goodput"] == 2 / 20.0
    assert out["mean_tpot_ms"] == (4.0 - 1.0) / 1 * 1000  # only the 2-token request


def test_goodput_compares_seconds_as_vllm_does():
    # 0.043000000000000003 s vs a 43 ms SLO: vLLM (43 / 1000 >= value) says not good;
    # comparing value * 1000 <= 43 (old code) says good.
    req = {"ttft": 0.043000000000000003, "tpot": None, "e2el": 0.05, "itl": []}
    assert not stats.meets(req, Slo(ttft_ms=43.0))
    assert stats.meets(req | {"ttft": 0.043}, Slo(ttft_ms=43.0))


def test_statistics_are_numpy_in_seconds_times_1000(monkeypatch):
    streams = [
        _read(_chat(["x"] * n, tokens=n), float(10 * i), monkeypatch)
        for i, n in enumerate((3, 5, 2, 7))
    ]
    out = stats.serving_stats(streams, 40.0)
    ttfts = [s.choice_times[0] - s.started for s in streams]
    e2els = [s.choice_times[-1] - s.started for s in streams]
    tpots = [(e - t) / (s.completion_tokens - 1) for s, t, e in zip(streams, ttfts, e2els,
                                                                    strict=True)]  # fmt: skip
    itls = [b - a for s in streams for a, b in zip(s.choice_times, s.choice_times[1:],
                                                   strict=False)]  # fmt: skip
    for name, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        assert out[f"mean_{name}_ms"] == np.mean(xs) * 1000  # bit for bit, as vLLM
        assert out[f"std_{name}_ms"] == np.std(xs) * 1000
        assert out[f"median_{name}_ms"] == np.median(xs) * 1000
        assert out[f"p99_{name}_ms"] == np.percentile(xs, 99) * 1000
    assert out["statistics"] == "numpy"
    assert out["output_throughput"] == sum((3, 5, 2, 7)) / 40.0


def test_empty_lists_count_as_zero_like_vllm(monkeypatch):
    one = _read(_chat(["a"], tokens=1), 0.0, monkeypatch)
    out = stats.serving_stats([one], 1.0)
    assert out["mean_tpot_ms"] == 0.0 and out["p99_tpot_ms"] == 0.0  # np.mean(0) * 1000
    assert not math.isnan(out["std_tpot_ms"])


def test_spec_decode_names_and_mean_acceptance_length():
    spec = stats.spec_decode_stats(10, 30, 15, {"0": 8, "1": 5, "2": 2})
    assert spec["spec_decode_acceptance_rate"] == 50.0
    assert spec["spec_decode_acceptance_length"] == 2.5  # 1 + accepted / drafts
    assert spec["spec_decode_per_position_acceptance_rates"] == [0.8, 0.5, 0.2]


@pytest.mark.parametrize("with_numpy", [True, False])
def test_the_python_fallback_agrees_to_rounding(monkeypatch, with_numpy):
    xs = [0.1, 0.25, 0.125, 0.3, 0.7]
    if not with_numpy:
        monkeypatch.setattr(stats, "_numpy", lambda: None)
    d = stats.describe("ttft", xs)
    assert d["mean_ttft_ms"] == pytest.approx(np.mean(xs) * 1000, rel=1e-15)
    assert d["p90_ttft_ms"] == pytest.approx(np.percentile(xs, 90) * 1000, rel=1e-15)


# --------------------------------------------------------------------------- acceptance


def _manifest(tmp_path, profile_lines: str):
    from pinwheel.manifest import model as manifest

    path = tmp_path / "m.toml"
    path.write_text(
        '[manifest]\nname = "x"\n[upstream]\nurl = "https://example.com/x.git"\n'
        f'commit = "{"c" * 40}"\nbranch = "main"\n[qualify]\nprompts = ["hi"]\n'
        f"[qualify.profile.p]\nconcurrency = [1]\n{profile_lines}\n"
    )
    return manifest.load(path).require("qualify").profile("p")


@pytest.mark.parametrize(
    ("line", "new"),
    [
        ("reference = { accepted_per_pass = 2.79 }", "acceptance_length"),
        ("min_accepted_per_pass = 2.0", "min_acceptance_length"),
    ],
)
def test_the_old_acceptance_key_is_refused_with_its_new_name(tmp_path, line, new):
    from pinwheel.errors import ManifestError

    with pytest.raises(ManifestError, match=f"renamed to '{new}'") as err:
        _manifest(tmp_path, line)
    assert "1 + accepted / drafts" in str(err.value)


def test_decode_runs_report_vllms_mean_acceptance_length(tmp_path):
    from pinwheel.serve.qualify import _summary
    from pinwheel.serve.receipt import DecodeSample

    # two decode runs: 10 drafts / 14 accepted and 6 drafts / 10 accepted -> 1 + 24/16 = 2.5
    runs = [
        DecodeSample(
            0,
            r,
            32,
            0.1,
            1.0,
            31.0,
            10,
            "spec-decode drafts",
            100.0,
            d,
            3 * d,
            a,
            1 + a / d,
            {"0": a / 2, "1": a / 2},
        )  # fmt: skip
        for r, (d, a) in enumerate(((10.0, 14.0), (6.0, 10.0)))
    ]
    s = _summary(runs, None, None)
    assert s["mean_acceptance_length"] == 2.5  # accepted / drafts (old "per pass") is 1.5
    assert s["acceptance_length"]["median"] == pytest.approx((2.4 + 1 + 10 / 6) / 2)
    assert s["per_position_acceptance_rates"] == [12 / 16, 12 / 16]
    assert s["acceptance_rate"] == 24 / 48


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_goodput_slo_that_is_not_finite_is_refused_at_load(tmp_path, value):
    # nan: no request is ever good; inf: every request is. Every manifest float is finite.
    from pinwheel.errors import ManifestError
    from pinwheel.manifest import model as manifest

    path = tmp_path / "m.toml"
    path.write_text(
        '[manifest]\nname = "x"\n[upstream]\nurl = "https://example.com/x.git"\n'
        f'commit = "{"c" * 40}"\nbranch = "main"\n[qualify]\nprompts = ["hi"]\n'
        f"slo = {{ ttft_ms = {value} }}\n[qualify.profile.p]\nconcurrency = [1]\n"
    )
    with pytest.raises(ManifestError, match="finite") as err:
        manifest.load(path).require("qualify")
    assert "ttft_ms" in str(err.value.where)

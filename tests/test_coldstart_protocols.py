"""Cold starts judged by the protocol each SM120 figure was measured under (card 004).

The card's own recorded runs go through the real :func:`coldstarts.run` (the start,
wait and measure callables hand back the card's recorded figures; no server runs):

- FP8, served, v44 TP2/DCP1 eager no-MTP (lines 153-163): five runs that DIFFER
  (0.024016412384 to 0.024882931269, population stddev 0.000326156681); the card
  passes them by the five-run mean and every run below 0.06. The mean protocol PASSes
  them; the hash protocol (the gate `cold_starts = 5` used to apply) FAILs the card's
  own passing runs.
- NVFP4, served, v44 (lines 165-176): one tokenwise SHA-256 for all five, mean
  0.06053485053836315: the card discloses it as a failure of its < 0.06 gate, and so
  does the hash protocol with the bound.
- The custom Transformers TP2 runtime's 25-window panel (lines 9-17): one hash, PASS.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from pinwheel.manifest import model as manifest
from pinwheel.serve import coldstarts
from pinwheel.serve.receipt import FidelityResult

ROOT = Path(__file__).resolve().parent.parent
SM120 = ROOT / "recipes" / "sm120-tp2" / "manifest.toml"

# card 004 lines 155-159: "Run | Mean teacher KLD" (v44, TP2/DCP1/eager/no-MTP, fp8_ds_mla)
FP8_V44 = (0.024566116964, 0.024849557477, 0.024882931269, 0.024016412384, 0.024827864889)
NVFP4_V44 = 0.06053485053836315  # line 169, five runs
NVFP4_V44_SHA = "03dc42308d83b9f64e04c101253a5e316dd21f1e55332a9d63c36fabac7b156e"  # line 173
PANEL = 0.024554564249958  # lines 11-15, the Transformers TP2 runtime, 51,175 positions


def _result(mean: float, positions: int, sha: str | None = None) -> FidelityResult:
    """A recorded run. The card gives no per-run hash for the FP8 runs: their values
    differ (their means do), so each gets the hash of its own mean's text."""
    sha = sha or hashlib.sha256(repr(mean).encode()).hexdigest()
    return FidelityResult(
        mean_kld=mean, ci95=(mean, mean), median=mean, p99=mean, max=mean, top1=0.9,
        positions=positions, windows=1, method="full", kld_sha256=sha, panel_sha256="p",
        teacher_sha256="t", teacher_source="card 004", top_k=-1, ci_method="-",
        kld_f64_sha256=sha, scorer="recorded",
    )  # fmt: skip


def replay(results: list[FidelityResult], protocol: coldstarts.Protocol):
    """coldstarts.run over recorded runs: start i hands back the card's run i."""

    @contextlib.contextmanager
    def start(i: int) -> Iterator[FidelityResult]:
        yield results[i - 1]

    return coldstarts.run(start, lambda r: r, lambda r: 0.0, protocol)


def _protocol(name: str, starts: int = 5) -> coldstarts.Protocol:
    return coldstarts.Protocol(name, starts, max_mean_kld=0.06, strict=True)


def test_the_cards_fp8_runs_pass_by_the_mean_and_fail_by_one_hash():
    runs = [_result(v, 2047) for v in FP8_V44]
    by_mean = replay(runs, _protocol("mean"))
    assert by_mean.ok and by_mean.protocol == "mean"
    # line 161 "five-run mean is 0.024628576596" (the card's runs carry more digits than shown)
    assert abs(by_mean.mean_kld - 0.024628576596) < 1e-12
    assert round(by_mean.stddev, 12) == 0.000326156681  # line 162 "population standard deviation"
    assert "5 of 5 runs < 0.06" in by_mean.gate.measured
    by_hash = replay(runs, _protocol("hash"))
    assert not by_hash.ok and by_hash.gate.measured.startswith("5 distinct hash(es)")


def test_a_run_over_the_bound_fails_the_mean_protocol_even_when_the_mean_passes():
    runs = [_result(v, 2047) for v in (0.01, 0.01, 0.01, 0.01, 0.061)]  # mean 0.0202
    out = replay(runs, _protocol("mean"))
    assert not out.ok and "runs over the bound: 5" in out.gate.detail
    assert "4 of 5 runs < 0.06" in out.gate.measured


def test_the_cards_nvfp4_runs_share_one_hash_and_fail_the_bound_as_the_card_discloses():
    runs = [_result(NVFP4_V44, 2047, NVFP4_V44_SHA) for _ in range(5)]
    out = replay(runs, _protocol("hash"))
    assert out.stddev == 0.0 and not out.ok
    assert out.gate.measured == "1 distinct hash(es) over 5 starts, mean 0.060534850538"
    below = [_result(0.054757372223, 2047, "b" * 64) for _ in range(5)]  # v71, line 117
    assert replay(below, _protocol("hash")).ok


def test_the_transformers_panel_passes_by_one_hash():
    runs = [_result(PANEL, 51175, "e" * 64) for _ in range(5)]
    out = replay(runs, _protocol("hash"))
    assert out.ok and out.gate.measured.startswith("1 distinct hash(es) over 5 starts")


def test_one_start_is_no_cold_start_check():
    with pytest.raises(coldstarts.UsageError, match="not enough starts, 2 needed"):
        replay([_result(PANEL, 51175)], _protocol("hash", 1))
    gate = coldstarts.judge((), _protocol("mean", 1))
    assert gate.status == "FAIL" and "not enough starts" in gate.detail


def test_a_nan_run_fails_the_mean_protocol():
    runs = [_result(v, 2047) for v in (0.02, 0.02, float("nan"))]
    assert not replay(runs, _protocol("mean", 3)).ok


def test_the_sm120_manifest_names_each_profiles_protocol():
    q = manifest.load(SM120).require("qualify")
    fid = q.fidelity
    assert fid is not None and (fid.cold_starts, fid.protocol, fid.strict) == (5, "mean", True)
    assert coldstarts.Protocol.of(q, "fidelity").name == "mean"
    assert coldstarts.Protocol.of(q, "fidelity-nvfp4").name == "hash"
    refs = {p.name: dict(p.reference) for p in q.profiles}
    assert refs["fidelity"]["mean_kld"] == "0.024628576596"  # the v44 DCP1 figure it reproduces
    assert refs["fidelity"]["stddev"] == "0.000326156681"
    assert refs["fidelity-nvfp4"]["tokenwise_kld_sha256"] == NVFP4_V44_SHA
    # the Transformers panel's figure is no served profile's reference
    assert not any("0.024554564250" in v for r in refs.values() for v in r.values())
    assert "0.024554564250" not in json.dumps(dict(fid.reference))


def test_the_outcome_names_its_protocol_in_the_receipt(tmp_path):
    out = replay([_result(v, 2047) for v in FP8_V44], _protocol("mean"))
    doc = json.loads(json.dumps(asdict(out)))
    assert doc["protocol"] == "mean" and doc["gate"]["status"] == "PASS"
    assert doc["gate"]["name"] == (
        "fidelity mean protocol (the mean and every run in bound) over 5 starts"
    )


def test_the_verdict_carries_its_own_profiles_card_reference():
    q = manifest.load(SM120).require("qualify")
    fp8 = coldstarts.Protocol.of(q, "fidelity")
    out = replay([_result(v, 2047) for v in FP8_V44], fp8)
    doc = json.loads(json.dumps(asdict(out)))
    # the card's v44 FP8 five-run figures (lines 161-162) beside the mean verdict
    assert doc["reference"]["mean_kld"] == "0.024628576596"
    assert doc["reference"]["stddev"] == "0.000326156681"
    nvfp4 = coldstarts.Protocol.of(q, "fidelity-nvfp4")
    out = replay([_result(NVFP4_V44, 2047, NVFP4_V44_SHA) for _ in range(5)], nvfp4)
    assert out.protocol == "hash" and out.reference["tokenwise_kld_sha256"] == NVFP4_V44_SHA
    # never another protocol's figure: the FP8 mean is not beside the NVFP4 hash verdict
    assert "0.024628576596" not in json.dumps(out.reference)
    # a profile with no qualify table of its name shows no reference (none is borrowed)
    assert coldstarts.Protocol.of(q, "no-such-profile").reference == ()


def test_the_mean_verdict_names_the_starts_it_had_not_five():
    two = replay([_result(v, 2047) for v in FP8_V44[:2]], _protocol("mean", 2))
    assert two.ok and "five" not in two.gate.name and "over 2 starts" in two.gate.name

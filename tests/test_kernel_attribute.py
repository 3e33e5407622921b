"""`pinwheel attribute --kernel`: a [[kernel]]'s steps attributed with the engine's
statistics and report. CPU side (CI has no CUDA): the variants of a real manifest's
[[kernel]], and the timing half on real processes: each variant's "wheel" is a directory
holding a module, the timing program a Python file that imports it and prints its RESULT
line, run once per variant and round in the balanced order. The builds of a CUDA kernel
run on the GPU machine (docs/qualify.md gives the command)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.flows.kernel_attribute import (
    FULL,
    KernelAttributeRequest,
    KernelVariant,
    kernel_effects,
    kernel_steps,
    kernel_variants,
    parse_result,
    time_variants,
)
from pinwheel.flows.kernel_report import human_lines, markdown, to_json
from pinwheel.manifest import load
from pinwheel.serve import pairstats

BASE = "a" * 40
MANIFEST = f"""
[[kernel]]
name = "kern"
builder = "torch-extension"
url = "https://example.invalid/acme/kernel.git"
commit = "{BASE}"
branch = "main"
tree = "{"b" * 40}"

[[kernel.step]]
action = "pick"
pr = 246
head = "{"c" * 40}"
title = "faster <b>gemm</b> | fp16"

[[kernel.step]]
action = "pick"
pr = 234
head = "{"d" * 40}"
"""

# The "kernel": its cost per call in ms, plus seeded normal jitter per process and per
# sample that changes from one process to the next (a counter file in its directory): the
# statistics see a spread, and the same one on every run of the test.
KERNEL = """
import pathlib, random
COST_MS = {cost}
_calls = pathlib.Path(__file__).with_name("calls.txt")
def times(samples):
    n = int(_calls.read_text()) if _calls.exists() else 0
    _calls.write_text(str(n + 1))
    rng = random.Random({salt} * 1000 + n)
    offset = rng.gauss(0, 0.1)  # this process's own
    return [COST_MS + offset + rng.gauss(0, 0.05) for i in range(samples)]
"""

TIMING = """
import argparse, json, fakekern
ap = argparse.ArgumentParser()
ap.add_argument("--samples", type=int)
ap.add_argument("--iters", type=int)
a = ap.parse_args()
print("noise before the result")
print("RESULT " + json.dumps({"times": {"gemm 16x4096": fakekern.times(a.samples),
                                        "gather": [1.0] * a.samples},
                              "error": {"gemm 16x4096": fakekern.COST_MS / 1000}}))
"""


def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "manifest.toml"
    path.write_text(MANIFEST)
    return path


def test_the_variants_leave_out_one_kernel_step_each_and_drop_the_tree_pin(tmp_path) -> None:
    m = load(manifest(tmp_path))
    spec, chosen = kernel_steps(m, "kern", None)
    variants = kernel_variants(spec, chosen)
    assert [n for n, _ in variants] == [FULL, "without-1", "without-2"]
    assert variants[0][1] is spec and spec.tree == "b" * 40
    assert [s.pr for s in variants[1][1].steps] == [234] and variants[1][1].tree is None
    assert [s.pr for s in variants[2][1].steps] == [246]
    _, only = kernel_steps(m, "kern", (2,))
    assert [s.pr for s in only] == [234]
    with pytest.raises(UsageError, match="no step 3 in \\[\\[kernel\\]\\] kern"):
        kernel_steps(m, "kern", (3,))
    with pytest.raises(UsageError, match="no \\[\\[kernel\\]\\] named 'other'"):
        kernel_steps(m, "other", None)


def sites(tmp_path: Path, costs: dict[str, float]) -> list[KernelVariant]:
    out = []
    for salt, (name, cost) in enumerate(costs.items()):
        site = tmp_path / "variants" / name / "site"
        site.mkdir(parents=True)
        (site / "fakekern.py").write_text(KERNEL.format(cost=cost, salt=salt + 10))
        out.append(KernelVariant(name, (), site=site))
    return out


def request(tmp_path: Path, **kw) -> KernelAttributeRequest:
    timing = tmp_path / "timing.py"
    timing.write_text(TIMING)
    fields = dict(
        build=None, kernel="kern", out=tmp_path, timing=timing, python=Path(sys.executable),
        environ={"PATH": "/usr/bin:/bin"}, samples=3, iters=1,
    )  # fmt: skip
    return KernelAttributeRequest(**(fields | kw))  # type: ignore[arg-type]


def test_kernel_steps_get_the_engine_statistics_over_processes(tmp_path: Path) -> None:
    m = load(manifest(tmp_path))
    _, steps = kernel_steps(m, "kern", None)
    # Step 1 (PR 246) takes 4 ms off a call: without it the kernel costs 6 ms; step 2 nothing.
    variants = sites(tmp_path, {FULL: 2.0, "without-1": 6.0, "without-2": 2.0})
    req = request(tmp_path)
    rounds = pairstats.rounds_needed(3)  # one Williams block of three variants: 3
    runs = time_variants(req, variants, rounds)
    assert [(r.variant, r.round) for r in runs] == [
        ([FULL, "without-1", "without-2"][i], r)
        for r, row in enumerate(pairstats.balanced_order(3, rounds))
        for i in row
    ]
    assert all(len(r.times["gemm 16x4096"]) == 3 for r in runs)
    effects = kernel_effects(steps, runs, 0.95, 0.0, 3)
    by = {(e.number, e.case): e for e in effects}
    assert len(by) == 4  # 2 steps x 2 cases, one Holm family
    gemm1 = by[(1, "gemm 16x4096")].effect
    assert gemm1 is not None and gemm1.verdict == "lower" and gemm1.family == 4
    assert gemm1.n == rounds and gemm1.samples == 3 * rounds
    assert gemm1.ci_high < 0 and -4.5 < gemm1.delta < -3.5
    assert gemm1.mde is not None and gemm1.mde < 1.0
    assert by[(1, "gemm 16x4096")].error == (0.002, 0.006)
    gemm2 = by[(2, "gemm 16x4096")].effect
    assert gemm2 is not None and gemm2.verdict == pairstats.NOISE and gemm2.ci_low < 0 < gemm2.ci_high
    assert by[(2, "gather")].effect.verdict == pairstats.NOISE  # type: ignore[union-attr]

    from pinwheel.flows.kernel_attribute import KernelAttributeOutcome, settings

    outcome = KernelAttributeOutcome(
        kernel="kern", manifest={"name": "m", "path": "manifest.toml", "sha256": "0" * 64},
        rounds=rounds, samples=3, iters=1, variants=tuple(variants), runs=tuple(runs),
        effects=effects, blocked=(), settings=settings(req, 3),
    )  # fmt: skip
    lines = human_lines(outcome)
    assert any("PR #246" in ln and "gemm 16x4096" in ln and "-> faster" in ln for ln in lines)
    assert any("PR #234" in ln and "gemm 16x4096" in ln and "-> within noise" in ln for ln in lines)
    assert "Holm over 4 step x case comparisons" in lines[0]
    doc = json.loads(json.dumps(to_json(outcome)))
    assert doc["schema"] == "pinwheel.kernel-attribution/1"
    step = next(s for s in doc["steps"] if s["number"] == 1 and s["case"] == "gemm 16x4096")
    assert step["ms"]["verdict"] == "lower" and step["ms"]["family"] == 4
    assert step["ms"]["method"] == pairstats.METHOD
    text = markdown(outcome)
    assert "<b>" not in text and r"faster \<b\>gemm\</b\> \| fp16" in text


def test_too_few_rounds_say_how_many_starts_a_verdict_needs(tmp_path: Path) -> None:
    m = load(manifest(tmp_path))
    _, steps = kernel_steps(m, "kern", (1,))
    variants = sites(tmp_path, {FULL: 2.0, "without-1": 6.0})
    runs = time_variants(request(tmp_path), variants, 1)
    (gemm, _gather) = kernel_effects(steps, runs, 0.95, 0.0, 2)
    assert gemm.effect is not None and not gemm.effect.decided
    assert gemm.effect.verdict == "not enough starts: 2 needed for a verdict (1 paired)"


@pytest.mark.parametrize(
    ("stdout", "needle"),
    [
        (b"nothing\n", "0 RESULT line"),
        (b'RESULT {"times": {"a": [1.0]}}\nRESULT {"times": {"a": [1.0]}}\n', "2 RESULT"),
        (b'RESULT {"times": {"a": [NaN]}}\n', "not JSON"),
        (b'RESULT {"times": {"a": [1.0, 2.0]}}\n', "not a list of 1 times"),
        (b'RESULT {"times": {"a": [-1.0]}}\n', "not a number >= 0"),
        (b'RESULT {"times": {"a\\u001b[2J": [1.0]}}\n', "not printable"),
        (b'RESULT {"times": {}}\n', "0 cases"),
        (b"RESULT [1]\n", "no object 'times'"),
    ],
    ids=["none", "two", "nan", "count", "negative", "escape", "empty", "shape"],
)
def test_a_timing_result_that_is_not_one_sane_line_is_refused(stdout: bytes, needle: str) -> None:
    with pytest.raises(PinwheelError, match=needle) as err:
        parse_result(stdout, "timing.py for full, round 1", 1)
    assert err.value.where == "timing.py for full, round 1" and err.value.next


def test_kernel_flags_are_checked_before_any_work(tmp_path: Path, capsys) -> None:
    m = manifest(tmp_path)
    base = ["--manifest", str(m), "--cache", str(tmp_path / "cache"), "--json", "attribute",
            "--out", str(tmp_path / "o")]  # fmt: skip
    rc = main([*base, "--timing", str(tmp_path / "t.py")])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and "--timing times a kernel" in doc["error"]["what"]
    rc = main([*base, "--kernel", "kern", "--python", sys.executable])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and doc["error"]["what"].startswith("--kernel needs --timing")
    rc = main([*base, "--kernel", "kern", "--python", sys.executable, "--timing",
               str(tmp_path / "missing.py")])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and "is not a file" in doc["error"]["what"]
    (tmp_path / "t.py").write_text("")
    rc = main([*base, "--kernel", "nope", "--python", sys.executable, "--timing",
               str(tmp_path / "t.py")])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and "no [[kernel]] named 'nope'" in doc["error"]["what"]
    rc = main([*base, "--kernel", "kern", "--python", sys.executable, "--timing",
               str(tmp_path / "t.py"), "--rounds", "3", "--step", "1"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and doc["error"]["what"].startswith("--rounds 3 does not balance")
    assert not (tmp_path / "o").exists()

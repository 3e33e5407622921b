"""`pinwheel attribute` on real parts: a real git upstream whose package is an
OpenAI-compatible server (servingproject.py, the engine under test), replayed by the real
engine per variant, built into wheels in one kept workspace, installed into venvs, served
interleaved, measured through vLLM-style counters; the paired statistics find each step's
effect with its sign and call a no-op step noise. Device code comes from the stand-in
compiler of tinyproject.py (CI has no CUDA)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from gitfixture import UPSTREAM_URL, manifest_text
from pinwheel.checksums import sha256_file
from pinwheel.cli import main
from pinwheel.compile.pipeline import BuildRequest
from pinwheel.errors import UsageError
from pinwheel.flows.attribute import AttributeRequest, attribute
from pinwheel.flows.attribute_report import human_lines, markdown, to_json
from pinwheel.manifest import load
from pinwheel.options import host as host_of
from pinwheel.serve import pairstats
from pinwheel.source.replay import replay_manifest
from pinwheel.source.result import ReplayRequest
from pinwheel.source.variants import PREFIXES, VariantRequest, replay_variants
from servingproject import BUILD_TABLE, Serving, make_serving_upstream

PY = f"{sys.version_info.major}.{sys.version_info.minor}"

needs_gcc = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("objcopy")), reason="needs gcc and objcopy"
)


@pytest.fixture
def serving(tmp_path: Path) -> Serving:
    return make_serving_upstream(tmp_path)


def _manifest(
    s: Serving,
    prs: list[int],
    *,
    titles: dict[int, str] | None = None,
    max_tokens: int = 25,
    name: str = "m.toml",
) -> Path:
    steps: list[dict[str, object]] = []
    for pr in prs:
        step: dict[str, object] = {
            "action": "pick",
            "pr": pr,
            "head": s.heads[pr],
            "commits": s.commits[pr],
        }
        if titles and pr in titles:
            step["title"] = titles[pr]
        steps.append(step)
    path = s.tmp / name
    table = BUILD_TABLE.format(python=PY, max_tokens=max_tokens)
    path.write_text(manifest_text(s.base, steps, tag=None, extra=table))
    return path


def _replay_request(s: Serving, manifest: Path) -> ReplayRequest:
    return ReplayRequest(load(manifest), s.tmp / "cache", {UPSTREAM_URL: str(s.up.bare)})


@needs_gcc
def test_attribution_finds_each_steps_effect_with_its_sign(serving: Serving) -> None:
    s = serving
    hostile = "docs | <script>x</script> `tick`"
    manifest = _manifest(s, [11, 12, 13, 14], titles={14: hostile})
    m = load(manifest)
    out = s.tmp / "attribution"
    environ = dict(os.environ)
    request = AttributeRequest(
        variants=VariantRequest(_replay_request(s, manifest)),
        build=BuildRequest(
            manifest=m,
            cache=s.tmp / "cache",
            out_dir=s.tmp / "unused",
            host=host_of(environ),
            mirrors={UPSTREAM_URL: str(s.up.bare)},
            kernels=(),
            cuda=False,
        ),
        out=out,
        model=str(s.tmp / "model"),
        environ=environ,
        samples=4,  # rounds: the default, one Williams block of the 5 variants
        no_deps=True,
        min_effect_ms=1.0,  # the steps' effects are 10 ms; a 2-core CI box jitters below 1
    )
    outcome = attribute(request)
    by_pr = {e.label.split("#")[1].rstrip(")"): e for e in outcome.effects}
    assert sorted(by_pr) == ["11", "12", "13", "14"]

    faster, more, slower, noop = by_pr["11"], by_pr["12"], by_pr["13"], by_pr["14"]
    assert faster.ms_per_pass is not None and faster.ms_per_pass.verdict == "lower"
    assert faster.ms_per_pass.ci_high < 0 and -13 < faster.ms_per_pass.delta < -7
    assert slower.ms_per_pass is not None and slower.ms_per_pass.verdict == "higher"
    assert slower.ms_per_pass.ci_low > 0 and 7 < slower.ms_per_pass.delta < 13
    assert slower.text == "differs"
    assert more.acceptance is not None and more.acceptance.verdict == "higher"
    assert more.acceptance.delta == pytest.approx(1.0)  # 1 + 2/1 with it, 1 + 1/1 without
    assert more.text == "same"
    assert noop.ms_per_pass is not None and noop.ms_per_pass.verdict == pairstats.NOISE
    assert noop.acceptance is not None and noop.acceptance.verdict == pairstats.NOISE
    assert noop.text == "same" and faster.text == "same"
    # The unit is the server start: one difference per round, Holm over the four steps.
    assert outcome.rounds == 5
    for e in outcome.effects:
        ms = e.ms_per_pass
        assert ms is not None and ms.n == 5 and ms.samples == 20 and ms.family == 4
        assert ms.mde is not None and 0 < ms.mde < 7, ms  # the design detects the 10 ms

    # Builds: one kept workspace, the full stack first; a Python-only step's variant takes the
    # compiled member from the full stack's wheel, the compiled step's variant compiles it.
    builds = {b.variant: b for b in outcome.builds}
    assert list(builds) == ["full", "without-1", "without-2", "without-3", "without-4"]
    assert builds["without-1"].changed == ("csrc/cost.c",)
    assert builds["without-1"].reused == ()
    for name in ("without-2", "without-3", "without-4"):
        assert builds[name].reused == ("vllm/_C.so",), name
    assert len({b.sha256 for b in builds.values()}) == 5

    # The full variant is what `pinwheel run` replays; receipts name trees, wheels, commands.
    full = replay_manifest(
        m, cache=s.tmp / "cache", mirrors={UPSTREAM_URL: str(s.up.bare)}, write_refs=False
    )
    doc = json.loads((out / "attribution.json").read_text())
    assert doc["schema"] == "pinwheel.attribution/1"
    variants = {v["name"]: v for v in doc["variants"]}
    assert variants["full"]["tree"] == full.tree
    for v in variants.values():
        wheel = out / "variants" / v["name"] / "wheels" / v["wheel"]
        assert sha256_file(wheel) == v["sha256"]
        cmd = v["serve_command"]
        assert cmd[0] == str(out / "variants" / v["name"] / "venv" / "bin" / "python")
        assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", request.model]
    rounds = [(x["variant"], x["round"]) for x in doc["servings"]]
    names = ["full", "without-1", "without-2", "without-3", "without-4"]
    williams = [[0, 1, 4, 2, 3], [1, 2, 0, 3, 4], [2, 3, 1, 4, 0], [3, 4, 2, 0, 1], [4, 0, 3, 1, 2]]
    assert rounds == [(names[i], r + 1) for r, row in enumerate(williams) for i in row]
    for name in names:  # every variant started once in every place
        assert sorted(row.index(names.index(name)) for row in williams) == [0, 1, 2, 3, 4]
    step14 = next(x for x in doc["steps"] if x["number"] == 4)
    assert step14["title"] == hostile and step14["ms_per_pass"]["verdict"] == pairstats.NOISE

    lines = human_lines(outcome)  # what the CLI prints
    assert any("PR #11)" in ln and "-> faster" in ln for ln in lines)
    assert any("PR #13)" in ln and "-> slower" in ln and "text differs" in ln for ln in lines)
    assert any("PR #14)" in ln and f"-> {pairstats.NOISE}" in ln for ln in lines)
    assert doc == json.loads(json.dumps(to_json(outcome)))  # the CLI's --json document

    text = (out / "attribution.md").read_text()
    assert text == markdown(outcome)
    assert "<script>" not in text and r"docs \| \<script\>x\</script\>" in text
    assert "faster" in text and "slower" in text and pairstats.NOISE in text
    print("\n" + "\n".join(ln for ln in text.splitlines() if ln.startswith("|")))


def test_a_step_a_later_step_needs_says_which_and_where(serving: Serving) -> None:
    manifest = _manifest(serving, [13, 15])
    plan = replay_variants(VariantRequest(_replay_request(serving, manifest)))
    assert [v.name for v in plan.variants] == ["full", "without-1", "without-2"]
    ((step, why),) = plan.blocked
    assert step.pr == 13
    assert why.step == 2 and "PR #15" in why.label and why.files == ("vllm/sampler.py",)
    assert plan.variant("without-1").result is None
    assert [c.step.pr for c in plan.comparisons] == [15]
    assert plan.variant("without-2").tree is not None


def test_prefixes_pair_each_step_with_the_stack_before_it(serving: Serving) -> None:
    manifest = _manifest(serving, [11, 12, 13])
    plan = replay_variants(VariantRequest(_replay_request(serving, manifest), mode=PREFIXES))
    assert [v.name for v in plan.variants] == ["full", "prefix-1", "prefix-0", "prefix-2"]
    pairs = [(c.step.number, c.with_, c.without) for c in plan.comparisons]
    assert pairs == [
        (1, "prefix-1", "prefix-0"),
        (2, "prefix-2", "prefix-1"),
        (3, "full", "prefix-2"),
    ]
    assert plan.variant("prefix-0").tree == plan.variant("prefix-0").result.tree  # type: ignore[union-attr]
    # The stack of no step is the base's own tree.
    base_tree = serving.up.rev(f"{serving.base}^{{tree}}")
    assert plan.variant("prefix-0").tree == base_tree
    one = replay_variants(
        VariantRequest(_replay_request(serving, manifest), steps=(2,), mode=PREFIXES)
    )
    assert [v.name for v in one.variants] == ["full", "prefix-2", "prefix-1"]


def test_an_unknown_step_is_a_usage_error_before_any_work(serving: Serving, capsys) -> None:
    manifest = _manifest(serving, [11])
    with pytest.raises(UsageError, match="no step 4"):
        replay_variants(VariantRequest(_replay_request(serving, manifest), steps=(4,)))
    rc = main(
        [
            "--manifest",
            str(manifest),
            "--cache",
            str(serving.tmp / "cache"),
            "--json",
            "attribute",
            "--step",
            "4",
            "--out",
            str(serving.tmp / "o"),
            "--model",
            "m",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and doc["error"]["what"].startswith("no step 4")
    assert not (serving.tmp / "o").exists()


# --------------------------------------------------------------------------- statistics


def starts(means: list[float], spread: float = 0.0) -> list[list[float]]:
    return [[m - spread, m + spread] for m in means]


def test_the_unit_is_the_start_and_an_effect_is_told_from_noise() -> None:
    base = [10.0, 10.4, 9.8, 10.1, 10.3, 9.9, 10.2, 10.0]
    jitter = [0.05, -0.04, 0.02, -0.03, 0.01, -0.02, 0.04, -0.05]
    same = [b + j for b, j in zip(base, jitter, strict=True)]
    a = pairstats.by_starts(starts(same, 0.5), starts(base, 0.5))
    assert a is not None and a == pairstats.by_starts(starts(same, 0.5), starts(base, 0.5))
    assert a.n == 8 and a.samples == 16  # eight starts a side, two samples each
    assert a.ci_low <= 0 <= a.ci_high and a.verdict == pairstats.NOISE
    slower = pairstats.by_starts(starts([x + 0.3 for x in same], 0.5), starts(base, 0.5))
    assert slower is not None and slower.verdict == "higher" and slower.ci_low > 0
    assert slower.delta == pytest.approx(0.3 + sum(jitter) / len(jitter))
    # t over the 8 round differences (df 7: t(0.975) = 2.3646), not over 16 samples
    d = [0.3 + j for j in jitter]
    mean = sum(d) / 8
    sd = (sum((x - mean) ** 2 for x in d) / 7) ** 0.5
    assert slower.ci_high - slower.ci_low == pytest.approx(2 * 2.364624 * sd / 8**0.5, rel=1e-5)
    faster = pairstats.by_starts(starts([x - 0.3 for x in same]), starts(base))
    assert faster is not None and faster.verdict == "lower" and faster.ci_high < 0
    small = pairstats.by_starts(starts([x + 0.3 for x in same]), starts(base), min_effect=0.5)
    assert small is not None and small.verdict == pairstats.NOISE
    assert pairstats.by_starts([], []) is None
    assert pairstats.by_starts([[], [1.0]], [[2.0], []]) is None  # no round has both


def test_samples_of_one_start_do_not_make_a_verdict() -> None:
    """Two starts a side, a thousand samples each: still two round differences."""
    many = pairstats.by_starts([[11.0] * 1000, [10.0] * 1000], [[10.0] * 1000, [10.5] * 1000])
    assert many is not None and many.n == 2 and many.verdict == pairstats.NOISE
    one = pairstats.by_starts([[11.0] * 1000], [[10.0] * 1000])
    assert one is not None and one.verdict.startswith("not enough starts: 2 needed")


def test_student_t_quantiles_match_the_tables() -> None:
    # Two-sided 95% critical values (any statistics table) and the 80% one-sided ones.
    for df, q975, q80 in [(1, 12.7062, 1.3764), (2, 4.3027, 1.0607), (4, 2.7764, 0.9410),
                          (10, 2.2281, 0.8791), (30, 2.0423, 0.8538)]:  # fmt: skip
        assert pairstats.t_quantile(0.975, df) == pytest.approx(q975, abs=1e-4)
        assert pairstats.t_quantile(0.8, df) == pytest.approx(q80, abs=1e-4)
        assert pairstats.t_cdf(q975, df) == pytest.approx(0.975, abs=2e-5)
        assert pairstats.t_cdf(pairstats.t_quantile(0.975, df), df) == pytest.approx(0.975)


def test_holm_adjusts_in_step_down_order_and_states_the_family() -> None:
    # p-values 0.01, 0.02, 0.04 over three steps: Holm's 0.03, 0.04, 0.04: all below 0.05
    # with Holm's step-down; Bonferroni (x3) would have kept the last within noise.
    raw = [_with_p(0.04, 1.0), _with_p(0.01, 1.0), _with_p(0.02, -1.0), None]
    out = pairstats.holm(raw)
    assert [e.p_holm if e else None for e in out] == pytest.approx([0.04, 0.03, 0.04, None])
    assert [e.verdict if e else None for e in out] == ["higher", "higher", "lower", None]
    assert all(e is None or e.family == 3 for e in out)
    out = pairstats.holm([_with_p(0.04, 1.0), _with_p(0.03, 1.0)])
    assert [e.verdict for e in out if e] == [pairstats.NOISE, pairstats.NOISE]  # 0.06, 0.06


def _with_p(p: float, delta: float) -> pairstats.Effect:
    return pairstats.Effect(
        n=5, samples=20, mean_with=1.0, mean_without=1.0, delta=delta, sd=1.0, ci_low=-1.0,
        ci_high=1.0, confidence=0.95, p=p, verdict=pairstats.NOISE,
    )  # fmt: skip


def test_the_minimum_detectable_effect_is_the_design_s() -> None:
    e = pairstats.by_starts(
        starts([1.0, 2.0, 3.0, 2.0, 1.5]), starts([1.2, 1.0, 2.5, 2.2, 1.0]), confidence=0.96
    )
    assert e is not None
    e4 = pairstats.holm([e, e, e, e])[0]
    assert e4 is not None and e4.family == 4
    # (t(1 - 0.04/8, 4) + t(0.8, 4)) * sd / sqrt(5); the tables' t(0.995, 4) = 4.6041
    assert e4.mde == pytest.approx((4.6041 + 0.9410) * e.sd / 5**0.5, rel=1e-3)
    alone = pairstats.holm([e])[0]
    assert alone is not None and alone.mde is not None and alone.mde < e4.mde


def test_the_order_is_balanced_by_construction() -> None:
    for n in range(1, 9):
        rows = pairstats.balanced_order(n, 2 * n)
        for block in (rows[:n], rows[n:]):
            assert all(sorted(r) == list(range(n)) for r in block)
            for place in range(n):  # every variant in every place once per block
                assert sorted(r[place] for r in block) == list(range(n))
        pairs = [(r[i], r[i + 1]) for r in rows for i in range(n - 1)]
        if n > 1:  # every ordered pair follows once per 2n rounds (odd n), twice (even n)
            assert len(set(pairs)) == n * (n - 1) and len(pairs) == 2 * n * (n - 1)
    assert pairstats.balanced_order(2, 4) == [[0, 1], [1, 0], [0, 1], [1, 0]]  # ABBA
    with pytest.raises(UsageError, match="--rounds 3 does not balance") as err:
        pairstats.check_rounds(3, 2)
    assert "--rounds 2 or --rounds 4" in err.value.next
    pairstats.check_rounds(1, 5)  # less than a block: run, and reported as too small


@pytest.mark.parametrize(
    "values",
    [[float("nan"), 1.0], [float("inf"), 1.0], [1e308 * 10, 1.0]],
    ids=["nan", "inf", "overflow"],
)
def test_a_measurement_that_is_not_a_finite_number_is_refused(values) -> None:
    with pytest.raises(ValueError, match="finite"):
        pairstats.by_starts([values], [[1.0, 1.0]])


def test_a_bad_level_or_unpaired_starts_are_refused() -> None:
    with pytest.raises(UsageError, match="confidence"):
        pairstats.by_starts([[1.0]], [[1.0]], confidence=1.0)
    with pytest.raises(ValueError, match="unpaired"):
        pairstats.by_starts([[1.0]], [[1.0], [2.0]])

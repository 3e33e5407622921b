"""Issue 50's injected bugs, each put into a copy of src/ and run against the test that
must catch it: a table of bug, site, test and whether the test failed (caught).

The worktree is never edited: src/ is copied into a temporary folder, one bug at a time
is written into the copy, and pytest runs the named tests with that copy first on
PYTHONPATH. The tests first run once on the unchanged copy (they must pass there, or a
failure below would prove nothing). A site that is no longer in the code is reported
(exit 2): the bug list follows the code, update it. Exit 1 when a bug is not caught.

    python bench/injected_bugs.py [--only ID] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Bug:
    id: str
    what: str
    edits: tuple[tuple[str, str, str], ...]  # (file under src/pinwheel, old, new)
    tests: tuple[str, ...]  # node ids that must fail with the bug in


def _edit(path: str, old: str, new: str) -> tuple[str, str, str]:
    return (path, old, new)


SPOT = "tests/test_fidelity_spotcheck.py::"
FID = "tests/test_fidelity.py::"
QF = "tests/test_qualify_fast.py::"
BUGS = (
    Bug("top1-ties-high", "top-1 ties to the highest token id (detkl._top1)", (
        _edit("serve/workers/detkl.py", "    top = int(row.argmax())\n",
              "    top = len(row) - 1 - int(row[::-1].argmax())\n"),
    ), ("tests/test_detkl.py::test_top1_ties_go_to_the_lowest_token_id_on_both_sides",)),
    Bug("next-teacher-row", "rows scored against the next teacher position (kld_ext)", (
        _edit("serve/workers/kld_ext.py", "self.scorer.one(st.full[at], rows[i])",
              "self.scorer.one(st.full[min(at + 1, st.positions - 1)], rows[i])"),
    ), (SPOT + "test_the_extension_scores_each_row_against_its_own_teacher_position",
        SPOT + "test_an_honest_engine_gives_detkl_on_its_own_rows_and_passes")),
    Bug("row-past-prompt", "the last prompt row scored past the prompt (kld_ext)", (
        _edit("serve/workers/kld_ext.py", "remaining = len(prompt) - (start + 1)\n",
              "remaining = len(prompt) - start\n"),
    ), (SPOT + "test_an_honest_engine_gives_detkl_on_its_own_rows_and_passes",)),
    Bug("top1-from-tie-bit", "top-1 agreement read from the tie bit (inprocess)", (
        _edit("serve/inprocess.py", 'agree = (rec["flags"] & detkl.AGREE) > 0',
              'agree = (rec["flags"] & detkl.TIED) > 0'),
    ), (SPOT + "test_an_honest_engine_gives_detkl_on_its_own_rows_and_passes",)),
    Bug("nan-mean-passes", "a NaN mean passes the gate (receipt.holds: no NaN check, "
        "comparisons written as 'not over the limit')", (
        _edit("serve/receipt.py", "limit is None or value != value or op not in OPS",
              "limit is None or op not in OPS"),
        _edit("serve/receipt.py", '"<": lambda a, b: a < b,', '"<": lambda a, b: not a >= b,'),
        _edit("serve/receipt.py", '"<=": lambda a, b: a <= b,', '"<=": lambda a, b: not a > b,'),
        _edit("serve/receipt.py", '">=": lambda a, b: a >= b,', '">=": lambda a, b: not a < b,'),
    ), (FID + "test_a_gate_with_a_nan_or_fewer_positions_than_its_panel_fails",)),
    Bug("nan-card-figure", "a NaN card figure judged as a number (gates.card: no NaN check)", (
        _edit("serve/gates/card.py", "if measured is None or measured != measured:",
              "if measured is None:"),
    ), (QF + "test_a_nan_card_figure_fails_its_gate_either_way_the_bound_points",)),
    Bug("tolerance-10x", "the non-strict tolerance loosened 10x (gates.fidelity)", (
        _edit("serve/gates/fidelity.py", "figure * (1 + cfg.tolerance)",
              "figure * (1 + 10 * cfg.tolerance)"),
    ), (FID + "test_the_tolerance_widens_a_non_strict_gate_by_exactly_its_margin",)),
    Bug("prefill-counted", "ms/pass counting the prefill step (qualify.decode_sample)", (
        _edit("serve/qualify.py", "passes, source = int(steps) - 1,",
              "passes, source = int(steps),"),
    ), ("tests/test_qualify_passes.py::test_ms_per_pass_counts_the_passes_after_the_first_token",)),
    Bug("not-paired", "round differences not paired: with of round r minus without of r+1 "
        "(pairstats.by_starts)", (
        _edit("serve/pairstats.py", "d = [x - y for x, y in zip(ma, mb, strict=True)]",
              "d = [x - y for x, y in zip(ma, mb[1:] + mb[:1], strict=True)]"),
    ), ("tests/test_attribute.py::test_the_unit_is_the_start_and_an_effect_is_told_from_noise",)),
    Bug("90-as-95", "a 90% interval labelled 95% (pairstats.by_starts)", (
        _edit("serve/pairstats.py", "t_quantile(1 - (1 - confidence) / 2, n - 1)",
              "t_quantile(1 - (1 - confidence), n - 1)"),
    ), ("tests/test_attribute.py::test_the_unit_is_the_start_and_an_effect_is_told_from_noise",
        "tests/test_attribute_calibration.py::test_no_effect_is_reported_at_the_nominal_rate_and_intervals_cover")),
    Bug("samples-as-starts", "every sample of a start counted as a start (pairstats.by_starts)", (
        _edit("serve/pairstats.py",
              "pairs = [(list(a), list(b)) for a, b in zip(with_, without, strict=True)"
              " if a and b]",
              "pairs = [([x], [y]) for a, b in zip(with_, without, strict=True) if a and b "
              "for x, y in zip(a, b)]"),
    ), ("tests/test_attribute.py::test_samples_of_one_start_do_not_make_a_verdict",)),
    Bug("self-grading", "the engine grades itself: the spot-check gate always PASSes "
        "(receipt.spot_status)", (
        _edit("serve/receipt.py", '    return "PASS" if ok else "FAIL"\n\n\n@dataclass',
              '    return "PASS"\n\n\n@dataclass'),
    ), (SPOT + "test_the_self_grading_engine_fails_the_gate",
        SPOT + "test_an_empty_spot_check_or_none_is_a_fail")),
    Bug("one-cold-start", "one cold start allowed (manifest.serve.MIN_COLD_STARTS = 1)", (
        _edit("manifest/serve.py", "MIN_COLD_STARTS = 2", "MIN_COLD_STARTS = 1"),
    ), ("tests/test_coldstart_protocols.py::test_one_start_is_no_cold_start_check",
        "tests/test_fidelity_inprocess.py::test_cold_start_gate_needs_one_hash_over_every_start")),
    Bug("no-holm", "several steps judged one by one, no Holm (pairstats.holm)", (
        _edit("serve/pairstats.py", "running = max(running, min(1.0, (m - rank) * e.p))",
              "running = e.p"),
    ), ("tests/test_attribute.py::test_holm_adjusts_in_step_down_order_and_states_the_family",
        "tests/test_attribute_calibration.py::test_without_holm_four_steps_report_an_effect_more_often_than_the_level")),
)


def pytest(src: Path, tests: tuple[str, ...], base: Path) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(src), CI="true", PINWHEEL_CI="1")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         f"--basetemp={base}", *tests],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr.strip()[-200:]
    return r.returncode, last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="a bug id (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    bugs = [b for b in BUGS if not args.only or b.id in args.only]
    tmp = Path(tempfile.mkdtemp(prefix="injected-bugs-"))
    try:
        clean = tmp / "src"
        shutil.copytree(ROOT / "src", clean, ignore=shutil.ignore_patterns("__pycache__"))
        every = tuple(dict.fromkeys(t for b in bugs for t in b.tests))
        rc, last = pytest(clean, every, tmp / "pt-clean")
        print(f"unchanged src: {last}")
        if rc != 0:
            print("the tests fail without a bug: nothing below would mean anything")
            return 1
        print("| bug | what | test(s) run | result |\n|---|---|---|---|")
        missed = stale = 0
        for i, bug in enumerate(bugs):
            src = tmp / f"src-{i}"
            shutil.copytree(clean, src)
            gone = []
            for rel, old, new in bug.edits:
                path = src / "pinwheel" / rel
                text = path.read_text()
                if text.count(old) != 1:
                    gone.append(f"{rel}: {old.strip()!r} found {text.count(old)} times")
                    continue
                path.write_text(text.replace(old, new))
            tests = ", ".join(t.split("::")[-1] for t in bug.tests)
            if gone:
                stale += 1
                print(f"| {bug.id} | {bug.what} | {tests} | SITE GONE: {'; '.join(gone)} |")
                continue
            started = time.monotonic()
            rc, last = pytest(src, bug.tests, tmp / f"pt-{i}")
            caught = rc == 1
            missed += not caught
            took = time.monotonic() - started
            result = "caught" if caught else "MISSED"
            print(f"| {bug.id} | {bug.what} | {tests} | {result} ({last}; {took:.0f} s) |",
                  flush=True)  # fmt: skip
            shutil.rmtree(src)
        return 2 if stale else (1 if missed else 0)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

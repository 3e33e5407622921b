"""Every bench script starts: ``python bench/X.py --help`` exits 0 and prints its usage.

A bench script imports the stages at its top, so a stage name that moved or a module that
no longer imports fails here, in CI, and not at the next bench run. The calls a script makes
into the stages (their requests' signatures) are checked by the lint session's ``mypy bench``
(noxfile.py ``_scripts``). Real parts: the checkout's own scripts, run by this interpreter
with this checkout's ``src/`` first on PYTHONPATH (as the scripts that insert it do).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def has_main(path: Path) -> bool:
    """Whether ``path`` runs as a program: a top-level ``if __name__ == "__main__":``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return any(
        isinstance(node, ast.If) and re.fullmatch(
            r"""__name__ == (['"])__main__\1""", ast.unparse(node.test)
        ) is not None
        for node in tree.body
    )  # fmt: skip


SCRIPTS = sorted(p for p in BENCH.glob("*.py") if has_main(p))
MODULES = sorted(p for p in BENCH.glob("*.py") if not has_main(p))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_bench_script_starts_and_prints_its_usage(script: Path, tmp_path: Path) -> None:
    path = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    proc = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"{script.name} --help exited {proc.returncode}:\n{proc.stderr}"
    assert proc.stdout.startswith(f"usage: {script.name}"), proc.stdout[:400]


def test_a_bench_file_without_a_main_is_imported_by_a_script() -> None:
    """A bench file the test above does not run is a module a script imports (so its own
    imports are run by that script's --help); a script that lost its ``__main__`` block
    fails here instead of dropping out of the test silently."""
    texts = {s.name: s.read_text(encoding="utf-8") for s in SCRIPTS}
    orphans = [
        m.name
        for m in MODULES
        if not any(re.search(rf"^(from {m.stem} import|import {m.stem}\b)", t, re.M)
                   for t in texts.values())  # fmt: skip
    ]
    assert SCRIPTS, f"no bench script with a __main__ block under {BENCH}"
    assert not orphans, f"bench files no script imports and none runs: {orphans}"


def test_engine_build_compares_a_build_that_ran_no_builder() -> None:
    """A no-change or object-store build records 0.0 s of wheel build: the comparison with
    cold says so and compares the whole command instead of dividing by zero (it did, after
    the real engine's runs)."""
    sys.path.insert(0, str(BENCH))
    try:
        import engine_build  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(BENCH))
    cold = {"seconds": 4239.2, "wall": None}
    line = engine_build.against_cold(cold, {"seconds": 0.0, "wall": 2.0})
    assert line.startswith("no wheel build")
    assert "2119.6x faster than cold's wheel build 4239.2 s" in line
    line = engine_build.against_cold({**cold, "wall": 4396.1}, {"seconds": 571.4, "wall": 654.3})
    assert line.startswith("7.4x faster wheel build (571.4 s vs 4239.2 s)")
    assert "6.7x faster than cold's whole 4396.1 s" in line

"""A venv's check by its files (every file hashed against its RECORD) against the same
check when the signed stat memo of its last passing check holds, in one run.

    python bench/venv_check.py [--python VENV/bin/python] [--repeat 3]

The venv is only read: the memo and its key go to a temporary cache. Both checks run
warm (one untimed full check first, which also writes the memo), so the figures
compare hashing against ``lstat``, not the disk. Prints the files hashed, each
check's best time of ``--repeat`` and the ratio. Default venv: the one running this.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pinwheel.compile import lockedvenv, venvmemo  # noqa: E402
from pinwheel.compile.phases import Note  # noqa: E402


def timed(python: Path, memo: venvmemo.Scope | None) -> tuple[float, Note, list[str]]:
    note = Note()
    begun = time.perf_counter()
    _packages, problems = lockedvenv.python_inventory(python, memo=memo, note=note)
    return time.perf_counter() - begun, note, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, default=Path(sys.prefix) / "bin" / "python")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    python = args.python.absolute()
    with tempfile.TemporaryDirectory(prefix="pinwheel-venv-bench-") as tmp:
        scope = venvmemo.Scope(Path(tmp) / "cache", "bench")
        _t, first, problems = timed(python, scope)  # warm, and writes the memo
        if problems:
            print(f"the venv has problems, no memo is written: {problems[:3]}")
            return 1
        if "recorded the venv's stat in a signed memo" not in first.did_:
            print(f"no memo was written: {first.did_}")
            return 1
        full = min(timed(python, None)[0] for _ in range(args.repeat))
        runs = [timed(python, scope) for _ in range(args.repeat)]
        if any(r[1].did_ for r in runs):
            print(f"the memo did not hold: {runs[0][1].did_}")
            return 1
        memo = min(r[0] for r in runs)
    print(f"venv: {python.parent.parent}")
    print(f"full check: {first.did_[0]}")
    print(f"full check (hash every file):  {full:.3f} s (best of {args.repeat})")
    print(f"memo'd check (stat, no hash):  {memo:.3f} s (best of {args.repeat})")
    print(f"ratio full / memo'd: {full / memo:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

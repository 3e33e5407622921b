"""A source tree extracted through the archive reader: folders opened once against the
one-path-at-a-time route it replaced, in one run.

    python bench/extract_tree.py [--git-dir REPO] [--commit REV] [--path P ...] [--repeat 3]

The tree is ``git archive REV -- P...`` of REPO (default: this checkout's HEAD), read
into memory once; each route extracts it ``--repeat`` times into a fresh folder (the
build sources of a fresh runner: cutlass and flash-attention-v100, 13,600 files). The
baseline is the same reader with :class:`pinwheel.confine.TreeWriter` saying no to
every member, so each goes the checked route (:func:`pinwheel.confine.inside`, then
``mkdirs``, then ``open_append``): what every extraction did before. Both outputs are
compared file by file (bytes, mode, mtime) before any figure is printed. Prints the
files, each route's best time and the ratio.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pinwheel import archive, confine  # noqa: E402


def extract(raw: bytes, dest: Path) -> int:
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return len(archive.extract_tar(tar, dest, "bench tree", inner_links=True))


def listing(root: Path) -> dict[str, tuple[bytes, int, int]]:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if path.is_file() and not path.is_symlink():
            out[path.relative_to(root).as_posix()] = (
                path.read_bytes(), st.st_mode, int(st.st_mtime),
            )  # fmt: skip
    return out


def best(raw: bytes, work: Path, label: str, repeat: int) -> tuple[float, Path]:
    times = []
    for i in range(repeat):
        dest = work / f"{label}-{i}"
        begun = time.perf_counter()
        extract(raw, dest)
        times.append(time.perf_counter() - begun)
    return min(times), dest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parents[1]
    parser.add_argument("--git-dir", type=Path, default=here / ".git")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--path", action="append", default=[])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    raw = subprocess.run(
        ["git", "--git-dir", str(args.git_dir), "archive", "--format=tar", args.commit, "--",
         *args.path],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pinwheel-extract-bench-") as tmp:
        work = Path(tmp)
        files = extract(raw, work / "warm")  # page cache, imports
        new, new_dest = best(raw, work, "writer", args.repeat)
        say_no = confine.TreeWriter.write, confine.TreeWriter.mkdir
        confine.TreeWriter.write = lambda self, *a, **k: False  # type: ignore[method-assign]
        confine.TreeWriter.mkdir = lambda self, *a, **k: False  # type: ignore[method-assign]
        try:
            old, old_dest = best(raw, work, "checked", args.repeat)
        finally:
            confine.TreeWriter.write, confine.TreeWriter.mkdir = say_no  # type: ignore[method-assign]
        if listing(new_dest) != listing(old_dest):
            print("the two routes wrote different trees", file=sys.stderr)
            return 1
    print(f"{files} files, {len(raw) / 2**20:.1f} MiB of tar, best of {args.repeat}, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    print(f"  one path at a time (before): {old:.3f} s")
    print(f"  folders opened once (after): {new:.3f} s")
    print(f"  ratio: {old / new:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Parallel sha256 (pinwheel.checksums) against `sha256sum` on the same files, in one run.

    python bench/hash.py [--files 8] [--size-mib 256] [--repeat 3] [--dir DIR]

Both read the same files from a warm page cache (one untimed pass first), so
the figures compare hashing, not the disk. Prints GB/s for each and the ratio;
`--min-ratio 1.8` makes it exit 1 when pinwheel is not that much faster.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pinwheel.checksums import sha256_file, sha256_files  # noqa: E402


def make_files(root: Path, count: int, size: int) -> list[Path]:
    paths = []
    block = 4 * 1024 * 1024
    for i in range(count):
        path = root / f"shard-{i:05d}.bin"
        with open(path, "wb") as fh:
            left = size
            while left:
                n = min(block, left)
                fh.write(os.urandom(n))
                left -= n
        paths.append(path)
    return paths


def time_sha256sum(paths: list[Path]) -> tuple[float, dict[Path, str]]:
    start = time.perf_counter()
    out = subprocess.run(
        ["sha256sum", *map(str, paths)], check=True, capture_output=True, text=True
    ).stdout
    elapsed = time.perf_counter() - start
    digests = {}
    for line in out.splitlines():
        digest, _, name = line.partition("  ")
        digests[Path(name)] = digest
    return elapsed, digests


def time_call(fn) -> tuple[float, dict[Path, str]]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write the files (temp dir)")
    ap.add_argument("--min-ratio", type=float, default=None)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="pinwheel-hash-bench.", dir=args.dir) as tmp:
        paths = make_files(Path(tmp), args.files, args.size_mib * 1024 * 1024)
        total = sum(p.stat().st_size for p in paths)
        sha256_files(paths)  # warm the page cache for both contenders

        best = {
            "sha256sum": float("inf"),
            "pinwheel": float("inf"),
            "pinwheel-1-thread": float("inf"),
        }
        reference: dict[Path, str] = {}
        for _ in range(args.repeat):  # interleaved, best of N: fair against noise
            t, reference = time_sha256sum(paths)
            best["sha256sum"] = min(best["sha256sum"], t)
            t, ours = time_call(lambda: sha256_files(paths))
            best["pinwheel"] = min(best["pinwheel"], t)
            if ours != reference:
                print("error: digests differ from sha256sum", file=sys.stderr)
                return 2
            t, _ = time_call(lambda: {p: sha256_file(p) for p in paths})
            best["pinwheel-1-thread"] = min(best["pinwheel-1-thread"], t)

    gb = total / 1e9
    print(
        f"files: {args.files} x {args.size_mib} MiB = {gb:.2f} GB, cores: {os.cpu_count()}, "
        f"best of {args.repeat}, warm page cache"
    )
    for name, seconds in best.items():
        print(f"  {name:18s} {seconds:7.3f} s  {gb / seconds:6.2f} GB/s")
    ratio = best["sha256sum"] / best["pinwheel"]
    print(
        f"ratio pinwheel / sha256sum: {ratio:.2f}x "
        f"(threads alone: {best['pinwheel-1-thread'] / best['pinwheel']:.2f}x)"
    )
    if args.min_ratio is not None and ratio < args.min_ratio:
        print(f"FAIL: below the {args.min_ratio}x target", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A [[kernel]] component on a CI runner's two paths, against its cold build, in one run.

Three builds of one kernel through the CLI (``pinwheel kernels``), every one timed whole:

1. ``cold``: cache A and an empty shared directory S (``SCCACHE_DIR``: sccache's objects
   when a binary is there, and pinwheel's object store, ``compile.objstore``, either way);
2. ``no-change``: cache A again (the kept workspace);
3. ``fresh+store``: an empty cache B sharing S: what a new CI runner with a warm shared
   cache sees (issue 40's target for exllamav3 on the H200: <= 20 s).

Prints each build's seconds, its ratio to cold and whether its wheel has the cold
build's sha256 (a fast path that changes bytes, or a build that makes no wheel, is a
failure: exit 1).

    PINWHEEL_TORCH_PYTHON=$(command -v python3) python bench/kernel_fresh_store.py \\
        --manifest recipes/sm120-tp2/manifest.toml --kernel exllamav3 --arch 9.0 --jobs 16 \\
        --mirror https://github.com/turboderp-org/exllamav3.git=MIRROR --work /tmp/kfs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]

from pr_ab import pinwheel, variant  # noqa: E402


def build(manifest: Path, cache: Path, out: Path, args: Any, tag: str) -> dict[str, Any]:
    mirrors = [f"--mirror={m}" for m in args.mirror]
    started = time.monotonic()
    p = pinwheel(
        "--manifest", str(manifest), *mirrors, "--cache", str(cache), "--offline",
        "kernels", "--name", args.kernel, "--out", str(out), log=args.work / f"{tag}.log",
    )  # fmt: skip
    seconds = time.monotonic() - started
    wheels = sorted(out.glob("*.whl"))
    if p.returncode != 0 or not wheels:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-12:])
        print(f"{tag}: exit {p.returncode} after {seconds:.1f} s\n{tail}", flush=True)
        return {"seconds": round(seconds, 1), "sha256": None, "exit": p.returncode}
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    hit = "object store hit" in p.stdout + p.stderr
    print(f"{tag}: {wheels[0].name} in {seconds:.1f} s, sha256 {digest[:16]}"
          + (" (object store hit)" if hit else ""), flush=True)  # fmt: skip
    return {"seconds": round(seconds, 1), "sha256": digest, "wheel": wheels[0].name,
            "store_hit": hit}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", type=Path, required=True)
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--mirror", action="append", default=[], help="URL=PATH, as for pinwheel")
    ap.add_argument("--arch", action="append", default=None, help="instead of [build] arches")
    ap.add_argument("--jobs", type=int, default=None, help="MAX_JOBS instead of [build.env]'s")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.work = args.work.absolute()
    args.work.mkdir(parents=True, exist_ok=True)
    manifest = variant(args.manifest.absolute(), args.work / "manifest", args.kernel, None, args)
    shared = args.work / "shared"
    os.environ["SCCACHE_DIR"] = str(shared)  # the shared directory every build sees
    os.environ["PINWHEEL_STORE_KEY"] = "bench-runners-of-one-store-share-this-key"
    runs = {
        "cold": build(manifest, args.work / "cache-a", args.work / "out-cold", args, "cold"),
        "no-change": build(manifest, args.work / "cache-a", args.work / "out-same", args,
                           "no-change"),  # fmt: skip
        "fresh+store": build(manifest, args.work / "cache-b", args.work / "out-fresh", args,
                             "fresh+store"),  # fmt: skip
    }
    cold = runs["cold"]
    bad = 0
    print(f"\n{args.kernel}: each build against cold ({cold['seconds']} s)")
    for name, r in runs.items():
        ratio = cold["seconds"] / r["seconds"] if r["seconds"] else float("nan")
        same = r["sha256"] is not None and r["sha256"] == cold["sha256"]
        bad += not same  # other bytes, or no wheel at all (then no figure is worth having)
        verdict = "same sha256" if same else "OTHER BYTES" if r["sha256"] else "no wheel"
        print(f"  {name:12} {r['seconds']:7.1f} s  {ratio:6.1f}x faster than cold  {verdict}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

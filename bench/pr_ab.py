"""A PR's effect on hardware: build a [[kernel]] component with and without one PR step,
run `pinwheel qualify tp` on both, print what differs.

Both builds go through the CLI (`pinwheel kernels`), from copies of one manifest
that differ only in the dropped ``[[kernel.step]]`` (and the pinned ``tree``,
which that stack no longer ends at); ``--arch``/``--jobs`` override ``[build]``
in both copies alike (e.g. sm_90 on an H200 for a manifest pinned to sm_120).
Both use one pinwheel cache, so the second build recompiles only what the PR
touched. Then each wheel's pg_* primitives run on ``--devices`` (one process per
GPU) against torch.distributed, and once more on the first GPU alone (the
one-rank cases). Prints a markdown table, one row per case, and writes
everything to ``--json``.

    PINWHEEL_TORCH_PYTHON=$(command -v python3) python bench/pr_ab.py \\
        --manifest recipes/sm120-tp2/manifest.toml --kernel exllamav3 --drop-pr 234 \\
        --mirror https://github.com/turboderp-org/exllamav3.git=MIRROR \\
        --arch 9.0 --jobs 16 --devices 0,1 --work /tmp/ab --json ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from manifestcopy import copy_beside  # noqa: E402

from pinwheel.serve.tpcheck import TpOutcome, table  # noqa: E402


def variant(source: Path, dest: Path, kernel: str, drop_pr: int | None, args: Any) -> Path:
    """A copy of ``source`` (with its patches/), [build] overridden, optionally one PR fewer."""
    import tomlkit

    doc = tomlkit.parse(source.read_text())
    copy_beside(source, doc, dest)  # the manifest's own files resolve beside it: copied along
    build = doc["build"]
    if args.arch:
        build["arches"] = list(args.arch)  # type: ignore[index]
    if args.jobs:
        build.setdefault("env", tomlkit.table())  # type: ignore[union-attr]
        build["env"]["MAX_JOBS"] = str(args.jobs)  # type: ignore[index]
    (table_,) = [k for k in doc["kernel"] if k["name"] == kernel]  # type: ignore[index,union-attr]
    if drop_pr is not None:
        steps = table_["step"]
        keep = [s for s in steps if s.get("pr") != drop_pr]
        if len(keep) == len(steps):
            raise SystemExit(f"{source}: kernel {kernel} has no step with pr = {drop_pr}")
        table_["step"] = tomlkit.aot()
        for s in keep:
            table_["step"].append(s)
        table_.pop("tree", None)
    out = dest / source.name
    out.write_text(tomlkit.dumps(doc))
    return out


def pinwheel(*argv: str, log: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pinwheel", *argv]
    path = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    log.write_text(p.stdout + p.stderr)
    return p


def build(manifest: Path, name: str, args: Any, out: Path, tag: str) -> tuple[Path | None, float]:
    cache_args = [f"--mirror={m}" for m in args.mirror] + ["--cache", str(args.work / "cache")]
    started = time.monotonic()
    p = pinwheel(
        "--manifest", str(manifest), *cache_args, "--offline", "kernels", "--name", args.kernel,
        "--out", str(out), log=args.work / f"build-{tag}.log",
    )  # fmt: skip
    seconds = time.monotonic() - started
    wheels = sorted(out.glob("*.whl"))
    if p.returncode != 0 or not wheels:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        print(f"build {name}: exit {p.returncode} after {seconds:.0f} s\n{tail}", flush=True)
        return None, seconds
    print(f"build {name}: {wheels[0].name} in {seconds:.0f} s", flush=True)
    return wheels[0], seconds


def check(wheel: Path, devices: str, name: str, args: Any, tag: str) -> TpOutcome | None:
    tag = f"{tag}-{devices.count(',') + 1}gpu"
    out = args.work / f"tp-{tag}"
    p = pinwheel(
        "--json", "qualify", "tp", "--wheel", str(wheel), "--devices", devices,
        "--python", args.python, "--out", str(out), log=args.work / f"tp-{tag}.log",
    )  # fmt: skip
    print(p.stderr.strip()[-2000:], flush=True)
    doc_path = out / "tp-primitives.json"
    if not doc_path.is_file():
        print(f"tp {name} on {devices}: no result (exit {p.returncode})", flush=True)
        return None
    outcome = TpOutcome.from_json(json.loads(doc_path.read_text())["outcome"])
    for c in outcome.checks():
        print(f"  [{name} on {devices}] {c.status:4} {c.name}: {c.detail}", flush=True)
    return outcome


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", type=Path, required=True)
    ap.add_argument("--kernel", default="exllamav3")
    ap.add_argument("--drop-pr", type=int, required=True)
    ap.add_argument("--mirror", action="append", default=[], help="URL=PATH, as for pinwheel")
    ap.add_argument("--arch", action="append", default=None, help="instead of [build] arches")
    ap.add_argument("--jobs", type=int, default=None, help="MAX_JOBS instead of [build.env]'s")
    ap.add_argument("--devices", default="0,1")
    ap.add_argument("--python", default=sys.executable, help="the python with CUDA torch")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.work = args.work.absolute()
    args.work.mkdir(parents=True, exist_ok=True)
    manifest = args.manifest.absolute()
    names = {"pinned": None, f"without PR {args.drop_pr}": args.drop_pr}
    results: dict[str, Any] = {}
    outcomes: dict[str, TpOutcome] = {}
    single: dict[str, TpOutcome] = {}
    for i, (name, drop) in enumerate(names.items()):
        m = variant(manifest, args.work / f"manifest-{i}", args.kernel, drop, args)
        wheel, seconds = build(m, name, args, args.work / f"wheels-{i}", str(i))
        results[name] = {"wheel": str(wheel) if wheel else None, "build_s": round(seconds, 1)}
        if wheel is None:
            continue
        tp = check(wheel, args.devices, name, args, str(i))
        if tp is not None:
            outcomes[name] = tp
        one = check(wheel, args.devices.split(",")[0], name, args, str(i))
        if one is not None:
            single[name] = one
    print(f"\n{args.devices.count(',') + 1} GPUs, pg_* vs torch.distributed:")
    print("\n".join(table(outcomes)))
    print(f"\none GPU ({args.devices.split(',')[0]}), the one-rank cases:")
    print("\n".join(table(single)))
    differ = []
    if len(outcomes) == 2:
        verdicts: dict[tuple[str, str], set[bool]] = {}
        for o in outcomes.values():
            for c in o.cases:
                verdicts.setdefault((c.op, c.case), set()).add(c.match)
        differ = [key for key, seen in verdicts.items() if seen == {True, False}]
    print(f"\ncases whose verdict differs between the builds: {len(differ)}")
    for op, case in differ:
        print(f"  {op} {case}")
    if args.json:
        from dataclasses import asdict

        doc = {
            "builds": results,
            "tp": {k: asdict(v) for k, v in outcomes.items()},
            "one_gpu": {k: asdict(v) for k, v in single.items()},
            "differ": differ,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

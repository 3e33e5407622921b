"""Per-step attribution of a [[kernel]] component on one GPU: the component built with every
step, then without each named PR (in one pinwheel cache, so each variant after the first
rebuilds what its step changed), each wheel's kernels timed interleaved, paired statistics
(`pinwheel.serve.pairstats`).

For exllamav3 (recipes/sm120-tp2): PR 246 changes `hgemm` (fp16 output: fp16 accumulation
in cuBLAS) and the EXL3 GEMM inner loop (`exl3_gemm`); PR 234 changes `pg_gather` only,
which needs two ranks: on one GPU its variant is a control for the kernels timed here.

Per round every variant runs in its own process (odd rounds in reverse order); per
process each kernel/shape is timed `--samples` times (CUDA events over `--iters` calls).
Pairs are (round, sample). hgemm's error against an fp32 matmul of the same inputs is
reported per variant.

    PINWHEEL_TORCH_PYTHON=$(command -v python3) python bench/attribute_kernels.py \\
        --manifest recipes/sm120-tp2/manifest.toml --kernel exllamav3 --drop-pr 234 \\
        --drop-pr 246 --mirror https://github.com/turboderp-org/exllamav3.git=MIRROR \\
        --arch 9.0 --jobs 16 --work /tmp/ak --out OUT
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
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]

from pr_ab import build, variant  # noqa: E402

from pinwheel.serve.pairstats import paired  # noqa: E402

KERNEL_BENCH = r"""
import json, sys, torch
import exllamav3_ext as ext
dev = "cuda:0"
samples, iters = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)

def timed(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters

out = {"times": {}, "error": {}}
cases = []
for m, k, n in [(16, 4096, 4096), (256, 4096, 14336), (2048, 4096, 4096)]:
    a = torch.randn(m, k, dtype=torch.half, device=dev)
    b = torch.randn(k, n, dtype=torch.half, device=dev) / k ** 0.5
    c = torch.empty(m, n, dtype=torch.half, device=dev)
    ext.hgemm(a, b, c)
    ref = a.float() @ b.float()
    out["error"][f"hgemm fp16 {m}x{k}x{n}"] = float((c.float() - ref).abs().max())
    cases.append((f"hgemm fp16 {m}x{k}x{n}", lambda a=a, b=b, c=c: ext.hgemm(a, b, c)))
for m, k, n in [(1, 4096, 14336), (4, 4096, 4096), (16, 8192, 8192)]:
    a = torch.randn(m, k, dtype=torch.half, device=dev)
    b = torch.zeros(k // 16, n // 16, 16 * 3, dtype=torch.short, device=dev)
    c = torch.zeros(m, n, dtype=torch.half, device=dev)
    suh = torch.randn(k, dtype=torch.half, device=dev)
    svh = torch.randn(n, dtype=torch.half, device=dev)
    ah = torch.empty_like(a)
    fn = lambda a=a, b=b, c=c, suh=suh, ah=ah, svh=svh: ext.exl3_gemm(
        a, b, c, suh, ah, svh, -1, False, False, 0)
    cases.append((f"exl3_gemm K3 {m}x{k}x{n}", fn))
for name, fn in cases:
    out["times"][name] = [timed(fn) for _ in range(samples)]
print("RESULT " + json.dumps(out))
"""


def run_kernels(site: Path, samples: int, iters: int) -> dict[str, Any]:
    env_path = str(site)
    p = subprocess.run(
        [sys.executable, "-c", KERNEL_BENCH, str(samples), str(iters)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": env_path},
        timeout=300,
    )  # fmt: skip
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    raise SystemExit(f"kernel bench failed in {site}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")


def effects(
    doc: dict[str, Any],
    series: dict[str, dict[str, dict[tuple[int, int], float]]],
    order: list[str],
) -> list[str]:
    lines = [
        "| kernel | variant | full ms | without ms | Δ ms (full - without) [95% CI] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for name in order:
        if name == "full" or "full" not in series:
            continue
        for kernel, with_ in series["full"].items():
            without = series[name].get(kernel, {})
            keys = sorted(set(with_) & set(without))
            e = paired([with_[k] for k in keys], [without[k] for k in keys], seed=0)
            if e is None:
                continue
            doc["effects"].setdefault(name, {})[kernel] = e.to_json()
            lines.append(
                f"| {kernel} | {name} | {e.mean_with:.4f} | {e.mean_without:.4f} | "
                f"{e.delta:+.4f} [{e.ci_low:+.4f}, {e.ci_high:+.4f}] | {e.verdict} |"
            )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", type=Path, required=True)
    ap.add_argument("--kernel", default="exllamav3")
    ap.add_argument("--drop-pr", type=int, action="append", required=True)
    ap.add_argument("--mirror", action="append", default=[])
    ap.add_argument("--arch", action="append", default=None)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-ptx", action="store_true", help="[build] ptx = false in every variant")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds: stop building after")
    args = ap.parse_args()
    args.work = args.work.absolute()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    doc: dict[str, Any] = {"builds": {}, "effects": {}, "errors": {}}
    names: dict[str, int | None] = {"full": None}
    names.update({f"without-{pr}": pr for pr in args.drop_pr})
    wheels: dict[str, Path] = {}
    for i, (name, drop) in enumerate(names.items()):
        if time.monotonic() - started > args.deadline:
            doc["builds"][name] = {"skipped": "past the deadline"}
            continue
        m = variant(args.manifest.absolute(), args.work / f"manifest-{i}", args.kernel, drop, args)
        if args.no_ptx:  # SASS only, in every variant alike: a shorter build, the same kernels
            m.write_text(m.read_text().replace("\nptx = true", "\nptx = false", 1))
        wheel, seconds = build(m, name, args, args.work / f"wheels-{i}", str(i))
        doc["builds"][name] = {"wheel": wheel.name if wheel else None, "seconds": round(seconds, 1)}
        if wheel is not None:
            wheels[name] = wheel
        (args.out / "attribute-kernels.json").write_text(json.dumps(doc, indent=2) + "\n")
    sites = {}
    for name, wheel in wheels.items():
        site = args.work / f"site-{name}"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--target", str(site), str(wheel)], check=True)  # fmt: skip
        sites[name] = site
    series: dict[str, dict[str, dict[tuple[int, int], float]]] = {n: {} for n in sites}
    order = list(sites)
    lines: list[str] = []
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else list(reversed(order)):
            res = run_kernels(sites[name], args.samples, args.iters)
            doc["errors"][name] = res["error"]
            doc.setdefault("times", {}).setdefault(name, []).append(res["times"])
            for kernel, times in res["times"].items():
                for i, t in enumerate(times):
                    series[name].setdefault(kernel, {})[(r, i)] = t
        print(f"round {r + 1} done at {time.monotonic() - started:.0f} s", flush=True)
        lines = effects(doc, series, order)  # after every round: a killed run keeps its data
        doc["table"] = lines
        (args.out / "attribute-kernels.json").write_text(json.dumps(doc, indent=2) + "\n")
    doc["seconds"] = round(time.monotonic() - started, 1)
    (args.out / "attribute-kernels.json").write_text(json.dumps(doc, indent=2) + "\n")
    print("\n".join(lines))
    print(json.dumps({"builds": doc["builds"], "errors": doc["errors"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

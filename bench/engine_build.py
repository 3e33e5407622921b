"""The real engine build, measured: cold, warm (compiler cache), and a Python-only change.

Three builds of one engine manifest through the real CLI (``pinwheel build``), in
one run, each against the cold build of the same run as the baseline:

1. cold: an empty compiler cache (a fresh ``SCCACHE_DIR`` under ``--work``);
2. warm: the same inputs again, the cache now full (every object a hit);
3. reuse: ``--pyonly`` (the same stack plus a Python-only change, e.g.
   ``recipes/examples/1cat-build-pyonly.toml``) with ``--reuse-from`` the warm
   (else the cold) build's release directory;
4. other-path: the same manifest from another pinwheel cache (``--other-cache``,
   at another path: its own workspace, toolchain and build venv) sharing cold's
   compiler cache: the canonical build path makes every object a hit there, and
   the wheel must be cold's sha256;
5. fresh: what an ephemeral CI runner sees: the other cache with everything deleted
   but its toolkit and build venv (what a runner restores from its own cache, keyed
   by the lock), so its git repositories, workspace, exports, stamps and memos are
   gone, and cold's shared cache (compiler cache and object store) warm. When the
   other cache has no toolkit or build venv yet, a first build makes them (printed
   as ``fresh-setup``, not a measurement).

Every build's output is kept in ``WORK/<phase>.log``; its phase table (where the
time went, what each phase did and skipped) is printed under its line.

Prints each build's seconds (the wheel build as provenance records it; the whole
``pinwheel build`` beside it), its ratio to cold, the wheel's sha256, the compiler
cache's hits and misses and the members reused, from the build's own provenance.
``--cold-from DIR`` takes the cold build from an earlier run instead (hours saved;
the output says the baseline is not of this run). ``--resume`` continues a cold phase
that was interrupted (the real build is longer than a working session on two
cores): the objects it already compiled are hits, so its bytes still answer "do two
cold builds match" but its time is no cold time, and the output says so.
The cold and warm wheels must be one sha256 (a hit gives the cold build's object).
``--compare WHEEL`` names an earlier build of the same manifest (another cold
build): the members whose bytes differ are listed, with sizes.

    PINWHEEL_MIRRORS=... PINWHEEL_WHEELHOUSE=... python bench/engine_build.py \\
        --manifest recipes/examples/1cat-build.toml \\
        --pyonly recipes/examples/1cat-build-pyonly.toml \\
        --cache CACHE --work DIR [--compare OLD.whl] [--phases cold,warm,reuse] \
        [--cold-from DIR --sccache-dir DIR]

The cache (``--cache``) keeps the toolchain, the hashed build venv and the git
repositories between runs: they are not what is measured here. The real 1Cat-vLLM
build for arch 7.0 took 70.7 min of wheel build cold on two idle cores (2026-12-03; no
change: 1.4 s for the whole `pinwheel build`; fresh workspace with the shared store warm:
30.1 s; docs/build.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

PHASES = ("cold", "warm", "reuse", "other-path", "fresh")
# What a fresh runner keeps of a pinwheel cache (restored from the runner's own cache).
RUNNER_KEEPS = ("toolchains", "venvs", "CACHEDIR.TAG")


BENCH_STORE_KEY = "bench-runners-of-one-store-share-this-key"  # PINWHEEL_STORE_KEY

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def differing_members(a: Path, b: Path) -> list[tuple[str, int, int]]:
    """(name, size in a, size in b) of members whose bytes differ, or that only one has."""
    out = []
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        names_a, names_b = set(za.namelist()), set(zb.namelist())
        for name in sorted(names_a | names_b):
            da = za.read(name) if name in names_a else b""
            db = zb.read(name) if name in names_b else b""
            if da != db:
                out.append((name, len(da), len(db)))
    return out


def run_build(
    manifest: Path, cache: Path, out: Path, env: dict[str, str], *extra: str, log: Path
) -> dict:
    """One ``pinwheel build``: wall seconds, its phase table and the engine's provenance
    entry; its whole output in ``log``."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pinwheel", "--manifest", str(manifest), "--cache", str(cache)]
    cmd += ["build", "--out", str(out), *extra]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True)
    seconds = time.monotonic() - start
    log.write_text(f"$ {' '.join(cmd)}\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"pinwheel build exited {proc.returncode} ({manifest.name}; {log})")
    return {**from_receipt(out), "wall": round(seconds, 1), "phases": phase_table(proc.stdout)}


def phase_table(stdout: str) -> list[str]:
    """The ``phases:`` block ``pinwheel build`` prints last (its rows, then the total)."""
    lines = stdout.splitlines()
    if "phases:" not in lines:
        return []
    return [line.strip() for line in lines[lines.index("phases:") + 1 :] if line.startswith("  ")]


def runner_restart(cache: Path) -> list[str]:
    """Empty ``cache`` as a fresh CI runner finds it: all but RUNNER_KEEPS removed."""
    gone = []
    for entry in sorted(cache.iterdir()) if cache.is_dir() else []:
        if entry.name not in RUNNER_KEEPS:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            gone.append(entry.name)
    return gone


def from_receipt(out: Path) -> dict:
    """The engine's entry of a build's provenance: its build seconds, cache and reuse."""
    receipt = json.loads((out / "provenance.json").read_text())
    engine = next(c for c in receipt["components"] if c.get("name") == "engine")
    wheel = out / engine["wheel"]
    cache = engine.get("compiler_cache") or {}
    return {
        "seconds": engine["seconds"],  # the wheel build itself (replay and export excluded)
        "wall": None,
        "wheel": wheel.name,
        "path": str(wheel),
        "sha256": sha256(wheel),
        "size": wheel.stat().st_size,
        "compiler_cache": {k: cache.get(k) for k in ("hits", "misses")},
        "reused": sorted((engine.get("reused") or {}).get("members", {})),
        "compiled_inputs": len((engine.get("compiled_inputs") or {}).get("files", {})),
    }


def show(phase: str, r: dict) -> None:
    wall = f"{r['wall']:.1f} s" if r.get("wall") is not None else "-"
    line = f"{phase:5} build {r['seconds']:8.1f} s (pinwheel build {wall})"
    line += f"  sha256 {r['sha256'][:16]}  {r['size'] / 2**20:.1f} MiB"
    line += f"  cache {r['compiler_cache']}  reused {len(r['reused'])}"
    line += f"  compiled inputs {r['compiled_inputs']}"
    print(line, flush=True)
    for row in r.get("phases") or []:
        print(f"      {row}", flush=True)


def against_cold(cold: dict, r: dict) -> str:
    """A build against the cold one: its wheel build (a fast path may run no builder at
    all: 0.0 s, no ratio) and its whole ``pinwheel build`` (what a user waits) against cold's
    whole command, or against cold's wheel build when cold's whole time is not known (an
    earlier run's: a lower bound of it, so the ratio is too)."""
    if r["seconds"] >= 0.05:
        out = f"{cold['seconds'] / r['seconds']:.1f}x faster wheel build "
        out += f"({r['seconds']:.1f} s vs {cold['seconds']:.1f} s)"
    else:
        out = f"no wheel build ({r['seconds']:.1f} s: the builder did not compile)"
    if r.get("wall"):
        whole = bool(cold.get("wall"))
        base, what = (cold["wall"], "whole") if whole else (cold["seconds"], "wheel build")
        out += f"; the whole pinwheel build {r['wall']:.1f} s, {base / r['wall']:.1f}x "
        out += f"faster than cold's {what} {base:.1f} s"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", type=Path, required=True)
    ap.add_argument("--pyonly", type=Path, help="the same stack plus a Python-only change")
    ap.add_argument("--cache", type=Path, required=True, help="pinwheel cache (toolchain, venv)")
    ap.add_argument("--work", type=Path, required=True, help="scratch: outputs, compiler cache")
    ap.add_argument("--compare", type=Path, help="an earlier wheel of the same manifest")
    ap.add_argument(
        "--cold-from", type=Path, metavar="DIR",
        help="take the cold build from DIR (an earlier `pinwheel build --out DIR` with an "
        "empty compiler cache) instead of running it: the baseline is then NOT of this run",
    )  # fmt: skip
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument(
        "--sccache-dir", type=Path, default=None,
        help="the compiler cache (default WORK/sccache; emptied by the cold phase); with "
        "--cold-from, the one that cold build filled",
    )  # fmt: skip
    ap.add_argument(
        "--other-cache", type=Path, default=None,
        help="the other-path phase's pinwheel cache (another path than --cache)",
    )  # fmt: skip
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument(
        "--resume", action="store_true",
        help="continue an interrupted cold phase: keep what it put in --sccache-dir (its "
        "wheel still comes from compiles never cached before; its time is not a cold time)",
    )  # fmt: skip
    args = ap.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    if unknown := set(phases) - set(PHASES):
        ap.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    if "reuse" in phases and args.pyonly is None:
        ap.error("the reuse phase needs --pyonly MANIFEST")

    for needs in ("other-path", "fresh"):
        if needs in phases and args.other_cache is None:
            ap.error(f"the {needs} phase needs --other-cache DIR")
    if args.other_cache is not None and args.other_cache.absolute() == args.cache.absolute():
        ap.error("--other-cache must be another path than --cache")
    if args.cold_from is not None and "cold" in phases:
        ap.error("--cold-from replaces the cold phase: leave 'cold' out of --phases")

    work = args.work.absolute()
    sccache = (args.sccache_dir or work / "sccache").absolute()
    if "cold" in phases and not args.resume:
        shutil.rmtree(sccache, ignore_errors=True)  # cold: an empty cache
    sccache.mkdir(parents=True, exist_ok=True)
    # The runners of one store share its key (PINWHEEL_STORE_KEY): the fresh workspace's
    # cache is another than the cold build's, and a per-cache key would make it miss.
    env = {**os.environ, "SCCACHE_DIR": str(sccache), "PINWHEEL_STORE_KEY": BENCH_STORE_KEY}

    results: dict[str, dict] = {}
    cold_out = work / "cold"
    if args.cold_from is not None:
        cold_out = args.cold_from
        results["cold"] = {**from_receipt(cold_out), "baseline": "earlier run (--cold-from)"}
        show("cold", results["cold"])
    for phase in phases:
        if phase == "reuse":
            if not (cold_out / "provenance.json").is_file():
                raise SystemExit("the reuse phase needs the cold phase's output (run it first)")
            reuse_from = work / "warm" if "warm" in results else cold_out
            extra = ("--reuse-from", str(reuse_from))
            r = run_build(args.pyonly, args.cache, work / phase, env, *extra,
                          log=work / f"{phase}.log")  # fmt: skip
        elif phase == "other-path":
            r = run_build(args.manifest, args.other_cache.absolute(), work / phase, env,
                          log=work / f"{phase}.log")  # fmt: skip
        elif phase == "fresh":
            other = args.other_cache.absolute()
            if not all((other / keep).is_dir() for keep in RUNNER_KEEPS[:2]):
                setup = run_build(args.manifest, other, work / "fresh-setup", env,
                                  log=work / "fresh-setup.log")  # fmt: skip
                results["fresh-setup"] = {**setup, "baseline": "not a measurement"}
                show("fresh-setup", setup)
            gone = runner_restart(other)
            print(f"fresh: removed {', '.join(gone) or 'nothing'} from the other cache; "
                  f"kept {', '.join(RUNNER_KEEPS)}", flush=True)
            r = run_build(args.manifest, other, work / phase, env, log=work / f"{phase}.log")
        else:
            r = run_build(args.manifest, args.cache, work / phase, env, log=work / f"{phase}.log")
        results[phase] = r
        show(phase, r)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")

    if args.resume and "cold" in results:
        results["cold"]["baseline"] = "interrupted and resumed cold phase (--resume)"
    cold = results.get("cold")
    if cold:
        if cold.get("baseline"):
            print(f"baseline: the cold build is from an {cold['baseline']}, not this run")
        for phase in ("warm", "reuse", "other-path", "fresh"):
            if phase in results:
                print(f"{phase} vs cold: {against_cold(cold, results[phase])}")
        for phase in ("warm", "other-path", "fresh"):
            if phase in results:
                same = results[phase]["sha256"] == cold["sha256"]
                print(f"cold == {phase} sha256: {same}")
        if args.compare:
            diff = differing_members(Path(cold["path"]), args.compare)
            print(f"cold vs {args.compare.name}: {len(diff)} member(s) differ")
            for name, size_a, size_b in diff:
                print(f"  {name}: {size_a} vs {size_b} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

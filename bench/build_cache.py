"""Incremental rebuilds and the canonical build path, measured in one run per package.

Each package (the in-tree selftest kernel; optionally a torch-extension
``[[kernel]]`` of another manifest, e.g. exllamav3) is built through the real build
stage (``pipeline.build``; sccache started by pinwheel):

1. ``cold``: empty cache A (no workspace, empty compiler cache);
2. ``warm``: cache A again, no change (the kept workspace: nothing compiles);
3. ``one-file``: cache A, one line of code added to one .cu (that file recompiles);
4. ``one-file-cold``: the edited source from an empty cache C (its bytes must equal 3's);
5. ``cold-other-path``: the original source from an empty cache B at another path
   (its bytes must equal 1's: the canonical path);
6. ``other-path-shared-cc``: an empty cache D at yet another path sharing A's compiler
   cache (SCCACHE_DIR): hits across cache directories, same bytes.

``--runs`` picks a subset (a GPU lease of ten minutes fits cold, warm and one-file
of exllamav3, not all six); ``--other-path`` puts cache B elsewhere, e.g. on
another filesystem (tmpfs lists directories in another order than ext4).

Every timing is against ``cold`` of the same run; the selftest also prints a
``--no-cache`` build's sha256 (no compiler cache at all). bitsandbytes (``--bnb-src``,
``--cublas``) keeps its compiler-cache-only bench (a CMake tree outside pinwheel's
build stage).

    python bench/build_cache.py --toolchain-cache ~/.cache/pinwheel [--work DIR]
    # exllamav3 as a component (PINWHEEL_TORCH_PYTHON = a python with the pinned torch):
    python bench/build_cache.py --toolchain-cache DIR --only kernel \\
        --kernel-manifest recipes/sm120-tp2/manifest.toml --kernel exllamav3 \\
        --mirror https://github.com/turboderp-org/exllamav3.git=MIRROR \\
        --touch exllamav3/exllamav3_ext/generator/sampling_basic.cu \\
        --runs cold,warm,one-file
    # bitsandbytes on a GPU box, its own toolkit and cores (CUDA_HOME=/usr/local/cuda):
    python bench/build_cache.py --toolchain-cache DIR --only bnb --bnb-src DIR \\
        --cublas /usr/local/cuda --cuda 13.0 --arch 9.0 --jobs 16
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from manifestcopy import copy_beside  # noqa: E402

from pinwheel import options  # noqa: E402
from pinwheel.cli import parse_mirrors  # noqa: E402
from pinwheel.compile import compcache  # noqa: E402
from pinwheel.compile.buildenv import build_env  # noqa: E402
from pinwheel.compile.pipeline import BuildRequest, build  # noqa: E402
from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit  # noqa: E402
from pinwheel.manifest import Manifest, load  # noqa: E402
from pinwheel.manifest.build import CacheConfig  # noqa: E402

# --profile DIR: one cProfile file per build (``NAME-RUN.pstats``), where the seconds went.
PROFILE_DIR: Path | None = None


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def truncate_entries(directory: Path) -> int:
    n = 0
    for f in directory.rglob("*"):
        if f.is_file() and len(f.name) == 64:
            data = f.read_bytes()
            f.write_bytes(data[: len(data) // 2])
            n += 1
    return n


def bench_environ() -> dict[str, str]:
    """The caller's environment without sccache server settings (each run starts its own
    local cache); SCCACHE_PATH, which only names the binary, stays."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_") or k == "SCCACHE_PATH"
    }


def cache_counts(name: str, cc: Mapping[str, Any]) -> tuple[int | None, int | None, int | None]:
    if "hits" not in cc:  # the cache was off: every figure would be a plain build's
        raise SystemExit(f"{name}: the compiler cache was off: {cc.get('reason', cc)}")
    return cc.get("hits"), cc.get("misses"), cc.get("errors")


@dataclasses.dataclass
class Run:
    name: str
    seconds: float
    sha256: str
    hits: int | None
    misses: int | None
    errors: int | None = None
    stage: float | None = None  # the component's own build (staging + builder), of `seconds`


def report(package: str, runs: list[Run], plain: str | None) -> dict[str, object]:
    by = {r.name: r for r in runs}
    print(f"\n== {package}")
    for r in runs:
        extra = f" errors={r.errors}" if r.errors else ""
        extra += f" (component build {r.stage:.1f} s)" if r.stage is not None else ""
        print(
            f"  {r.name:<22} {r.seconds:7.1f} s  hits={r.hits} misses={r.misses}{extra}  {r.sha256}"
        )
    if plain:
        print(f"  {'plain (--no-cache)':<22} {'':>9}  {'':<20}{plain}")
    ratios: dict[str, float] = {}
    for name, target in (("warm", 10), ("one-file", 5)):
        if "cold" in by and name in by:
            ratios[name] = by["cold"].seconds / by[name].seconds
            print(f"  {name} vs cold: {ratios[name]:.1f}x (target >= {target}x)")
    same = {by[n].sha256 for n in ORIGINAL if n in by}
    if plain:
        same.add(plain)
    verdict = "ONE sha256" if len(same) == 1 else f"DIFFER: {sorted(same)}"
    print(f"  {' / '.join(n for n in ORIGINAL if n in by)}{' / plain' if plain else ''}: {verdict}")
    edited = {by[n].sha256 for n in ("one-file", "one-file-cold") if n in by}
    both = "one-file" in by and "one-file-cold" in by
    if both:
        print(f"  one-file (incremental) == one-file-cold (fresh cache): {len(edited) == 1}")
    return {
        "package": package,
        "runs": [dataclasses.asdict(r) for r in runs],
        "plain": plain,
        "warm_ratio": round(ratios["warm"], 2) if "warm" in ratios else None,
        "one_file_ratio": round(ratios["one-file"], 2) if "one-file" in ratios else None,
        "one_sha256": len(same) == 1,
        "one_file_equals_cold": len(edited) == 1 if both else None,
    }


# The runs of the original source: one sha256 from all of them.
ORIGINAL = ("cold", "warm", "cold-other-path", "other-path-shared-cc")


RUNS = ("cold", "warm", "one-file", "one-file-cold", "cold-other-path", "other-path-shared-cc")


def scenario(
    one: Callable[..., Run], base: Manifest, edited: Manifest, work: Path,
    runs: tuple[str, ...] = RUNS, other: Path | None = None,
) -> list[Run]:  # fmt: skip
    """cold (empty cache A), warm no-change (A kept), one-file (A, one .cu edited),
    one-file-cold (the edited source, empty cache C), cold-other-path (empty cache B at
    another path: ``other``, e.g. on another filesystem), other-path-shared-cc (empty
    cache D, A's compiler cache: hits across cache directories need the canonical path).
    ``runs``: which of them, always in this order (warm and one-file need cold)."""
    b = other or work / "cache-b"
    for cache in (work / "cache-a", b, work / "cache-c", work / "cache-d"):
        shutil.rmtree(cache, ignore_errors=True)
    a = work / "cache-a"
    plan = {
        "cold": lambda: one("cold", base, a),
        "warm": lambda: one("warm", base, a),
        "one-file": lambda: one("one-file", edited, a),
        "one-file-cold": lambda: one("one-file-cold", edited, work / "cache-c"),
        "cold-other-path": lambda: one("cold-other-path", base, b),
        "other-path-shared-cc": lambda: one(
            "other-path-shared-cc", base, work / "cache-d" / "deeper",
            extra_env={"SCCACHE_DIR": str(a / "sccache")},
        ),  # fmt: skip
    }
    if ({"warm", "one-file", "other-path-shared-cc"} & set(runs)) and "cold" not in runs:
        raise SystemExit("--runs: warm, one-file and other-path-shared-cc need cold")
    return [plan[name]() for name in RUNS if name in runs]


# --------------------------------------------------------------------------- selftest


def kernel_only(manifest: Manifest) -> Manifest:
    """The manifest for one kernel's wheel: the engine's required members are not its business."""
    config = dataclasses.replace(manifest.require("build"), required_members=())
    return dataclasses.replace(manifest, build=config)


def build_kernel(
    run: str, manifest: Manifest, name: str, toolkit, cache: Path, out: Path,
    environ: dict[str, str], *, compiler_cache: bool = True, **request: Any,
) -> Run:  # fmt: skip
    """One real build of kernel ``name`` into ``out``: its time, sha256 and cache counts."""
    shutil.rmtree(out, ignore_errors=True)
    profiler = cProfile.Profile() if PROFILE_DIR is not None else None
    started = time.monotonic()
    if profiler is not None:
        profiler.enable()
    outcome = build(
        BuildRequest(
            manifest=manifest,
            cache=cache,
            out_dir=out,
            host=options.host(environ),
            kernels=(name,),
            toolkit=toolkit,
            source_date_epoch=1700000000,
            compiler_cache=compiler_cache,
            **request,
        )
    )
    seconds = time.monotonic() - started
    if profiler is not None and PROFILE_DIR is not None:
        profiler.disable()
        profiler.dump_stats(PROFILE_DIR / f"{name}-{run}.pstats")
    (b,) = outcome.built
    wheel = outcome.wheels.built[0]
    print(f"  {name} {run}: {seconds:.1f} s {sha(wheel)}", flush=True)
    if not compiler_cache:
        return Run(run, seconds, sha(wheel), None, None, stage=b.seconds)
    counts = cache_counts(f"{name} {run}", b.build.compiler_cache or {})
    return Run(run, seconds, sha(wheel), *counts, stage=b.seconds)


# default: what provisions on the 2-core machines (CUDA 12.4, sm_70); the selftest as the
# V100 card's manifest declares it (that manifest pins CUDA 12.8, which cannot be had here).
SELFTEST_MANIFEST = (ROOT / "recipes" / "examples" / "selftest-cuda124.toml").read_text()


def bench_selftest(
    toolkit, work: Path, runs: tuple[str, ...] = RUNS, other: Path | None = None
) -> dict[str, object]:
    def checkout(dest: Path) -> Path:
        """A copy of the checkout's kernel + manifest: the one-file change edits a copy."""
        shutil.rmtree(dest, ignore_errors=True)
        (dest / "kernels").mkdir(parents=True)
        shutil.copytree(ROOT / "kernels" / "pinwheel-selftest",
                        dest / "kernels" / "pinwheel-selftest")  # fmt: skip
        (dest / "manifest.toml").write_text(SELFTEST_MANIFEST)
        return dest / "manifest.toml"

    base = kernel_only(load(checkout(work / "repo")))
    edited_path = checkout(work / "repo-edited")
    cu = edited_path.parent / "kernels" / "pinwheel-selftest" / "csrc" / "selftest.cu"
    cu.write_text(cu.read_text() + "\n__global__ void pinwheel_bench_touch() {}\n")
    edited = kernel_only(load(edited_path))

    def one(
        name: str, manifest: Manifest, cache: Path, *, compiler_cache: bool = True,
        extra_env: dict[str, str] | None = None,
    ) -> Run:  # fmt: skip
        environ = {**bench_environ(), **(extra_env or {})}
        return build_kernel(name, manifest, "pinwheel-selftest", toolkit, cache,
                            work / f"wheels-{name}", environ,
                            compiler_cache=compiler_cache)  # fmt: skip

    plain = one("plain", base, work / "cache-plain", compiler_cache=False).sha256
    done = scenario(one, base, edited, work, runs, other)
    return report("kernels/pinwheel-selftest (pinwheel kernels, CMake)", done, plain)


# --------------------------------------------------------------------------- bitsandbytes


def bench_bnb(
    toolkit, config, src: Path, cublas: Path, work: Path, *, jobs: int = 2
) -> dict[str, object]:
    fixed = work / "bnb" / "src"  # always built from this path: cudafe++ hashes it
    build_dir = work / "bnb" / "build"
    cache = work / "bnb" / "cache"
    environ = bench_environ()
    host = options.host(environ)  # what the compiler cache's plan and server get

    def stage() -> None:
        shutil.rmtree(fixed, ignore_errors=True)
        shutil.copytree(src, fixed, ignore=shutil.ignore_patterns(".git", "build"))

    def cmake_build(name: str, session: compcache.Session | None) -> Run:
        shutil.rmtree(build_dir, ignore_errors=True)
        for so in fixed.glob("bitsandbytes/libbitsandbytes_cuda*.so"):
            so.unlink()
        # pinwheel's one build environment (SOURCE_DATE_EPOCH, -Wl,--strip-all, arches)
        env, _ = build_env(config, toolkit=toolkit, source_date_epoch=1700000000, base=environ)
        defines: list[str] = []
        if session is not None:
            env.update(session.launch_env(env.get("PATH", "")))
            defines = [f"-D{d}" for d in session.cmake_defines()]
            session.zero()
        inc = cublas / "include"
        libs = {n: sorted(cublas.glob(f"lib*/{n}.so.*"))[0] for n in ("libcublas", "libcublasLt")}
        capability = "".join(a.replace(".", "") for a in config.arches)
        started = time.monotonic()
        subprocess.run(
            ["cmake", "-S", str(fixed), "-B", str(build_dir), "-G", "Ninja",
             "-DCMAKE_BUILD_TYPE=Release", "-DCOMPUTE_BACKEND=cuda",
             f"-DCOMPUTE_CAPABILITY={capability}",
             f"-DCMAKE_CUDA_COMPILER={toolkit.nvcc}", f"-DCUDAToolkit_ROOT={toolkit.root}",
             f"-DCMAKE_CUDA_FLAGS=-I{inc}", f"-DCMAKE_CXX_FLAGS=-I{inc}",
             f"-DCUDA_cublas_LIBRARY={libs['libcublas']}",
             f"-DCUDA_cublasLt_LIBRARY={libs['libcublasLt']}", *defines],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        log = work / "bnb" / f"{name}.ninja.log"
        with open(log, "wb") as out:
            proc = subprocess.run(
                ["ninja", "-C", str(build_dir), f"-j{jobs}"], env=env, stdout=out, stderr=out
            )
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-12:]
            print(
                f"  {name}: ninja exit {proc.returncode} (log {log}):\n    " + "\n    ".join(tail)
            )
            stats = session.stats() if session is not None else {}
            return Run(name, seconds, f"FAILED (exit {proc.returncode})", stats.get("hits"),
                       stats.get("misses"), stats.get("errors"))  # fmt: skip
        (so,) = fixed.glob("bitsandbytes/libbitsandbytes_cuda*.so")
        (work / "bnb" / "out").mkdir(exist_ok=True)
        shutil.copy2(so, work / "bnb" / "out" / f"{name}.so")
        stats = session.stats() if session is not None else {}
        return Run(
            name, seconds, sha(so), stats.get("hits"), stats.get("misses"), stats.get("errors")
        )

    def with_cache(name: str, fn: Callable[[compcache.Session], Run]) -> Run:
        plan = compcache.plan(CacheConfig(size="5G"), cache, host)
        session, plan = compcache.start(plan, cache / "run", host)
        if session is None:
            raise SystemExit(f"sccache did not start: {plan.disabled}")
        try:
            run = fn(session)
        finally:
            session.stop()
        print(f"  bitsandbytes {run.name}: {run.seconds:.1f} s {run.sha256}", flush=True)
        return run

    stage()
    plain = cmake_build("plain", None).sha256
    shutil.rmtree(cache, ignore_errors=True)
    runs = [with_cache("cold", lambda s: cmake_build("cold", s))]
    runs.append(with_cache("warm", lambda s: cmake_build("warm", s)))
    cu = fixed / "csrc" / "ops.cu"
    original = cu.read_text()
    cu.write_text(original + "\n// one-line change\nint pinwheel_bench_touch() { return 1; }\n")
    runs.append(with_cache("one-file", lambda s: cmake_build("one-file", s)))
    cu.write_text(original)
    shutil.rmtree(cache)
    runs.append(with_cache("cold-again", lambda s: cmake_build("cold-again", s)))
    print(f"bitsandbytes: truncated {truncate_entries(cache / 'sccache')} cache entries")
    runs.append(with_cache("truncated-cache", lambda s: cmake_build("truncated-cache", s)))
    arches = ", ".join(f"sm_{a.replace('.', '')}" for a in config.arches)
    return report(f"bitsandbytes (CMake, 4 .cu + 2 .cpp, {arches}, -j{jobs})", runs, plain)


# --------------------------------------------------------------------------- a [[kernel]]


def one_file_patch(path: str, text: str) -> str:
    """A unified diff appending one line of code to ``path`` (``text``: its content).

    Code, not a comment: the cache keys on preprocessed source, so a comment-only
    change is all hits (measured: 230 of 230 for exllamav3)."""
    old = text.splitlines(keepends=True)
    if old and not old[-1].endswith("\n"):
        raise SystemExit(f"{path}: no newline at the end; pick another --touch file")
    line = (
        "__global__ void pinwheel_bench_touch() {}\n"
        if path.endswith(".cu")
        else "int pinwheel_bench_touch() { return 1; }\n"
    )
    new = [*old, line]
    diff = difflib.unified_diff(old, new, fromfile=f"a/{path}", tofile=f"b/{path}")
    return "".join(diff)


def one_file_manifest(source: Path, name: str, patch: str, dest: Path) -> Path:
    """A copy of ``source`` whose kernel ``name`` has one more step: ``patch``.

    The copy holds the manifest, its ``patches/`` and every file it names beside it
    (``[build.torch_lock]``, ...: the SM120 manifest's copy did not load without its torch
    lock); the kernel's pinned ``tree`` is dropped (the stack now ends elsewhere)."""
    import tomlkit

    doc = tomlkit.parse(source.read_text())
    copy_beside(source, doc, dest)
    (dest / "patches").mkdir(exist_ok=True)
    patch_file = dest / "patches" / "bench-one-file.patch"
    patch_file.write_text(patch)
    (table,) = [k for k in doc["kernel"] if k["name"] == name]  # type: ignore[index,union-attr]
    if "url" not in table:
        raise SystemExit(f"{source}: [[kernel]] {name} is in-tree (no upstream stack to add "
                         "a patch to): name a [[kernel]] with a url")  # fmt: skip
    table.pop("tree", None)
    step = tomlkit.table()
    # one more [[kernel.patch]] where the stack is written so, else one more [[kernel.step]]
    key = "patch" if "patch" in table else "step"
    if key == "step":
        step["action"] = "patch"
    step["path"] = "patches/bench-one-file.patch"
    step["sha256"] = sha(patch_file)
    if key not in table:
        table[key] = tomlkit.aot()
    table[key].append(step)
    out = dest / source.name
    out.write_text(tomlkit.dumps(doc))
    return out


def bench_kernel(
    toolkit, manifest_path: Path, name: str, touch: str, mirrors: dict[str, str], work: Path,
    runs: tuple[str, ...] = RUNS, other: Path | None = None,
) -> dict[str, object]:  # fmt: skip
    base = kernel_only(load(manifest_path))

    def one(
        run: str, manifest: Manifest, cache: Path, *, extra_env: dict[str, str] | None = None
    ) -> Run:
        environ = {**bench_environ(), **(extra_env or {})}
        r = build_kernel(run, manifest, name, toolkit, cache, work / f"wheels-{run}", environ,
                         mirrors=mirrors, offline=True)  # fmt: skip
        print(f"  {name} {run}: hits/misses {r.hits, r.misses}", flush=True)
        return r

    # The edited stack needs the replayed tree's file: replay it once (a cold build of the
    # original in a scratch cache gives that tree, and the cold run then starts empty).
    probe = work / "cache-probe"
    shutil.rmtree(probe, ignore_errors=True)
    from pinwheel.compile.kernels import BuildOptions, stage_out_of_tree

    (spec,) = [k for k in base.kernels if k.name == name]
    caller = options.host(bench_environ())
    opts = BuildOptions(cache=probe, mirrors=mirrors, host=caller, offline=True)
    staged = stage_out_of_tree(spec, opts).directory / touch
    if not staged.is_file():
        raise SystemExit(f"--touch {touch}: not a file of the replayed {name} tree")
    variant = one_file_manifest(
        manifest_path, name, one_file_patch(touch, staged.read_text()), work / "one-file"
    )
    done = scenario(one, base, kernel_only(load(variant)), work, runs, other)
    config = base.require("build")
    arches = ", ".join(f"sm_{a.replace('.', '')}" for a in config.arches)
    jobs = os.environ.get("MAX_JOBS") or config.env.get("MAX_JOBS")
    return report(
        f"{name} ([[kernel]] torch-extension, {arches}, MAX_JOBS={jobs}; one-file: {touch})",
        done, None,
    )  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--toolchain-cache",
        type=Path,
        required=True,
        help="pinwheel cache with a CUDA 12.x toolkit",
    )
    ap.add_argument("--work", type=Path, default=None, help="scratch dir (fixed paths inside)")
    ap.add_argument("--bnb-src", type=Path, default=None)
    ap.add_argument("--cublas", type=Path, default=None)
    ap.add_argument("--kernel-manifest", type=Path, default=None, help="a manifest with [[kernel]]")
    ap.add_argument("--kernel", default="exllamav3", help="its torch-extension [[kernel]] name")
    ap.add_argument("--mirror", action="append", default=[], help="URL=PATH, as for pinwheel")
    ap.add_argument(
        "--touch",
        # the first file above the median compile time of exllamav3's 68 objects (41 s in
        # the ninja log of an H200 cold build run beside another) that ends in a newline;
        # quant/quantize.cu took 136 s there, quant/comp_units/* up to 159 s
        default="exllamav3/exllamav3_ext/generator/sampling_basic.cu",
        help="the kernel's .cu file (path in its tree) the one-file run changes",
    )
    ap.add_argument("--only", choices=("selftest", "bnb", "kernel"), default=None)
    ap.add_argument(
        "--runs", default=",".join(RUNS),
        help=f"comma-separated subset of {','.join(RUNS)} (a GPU lease may not fit all)",
    )  # fmt: skip
    ap.add_argument(
        "--other-path", type=Path, default=None,
        help="cache B of cold-other-path (default WORK/.../cache-b); e.g. on another filesystem",
    )  # fmt: skip
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--profile", type=Path, default=None, metavar="DIR",
        help="write a cProfile file per build into DIR (NAME-RUN.pstats)",
    )  # fmt: skip
    ap.add_argument("--cuda", default=None, help="another CUDA (a system toolkit), e.g. 13.0")
    ap.add_argument("--arch", action="append", default=None, help="instead of [build] arches")
    ap.add_argument("--jobs", type=int, default=2, help="ninja -j for bitsandbytes")
    args = ap.parse_args()
    if args.profile is not None:
        global PROFILE_DIR
        args.profile.mkdir(parents=True, exist_ok=True)
        PROFILE_DIR = args.profile.absolute()
    runs = tuple(r for r in args.runs.split(",") if r)
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        ap.error(f"--runs: unknown {unknown}; known: {', '.join(RUNS)}")
    work = args.work or Path(tempfile.gettempdir()) / "pinwheel-bench-build-cache"
    work.mkdir(parents=True, exist_ok=True)
    scratch = work / "selftest-manifest"
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "manifest.toml").write_text(SELFTEST_MANIFEST)
    (scratch / "kernels" / "pinwheel-selftest").mkdir(parents=True, exist_ok=True)
    config = load(scratch / "manifest.toml").require("build")
    if args.cuda or args.arch:  # e.g. a GPU box's own CUDA 13 for sm_90
        config = dataclasses.replace(
            config, cuda=args.cuda or config.cuda, arches=tuple(args.arch or config.arches)
        )
    caller = options.host(os.environ)
    print(f"sccache {compcache.find_sccache(caller)}")
    results = []
    if args.only in (None, "selftest", "bnb"):  # the kernel bench takes its manifest's
        toolkit = resolve_toolkit(
            ToolkitRequest(config, args.toolchain_cache, caller, provision=False)
        )
        print(f"CUDA {toolkit.version} at {toolkit.root}")
    if args.only in (None, "selftest"):
        results.append(bench_selftest(toolkit, work / "selftest", runs, args.other_path))
    if args.only in (None, "bnb"):
        if args.bnb_src and args.cublas:
            results.append(
                bench_bnb(toolkit, config, args.bnb_src, args.cublas, work, jobs=args.jobs)
            )
        else:
            print("\nbitsandbytes: skipped (pass --bnb-src and --cublas)")
    if args.only in (None, "kernel"):
        if args.kernel_manifest:
            kconfig = load(args.kernel_manifest).require("build")
            ktoolkit = resolve_toolkit(
                ToolkitRequest(kconfig, args.toolchain_cache, caller, provision=False)
            )
            print(f"{args.kernel}: CUDA {ktoolkit.version} at {ktoolkit.root}")
            mirrors = parse_mirrors(args.mirror, os.environ.get("PINWHEEL_MIRRORS"))
            results.append(
                bench_kernel(
                    ktoolkit,
                    args.kernel_manifest.absolute(),
                    args.kernel,
                    args.touch,
                    mirrors,
                    work / "kernel",
                    runs,
                    args.other_path,
                )  # fmt: skip
            )
        else:
            print("\n[[kernel]]: skipped (pass --kernel-manifest)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

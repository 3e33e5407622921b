"""A fresh workspace with a warm shared cache, and a no-change rebuild, against cold.

Per package, in one run, through the real build stage (``pipeline.build``; the engine
after a real replay of its stack), every build timed whole:

1. ``cold``: cache A, an empty shared compiler-cache directory S (``SCCACHE_DIR``);
2. ``no-change``: cache A again (the kept workspace; the phase table says what ran);
3. ``fresh+store``: an empty cache B sharing S: sccache's objects and pinwheel's
   object store (``compile.objstore``), what a new CI runner with a warm shared cache
   sees;
4. ``fresh+sccache``: an empty cache C sharing S with the object store turned off in
   this process: every object a compiler-cache hit, each hit still preprocessed, and
   configure and link in full (what that runner saw before the store).

Prints each build's seconds, its ratio to cold, the compiler cache's hits and misses,
the members reused, the phase table of 2 and 3, and each wheel's sha256 against cold.

Packages: the tiny engine-shaped project of the tests (``tests/tinyproject.py``: a
setuptools tree; with ``--toolchain-cache``, its .cu compiled by the provisioned nvcc
12.4, else a C extension by gcc) and, with ``--toolchain-cache``, the in-tree selftest
kernel (``kernels/pinwheel-selftest``, CMake + nvcc).

    python bench/objstore_build.py [--toolchain-cache DIR] [--work DIR] [--only tiny]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from pinwheel import options  # noqa: E402
from pinwheel.compile import objstore, pipeline  # noqa: E402
from pinwheel.compile.phases import human_lines  # noqa: E402
from pinwheel.compile.pipeline import BuildOutcome, BuildRequest, build  # noqa: E402
from pinwheel.manifest import Manifest, load  # noqa: E402

RUNS = ("cold", "no-change", "fresh+store", "fresh+sccache")


@dataclasses.dataclass
class Run:
    name: str
    seconds: float
    sha256: str
    hits: Any
    misses: Any
    reused: int
    phases: list[str]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def environ(shared: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_")}
    if os.environ.get("SCCACHE_PATH"):
        env["SCCACHE_PATH"] = os.environ["SCCACHE_PATH"]
    # Runners of one store share its key (else each cache's own key: a fresh cache misses).
    return {**env, "SCCACHE_DIR": str(shared),
            "PINWHEEL_STORE_KEY": "bench-runners-of-one-store-share-this-key"}


def timed(name: str, make: Callable[[], BuildOutcome], store: bool = True) -> Run:
    original = objstore.for_plan
    if not store:  # the object store off: compiler-cache hits only (before the store)
        pipeline.objstore.for_plan = lambda plan, **kw: (None, "off (bench)")  # type: ignore[assignment]
    try:
        started = time.monotonic()
        outcome = make()
        seconds = time.monotonic() - started
    finally:
        pipeline.objstore.for_plan = original  # type: ignore[assignment]
    (b,) = outcome.built
    wheel = outcome.wheels.built[0]
    cc = b.build.compiler_cache or {}
    reused = len((b.build.reused or {}).get("members") or {})
    print(f"  {name:<14} {seconds:7.2f} s  hits={cc.get('hits')} misses={cc.get('misses')} "
          f"reused={reused}  {sha(wheel)}", flush=True)  # fmt: skip
    return Run(name, seconds, sha(wheel), cc.get("hits"), cc.get("misses"), reused,
               human_lines(outcome.phases))  # fmt: skip


def report(package: str, runs: list[Run]) -> None:
    by = {r.name: r for r in runs}
    cold = by["cold"]
    print(f"\n== {package}")
    for r in runs:
        ratio = cold.seconds / r.seconds if r.seconds else float("inf")
        same = "= cold" if r.sha256 == cold.sha256 else "DIFFERS from cold"
        print(f"  {r.name:<14} {r.seconds:7.2f} s  cold/this {ratio:6.1f}x  "
              f"hits={r.hits} misses={r.misses} reused={r.reused}  sha256 {same}")  # fmt: skip
    for name in ("no-change", "fresh+store"):
        if name in by:
            print(f"  phases of {name}:")
            print("\n".join(f"    {line}" for line in by[name].phases))
    if "fresh+store" in by and "fresh+sccache" in by:
        gain = by["fresh+sccache"].seconds / by["fresh+store"].seconds
        print(f"  fresh workspace: store {by['fresh+store'].seconds:.2f} s vs compiler cache "
              f"alone {by['fresh+sccache'].seconds:.2f} s: {gain:.1f}x")  # fmt: skip
    one = {r.sha256 for r in runs}
    print(f"  sha256: {'ONE for every path' if len(one) == 1 else f'DIFFER: {sorted(one)}'}")


def toolkit_of(cache: Path | None, cuda: str = "12.4") -> Any:
    if cache is None:
        return None
    from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit
    from pinwheel.manifest.build import BuildConfig

    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    config = BuildConfig(python=py, cuda=cuda, arches=("7.0",), ptx=True, torch=None,
                         label=None, version=None)  # fmt: skip
    return resolve_toolkit(ToolkitRequest(config, cache, options.host(os.environ)))


def bench_tiny(work: Path, toolkit: Any) -> None:
    from gitfixture import UPSTREAM_URL
    from pinwheel.source.replay import replay_manifest
    from test_build import make_tiny
    from tinyproject import NVCC_SETUP, STANDIN_SETUP

    tiny = make_tiny(work / "tiny", NVCC_SETUP if toolkit is not None else STANDIN_SETUP)
    manifest = tiny.manifest(ptx="true" if toolkit is not None else "false")
    shared = work / "shared-tiny"

    def one(name: str, cache: str, store: bool = True) -> Run:
        def make() -> BuildOutcome:
            m = load(manifest)
            replayed = replay_manifest(
                m, cache=work / cache, mirrors={UPSTREAM_URL: str(tiny.up.bare)}
            )
            env = environ(shared)
            if toolkit is not None:
                env["CUDA_HOME"] = str(toolkit.root)
            return build(BuildRequest(
                manifest=m, cache=work / cache, out_dir=work / f"wheels-tiny-{name}",
                host=options.host(env), replayed=replayed, kernels=(), toolkit=toolkit,
                cuda=toolkit is not None,
            ))  # fmt: skip

        return timed(name, make, store)

    kind = "nvcc 12.4 .cu" if toolkit is not None else "gcc C extension (stand-in device code)"
    print(f"tiny engine ({kind}):")
    runs = [
        one("cold", "cache-a"),
        one("no-change", "cache-a"),
        one("fresh+store", "cache-b"),
        one("fresh+sccache", "cache-c", store=False),
    ]
    report(f"tiny engine, {kind} (pinwheel build: replay + build)", runs)


def bench_selftest(work: Path, toolkit: Any) -> None:
    manifest_text = (ROOT / "recipes" / "examples" / "selftest-cuda124.toml").read_text()
    repo = work / "selftest-repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(ROOT / "kernels" / "pinwheel-selftest",
                    repo / "kernels" / "pinwheel-selftest")  # fmt: skip
    (repo / "manifest.toml").write_text(manifest_text)
    m: Manifest = load(repo / "manifest.toml")
    m = dataclasses.replace(m, build=dataclasses.replace(m.require("build"), required_members=()))
    shared = work / "shared-selftest"

    def one(name: str, cache: str, store: bool = True) -> Run:
        return timed(name, lambda: build(BuildRequest(
            manifest=m, cache=work / cache, out_dir=work / f"wheels-selftest-{name}",
            host=options.host(environ(shared)), kernels=("pinwheel-selftest",),
            toolkit=toolkit, source_date_epoch=1700000000,
        )), store)  # fmt: skip

    print("selftest kernel:")
    runs = [
        one("cold", "cache-a"),
        one("no-change", "cache-a"),
        one("fresh+store", "cache-b"),
        one("fresh+sccache", "cache-c", store=False),
    ]
    report("kernels/pinwheel-selftest (pinwheel kernels: CMake + nvcc 12.4)", runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toolchain-cache", type=Path, default=None,
                    help="a pinwheel cache holding (or provisioning) CUDA 12.4")  # fmt: skip
    ap.add_argument("--work", type=Path, default=None, help="scratch dir (emptied first)")
    ap.add_argument("--only", choices=("tiny", "selftest"), default=None)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="pinwheel-objstore-bench-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    toolkit = toolkit_of(args.toolchain_cache)
    if args.only in (None, "tiny"):
        bench_tiny(work, toolkit)
    if args.only in (None, "selftest"):
        if toolkit is None:
            print("selftest kernel: not run (needs --toolchain-cache for CUDA 12.4)")
        else:
            bench_selftest(work, toolkit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

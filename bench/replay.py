"""Benchmark: pinwheel's in-memory replay vs the plain git-CLI way, measured in the same run.

    python bench/replay.py --mirror https://github.com/1CatAI/1Cat-vLLM.git=PATH [--runs 7]

(or set PINWHEEL_MIRRORS instead of --mirror). It measures this checkout's pinwheel
(``src/`` first on the path, in process and for ``python -m pinwheel``). Default stack:
recipes/examples/1cat-stack.toml (5 picks, 9 commits, then 1 merge).

Measured, each as a median over ``--runs``:
  * pinwheel warm, in process: ``replay_manifest`` on a cache that already
    holds the refs (fetch from the mirror, then the replay recalled from its stamp:
    every input and recorded object checked, tree check);
  * pinwheel warm, in process, no stamp: the same with the stamp removed before
    each run (fetch, replay in libgit2, tree check, tag: the engine itself);
  * pinwheel warm, CLI: ``python -m pinwheel run`` as a user runs it
    (adds interpreter start-up and imports);
  * pinwheel warm, ``tools/replay run``: the launcher a fresh clone uses (adds
    its stamp check); measured when its .venv is set up (run ``tools/replay
    --version`` once), else left out and said so;
  * git CLI: a fresh ``git clone --shared`` of the mirror, sparse checkout of
    the base, ``git cherry-pick`` per commit, ``git merge --no-ff`` per merge
    step (bench/gitcli.py; the sparse checkout leaves out the blobs a partial
    mirror lacks, found once before timing).
Warm includes bytecode: this checkout's modules are compiled first (as a run without
PYTHONDONTWRITEBYTECODE leaves them). The cold first pinwheel run (empty cache) is
printed too. Every run's tree is
checked against the others; a difference exits 1.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"  # this checkout's pinwheel, in process and in `python -m pinwheel`
sys.path[:0] = [str(HERE), str(SRC)]

from gitcli import absent_paths, replay_with_git_cli, sealed_env  # noqa: E402

from pinwheel.cli import parse_mirrors  # noqa: E402
from pinwheel.manifest import Manifest, load  # noqa: E402
from pinwheel.source import stamp  # noqa: E402
from pinwheel.source.cache import resolve_source  # noqa: E402
from pinwheel.source.replay import replay_manifest  # noqa: E402

DEFAULT_MANIFEST = HERE.parent / "recipes" / "examples" / "1cat-stack.toml"
LAUNCHER = HERE.parent / "tools" / "replay"


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (git, pinwheel subprocesses)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], str], runs: int) -> tuple[list[float], list[float], set[str]]:
    """Run ``fn`` (returns a tree id) ``runs`` times: wall seconds, CPU seconds, trees seen.

    CPU seconds are reported beside wall time because a shared machine's load
    stretches wall time; the ratio of CPU seconds is the load-independent one.
    """
    wall, cpu, trees = [], [], set()
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), cpu_seconds()
        trees.add(fn())
        wall.append(time.perf_counter() - start)
        cpu.append(cpu_seconds() - start_cpu)
    return wall, cpu, trees


def bench(manifest: Manifest, mirror: Path, runs: int, work: Path) -> dict[str, object]:
    # Warm means bytecode too: what any run leaves in __pycache__ unless
    # PYTHONDONTWRITEBYTECODE is set (then every run would compile pinwheel again).
    compileall.compile_dir(str(SRC), quiet=1)
    mirrors = {manifest.upstream.url: str(mirror)}
    cache = work / "cache"

    start = time.perf_counter()
    cold = replay_manifest(manifest, cache=cache, mirrors=mirrors)
    cold_s = time.perf_counter() - start

    def engine() -> str:
        return replay_manifest(manifest, cache=cache, mirrors=mirrors).tree

    stamped = stamp.path(cold.repo_path, manifest.name)

    def engine_unstamped() -> str:
        stamped.unlink(missing_ok=True)
        return replay_manifest(manifest, cache=cache, mirrors=mirrors).tree

    cli_argv = [
        sys.executable,
        "-m",
        "pinwheel",
        "--manifest",
        str(manifest.path),
        "--cache",
        str(cache),
        "--mirror",
        f"{manifest.upstream.url}={mirror}",
        "--json",
        "run",
    ]

    cli_env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]
    )}

    def engine_cli() -> str:
        proc = subprocess.run(cli_argv, capture_output=True, text=True, check=True, env=cli_env)
        return str(json.loads(proc.stdout)["tree"])

    launcher_argv = [str(LAUNCHER), *cli_argv[3:]]

    def engine_launcher() -> str:
        proc = subprocess.run(launcher_argv, capture_output=True, text=True, check=True)
        return str(json.loads(proc.stdout)["tree"])

    env = sealed_env(work / "home", manifest)
    start = time.perf_counter()
    absent = absent_paths(mirror, manifest.upstream.commit, env)
    absent_s = time.perf_counter() - start
    counter = iter(range(10**6))

    def git_cli() -> str:
        return replay_with_git_cli(manifest, mirror, work / f"git-{next(counter)}", absent).tree

    full_s, full_cpu, full_trees = timed(engine_unstamped, runs)
    engine_s, engine_cpu, engine_trees = timed(engine, runs)
    cli_s, cli_cpu, cli_trees = timed(engine_cli, runs)
    launcher_ready = (LAUNCHER.parent.parent / ".venv" / ".pinwheel-stamp").is_file()
    if launcher_ready:
        engine_launcher()  # a first call restamps a stamp from an older tools/replay
        tool_s, tool_cpu, tool_trees = timed(engine_launcher, runs)
    else:
        tool_s, tool_cpu, tool_trees = [], [], set()
    git_s, git_cpu, git_trees = timed(git_cli, runs)
    trees = engine_trees | full_trees | cli_trees | tool_trees | git_trees | {cold.tree}
    commits = sum(len(s.commits) for s in cold.steps)
    return {
        "manifest": manifest.path.name,
        "steps": len(manifest.steps),
        "commits_replayed": commits,
        "runs": runs,
        "tree": cold.tree,
        "trees_agree": len(trees) == 1,
        "absent_blob_paths": list(absent),
        "absent_scan_s": absent_s,
        "pinwheel_cold_s": cold_s,
        "pinwheel_warm_s": statistics.median(engine_s),
        "pinwheel_warm_unstamped_s": statistics.median(full_s),
        "pinwheel_warm_unstamped_cpu_s": statistics.median(full_cpu),
        "pinwheel_cli_warm_s": statistics.median(cli_s),
        "tools_replay_warm_s": statistics.median(tool_s) if tool_s else None,
        "tools_replay_warm_cpu_s": statistics.median(tool_cpu) if tool_cpu else None,
        "git_cli_s": statistics.median(git_s),
        "pinwheel_warm_cpu_s": statistics.median(engine_cpu),
        "pinwheel_cli_warm_cpu_s": statistics.median(cli_cpu),
        "git_cli_cpu_s": statistics.median(git_cpu),
        "load_average_1m": os.getloadavg()[0],
        "all_s": {
            "pinwheel": engine_s, "pinwheel_unstamped": full_s, "pinwheel_cli": cli_s,
            "tools_replay": tool_s, "git_cli": git_s,
        },
    }


def mirror_for(url: str, items: list[str]) -> Path:
    source = resolve_source(url, parse_mirrors(items, os.environ.get("PINWHEEL_MIRRORS")))
    if not source.local:
        sys.exit(f"no local mirror for {url}: pass --mirror {url}=PATH or set PINWHEEL_MIRRORS")
    return Path(source.location)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    parser.add_argument("--mirror", action="append", default=[], metavar="URL=PATH")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    manifest = load(args.manifest)
    mirror = mirror_for(manifest.upstream.url, args.mirror)
    with tempfile.TemporaryDirectory(prefix="pinwheel-bench-") as tmp:
        r = bench(manifest, mirror, args.runs, Path(tmp))
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        f = {k: v for k, v in r.items() if isinstance(v, float)}
        eng, cli, git = f["pinwheel_warm_s"], f["pinwheel_cli_warm_s"], f["git_cli_s"]
        ceng, ccli = f["pinwheel_warm_cpu_s"], f["pinwheel_cli_warm_cpu_s"]
        cgit = f["git_cli_cpu_s"]
        print(
            f"stack {r['manifest']}: {r['steps']} steps, {r['commits_replayed']} commits, "
            f"median of {r['runs']} runs, tree {r['tree']}, load {f['load_average_1m']:.1f}"
        )
        print("                                      wall      CPU")
        print(f"  pinwheel cold (empty cache)      {f['pinwheel_cold_s']:7.3f} s")
        print(f"  pinwheel warm, in process        {eng:7.3f} s {ceng:7.3f} s")
        full, cfull = f["pinwheel_warm_unstamped_s"], f["pinwheel_warm_unstamped_cpu_s"]
        print(f"  pinwheel warm, no stamp (replay) {full:7.3f} s {cfull:7.3f} s")
        print(f"  pinwheel warm, `pinwheel run`    {cli:7.3f} s {ccli:7.3f} s")
        tool, ctool = r["tools_replay_warm_s"], r["tools_replay_warm_cpu_s"]
        if isinstance(tool, float) and isinstance(ctool, float):
            print(f"  pinwheel warm, `tools/replay run`{tool:7.3f} s {ctool:7.3f} s")
        else:
            print("  pinwheel warm, `tools/replay run`  not measured: run `tools/replay --version`")
        print(f"  git CLI (clone, pick, merge)     {git:7.3f} s {cgit:7.3f} s")
        print(f"  ratio git CLI / replay without its stamp: {git / full:5.1f}x wall, "
              f"{cgit / cfull:5.1f}x CPU")
        print(
            f"  ratio git CLI / pinwheel, wall:  {git / eng:5.1f}x in process, "
            f"{git / cli:5.1f}x as a command"
        )
        print(
            f"  ratio git CLI / pinwheel, CPU:   {cgit / ceng:5.1f}x in process, "
            f"{cgit / ccli:5.1f}x as a command"
        )
        if isinstance(tool, float) and isinstance(ctool, float):
            print(
                f"  ratio git CLI / `tools/replay run`: {git / tool:5.1f}x wall, "
                f"{cgit / ctool:5.1f}x CPU"
            )
        print(f"  trees agree across all runs: {r['trees_agree']}")
    return 0 if r["trees_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())

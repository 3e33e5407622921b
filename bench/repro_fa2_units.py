"""Reproducibility check: the engine's `_vllm_fa2_C` units, compiled cold, twice each way.

    python bench/repro_fa2_units.py --toolkit CUDA_ROOT --arch sm_70 \\
        --flash-attn MIRROR[@COMMIT] --cutlass MIRROR[@COMMIT] \\
        --torch-include DIR [--torch-include DIR ...] [--unit PATH ...] [--no-plain]

Each unit of flash-attention-v100 (default: `flash_fwd_hdim256_causal_prefill_sm70.cu`,
one of the two whose internal names nvcc takes from cudafe++'s process id) is compiled
four times, all at once, with the same nvcc arguments, then linked as the engine links
(``g++ -shared -Wl,--strip-all``: nvcc's own ``tmpxft_<pid>`` name lives only in the
object's ``.symtab``):

  * plain nvcc, twice, in two trees (the machine's pids: what builds did before);
  * through pinwheel's canonical namespace (``compile.canonical``: the cache at its
    canonical path, cudafe++ at pid 1 in a fixed folder), twice, from two caches at other
    paths (the second with spaces), other umasks and the caller's TZ/LANG different,
    with 300 processes spent between them; the build sets TZ=UTC and LC_ALL=C over the
    caller's, as ``compile.buildenv`` does.

It prints each linked object's sha256 and the internal names' pid suffix, and exits 0
when the two namespace builds agree (1 when they differ). Sources come from local
mirrors by ``git archive`` (the cutlass commit: flash-attention-v100's ``csrc/cutlass``
submodule by default); the torch headers from any torch install (a CPU wheel lacks
``c10/cuda/impl/cuda_cmake_macros.h``: pass a folder holding a stand-in with
``--torch-include``). Needs a toolkit that compiles ``--arch`` and user namespaces.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pinwheel import archive as archive_  # noqa: E402
from pinwheel import options  # noqa: E402
from pinwheel.compile import canonical  # noqa: E402

DEFAULT_UNIT = "csrc/flash_attn/src/flash_fwd_hdim256_causal_prefill_sm70.cu"
FA_COMMIT = "c2eda5e6115b98c3ba4bfd181570668742eece22"  # recipes/examples/1cat-build.toml
SOURCE_MTIME = 1_700_000_000  # a default: one fixed time for every source file
NAME = re.compile(rb"_cu_[0-9a-f]{8}_\d+")  # an internal name's tail: the pid, then a length


def archive(mirror: str, default_commit: str | None, path: str, dest: Path) -> None:
    repo, _, commit = mirror.partition("@")
    commit = commit or default_commit or "HEAD"
    data = subprocess.run(
        ["git", "--git-dir", repo, "archive", "--format=tar", commit, "--", path],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # checked as any archive pinwheel reads
        archive_.extract_tar(tar, dest, f"git archive {commit} -- {path}", inner_links=True)


def submodule_commit(mirror: str, path: str) -> str:
    repo, _, commit = mirror.partition("@")
    out = subprocess.run(
        ["git", "--git-dir", repo, "ls-tree", commit or FA_COMMIT, "--", path],
        check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    return out[2]


def nvcc(toolkit: Path, arch: str, unit: str, out: str, includes: list[str]) -> list[str]:
    return [
        str(toolkit / "bin" / "nvcc"), "-c", unit, "-o", out, "-O3", "-std=c++17",
        f"-arch={arch}", "--expt-relaxed-constexpr", "--expt-extended-lambda",
        "--use_fast_math", "-DNDEBUG", "-Xcompiler=-fPIC", "-Icsrc/flash_attn",
        "-Icsrc/flash_attn/src", "-Icutlass/include", *[f"-I{d}" for d in includes],
    ]  # fmt: skip


def place(template: Path, root: Path) -> Path:
    src = root / "src"
    shutil.copytree(template, src)
    for p in [src, *src.rglob("*")]:
        os.utime(p, (SOURCE_MTIME, SOURCE_MTIME), follow_symlinks=False)
    return src


def main() -> int:
    ap = argparse.ArgumentParser(prog="repro_fa2_units.py", description=__doc__.splitlines()[0])
    ap.add_argument("--toolkit", required=True, type=Path, help="a CUDA toolkit's root")
    ap.add_argument("--arch", default="sm_70", help="nvcc -arch (default sm_70)")
    ap.add_argument("--flash-attn", required=True,
                    help=f"mirror[@commit] (default {FA_COMMIT[:12]})")  # fmt: skip
    ap.add_argument("--cutlass", required=True, help="mirror[@commit] (default: the submodule's)")
    ap.add_argument("--torch-include", action="append", default=[], help="torch header folders")
    ap.add_argument("--unit", action="append", help=f"a unit (default {DEFAULT_UNIT})")
    ap.add_argument("--work", type=Path, help="where the trees go (default: a temporary folder)")
    ap.add_argument("--no-plain", action="store_true",
                    help="only the two namespace builds (half the compile time)")  # fmt: skip
    args = ap.parse_args()
    units = args.unit or [DEFAULT_UNIT]
    toolkit = args.toolkit.resolve()
    work = Path(args.work or tempfile.mkdtemp(prefix="repro-fa2-"))
    template = work / "template"
    archive(args.flash_attn, FA_COMMIT, "csrc/flash_attn", template)
    cutlass_commit = (
        None if "@" in args.cutlass else submodule_commit(args.flash_attn, "csrc/cutlass")
    )
    archive(args.cutlass, cutlass_commit, "include", template / "cutlass")
    includes = [str(Path(d).resolve()) for d in args.torch_include]
    base = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(work / "home")}
    (work / "home").mkdir(exist_ok=True)
    host = options.host(dict(os.environ))
    jobs: list[tuple[str, str, Path, subprocess.Popen[bytes]]] = []
    for i in () if args.no_plain else (1, 2):  # plain nvcc: the machine's pid reaches the names
        src = place(template, work / f"plain{i}")
        for u in units:
            cmd = nvcc(toolkit, args.arch, u, Path(u).stem + ".o", includes)
            jobs.append((f"plain {i}", u, src, subprocess.Popen(cmd, cwd=src, env=base)))
        for _ in range(200):
            subprocess.run(["true"], check=True)
    variants = [("namespace A", work / "A" / "cache", {"TZ": "UTC", "LANG": "C.UTF-8"}, 0o022),
                ("namespace B", work / "B space" / "cache dir",
                 {"TZ": "Pacific/Chatham", "LANG": "fr_FR.UTF-8"}, 0o077)]  # fmt: skip
    for label, cache, caller, umask in variants:
        src = place(template, cache)
        canon = canonical.choose(cache, host).with_toolkit(toolkit)
        if canon.method != canonical.NAMESPACE or not canon.front_ends:
            print(f"no fixed-pid namespace here: {canon.why or canon.pid_refused}")
            return 2
        env = canon.env({**base, **caller, "TZ": "UTC", "LC_ALL": "C"})
        for u in units:
            cmd, cwd = canon.wrap(nvcc(toolkit, args.arch, u, Path(u).stem + ".o", includes), src)
            old = os.umask(umask)
            jobs.append((label, u, src, subprocess.Popen(cmd, cwd=cwd, env=env)))
            os.umask(old)
        for _ in range(300):
            subprocess.run(["true"], check=True)
        time.sleep(2)
    start = time.monotonic()
    shas: dict[tuple[str, str], str] = {}
    for label, u, src, proc in jobs:
        if proc.wait() != 0:
            print(f"{label} {u}: nvcc exited {proc.returncode}")
            return 2
        obj = src / (Path(u).stem + ".o")
        so = obj.with_suffix(".so")
        subprocess.run(["g++", "-shared", "-Wl,--strip-all", "-o", str(so), str(obj)], check=True)
        data = so.read_bytes()
        tails = sorted({m.decode() for m in NAME.findall(data)})
        shas[(label, u)] = hashlib.sha256(data).hexdigest()
        print(f"{label:12s} {Path(u).name}: {shas[(label, u)][:16]}  {len(data)} bytes, "
              f"internal names end {tails[:2]}")  # fmt: skip
    print(f"compiled in {time.monotonic() - start:.0f} s (all at once)")
    same = all(shas[("namespace A", u)] == shas[("namespace B", u)] for u in units)
    if args.no_plain:
        print(f"namespace builds agree: {same}; plain builds not run (--no-plain)")
        return 0 if same else 1
    plain = all(shas[("plain 1", u)] == shas[("plain 2", u)] for u in units)
    print(f"namespace builds agree: {same}; plain builds agree: {plain}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

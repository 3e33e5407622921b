"""What the kernel build's frontend saves: ``pip wheel --no-build-isolation`` against the
backend's ``build_wheel`` alone (:mod:`pinwheel.compile.frontend`), on one torch extension.

A tiny torch ``CppExtension`` (setup.py imports torch, as every torch-extension
kernel's does) is built once, then rebuilt ``--repeat`` times by each frontend in
turn, with its ``build/`` kept: ninja has nothing to compile, so what remains is what
a one-file or no-change rebuild pays around the compiler -- the frontend's start-up,
setup.py runs (each one imports torch), the link check, the zip. Prints each run, the
medians and the ratio (pip over hook), and whether both wheels are the same bytes.

    python bench/frontend.py --python VENV/bin/python [--repeat 5] [--work DIR]

``--python``: an interpreter with torch, setuptools and ninja (e.g. a torch venv that
``pinwheel kernels`` made under ``<cache>/venvs/``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from pinwheel.compile import frontend  # noqa: E402

SETUP = """
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
setup(
    name="bench-frontend-ext",
    version="0.1",
    ext_modules=[CppExtension("bench_frontend_ext", ["ext.cpp"])],
    cmdclass={"build_ext": BuildExtension},
)
"""
EXT = """
#include <torch/extension.h>
torch::Tensor twice(torch::Tensor x) { return x * 2; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="a Python with torch, setuptools, ninja")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="pinwheel-bench-frontend-"))
    tree = work / "src"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    (tree / "setup.py").write_text(SETUP)
    (tree / "ext.cpp").write_text(EXT)
    env = {**os.environ, "SOURCE_DATE_EPOCH": "1700000000", "MAX_JOBS": "2"}

    def by_pip(out: Path) -> list[str]:
        return [args.python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                "--no-cache-dir", "-q", "-w", str(out), str(tree)]  # fmt: skip

    def by_pip_run(out: Path) -> None:
        subprocess.run(by_pip(out), cwd=tree, env=env, check=True, capture_output=True)

    def by_hook(out: Path) -> None:
        def hook(cmd: Sequence[str], cwd: str, added: Mapping[str, str]) -> None:
            subprocess.run(list(cmd), cwd=cwd, env={**env, **added}, check=True,
                           capture_output=True)  # fmt: skip

        frontend.build_wheel(args.python, tree, str(out), {}, hook)

    def run(name: str, make: Callable[[Path], None], i: int) -> tuple[float, str]:
        out = work / f"dist-{name}-{i}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        started = time.monotonic()
        make(out)
        seconds = time.monotonic() - started
        (wheel,) = out.glob("*.whl")
        return seconds, sha(wheel)

    first, digest = run("hook", by_hook, 0)  # compiles: not what is measured
    print(f"first build (compiles ext.cpp): {first:.1f} s  {digest[:16]}", flush=True)
    times: dict[str, list[float]] = {"pip": [], "hook": []}
    digests: set[str] = {digest}
    for i in range(1, args.repeat + 1):
        for name, make in (("pip", by_pip_run), ("hook", by_hook)):  # interleaved: same load
            seconds, d = run(name, make, i)
            times[name].append(seconds)
            digests.add(d)
            print(f"  {name:4} run {i}: {seconds:6.2f} s  {d[:16]}", flush=True)
    pip, hook = statistics.median(times["pip"]), statistics.median(times["hook"])
    print(f"median: pip wheel {pip:.2f} s, build_wheel alone {hook:.2f} s: "
          f"{pip / hook:.2f}x ({pip - hook:.2f} s saved per rebuild)")  # fmt: skip
    print(f"one sha256 from both frontends: {len(digests) == 1}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

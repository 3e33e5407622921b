"""nox sessions: the single source of truth for what CI runs.

`nox` with no arguments runs the default set (the README's test command).
"""

from __future__ import annotations

import hashlib
import os
import sys

import nox

nox.options.sessions = ["lint", "tests", "kernels", "qualify-cpu"]


def _test_caches() -> None:
    """Every session's caches live in $PINWHEEL_TEST_CACHE (default ~/.cache/pinwheel-test):
    pinwheel's own cache is set to a directory inside it, so the tests never write into
    the user's ~/.cache/pinwheel (README: what the test command costs)."""
    root = os.environ.get("PINWHEEL_TEST_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "pinwheel-test"
    )
    os.environ["PINWHEEL_TEST_CACHE"] = root
    os.environ["PINWHEEL_CACHE"] = os.path.join(root, "pinwheel")


_test_caches()
nox.options.reuse_existing_virtualenvs = True
PYTHONS = ["3.11"]
LOCKS = "locks"  # hashed locks (pinwheel.compile.toollocks): every session installs from one


def _lock_line(name: str) -> str:
    path = os.path.join(LOCKS, f"{name}.txt")
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), path)
    try:
        with open(here, "rb") as fh:
            return f"{path} sha256 {hashlib.sha256(fh.read()).hexdigest()}"
    except OSError as exc:
        return f"{path} (not readable: {exc.strerror})"


def _install_locked(session: nox.Session, lock: str) -> None:
    """pinwheel's dependencies from ``locks/<lock>.txt`` (hashes required, nothing
    unlisted), then pinwheel itself from the checkout with no dependencies and no build
    isolation (its backend is in the lock too)."""
    session.log(f"installing from {_lock_line(lock)} (--require-hashes)")
    session.install("--require-hashes", "--no-deps", "-r", os.path.join(LOCKS, f"{lock}.txt"))
    session.install("--no-deps", "--no-build-isolation", "-e", ".")


# nox itself: .ci/run and the README install it from locks/nox.txt; say which.
print(f"nox from {_lock_line('nox')}", file=sys.stderr)


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Unit and integration tests on real git repos, files and local servers."""
    _install_locked(session, "tests")
    session.run("pytest", "-m", "not slow", *session.posargs)


@nox.session(python=PYTHONS)
def lint(session: nox.Session) -> None:
    """ruff over everything, mypy over src/."""
    _install_locked(session, "lint")
    session.run("ruff", "check", "src", "tests", "bench", "noxfile.py")
    session.run("mypy", "src")


# Provisions CUDA 12.4 into argv[1] (a cache dir) and prints the toolkit's root.
PROVISION = """
import os, sys
from pathlib import Path
from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit
from pinwheel.manifest.build import BuildConfig
config = BuildConfig(python="%d.%d" % sys.version_info[:2], cuda="12.4", arches=("8.0", "9.0"),
                     ptx=True, torch=None, label=None, version=None)
toolkit = resolve_toolkit(ToolkitRequest(config, Path(sys.argv[1]), {"PATH": os.defpath},
                                         provision=True))
print(toolkit.root)
"""


def _test_cache() -> str:
    return os.environ.get("PINWHEEL_TEST_CACHE") or os.path.expanduser("~/.cache/pinwheel-test")


@nox.session(python=PYTHONS)
def kernels(session: nox.Session) -> None:
    """Provision CUDA 12.x, build the in-tree kernel wheel twice, check it; then the check's
    real-nvcc fatbin test with that toolkit's nvcc on PATH (it must run, not skip)."""
    _install_locked(session, "kernels")
    session.run("pytest", "-m", "slow and kernels", "-s", *session.posargs)
    out = session.run(
        "python", "-c", PROVISION, os.path.join(_test_cache(), "kernels-session"), silent=True
    )
    root = str(out).strip().splitlines()[-1]
    path = os.pathsep.join([os.path.join(root, "bin"), session.env.get("PATH") or os.defpath])
    session.run(
        "pytest", "tests/test_check.py", "-k", "nvcc", "-rs",
        env={"PATH": path, "PINWHEEL_REQUIRE_NVCC": "1"},
    )  # fmt: skip


@nox.session(python=PYTHONS)
def bootstrap(session: nox.Session) -> None:
    """Slow tests that are neither kernels nor qualify: tools/replay's fresh-clone bootstrap
    (pip installs from the package index) and the CUDA 13 wheel toolkit when its wheels are
    given (PINWHEEL_CU13_WHEELS)."""
    _install_locked(session, "tests")
    session.run(
        "pytest", "-m", "slow and not kernels and not qualify and not flash_attn and not upstream",
        "-rs", *session.posargs, env=dict(os.environ),
    )  # fmt: skip


@nox.session(name="flash-attn", python=PYTHONS)
def flash_attn(session: nox.Session) -> None:
    """flash-attention-v100 with torch 2.9.1 CUDAExtension: heavy, not in the default run."""
    _install_locked(session, "kernels")
    session.run("pytest", "-m", "flash_attn", "-s", *session.posargs, env=dict(os.environ))


@nox.session(name="qualify-cpu", python=PYTHONS)
def qualify_cpu(session: nox.Session) -> None:
    """End-to-end qualification against a real CPU vLLM server (venv + model cached in
    $PINWHEEL_TEST_CACHE, default ~/.cache/pinwheel-test)."""
    _install_locked(session, "qualify")
    # -s: the server venv's download (~3 GB, sizes said first) shows on the screen
    session.run("pytest", "-m", "slow and qualify", "-s", *session.posargs, env=dict(os.environ))


@nox.session(python=PYTHONS)
def upstream(session: nox.Session) -> None:
    """Acceptance on the real 1Cat-vLLM upstream, then the replay benchmark.

    Needs PINWHEEL_MIRRORS mapping https://github.com/1CatAI/1Cat-vLLM.git to a
    local mirror; without it the tests skip and the benchmark is not run.
    """
    _install_locked(session, "tests")
    session.run("pytest", "-m", "upstream", "-rs", *session.posargs, env=dict(os.environ))
    if "PINWHEEL_MIRRORS" in os.environ:
        session.run("python", "bench/replay.py", "--runs", "5", env=dict(os.environ))


@nox.session(python=PYTHONS)
def lock(session: nox.Session) -> None:
    """Regenerate every hashed lock in locks/ (uv pip compile) and show the diff; after
    merging a branch that adds a dependency, run this and commit locks/."""
    _install_locked(session, "tests")  # uv comes with the test extra
    session.run("pinwheel", "lock", "--tools", *session.posargs)

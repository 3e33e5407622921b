"""tools/replay from a fresh clone: bootstraps its own venv, then is the pinwheel CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the project's git checkout")
def test_tools_replay_bootstraps_from_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable}
    import os

    # Keep the machine's pip configuration (its package index), nothing else.
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    first = subprocess.run(
        [str(clone / "tools" / "replay"), "--help"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert first.returncode == 0, first.stderr
    assert "setting up" in first.stderr  # first run bootstraps .venv
    assert (clone / ".venv" / "bin" / "pinwheel").exists()
    for command in ("plan", "run", "build", "lock", "drift", "export", "resolve"):
        assert command in first.stdout
    second = subprocess.run(
        [str(clone / "tools" / "replay"), "--version"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 0 and second.stdout.startswith("pinwheel ")
    assert "setting up" not in second.stderr  # reused
    direct = subprocess.run(  # the same environment: the caller's width never reaches one side
        [str(clone / ".venv" / "bin" / "pinwheel"), "--help"], env=env, capture_output=True,
        text=True,
    )
    assert direct.stdout == first.stdout  # tools/replay X == pinwheel X


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the project's git checkout")
def test_interrupted_or_broken_venv_never_sticks(tmp_path):
    """Killed at 1 s, the first run leaves no .venv; a .venv without pip is rebuilt; the
    venv carries what `tools/replay build` needs for the default [[kernel]]."""
    import os
    import signal
    import time

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    replay = str(clone / "tools" / "replay")
    killed = subprocess.Popen(
        [replay, "--version"],
        cwd=clone,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    os.killpg(killed.pid, signal.SIGKILL)
    _, err = killed.communicate(timeout=30)
    assert "creating a virtual environment" in err or "setting up" in err
    assert not (clone / ".venv").exists()  # nothing under the final name

    first = subprocess.run(
        [replay, "--version"], cwd=clone, env=env, capture_output=True, text=True, timeout=900
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("pinwheel ") and "ready:" in first.stderr
    venv_python = clone / ".venv" / "bin" / "python"
    probe = subprocess.run(
        [str(venv_python), "-c", "import scikit_build_core, cmake, ninja"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr  # the default [[kernel]] (cmake builder) builds

    pip_dirs = list((clone / ".venv" / "lib").glob("python*/site-packages/pip"))
    assert pip_dirs
    import shutil

    shutil.rmtree(pip_dirs[0])  # what a run killed inside `python -m venv` used to leave
    (clone / ".venv" / "bin" / "pinwheel").unlink()  # ... before pip wrote the entry point
    again = subprocess.run(
        [replay, "--version"], cwd=clone, env=env, capture_output=True, text=True, timeout=900
    )
    assert again.returncode == 0, again.stderr
    assert "is broken (pip is missing): rebuilding it" in again.stderr
    assert (clone / ".venv" / ".pinwheel-stamp").is_file()
    assert subprocess.run([str(venv_python), "-c", "import pip"]).returncode == 0


def _fake_checkout(tmp_path: Path, stamped: str | None) -> tuple[Path, Path]:
    """A checkout with this tools/replay and a .venv whose python and pinwheel log each call."""
    import shutil

    root = tmp_path / "checkout"
    (root / "tools").mkdir(parents=True)
    shutil.copy2(ROOT / "tools" / "replay", root / "tools" / "replay")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    bindir = root / ".venv" / "bin"
    bindir.mkdir(parents=True)
    calls = tmp_path / "calls"
    for name in ("python", "pinwheel"):
        script = bindir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\n')
        script.chmod(0o755)
    if stamped is not None:
        (root / ".venv" / ".pinwheel-stamp").write_text(stamped + "\n")
    return root, calls


def test_the_common_path_runs_nothing_before_pinwheel(tmp_path: Path) -> None:
    """A current stamp for this checkout: tools/replay execs pinwheel and spawns no python."""
    root, calls = _fake_checkout(tmp_path, stamped=None)
    (root / ".venv" / ".pinwheel-stamp").write_text(str(root.resolve()) + "\nbytecode\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [str(root / "tools" / "replay"), "run", "--json"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert calls.read_text().splitlines() == ["pinwheel run --json"]
    assert proc.stderr == ""


def test_a_stamp_for_another_checkout_is_checked_then_rewritten(tmp_path: Path) -> None:
    root, calls = _fake_checkout(tmp_path, stamped="/elsewhere")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    replay = str(root / "tools" / "replay")
    first = subprocess.run([replay, "--version"], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    log = calls.read_text().splitlines()
    assert log[-1] == "pinwheel --version" and any(c.startswith("python ") for c in log)
    assert "restamped" in first.stderr
    stamp = root / ".venv" / ".pinwheel-stamp"
    assert stamp.read_text().splitlines() == [str(root.resolve()), "bytecode"]
    assert any(c.startswith("python -m compileall") for c in log)
    calls.unlink()
    again = subprocess.run([replay, "--version"], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and calls.read_text().splitlines() == ["pinwheel --version"]


def test_a_stamp_from_before_bytecode_is_compiled_then_rewritten(tmp_path: Path) -> None:
    """A stamp an older tools/replay wrote (the checkout alone): this checkout's modules are
    compiled once, the stamp rewritten, and the next call is the common path again."""
    root, calls = _fake_checkout(tmp_path, stamped=None)
    (root / ".venv" / ".pinwheel-stamp").write_text(str(root.resolve()) + "\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    replay = str(root / "tools" / "replay")
    first = subprocess.run([replay, "--version"], env=env, capture_output=True, text=True)
    assert first.returncode == 0 and "restamped" in first.stderr, first.stderr
    log = calls.read_text().splitlines()
    assert f"python -m compileall -q {root.resolve()}/src" in log
    calls.unlink()
    again = subprocess.run([replay, "--version"], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and calls.read_text().splitlines() == ["pinwheel --version"]

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
    direct = subprocess.run(
        [str(clone / ".venv" / "bin" / "pinwheel"), "--help"], capture_output=True, text=True
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
    again = subprocess.run(
        [replay, "--version"], cwd=clone, env=env, capture_output=True, text=True, timeout=900
    )
    assert again.returncode == 0, again.stderr
    assert "is broken (pip is missing): rebuilding it" in again.stderr
    assert (clone / ".venv" / ".pinwheel-stamp").is_file()
    assert subprocess.run([str(venv_python), "-c", "import pip"]).returncode == 0

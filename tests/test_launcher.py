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
    first = subprocess.run([str(clone / "tools" / "replay"), "--help"], cwd=clone, env=env,
                           capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr
    assert "setting up" in first.stderr  # first run bootstraps .venv
    assert (clone / ".venv" / "bin" / "pinwheel").exists()
    for command in ("plan", "run", "build", "lock", "drift", "export", "resolve"):
        assert command in first.stdout
    second = subprocess.run([str(clone / "tools" / "replay"), "--version"], cwd=clone, env=env,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and second.stdout.startswith("pinwheel ")
    assert "setting up" not in second.stderr  # reused
    direct = subprocess.run([str(clone / ".venv" / "bin" / "pinwheel"), "--help"],
                            capture_output=True, text=True)
    assert direct.stdout == first.stdout  # tools/replay X == pinwheel X

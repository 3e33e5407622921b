"""`pinwheel check wheels/*.whl` from a subdirectory of the checkout: the shell hands the
pattern over unexpanded, and the error says where the build's wheels really are."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _check(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pinwheel", "check", "--arch", "7.0", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_from_a_subdirectory_the_error_names_the_wheels_beside_the_manifest(tmp_path: Path) -> None:
    shutil.copy(ROOT / "manifest.toml", tmp_path / "manifest.toml")
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"not checked here")
    (tmp_path / "sub").mkdir()
    got = _check(tmp_path / "sub", "wheels/*.whl")
    assert got.returncode == 2, got.stderr
    assert "build first" not in got.stderr
    assert f"pinwheel check {tmp_path / 'wheels'}/*.whl" in got.stderr


def test_with_no_build_anywhere_it_says_build_first(tmp_path: Path) -> None:
    shutil.copy(ROOT / "manifest.toml", tmp_path / "manifest.toml")
    got = _check(tmp_path, "wheels/*.whl")
    assert got.returncode == 2 and "build first" in got.stderr, got.stderr

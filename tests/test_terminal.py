"""No test reads the caller's terminal by accident: width, colour and TTY are CI's.

A person runs the README's test command in a terminal (120 columns, say); CI pipes it.
tests/testenv.py fixes the width at 80 and drops the colour switches for every test and
every child a test starts; these tests drive pytest in a real pseudo-terminal
(tests/ptyrun.py) and check what a test and its children see.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ptyrun

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

PROBE = '''
import os, shutil, subprocess, sys

def test_width_and_colour_are_cis():
    assert shutil.get_terminal_size().columns == 80
    assert "FORCE_COLOR" not in os.environ and "NO_COLOR" not in os.environ
    child = subprocess.run(
        [sys.executable, "-c", "import shutil; print(shutil.get_terminal_size().columns)"],
        capture_output=True, text=True, check=True,
    )
    assert child.stdout.strip() == "80"

def test_help_wraps_as_when_piped():
    # tests/test_launcher.py's case: the CLI's help from a test's child, against the help
    # from a child started with a clean environment and a pipe (80 columns by fallback)
    here = subprocess.run([sys.executable, "-m", "pinwheel", "--help"],
                          capture_output=True, text=True, check=True)
    clean = {"PATH": os.defpath, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    piped = subprocess.run([sys.executable, "-m", "pinwheel", "--help"], env=clean,
                           capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
    assert here.stdout == piped.stdout
'''


def _pytest_in_pty(tmp_path: Path, columns: int, conftest: bool) -> tuple[int, str]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    if conftest:  # the project's own conftest, as every test run has it
        (tmp_path / "conftest.py").write_text(
            f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport os, testenv\n\n"
            "def pytest_configure(config):\n    testenv.apply(os.environ, testenv.default_root())\n"
        )
    out = tmp_path / "out.txt"
    env_note = f"FORCE_COLOR=1 COLUMNS= {columns} columns"
    with out.open("wb") as f:
        code = subprocess.run(
            [sys.executable, str(TESTS / "ptyrun.py"), "--columns", str(columns), "--",
             sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
            stdout=f, env={**os.environ, "FORCE_COLOR": "1"}, cwd=tmp_path, timeout=300,
        ).returncode  # fmt: skip
    return code, env_note + "\n" + out.read_text(errors="replace")


@pytest.mark.parametrize("columns", [120, 200])
def test_a_wide_terminal_does_not_reach_the_tests(tmp_path: Path, columns: int) -> None:
    code, out = _pytest_in_pty(tmp_path, columns, conftest=True)
    assert code == 0, out


def test_the_probe_sees_the_terminal_without_the_projects_conftest(tmp_path: Path) -> None:
    """The probe is not vacuous: without tests/testenv.py a 120-column terminal reaches it."""
    code, out = _pytest_in_pty(tmp_path, 120, conftest=False)
    assert code != 0 and "120" in out, out


def test_ptyrun_gives_the_child_a_terminal_of_that_width(tmp_path: Path) -> None:
    probe = "import os, sys; print(sys.stdout.isatty(), os.get_terminal_size(1).columns)"
    out = tmp_path / "out.txt"
    with out.open("wb") as f:
        code = subprocess.run(
            [sys.executable, str(TESTS / "ptyrun.py"), "--columns", "137", "--",
             sys.executable, "-c", probe], stdout=f, timeout=60,
        ).returncode  # fmt: skip
    assert code == 0
    assert out.read_text().split() == ["True", "137"]
    assert ptyrun.main(["--columns", "90", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3

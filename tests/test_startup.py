"""Start-up cost: `pinwheel --help` and the help of every subcommand load only the CLI's tables.

libgit2 (pygit2), filelock and rich are loaded by the commands that use them,
never to print help. Checked in a fresh interpreter, so nothing this test
session imported earlier can hide an import.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pygit2", "filelock", "rich")

PROBE = """
import contextlib, io, json, sys
from pinwheel.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(sys.argv[1:])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def loaded(*argv: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("run", "--help"),
        ("plan", "--help"),
        ("cache", "--help"),
        ("serve", "--help"),
        ("fetch", "--help"),
        ("--version",),
    ],
)
def test_help_loads_no_heavy_library(argv: tuple[str, ...]) -> None:
    heavy = loaded(*argv) & set(HEAVY)
    assert not heavy, f"`pinwheel {' '.join(argv)}` imported {sorted(heavy)}"


def test_the_probe_sees_an_import() -> None:
    """Not vacuous: a command that does use the cache's lock library shows up as loading it
    (a warm `run` that loads no libgit2 is tests/test_replay_stamp.py's)."""
    assert "filelock" in loaded("--cache", "/nonexistent-pinwheel-cache", "cache", "verify")

"""Start-up cost: `pinwheel --help` and the help of every subcommand load only the CLI's tables.

libgit2 (pygit2) and rich are loaded by the commands that use them, never to print
help; filelock by none (pinwheel.locking takes the same lock without it). Checked in a fresh interpreter, so nothing this test
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
    """Not vacuous: a command that does use libgit2 shows up as loading it, even when it
    then fails on a missing manifest (a warm `run` that loads no libgit2 is
    tests/test_replay_stamp.py's); the cache commands, which lock, load no filelock."""
    missing = ("--cache", "/nonexistent-pinwheel-cache", "--manifest",
               "/nonexistent-pinwheel/manifest.toml")  # fmt: skip
    assert "pygit2" in loaded(*missing, "plan")
    assert "filelock" not in loaded(*missing, "cache", "verify")


def _choices(parser):
    import argparse

    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_a_parser_built_for_one_subcommand_is_the_whole_parser_for_it() -> None:
    """`main` builds only the options of the subcommand it runs: the top-level help, the
    list of commands and that subcommand's own help and defaults are the whole parser's."""
    from pinwheel.cli import build_parser

    whole = build_parser()
    names = list(_choices(whole))
    assert len(names) > 20
    for name in names:
        one = build_parser(name)
        assert one.format_help() == whole.format_help()
        assert list(_choices(one)) == names
        assert _choices(one)[name].format_help() == _choices(whole)[name].format_help()
        assert _choices(one)[name]._defaults == _choices(whole)[name]._defaults


def test_the_subcommand_is_told_past_global_options_with_values() -> None:
    from pinwheel.cli import _subcommand

    assert _subcommand(["--manifest", "run", "--cache", "x", "plan", "--json"]) == "plan"
    assert _subcommand(["--mirror=u=p", "--json", "cache", "du"]) == "cache"
    assert _subcommand(["--version"]) is None
    assert _subcommand([]) is None


def test_a_command_line_told_wrong_is_parsed_with_every_subcommand(capsys, monkeypatch) -> None:
    """Should the pre-scan name another subcommand than argparse reads, the command line is
    parsed again with every subcommand built and runs what argparse reads."""
    import pinwheel.cli as cli

    monkeypatch.setattr(cli, "_subcommand", lambda argv: "plan")
    assert cli.main(["--json", "env"]) == 0
    assert '"schema"' in capsys.readouterr().out

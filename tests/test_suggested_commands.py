"""Every command pinwheel suggests exists, with the flags it names (issue 53, item 3).

A message's next step is a command in backticks (`pinwheel cache clean --yes`); the
README and docs/*.md show commands in fenced blocks and backticks. Each is read here
and held to the real parser (``pinwheel.cli.build_parser``): the subcommand (and its
sub-subcommand) must exist, and every ``--flag`` on it must be one that command or the
global options take. Messages said `pinwheel cache clean --apply`, which only `cache
prune` takes.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

from pinwheel.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
# A command line that runs pinwheel: env assignments, then pinwheel (by any path),
# tools/replay or python -m pinwheel as its first word.
_CALL = re.compile(
    r"^\s*(?:\$\s+)?(?:[A-Z_]+=\S*\s+)*(?:(?:\S*/)?(?:pinwheel|replay)|python3? -m pinwheel)"
    r"\s+(\S.*)"
)
_FLAG = re.compile(r"(--[a-z][a-z0-9-]*)")
_WORD = re.compile(r"[a-z][a-z-]+$")


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def problems_in(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """What is wrong with the suggested ``command`` (a shell line; empty: nothing)."""
    out: list[str] = []
    top = {s for a in parser._actions for s in a.option_strings}
    for part in re.split(r"&&|\|\||;|\|\s", command):
        m = _CALL.match(part)
        if m is None:
            continue
        words = m.group(1).split()
        p, path, stop = parser, [], ""
        for w in words:
            if w.startswith("-"):
                continue
            children = _children(p)
            if w in children:
                p, path = children[w], [*path, w]
                continue
            stop = w if children else ""
            break
        if _WORD.match(stop):
            named = " ".join(("pinwheel", *path))
            out.append(f"`{part.strip()}`: {named} has no command {stop!r}")
            continue
        if not path:
            continue
        known = top | {s for a in p._actions for s in a.option_strings}
        for w in words:
            flag = _FLAG.match(w)
            if flag and flag.group(1) not in known:
                out.append(
                    f"`{part.strip()}`: pinwheel {' '.join(path)} takes no {flag.group(1)}"
                )
    return out


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Each string literal (an f-string with its fields as ``X``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "X" for v in node.values]
            yield node.lineno, "".join(str(p) for p in parts)


def _source_commands() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "src" / "pinwheel").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, text in _strings(tree):
            for quoted in re.findall(r"`([^`\n]+)`", text):
                yield f"{path.relative_to(ROOT)}:{line}", quoted


def _doc_commands() -> Iterator[tuple[str, str]]:
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fenced = False
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{n}"
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                yield where, line.split("  #")[0]
            else:
                for quoted in re.findall(r"`([^`]+)`", line):
                    yield where, quoted


def test_every_command_a_message_suggests_exists_with_its_flags() -> None:
    parser = build_parser()
    found = sorted({f"{at}: {p}" for at, cmd in _source_commands() for p in problems_in(cmd, parser)})
    assert not found, "\n".join(found)


def test_every_command_the_docs_show_exists_with_its_flags() -> None:
    parser = build_parser()
    found = sorted({f"{at}: {p}" for at, cmd in _doc_commands() for p in problems_in(cmd, parser)})
    assert not found, "\n".join(found)


def test_the_reading_finds_a_missing_flag_and_a_missing_command() -> None:
    """The check can fail: the message this test was written for, and two more."""
    parser = build_parser()
    assert problems_in("pinwheel cache clean --apply", parser) == [
        "`pinwheel cache clean --apply`: pinwheel cache clean takes no --apply"
    ]
    assert problems_in("tools/replay verify-releases DIR", parser)
    assert problems_in("cd x && pinwheel install DIR --dest y", parser)
    assert not problems_in("pinwheel cache clean --yes", parser)
    assert not problems_in("pinwheel --json verify-release DIR --sums S", parser)
    assert not problems_in("the venv pinwheel itself runs from", parser)
    assert problems_in("PINWHEEL_CACHE=/c .venv/bin/pinwheel cache cleen", parser)

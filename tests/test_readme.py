"""The README cannot rot: its shell commands are extracted and run.

Every command in a ``sh``/``bash``/``shell``/``console`` code block runs, block
by block in README order, in one temporary clone of this checkout (as a reader
following the README would), unless it ends with a marker naming what it needs
that a test machine has not got::

    tools/replay build   # needs: gpu, network

Known needs: ``gpu``; ``editor`` (an interactive editor); ``network``
(anything past the package registries); ``build`` (a real build's output);
``model`` (a downloaded model pack); ``upstream`` (an upstream repository
with PR refs: such a block runs against a real local one, the stack that
tests/conftest.py builds, with the clone's manifest.toml pointing at it
through PINWHEEL_MIRRORS for that block). A command equal to
``.ci/run``'s test command is not run here (it is what runs this test); a
separate test keeps the two equal.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHELL_LANGS = {"sh", "bash", "shell", "console", "zsh"}
# What a test machine has not got: gpu, network, editor, build (the output of a
# real `tools/replay build`), model (a downloaded model pack); upstream is
# provided (the fixture upstream below).
KNOWN_NEEDS = {"gpu", "network", "upstream", "editor", "build", "model"}
NEEDS = re.compile(r"#\s*needs:\s*([a-z][a-z, -]*?)\s*$")


@dataclass(frozen=True)
class Command:
    line: int  # README line the command starts on
    text: str  # the command as the shell gets it (continuations kept)
    needs: frozenset[str]


@dataclass(frozen=True)
class Block:
    line: int  # README line of the opening fence
    section: str  # the heading above it
    commands: tuple[Command, ...]


def parse_blocks(markdown: str) -> list[Block]:
    """Shell code blocks with their commands; heredocs and ``\\`` continuations kept whole."""
    blocks: list[Block] = []
    lines = markdown.splitlines()
    section, i = "", 0
    while i < len(lines):
        heading = re.match(r"^#{1,6}\s+(.*)", lines[i])
        if heading:
            section = heading.group(1).strip()
        fence = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not fence:
            i += 1
            continue
        marker, lang, start = fence.group(2), fence.group(3).lower(), i + 1
        body: list[tuple[int, str]] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(marker):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1
        if lang in SHELL_LANGS:
            blocks.append(Block(start, section, tuple(_commands(body, lang == "console"))))
    return blocks


def _commands(body: list[tuple[int, str]], console: bool) -> list[Command]:
    out: list[Command] = []
    j = 0
    while j < len(body):
        number, text = body[j]
        j += 1
        if console:
            if not text.startswith("$ "):
                continue  # program output
            text = text[2:]
        if not text.strip() or text.strip().startswith("#"):
            continue
        parts = [text]
        while parts[-1].endswith("\\") and j < len(body):
            parts.append(body[j][1][2:] if console else body[j][1])
            j += 1
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", parts[0])
        if heredoc:
            while j < len(body):
                parts.append(body[j][1])
                j += 1
                if parts[-1].strip() == heredoc.group(1):
                    break
        needs = NEEDS.search(parts[0] if heredoc else parts[-1])
        wanted = frozenset(n.strip() for n in needs.group(1).split(",")) if needs else frozenset()
        out.append(Command(number, "\n".join(parts), wanted))
    return out


def normalized(command: str) -> list[str]:
    """A command's words without comments and quiet flags (``-q`` only changes output)."""
    return [w for w in shlex.split(command, comments=True) if w not in ("-q", "-qq", "--quiet")]


def ci_test_command() -> str:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    steps = [
        line.strip()
        for line in lines
        if line.strip()
        and not line.strip().startswith(("#", "set ", "cd "))
        and not re.match(r"^[A-Za-z_]+=", line.strip())
    ]
    assert steps, ".ci/run runs no command"
    return steps[-1]


def available_needs() -> set[str]:
    return {"upstream"}  # the local fixture upstream stands in for it


# --------------------------------------------------------------------------- the parser itself


SAMPLE = """\
# Title

## Quick start

```sh
tools/replay build        # needs: gpu, network
python3 -m pip install nox && python3 -m nox   # the tests
```

Some text.

```console
$ pinwheel --version
pinwheel 0.1.0
$ pinwheel plan \\
>   --json
```

```python
print("not shell")
```

```bash
cat > x.txt <<'EOF'
# not a comment, file content
EOF
echo done   # needs: upstream
```
"""


def test_parser_reads_commands_markers_console_and_heredocs() -> None:
    blocks = parse_blocks(SAMPLE)
    assert [b.section for b in blocks] == ["Quick start", "Quick start", "Quick start"]
    first, console, heredoc = (b.commands for b in blocks)
    assert [(c.line, c.needs) for c in first] == [
        (6, frozenset({"gpu", "network"})),
        (7, frozenset()),
    ]
    assert [c.text for c in console] == ["pinwheel --version", "pinwheel plan \\\n  --json"]
    assert heredoc[0].text.splitlines()[-1] == "EOF" and heredoc[0].needs == frozenset()
    assert heredoc[1].needs == frozenset({"upstream"})


def test_normalized_ignores_quiet_flags_and_comments() -> None:
    assert normalized("pip install -q nox  # x") == normalized("pip install nox")
    assert normalized("pip install nox") != normalized("pip install nose")


# --------------------------------------------------------------------------- the real README


def test_readme_needs_markers_are_known() -> None:
    for block in parse_blocks(README.read_text()):
        for command in block.commands:
            unknown = command.needs - KNOWN_NEEDS
            assert not unknown, f"README.md:{command.line}: unknown needs {sorted(unknown)}"


def test_ci_runs_the_readme_quick_start_test_command() -> None:
    blocks = parse_blocks(README.read_text())
    quick = [c for b in blocks if "quick start" in b.section.lower() for c in b.commands]
    assert quick, "README.md has no shell block under a 'Quick start' heading"
    ci = normalized(ci_test_command())
    matches = [c for c in quick if normalized(c.text) == ci]
    assert matches, f".ci/run runs {ci_test_command()!r}, which is not a README quick start command"
    assert not matches[0].needs, "the test command must run on a machine with no GPU or network"


def _git(repo: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t.invalid",
    }
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of this checkout (tracked and new files, nothing ignored)."""
    dest = tmp_path_factory.mktemp("readme") / "pinwheel"
    dest.mkdir()
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if not src.is_file():
            continue  # deleted but still in the index
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(src.read_bytes())
        target.chmod(src.stat().st_mode)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "readme test clone"]):
        _git(dest, *args)
    return dest


@pytest.fixture(scope="module")
def fixture_upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A real local upstream with PR refs and a two-PR manifest for it: (text, mirror)."""
    from conftest import make_stack  # the stack the replay tests use
    from gitfixture import manifest_text

    stack = make_stack(tmp_path_factory.mktemp("upstream"))
    steps: list[dict[str, object]] = [
        {"action": "pick", "pr": 1, "head": stack.pr[1]},
        {"action": "pick", "pr": 2, "head": stack.pr[2]},
    ]
    return manifest_text(stack.base, steps), stack.mirror


def _block_params() -> list[Any]:
    return [
        pytest.param(block, id=f"README.md:{block.line}")
        for block in parse_blocks(README.read_text())
        if block.commands
    ]


@pytest.mark.parametrize("block", _block_params())
def test_readme_block_runs(block: Block, clone: Path, request: pytest.FixtureRequest) -> None:
    run_block(block, clone, request)


UPSTREAM_SAMPLE = """\
```sh
pinwheel drift                  # needs: upstream
pinwheel lock --update-base     # needs: upstream
git diff --quiet manifest.toml && exit 9   # lock must have moved the base
pinwheel plan                   # needs: upstream
```
"""


def test_upstream_blocks_run_on_the_fixture_upstream(
    clone: Path, request: pytest.FixtureRequest
) -> None:
    # The harness itself, on a block like the README's "update the stack" journey.
    shipped = (clone / "manifest.toml").read_bytes()
    run_block(parse_blocks(UPSTREAM_SAMPLE)[0], clone, request)
    assert (clone / "manifest.toml").read_bytes() == shipped  # restored for later blocks


def run_block(block: Block, clone: Path, request: pytest.FixtureRequest) -> None:
    have, ci = available_needs(), normalized(ci_test_command())
    script, ran, skipped = ["set -e"], 0, []
    for command in block.commands:
        if command.needs - have:
            skipped.append(f"line {command.line} needs {', '.join(sorted(command.needs - have))}")
        elif normalized(command.text) == ci:
            skipped.append(f"line {command.line} is .ci/run's test command (running now)")
        else:
            script.append(f"echo '+ README.md:{command.line}' >&2")
            script.append(command.text)
            ran += 1
    if not ran:
        pytest.skip("; ".join(skipped))
    env = {
        **os.environ,
        "PATH": os.pathsep.join(
            [str(clone / ".venv" / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]]
        ),
        "PINWHEEL_CACHE": str(clone.parent / "cache"),
    }
    env.pop("PINWHEEL_MIRRORS", None)
    manifest = clone / "manifest.toml"
    shipped = manifest.read_bytes()
    if any("upstream" in c.needs for c in block.commands):
        text, mirror = request.getfixturevalue("fixture_upstream")
        manifest.write_text(text)
        _git(clone, "commit", "-q", "-am", "readme test: a manifest on the fixture upstream")
        env["PINWHEEL_MIRRORS"] = mirror
    try:
        result = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
        )
    finally:
        if manifest.read_bytes() != shipped:  # later blocks read the shipped manifest
            manifest.write_bytes(shipped)
            _git(clone, "commit", "-q", "-am", "readme test: the shipped manifest")
    where = re.findall(r"\+ (README\.md:\d+)", result.stderr)
    assert result.returncode == 0, (
        f"{where[-1] if where else 'README'} failed (exit {result.returncode})\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )

"""A command pinwheel suggests (``next: ... `pinwheel release --key PATH```) is a line a person
pastes into a shell: a path with a space or a quote in it stays one word (shlex.quote), and a
URL where a command reads a local folder is refused by name with the fetch that makes one.

Real commands through the CLI, real files and a real ssh-keygen; the suggested line is read
back with ``shlex.split``, as a POSIX shell would split it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.printable import shown_cmd
from pinwheel.urls import redact
from releasekit import make_wheel, write_manifest

pytestmark = pytest.mark.release

ODD = "a b's dir"  # a space and a quote: both break an unquoted shell word


def _ticked(text: str, starts: str) -> list[str]:
    """The backticked command that starts with ``starts``, split as a shell splits it."""
    for cmd in re.findall(r"`([^`]+)`", text):
        if cmd.startswith(starts):
            return shlex.split(cmd)
    raise AssertionError(f"no `{starts}...` in:\n{text}")


def _keygen(tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    key = tmp / ODD / "key"
    signers = tmp / ODD / "keys" / "allowed_signers"
    assert main(["--manifest", str(tmp / "none.toml"), "keygen", "--key", str(key),
                 "--allowed-signers", str(signers)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("next:"))
    argv = _ticked(line, "pinwheel release")
    assert argv == ["pinwheel", "release", "--key", str(key)]
    # the file to commit, before the backticks, is one shell word too
    assert shlex.split(line.split(", then")[0].removeprefix("next: commit ")) == [str(signers)]
    return argv, str(key)


def _fetch_into_its_source(tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    src = tmp / ODD / "release"
    src.mkdir(parents=True)
    (src / "SHA256SUMS").write_text("")
    code = main(["--manifest", str(tmp / "none.toml"), "fetch", str(src), "--dest", str(src),
                 "--allow-unsigned"])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0, err
    return _ticked(err, "pinwheel fetch"), str(src)


def _check_beside_the_manifest(
    tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], str]:
    project = tmp / ODD
    project.mkdir()
    manifest = write_manifest(project)
    make_wheel(project / "wheels", "pwa", "1.0")
    monkeypatch.chdir(tmp)
    code = main(["--manifest", str(manifest), "check", "wheels/nothing.whl", "--arch", "7.0"])
    err = capsys.readouterr().err
    assert code != 0, err
    argv = _ticked(err, "pinwheel check")
    return argv, str(project / "wheels") + "/*.whl"


def _install_a_url(tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    venv = tmp / ODD / "venv"
    code = main(["--manifest", str(tmp / "none.toml"), "install", "http://127.0.0.1:9/files/",
                 "--venv", str(venv)])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0, err
    cmd = re.findall(r"`([^`]+)`", err)[-1]
    fetch, install = cmd.split(" && ")
    assert shlex.split(fetch) == ["pinwheel", "fetch", "http://127.0.0.1:9/files/", "--dest",
                                  "fetched-release"]  # fmt: skip
    return shlex.split(install), str(venv)


CASES: dict[str, Callable[..., tuple[list[str], str]]] = {
    "keygen --key": _keygen,
    "fetch --dest its source": _fetch_into_its_source,
    "check beside the manifest": _check_beside_the_manifest,
    "install URL --venv": _install_a_url,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_suggested_command_gives_back_the_exact_path(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    run = CASES[case]
    args = (tmp_path, capsys, monkeypatch) if case.startswith("check") else (tmp_path, capsys)
    argv, path = run(*args)
    assert path in argv, (argv, path)
    assert argv[0] == "pinwheel"


def test_a_directory_given_as_the_manifest_suggests_the_file_quoted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / ODD
    project.mkdir()
    manifest = write_manifest(project)
    code = main(["--manifest", str(project), "release", "--no-sign"])
    err = capsys.readouterr().err
    assert code != 0
    said = re.search(r"pass (--manifest .*)$", err, re.M)
    assert said is not None, err
    assert shlex.split(said.group(1)) == ["--manifest", str(manifest)]


def test_shown_cmd_quotes_only_what_needs_it() -> None:
    assert shown_cmd("pinwheel", "release", "--key", "/tmp/key") == "pinwheel release --key /tmp/key"
    line = shown_cmd("pinwheel", "release", "--key", Path("/tmp/a b/k'ey"))
    assert shlex.split(line) == ["pinwheel", "release", "--key", "/tmp/a b/k'ey"]


@pytest.mark.parametrize("argv,command", [
    (["install", "http://bot:s3cr3t-token@127.0.0.1:44053/files"], "pinwheel install"),
    (["install", "https://example.org/rel/", "--venv", "v"], "pinwheel install"),
    (["index", "http://127.0.0.1:44053/files/"], "pinwheel index"),
    (["runtime-lock", "venv", "--release", "https://example.org/rel/"],
     "pinwheel runtime-lock --release"),
    (["check", "https://example.org/rel/pwa-1.0-py3-none-any.whl", "--arch", "7.0"],
     "pinwheel check"),
])  # fmt: skip
def test_a_url_where_a_folder_is_read_is_refused_by_name(
    argv: list[str], command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Not `no SHA256SUMS in http:/127.0.0.1:44053/files` (the URL read as a path): what the
    command reads, the URL (credentials hidden), and the fetch that makes the folder."""
    monkeypatch.chdir(tmp_path)
    code = main(["--manifest", str(tmp_path / "none.toml"), *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{command} reads" in err and "not a URL" in err
    assert "http:/1" not in err and "https:/e" not in err  # never the URL as a path
    assert "s3cr3t" not in err
    cmd = re.findall(r"`([^`]+)`", err)[-1]
    fetch, then = cmd.split(" && ")
    fetched = shlex.split(fetch)
    assert fetched[:2] == ["pinwheel", "fetch"] and fetched[3:] == ["--dest", "fetched-release"]
    url = next(a for a in argv if "://" in a)
    folder = url.rsplit("/", 1)[0] + "/" if url.endswith(".whl") else url
    assert fetched[2] == redact(folder)
    assert shlex.split(then)[:2] == command.split()[:2]
    assert "fetched-release" in then
    assert not list(tmp_path.iterdir())  # nothing made


# Values a suggested command may hold as they are: each is checked to a shape with no space
# or shell character before it gets here (a Python version, an ssh principal).
VALIDATED = {"version", "principal", "opts.pinned_python"}
_SUGGESTED = re.compile(r"`((?:pinwheel|rm|ls|ssh-keygen|git|sha256sum|uv|pip) [^`]*)`")


def test_every_suggested_command_in_src_quotes_what_it_interpolates() -> None:
    """A backticked command in an f-string of src/ (implicitly joined lines are one node)
    takes each interpolated value through shown_cmd, unless the value is in VALIDATED."""
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "pinwheel"
    bad = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.JoinedStr):
                continue
            text, holes = "", []
            for part in node.values:
                if isinstance(part, ast.FormattedValue):
                    holes.append((len(text), part.value))
                    text += "\0"
                else:
                    assert isinstance(part, ast.Constant)
                    text += str(part.value)
            for m in _SUGGESTED.finditer(text):
                for at, value in holes:
                    quoted = isinstance(value, ast.Call) and ast.unparse(value.func) == "shown_cmd"
                    if m.start() <= at < m.end() and not quoted and (
                            ast.unparse(value) not in VALIDATED):  # fmt: skip
                        bad.append(f"{path.relative_to(src)}:{node.lineno}: "
                                   f"{{{ast.unparse(value)}}} in `{m.group(1)[:50].replace(chr(0), '{}')}`")  # fmt: skip
    assert not bad, "\n".join(bad)

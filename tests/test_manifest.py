"""Bad manifests: each gives one clear error naming file, line, key and what is expected."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pinwheel.errors import ManifestError
from pinwheel.manifest import load

SHA = "a" * 40
HEAD = "b" * 40

GOOD = f"""[upstream]
url = "https://example.invalid/x.git"
commit = "{SHA}"
branch = "main"

[[step]]
action = "pick"
pr = 1
head = "{HEAD}"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    return path


def test_good_manifest_loads(tmp_path):
    m = load(write(tmp_path, GOOD))
    assert m.upstream.commit == SHA and m.steps[0].head == HEAD and m.steps[0].action == "pick"
    assert m.identity.time is None  # default: the base commit's date
    assert len(m.sha256) == 64


def test_flagship_manifest_loads():
    m = load(Path(__file__).parent.parent / "manifest.toml")
    assert m.upstream.commit == "ec60883ad7187dc8aa29b3c30cae5a69e1cfa5cd"
    assert [s.pr for s in m.steps] == [1125, 1159, 1161, 1166, 1165, 1102]
    assert [s.action for s in m.steps] == ["pick"] * 5 + ["merge"]
    assert m.result.tag == "glm53-card-20261010"
    assert m.result.tree is None  # unverified: newer than any reachable mirror


CASES = [
    (
        "unknown action",
        GOOD.replace('"pick"', '"rebase"'),
        "manifest.toml:7: [[step]] #1 (PR 1) key 'action': expected one of 'pick', 'merge', 'patch'",
    ),
    (
        "short SHA",
        GOOD.replace(SHA, "abc1234"),
        "manifest.toml:3: [upstream] key 'commit': expected a full 40-hex commit SHA, got short",
    ),
    (
        "non-hex SHA",
        GOOD.replace(HEAD, "z" * 40),
        "manifest.toml:9: [[step]] #1 (PR 1) key 'head': expected a full 40-hex lowercase commit SHA",
    ),
    (
        "duplicate PR",
        GOOD + f'\n[[step]]\naction = "merge"\npr = 1\nhead = "{HEAD}"\n',
        "PR #1 appears twice (steps 1 and 2)",
    ),
    ("syntax error", GOOD + "\n[result\n", "TOML syntax error"),
    (
        "unknown key",
        GOOD + 'heads = "x"\n',
        "manifest.toml:10: [[step]] #1 (PR 1) key 'heads': unknown key",
    ),
    ("unknown table", GOOD + "\n[buidl]\nx = 1\n", "unknown table [buidl]"),
    ("missing head", GOOD.replace(f'head = "{HEAD}"\n', ""), "PR #1 has no 'head'"),
    (
        "date without offset",
        GOOD + '\n[identity]\ndate = "2026-01-01T00:00:00"\n',
        "[identity] key 'date': expected a date with an explicit UTC offset",
    ),
    (
        "patch escaping",
        GOOD + '\n[[step]]\naction = "patch"\npath = "patches/../../etc/passwd"\n'
        f'sha256 = "{"0" * 64}"\n',
        "key 'path': expected a relative path under patches/",
    ),
    (
        "absolute patch",
        GOOD + f'\n[[step]]\naction = "patch"\npath = "/etc/passwd"\nsha256 = "{"0" * 64}"\n',
        "key 'path': expected a relative path under patches/",
    ),
    (
        "missing patch",
        GOOD + '\n[[step]]\naction = "patch"\npath = "patches/nope.patch"\n'
        f'sha256 = "{"0" * 64}"\n',
        "patch file nope.patch does not exist",
    ),
    ("pick without pr", GOOD.replace("pr = 1\n", ""), "key 'pr': expected a PR number"),
    ("no upstream", "[[step]]\naction = 'patch'\n", "expected an [upstream] table"),
]


@pytest.mark.parametrize("label,text,message", CASES, ids=[c[0] for c in CASES])
def test_bad_manifest(tmp_path, label, text, message):
    (tmp_path / "patches").mkdir()
    with pytest.raises(ManifestError) as info:
        load(write(tmp_path, text))
    text_err = str(info.value)
    assert message in text_err
    assert "next:" in text_err  # every error says what to do
    assert len(text_err.splitlines()[0]) < 300


def test_wrong_patch_sha256(tmp_path):
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "fix.patch").write_text("diff\n")
    text = (
        GOOD + f'\n[[step]]\naction = "patch"\npath = "patches/fix.patch"\nsha256 = "{"0" * 64}"\n'
    )
    with pytest.raises(ManifestError) as info:
        load(write(tmp_path, text))
    actual = hashlib.sha256(b"diff\n").hexdigest()
    assert f"sha256 of fix.patch is {actual}" in str(info.value)
    assert "manifest.toml:14" in str(info.value) and "pinwheel lock" in str(info.value)


def test_short_sha_accepted_in_lock_mode(tmp_path):
    m = load(write(tmp_path, GOOD.replace(SHA, "abc1234")), allow_short=True)
    assert m.upstream.commit == "abc1234"


def test_cli_reports_bad_manifest_with_exit_2(tmp_path, capsys):
    from pinwheel.cli import main

    path = write(tmp_path, GOOD.replace('"pick"', '"rebase"'))
    assert main(["--manifest", str(path), "plan"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "key 'action'" in err


@pytest.mark.parametrize(
    "deep",
    [
        "x = " + "[" * 1000 + "]" * 1000,
        "x = " + "{a = " * 1000 + "1" + "}" * 1000,
        ".".join(["a"] * 1000) + " = 1",
        "[" + ".".join(["t"] * 1000) + "]\n",
    ],
)
def test_a_1000_level_manifest_is_an_error_not_a_recursion_error(tmp_path: Path, deep: str) -> None:
    from pinwheel.errors import ManifestError
    from pinwheel.manifest.model import loads

    with pytest.raises(ManifestError, match="nested more than"):
        loads(deep.encode(), tmp_path / "manifest.toml")

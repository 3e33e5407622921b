"""Hostile input and faults for the source stage, through the real CLI.

Each case asserts the exit code, the message (what, where, next) and that
nothing was left half-done: no marker file from an injected command, no ref
or tag moved, no temp file left under a final name.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pygit2
import pytest

from gitfixture import UPSTREAM_URL, git
from pinwheel.cli import main

SHA = "0123456789abcdef0123456789abcdef01234567"
UPSTREAM = f'[upstream]\nurl = "{UPSTREAM_URL}"\ncommit = "{SHA}"\nbranch = "main"\n'


def run_cli(tmp: Path, manifest: Path, *args: str, mirror: str | None = None) -> int:
    argv = ["--manifest", str(manifest), "--cache", str(tmp / "cache")]
    if mirror:
        argv += ["--mirror", mirror]
    return main([*argv, *args])


# --------------------------------------------------------------------------- manifest input

MARK = "@MARK@"  # replaced by a path under tmp_path: an injected command would create it

# case id -> (manifest text, what the message must say)
BAD_MANIFESTS = {
    "url-option-injection": (
        f'[upstream]\nurl = "--upload-pack=touch {MARK};true"\ncommit = "{SHA}"\n',
        ["[upstream] key 'url'", "starts with '-'"],
    ),
    "url-ext-transport": (
        f'[upstream]\nurl = "ext::sh -c touch% {MARK}"\ncommit = "{SHA}"\n',
        ["key 'url'", "unsupported repository URL"],
    ),
    "url-remote-helper": (
        f'[upstream]\nurl = "fd::17"\ncommit = "{SHA}"\n',
        ["key 'url'", "remote-helper"],
    ),
    "url-unknown-scheme": (
        f'[upstream]\nurl = "ftp://example.invalid/x.git"\ncommit = "{SHA}"\n',
        ["key 'url'", "scheme 'ftp'"],
    ),
    "kernel-url-injection": (
        UPSTREAM + f'\n[[kernel]]\nname = "k"\nbuilder = "cmake"\n'
        f'url = "-oProxyCommand=touch {MARK}"\ncommit = "{SHA}"\n',
        ["[[kernel]] k key 'url'", "starts with '-'"],
    ),
    "branch-refspec-injection": (
        f'[upstream]\nurl = "{UPSTREAM_URL}"\ncommit = "{SHA}"\nbranch = "main:refs/heads/x"\n',
        ["key 'branch'", "git ref name"],
    ),
    "step-not-tables": ("step = [1, 2]\n" + UPSTREAM, ["key 'step'", "[[step]]"]),
    "upstream-not-table": ("upstream = 5\n", ["key 'upstream'", "a table"]),
    "identity-string": (
        'identity = "bob"\n' + UPSTREAM,
        ["key 'identity'", "a table written [identity]"],
    ),
    "identity-header-injection": (
        UPSTREAM + '\n[identity]\nname = "Bot\\ngpgsig x"\n',
        ["[identity] key 'name'", "one line"],
    ),
    "sha-trailing-newline": (
        f'[upstream]\nurl = "{UPSTREAM_URL}"\ncommit = "{SHA}\\n"\n',
        ["[upstream] key 'commit'", "40-hex"],
    ),
    "name-with-slash": (
        '[manifest]\nname = "a/b"\n\n' + UPSTREAM,
        ["[manifest] key 'name'", "no '/'"],
    ),
    "name-dotdot": ('[manifest]\nname = "..x"\n\n' + UPSTREAM, ["key 'name'"]),
    "build-not-table": ("build = 3\n" + UPSTREAM, ["key 'build'", "a table"]),
    "kernel-string": ('kernel = "x"\n' + UPSTREAM, ["key 'kernel'", "[[kernel]]"]),
    "serve-array": ("serve = []\n" + UPSTREAM, ["key 'serve'", "a table"]),
    "tag-dotdot": (UPSTREAM + '\n[result]\ntag = "v1..2"\n', ["key 'tag'", "'..'"]),
    "tag-trailing-newline": (
        UPSTREAM + '\n[result]\ntag = "v1\\n"\n',
        ["key 'tag'", "'\\n'"],
    ),
    "tag-leading-dash": (UPSTREAM + '\n[result]\ntag = "-d"\n', ["key 'tag'", "'-'"]),
    "tag-lock-suffix": (UPSTREAM + '\n[result]\ntag = "v1.lock"\n', ["key 'tag'", ".lock"]),
    "tag-at-brace": (UPSTREAM + '\n[result]\ntag = "v@{1}"\n', ["key 'tag'", "'@{'"]),
    "tag-space": (UPSTREAM + '\n[result]\ntag = "v 1"\n', ["key 'tag'", "' '"]),
    "missing-patch-outside-repo": (
        UPSTREAM
        + '\n[[step]]\naction = "patch"\npath = "patches/x.patch"\nsha256 = "'
        + "0" * 64
        + '"\n',
        ["key 'path'", "relative to its own folder"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_bad_manifest_is_exit_2_with_where_and_next(case, tmp_path, capsys):
    text, needles = BAD_MANIFESTS[case]
    marker = tmp_path / "INJECTED"
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(text.replace(MARK, str(marker)))
    rc = run_cli(tmp_path, manifest, "plan")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "manifest.toml:" in err and "next:" in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert "Traceback" not in err
    assert not marker.exists()
    assert not (tmp_path / "cache" / "repos").exists()  # failed before touching the cache


def test_non_utf8_manifest_names_line(tmp_path, capsys):
    manifest = tmp_path / "manifest.toml"
    manifest.write_bytes(UPSTREAM.encode() + b'\n[result]\ntag = "caf\xe9"\n')
    assert run_cli(tmp_path, manifest, "plan") == 2
    err = capsys.readouterr().err
    assert "manifest.toml:7" in err and "not UTF-8" in err and "next:" in err


@pytest.mark.parametrize(
    ("env", "flag", "needle"),
    [
        ("--upload-pack=touch @MARK@=/tmp", None, "starts with '-'"),
        (None, f"{UPSTREAM_URL}=-oops", "PATH starts with '-'"),
        (None, "ext::sh -c touch% @MARK@=/tmp", "URL:"),
    ],
    ids=["env-url-dash", "flag-path-dash", "flag-ext-url"],
)
def test_bad_mirror_mapping_is_exit_2(env, flag, needle, tmp_path, capsys, monkeypatch):
    marker = tmp_path / "INJECTED"
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(UPSTREAM)
    if env:
        monkeypatch.setenv("PINWHEEL_MIRRORS", env.replace(MARK, str(marker)))
    mirror = flag.replace(MARK, str(marker)) if flag else None
    assert run_cli(tmp_path, manifest, "plan", mirror=mirror) == 2
    err = capsys.readouterr().err
    assert "--mirror / PINWHEEL_MIRRORS" in err and needle in err and "next:" in err
    assert not marker.exists()


def test_credentials_are_redacted(tmp_path, capsys):
    url = "https://bob:s3cr3t-token@example.invalid/x.git"
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(f'[upstream]\nurl = "{url}"\ncommit = "{SHA}"\n')
    rc = run_cli(tmp_path, manifest, "plan", mirror=f"{url}={tmp_path / 'nope'}")
    err = capsys.readouterr().err
    assert rc == 1 and "does not exist" in err and "next:" in err
    assert "s3cr3t" not in err and "bob:***@example.invalid" in err
    # The cache directory name carries no secret either.
    rc = run_cli(tmp_path, manifest, "--offline", "plan")
    err = capsys.readouterr().err
    assert "s3cr3t" not in err
    assert not any("s3cr3t" in p.name for p in (tmp_path / "cache" / "repos").iterdir())


def test_bom_is_accepted(stack, capsys):
    m = stack.write([{"action": "pick", "pr": 1, "head": stack.pr[1]}])
    m.write_bytes(b"\xef\xbb\xbf" + m.read_bytes())
    rc, out = stack.cli(m, "plan", capsys=capsys)
    assert rc == 0 and out["steps"][0]["pr"] == 1


# --------------------------------------------------------------------------- nothing half-done


def cache_repo(stack) -> pygit2.Repository:
    return pygit2.Repository(str(next((stack.tmp / "cache" / "repos").glob("*.git"))))


def test_pick_of_zero_commits_is_exit_2(stack, capsys):
    git(stack.up.work, "push", "-q", str(stack.up.bare), f"{stack.base}:refs/pull/9/head")
    m = stack.write([{"action": "pick", "pr": 9, "head": stack.base}])
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 2
    assert "step 1 (pick PR #9)" in err and "selects 0 commits" in err
    assert "remove step 1" in err and "pinwheel drift" in err
    assert "refs/tags/stack-1" not in cache_repo(stack).references


def test_second_manifest_does_not_move_a_tag(stack, capsys):
    one = stack.write([{"action": "pick", "pr": 1, "head": stack.pr[1]}], name="one.toml")
    rc, first = stack.cli(one, "run", capsys=capsys)
    assert rc == 0
    two = stack.write(
        [
            {"action": "pick", "pr": 1, "head": stack.pr[1]},
            {"action": "pick", "pr": 2, "head": stack.pr[2]},
        ],
        name="two.toml",
    )
    rc = stack.cli(two, "run")[0]
    err = capsys.readouterr().err
    assert rc == 2
    assert "tag stack-1 already exists" in err and "two.toml [result] tag" in err
    assert "tag -d stack-1" in err
    repo = cache_repo(stack)
    assert str(repo.references["refs/tags/stack-1"].target) == first["head"]
    assert "refs/pinwheel/stack/two" not in repo.references  # one transaction: nothing written
    # The same manifest again is not a move: still fine.
    assert stack.cli(one, "run")[0] == 0


# --------------------------------------------------------------------------- faults


def fake_git(tmp: Path, fail_on: str, message: str) -> Path:
    """A `git` on PATH that fails one subcommand the way a full disk makes it fail."""
    real = next(
        Path(d) / "git"
        for d in os.environ["PATH"].split(os.pathsep)
        if (Path(d) / "git").is_file() and os.access(Path(d) / "git", os.X_OK)
    )
    bindir = tmp / "fakebin"
    bindir.mkdir()
    script = bindir / "git"
    script.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do [ "$a" = "{fail_on}" ] && {{ echo "{message}" >&2; exit 128; }}; done\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return bindir


@pytest.mark.parametrize(
    ("fail_on", "message"),
    [
        ("update-ref", "fatal: update_ref failed: unable to write: No space left on device"),
        ("apply", "error: unable to write index: No space left on device"),
    ],
    ids=["ref-write", "patch-apply"],
)
def test_disk_full_from_git_is_disk_full(fail_on, message, stack, capsys, monkeypatch, tmp_path):
    from test_stack_ops import make_patch

    path, digest = make_patch(stack, tmp_path)
    m = stack.write(
        [
            {"action": "pick", "pr": 1, "head": stack.pr[1]},
            {"action": "patch", "path": path, "sha256": digest},
        ]
    )
    bindir = fake_git(tmp_path, fail_on, message)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 1, err  # not 4 (conflict)
    assert "disk full" in err and "free)" in err and "cache du" in err
    assert "conflict" not in err and "resolve start" not in err
    assert "refs/tags/stack-1" not in cache_repo(stack).references


def test_disk_full_in_libgit2_is_not_missing_from_mirror(stack, capsys, monkeypatch):
    m = stack.write([{"action": "pick", "pr": 1, "head": stack.pr[1]}])

    def full(self, *args, **kw):
        raise pygit2.GitError("failed to write object: No space left on device")

    monkeypatch.setattr(pygit2.Repository, "merge_trees", full)
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 1 and "disk full" in err and "missing from the mirror" not in err

    def full_commit(self, *args, **kw):
        raise OSError(28, "No space left on device", str(stack.tmp / "cache"))

    monkeypatch.undo()
    from pinwheel.source import replay

    monkeypatch.setattr(replay.Replayer, "_commit", full_commit)
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 1 and "disk full" in err and "Traceback" not in err


def test_object_dropped_on_full_disk_is_disk_full(stack, capsys, monkeypatch):
    """Seen on a full tmpfs: libgit2 returned a commit id it never stored (then KeyError)."""
    from pinwheel.source import faults

    m = stack.write([{"action": "pick", "pr": 1, "head": stack.pr[1]}])
    monkeypatch.setattr(pygit2.Repository, "create_commit", lambda self, *a: pygit2.Oid(hex=SHA))
    monkeypatch.setattr(faults, "low_space", lambda path: True)
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 1 and "disk full" in err and f"could not store commit {SHA[:12]}" in err
    assert "KeyError" not in err and "Traceback" not in err
    assert "refs/tags/stack-1" not in cache_repo(stack).references


def test_corrupt_cache_object_is_named_with_repair(stack, capsys):
    m = stack.write([{"action": "pick", "pr": 1, "head": stack.pr[1]}])
    rc, out = stack.cli(m, "run", capsys=capsys)
    assert rc == 0
    repo_dir = next((stack.tmp / "cache" / "repos").glob("*.git"))
    head = out["head"]
    loose = repo_dir / "objects" / head[:2] / head[2:]
    loose.chmod(0o644)
    loose.write_bytes(b"not zlib at all")
    rc = main(["--cache", str(stack.tmp / "cache"), "cache", "verify"])
    err_out = capsys.readouterr()
    assert rc == 1
    assert f"BAD  {repo_dir}" in err_out.out and f"rm -rf -- {repo_dir}" in err_out.out
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 1 and "cache corruption" in err and "pinwheel cache verify" in err
    assert "Traceback" not in err


def test_cache_du_clean_prune(stack, capsys, tmp_path):
    m = stack.write([{"action": "pick", "pr": 1, "head": stack.pr[1]}])
    assert stack.cli(m, "run")[0] == 0
    cache = stack.tmp / "cache"
    (cache / "repos" / "stale-00000000.git").mkdir()
    capsys.readouterr()
    assert main(["--cache", str(cache), "--json", "cache", "du"]) == 0
    du = json.loads(capsys.readouterr().out)
    assert du["entries"]["repos"]["bytes"] > 0 and "locks" in du["entries"]
    # prune: dry run by default; the manifest's own repo is kept.
    assert main(["--cache", str(cache), "--json", "cache", "prune", str(m)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [Path(p).name for p in plan["paths"]] == ["stale-00000000.git"]
    assert (cache / "repos" / "stale-00000000.git").exists() and not plan["applied"]
    assert main(["--cache", str(cache), "cache", "prune", str(m), "--apply"]) == 0
    assert not (cache / "repos" / "stale-00000000.git").exists()
    assert len(list((cache / "repos").glob("*.git"))) == 1
    assert main(["--cache", str(cache), "cache", "prune"]) == 2  # nothing to select by
    assert main(["--cache", str(cache), "cache", "clean"]) == 0
    assert (cache / "repos").exists()  # dry run
    assert main(["--cache", str(cache), "cache", "clean", "--yes"]) == 0
    # the marker, the locks and the cache's keys stay (pinwheel.cachelayout's table says so)
    assert sorted(p.name for p in cache.iterdir()) == ["CACHEDIR.TAG", "keys", "locks"]


# --------------------------------------------------------------------------- lock


def test_lock_keeps_crlf_mode_symlink_and_cleans_temps(stack, capsys, tmp_path):
    real = stack.write([{"action": "pick", "pr": 1}], name="real.toml")
    real.write_bytes(real.read_bytes().replace(b"\n", b"\r\n"))
    real.chmod(0o600)
    link = stack.tmp / "manifest.toml"
    link.symlink_to(real.name)
    stale = stack.tmp / ".real.toml.abandoned.tmp"
    stale.write_text("left by a killed lock")
    os.utime(stale, (1, 1))
    rc = stack.cli(link, "lock")[0]
    assert rc == 0, capsys.readouterr().err
    assert link.is_symlink() and os.readlink(link) == real.name
    data = real.read_bytes()
    assert stack.pr[1].encode() in data and b"tree = " in data
    assert data.count(b"\n") == data.count(b"\r\n")  # every line still CRLF
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert not stale.exists()
    assert not list(stack.tmp.glob(".real.toml.*.tmp"))


# --------------------------------------------------------------------------- partial mirrors and refs


def test_drift_reports_every_pr_when_refs_are_missing(stack, capsys):
    m = stack.write(
        [
            {"action": "pick", "pr": 1, "head": stack.pr[1]},
            {"action": "pick", "pr": 77, "head": "1" * 40},
        ]
    )
    rc, out = stack.cli(m, "drift", capsys=capsys)
    assert rc == 0, out
    by_pr = {p["pr"]: p for p in out["prs"]}
    assert by_pr[1]["status"] == "ok"
    assert by_pr[77]["status"] == "missing ref and head"
    assert not out["replays_on_tip"] and "PR #77" in out["replay_problem"]
    rc = main(
        ["--manifest", str(m), "--cache", str(stack.tmp / "cache"), "--mirror"]
        + [stack.mirror, "drift"]
    )
    human = capsys.readouterr().out
    assert rc == 0
    assert "PR #1: unchanged" in human and "PR #77: missing ref and head" in human
    assert "next:" in human


def test_export_on_partial_mirror_names_missing_files(stack, capsys, tmp_path):
    from test_replay import make_partial_mirror

    partial = make_partial_mirror(stack, tmp_path)
    m = stack.write([{"action": "pick", "pr": 1, "head": stack.pr[1]}])
    out_dir = tmp_path / "out"
    rc = main(
        [
            "--manifest",
            str(m),
            "--cache",
            str(tmp_path / "pc"),
            "--mirror",
            f"{UPSTREAM_URL}={partial}",
            "export",
            "--out",
            str(out_dir),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "missing from the partial mirror" in err and "shared.txt" in err
    assert "--refetch" in err and "next:" in err
    assert not out_dir.exists() or not any(out_dir.iterdir())


def test_resolve_start_on_partial_mirror_names_missing_files(stack, capsys, tmp_path):
    from test_replay import make_partial_mirror

    partial = make_partial_mirror(stack, tmp_path)
    m = stack.write(
        [
            {"action": "pick", "pr": 1, "head": stack.pr[1]},
            {"action": "pick", "pr": 4, "head": stack.pr[4]},
        ]
    )
    work = tmp_path / "fix"
    rc = main(
        [
            "--manifest",
            str(m),
            "--cache",
            str(tmp_path / "pc"),
            "--mirror",
            f"{UPSTREAM_URL}={partial}",
            "resolve",
            "start",
            str(work),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1, err  # not 4: the conflict cannot even be computed without the blobs
    assert "step 2 (pick PR #4)" in err and "missing from the mirror" in err
    assert "a.txt" in err and "--refetch" in err and "next:" in err
    assert not work.exists()

"""Boundary: pinwheel's cache repositories and their git configuration (docs/SECURITY.md).

A cache repository carries only keys pinwheel (``git init``, ``git worktree``) wrote:
any other key in ``config``, ``config.worktree`` (read under
``extensions.worktreeConfig``), an included file or a ``commondir`` target is refused
before git runs there; every command-valued key git knows by a fixed name is also
overridden with ``-c`` on every call. Real git repositories and real fetches.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gitfixture import Upstream, git
from pinwheel import runner
from pinwheel.errors import PinwheelError
from pinwheel.source import gitcli, gitpolicy


@pytest.fixture
def mark(tmp_path: Path) -> Path:
    return tmp_path / "MARK"


def _with_alternate(tmp_path: Path) -> tuple[Path, Upstream]:
    """A bare cache repository with a mirror attached as an alternate (as source.cache
    does), and an upstream one commit ahead of the mirror: a fetch asks the alternate's
    refs (core.alternateRefsCommand)."""
    up = Upstream(tmp_path / "up")
    up.commit({"a.txt": "1\n"}, "one")
    up.publish()
    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(up.bare), str(mirror)], check=True)
    up.commit({"a.txt": "2\n"}, "two")
    up.publish()
    repo = tmp_path / "cache.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    (repo / "objects" / "info" / "alternates").write_text(f"{mirror}/objects\n")
    return repo, up


def test_config_worktree_naming_alternate_refs_command_is_refused(tmp_path, mark):
    """Issue 34: the config check read one file; git also reads config.worktree under
    extensions.worktreeConfig (a key the check allows), where core.alternateRefsCommand
    runs on the next fetch."""
    repo, up = _with_alternate(tmp_path)
    git(repo, "config", "extensions.worktreeConfig", "true")
    (repo / "config.worktree").write_text(f"[core]\n\talternateRefsCommand = touch {mark}; false\n")
    with pytest.raises(PinwheelError, match="core.alternaterefscommand"):
        gitcli.git(["fetch", "-q", "--", str(up.bare), "main"], git_dir=repo)
    assert not mark.exists()


def test_a_commondir_pointing_elsewhere_is_refused(tmp_path, mark):
    """Issue 34: a `commondir` file makes git read another directory's config (and
    objects); the check followed it only for a `.git` file, and then trusted it."""
    repo, up = _with_alternate(tmp_path)
    evil = tmp_path / "evil.git"
    subprocess.run(["git", "init", "-q", "--bare", str(evil)], check=True)
    subprocess.run(["git", "config", "--file", str(evil / "config"), "core.alternateRefsCommand",
                    f"touch {mark}; false"], check=True)  # fmt: skip
    (repo / "commondir").write_text(f"{evil}\n")
    with pytest.raises(PinwheelError, match="commondir"):
        gitcli.git(["fetch", "-q", "--", str(up.bare), "main"], git_dir=repo)
    assert not mark.exists()


def test_a_worktree_made_by_git_worktree_add_is_accepted(tmp_path):
    """What pinwheel's own `resolve` makes: worktrees/<name>/commondir -> the repository."""
    repo, up = _with_alternate(tmp_path)
    gitcli.git(["fetch", "-q", "--", str(up.bare), "main:refs/heads/main"], git_dir=repo)
    work = tmp_path / "wt"
    gitcli.git(["worktree", "add", "-q", "--detach", "--", str(work), "main"], git_dir=repo)
    assert gitcli.out(["rev-parse", "HEAD"], cwd=work) == up.rev("HEAD")
    assert gitpolicy.config_files(work) == [repo / "config"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("includeIf.gitdir:/.path", "@MARK@.cfg"),
        ("include.path", "@MARK@.cfg"),
        ("remote.origin.uploadpack", "touch @MARK@; git-upload-pack"),
        ("filter.x.smudge", "touch @MARK@; cat"),
    ],
)
def test_included_files_and_driver_keys_are_refused(tmp_path, mark, key, value):
    repo, up = _with_alternate(tmp_path)
    git(repo, "config", "extensions.worktreeConfig", "true")
    subprocess.run(["git", "config", "--file", str(repo / "config.worktree"), key,
                    value.replace("@MARK@", str(mark))], check=True)  # fmt: skip
    with pytest.raises(PinwheelError, match="refusing a repository whose config"):
        gitcli.git(["fetch", "-q", "--", str(up.bare), "main"], git_dir=repo)
    assert not mark.exists()


def test_command_keys_are_overridden_even_where_the_config_is_trusted(tmp_path, mark):
    """The second fence: in the user's own checkout (its config is not checked) a fetch
    still never runs core.alternateRefsCommand, and the alternate's refs are still used."""
    repo, up = _with_alternate(tmp_path)
    git(repo, "config", "core.alternateRefsCommand", f"touch {mark}; false")
    proc = runner.run(gitcli.command(["fetch", "-q", "--", str(up.bare), "main"],
                                     git_dir=repo, own_checkout=True))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not mark.exists()
    # the override is git's own default, written out: it lists the alternate's refs
    out = subprocess.run(["sh", "-c", gitpolicy.ALTERNATE_REFS + ' "$@"', "x",
                          str(tmp_path / "mirror.git")], capture_output=True, text=True)  # fmt: skip
    assert out.stdout.split() == [up.rev("HEAD~1")]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("core.editor", "touch @MARK@"),
        ("sequence.editor", "touch @MARK@"),
        ("diff.external", "touch @MARK@; true"),
    ],
)
def test_other_command_keys_never_run_in_a_trusted_checkout(tmp_path, mark, key, value):
    """`git commit` without -m asks the editor; `git diff` runs diff.external: -c wins."""
    work = tmp_path / "w"
    work.mkdir()
    git(work, "init", "-q")
    (work / "a").write_text("1\n")
    git(work, "add", "a")
    git(work, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "one")
    (work / "a").write_text("2\n")
    git(work, "config", key, value.replace("@MARK@", str(mark)))
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@b"}  # fmt: skip
    for args in (["diff"], ["commit", "-qa"], ["rebase", "-i", "HEAD"]):
        runner.run(gitcli.command(args, cwd=work, env=env, own_checkout=True))
    assert not mark.exists()

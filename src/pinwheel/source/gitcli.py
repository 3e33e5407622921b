"""Running the git CLI where pinwheel needs it (fetch, apply, archive, worktrees).

Everything that decides commit bytes happens in libgit2 (replay.py). The CLI is
run under one fixed policy (:mod:`pinwheel.source.gitpolicy`): no system or
global config (fetches included), a protocol allowlist, no hooks, fsmonitor,
credential helpers or signing, C locale, UTC, and no repository whose own
config names files or commands.

Every git command goes through :func:`git`, which asks :func:`policy` for the
options and environment to run it with and hands the command to
:mod:`pinwheel.runner`: tightening what git may do (protocols, config) is one
edit in :func:`policy`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pinwheel import runner
from pinwheel.errors import PinwheelError
from pinwheel.progress import SILENT, Reporter
from pinwheel.source import faults, gitpolicy
from pinwheel.urls import redact


@dataclass(frozen=True)
class GitPolicy:
    """How every git command is run: options before the subcommand, environment changes."""

    options: tuple[str, ...]  # `-c key=value` pairs, before the subcommand
    env_set: Mapping[str, str] = field(default_factory=dict)
    env_unset_prefixes: tuple[str, ...] = ("GIT_",)  # no inherited GIT_DIR, GIT_CONFIG_*, ...


def policy() -> GitPolicy:
    """The one place git's settings are decided: :mod:`pinwheel.source.gitpolicy`.

    No user or system config (not even for fetches), ``GIT_ALLOW_PROTOCOL``,
    hooks/fsmonitor/credential helpers/signing off per command.
    """
    return GitPolicy(options=tuple(gitpolicy.config_args()), env_set=gitpolicy.fixed_env())


def command(
    args: Sequence[str],
    *,
    git_dir: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    what: str = "git",
    own_checkout: bool = False,
) -> runner.Command:
    """The :class:`~pinwheel.runner.Command` for ``git ARGS`` under :func:`policy`.

    A repository whose own config names files or commands is refused first
    (:func:`pinwheel.source.gitpolicy.check_repo_config`). ``own_checkout``: the
    user's checkout that holds the manifest (its config is the user's, as trusted
    as the manifest); only read-only history commands run there, under the same
    per-command overrides.
    """
    rule = policy()
    if not own_checkout:
        if git_dir is not None:
            gitpolicy.check_repo_config(Path(git_dir))
        elif cwd is not None:
            gitpolicy.check_repo_config(Path(cwd))
    argv = ["git"]
    if git_dir is not None:
        argv += ["--git-dir", str(git_dir)]
    argv += [*rule.options, *gitpolicy.subcommand_options(list(args))]
    extra = {k: v for k, v in (env or {}).items() if k not in rule.env_set}
    return runner.Command(
        argv=tuple(argv),
        what=what,
        cwd=cwd,
        env_set={**extra, **rule.env_set},  # a caller adds variables, never loosens the policy
        env_unset_prefixes=rule.env_unset_prefixes,
        input=input,
        check=False,
        redact=True,
        missing_hint="install git (2.38 or newer) and put it on PATH",
    )


def git(
    args: Sequence[str],
    *,
    git_dir: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
    what: str = "git",
    own_checkout: bool = False,
    reporter: Reporter = SILENT,
) -> runner.Completed:
    """Run git hermetically (see :func:`policy`); ``env`` adds variables on top.

    Callers put values that come from a manifest, a flag or a server after ``--``
    (or ``--end-of-options``) so git can never read them as options.
    """
    cmd = command(
        args, git_dir=git_dir, cwd=cwd, env=env, input=input, what=what, own_checkout=own_checkout
    )
    proc = runner.run(cmd, reporter)
    if proc.returncode != 0 and proc.stderr:
        # A full disk or a corrupt object is never "a patch that does not apply" or
        # "a network problem", whatever the caller would have made of the failure.
        fault = faults.classify(
            proc.stderr.decode(errors="replace"), Path(git_dir or cwd or Path.cwd())
        )
        if fault is not None:
            raise fault
    if check and proc.returncode != 0:
        err = stderr_lines(proc)
        raise PinwheelError(
            f"{what} failed: {err[-1] if err else 'exit ' + str(proc.returncode)}",
            where=redact(f"git {' '.join(args[:3])}"),
        )
    return proc


def stderr_lines(proc: runner.Completed) -> list[str]:
    """git's stderr as lines, credentials in any URL it echoes redacted."""
    text = (proc.stderr or b"(git wrote nothing on stderr)").decode(errors="replace")
    return redact(text).strip().splitlines()


def out(args: Sequence[str], **kw) -> str:  # type: ignore[no-untyped-def]
    return git(args, **kw).stdout.decode().strip()

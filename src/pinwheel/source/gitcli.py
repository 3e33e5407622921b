"""Running the git CLI where pinwheel needs it (fetch, apply, archive, worktrees).

Everything that decides commit bytes happens in libgit2 (replay.py). The CLI is
run hermetically so a user's config cannot change results: no system or global
config, no hooks, no signing, C locale, UTC. Fetches may opt back into the
user's config (proxies, credentials, insteadOf) because they do not shape commits.

Every git command goes through :func:`git`, which asks :func:`policy` for the
options and environment to run it with and hands the command to
:mod:`pinwheel.runner`: tightening what git may do (protocols, config) is one
edit in :func:`policy`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pinwheel import runner
from pinwheel.errors import PinwheelError
from pinwheel.progress import SILENT, Reporter
from pinwheel.source import faults
from pinwheel.urls import redact_text


@dataclass(frozen=True)
class GitPolicy:
    """How every git command is run: options before the subcommand, environment changes."""

    options: tuple[str, ...]  # `-c key=value` pairs, before the subcommand
    env_set: Mapping[str, str] = field(default_factory=dict)
    env_unset_prefixes: tuple[str, ...] = ("GIT_",)  # no inherited GIT_DIR, GIT_CONFIG_*, ...


def policy(*, user_config: bool) -> GitPolicy:
    """The one place git's hermetic settings are decided.

    ``user_config`` (fetches from the network only): the user's global config
    applies (proxies, credentials, insteadOf); the system config never does.
    """
    env = {"LC_ALL": "C", "LANG": "C", "TZ": "UTC", "GIT_TERMINAL_PROMPT": "0", "GIT_ADVICE": "0"}
    if not user_config:
        env |= {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    # Hooks and signing are switched off per command as a second fence.
    options = (
        "-c", "core.hooksPath=/dev/null",
        "-c", "commit.gpgSign=false",
        "-c", "tag.gpgSign=false",
    )  # fmt: skip
    return GitPolicy(options=options, env_set=env)


def command(
    args: Sequence[str],
    *,
    git_dir: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    user_config: bool = False,
    input: bytes | None = None,
    what: str = "git",
) -> runner.Command:
    """The :class:`~pinwheel.runner.Command` for ``git ARGS`` under :func:`policy`."""
    rule = policy(user_config=user_config)
    argv = ["git"]
    if git_dir is not None:
        argv += ["--git-dir", str(git_dir)]
    argv += [*rule.options, *args]
    return runner.Command(
        argv=tuple(argv),
        what=what,
        cwd=cwd,
        env_set={**rule.env_set, **(env or {})},
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
    user_config: bool = False,
    input: bytes | None = None,
    check: bool = True,
    what: str = "git",
    reporter: Reporter = SILENT,
) -> runner.Completed:
    """Run git hermetically (see :func:`policy`); ``env`` adds variables on top.

    Callers put values that come from a manifest, a flag or a server after ``--``
    (or ``--end-of-options``) so git can never read them as options.
    """
    cmd = command(
        args, git_dir=git_dir, cwd=cwd, env=env, user_config=user_config, input=input, what=what
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
            where=redact_text(f"git {' '.join(args[:3])}"),
        )
    return proc


def stderr_lines(proc: runner.Completed) -> list[str]:
    """git's stderr as lines, credentials in any URL it echoes redacted."""
    text = (proc.stderr or b"(git wrote nothing on stderr)").decode(errors="replace")
    return redact_text(text).strip().splitlines()


def out(args: Sequence[str], **kw) -> str:  # type: ignore[no-untyped-def]
    return git(args, **kw).stdout.decode().strip()

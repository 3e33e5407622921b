"""Running the git CLI where pinwheel needs it (fetch, apply, archive, worktrees).

Everything that decides commit bytes happens in libgit2 (replay.py). The CLI is
run hermetically so a user's config cannot change results: no system or global
config, no hooks, no signing, C locale, UTC. Fetches may opt back into the
user's config (proxies, credentials, insteadOf) because they do not shape commits.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from pinwheel.errors import PinwheelError
from pinwheel.source import faults
from pinwheel.urls import redact_text


def hermetic_env(
    extra: Mapping[str, str] | None = None, *, user_config: bool = False
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        LC_ALL="C",
        LANG="C",
        TZ="UTC",
        GIT_TERMINAL_PROMPT="0",
        GIT_ADVICE="0",
    )
    if not user_config:
        env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    if extra:
        env.update(extra)
    return env


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
    stream_stderr: bool = False,
) -> subprocess.CompletedProcess[bytes]:
    """Run git hermetically; ``stream_stderr`` shows git's own progress on the terminal.

    Callers put values that come from a manifest, a flag or a server after ``--``
    (or ``--end-of-options``) so git can never read them as options.
    """
    cmd = ["git"]
    if git_dir is not None:
        cmd += ["--git-dir", str(git_dir)]
    # Hooks and signing are switched off per command as a second fence.
    cmd += [
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "commit.gpgSign=false",
        "-c",
        "tag.gpgSign=false",
    ]
    cmd += list(args)
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env=hermetic_env(env, user_config=user_config),
        input=input,
        stdout=subprocess.PIPE,
        stderr=None if stream_stderr else subprocess.PIPE,
    )
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


def stderr_lines(proc: subprocess.CompletedProcess[bytes]) -> list[str]:
    """git's stderr as lines, credentials in any URL it echoes redacted."""
    text = (proc.stderr or b"(see git's output above)").decode(errors="replace")
    return redact_text(text).strip().splitlines()


def out(args: Sequence[str], **kw) -> str:  # type: ignore[no-untyped-def]
    return git(args, **kw).stdout.decode().strip()

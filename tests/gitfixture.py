"""Real git repositories for tests: an upstream with main, PR branches and refs/pull/N/head.

Everything is made with the git CLI in a temp dir, the way GitHub would hold
it: PR heads live under refs/pull/N/head, test merges under refs/pull/N/merge.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

UPSTREAM_URL = "https://example.invalid/acme/engine.git"

BASE_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Fixture",
    "GIT_AUTHOR_EMAIL": "fixture@example.org",
    "GIT_COMMITTER_NAME": "Fixture",
    "GIT_COMMITTER_EMAIL": "fixture@example.org",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "LC_ALL": "C",
    "TZ": "UTC",
}


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, **BASE_ENV, **(env or {})}
    proc = subprocess.run(["git", *args], cwd=cwd, env=full, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


@dataclass
class Upstream:
    """A work repo (for making commits) plus a bare repo that plays GitHub."""

    root: Path
    work: Path = field(init=False)
    bare: Path = field(init=False)
    clock: int = 1_700_000_000

    def __post_init__(self) -> None:
        self.work = self.root / "work"
        self.bare = self.root / "upstream.git"
        self.work.mkdir(parents=True)
        git(self.work, "init", "-q", "-b", "main")
        git(self.root, "init", "-q", "--bare", "-b", "main", str(self.bare))

    def commit(
        self,
        files: dict[str, str | None],
        message: str,
        *,
        author: str = "Ada Lovelace <ada@example.org>",
        tz: str = "+0000",
        allow_empty: bool = False,
    ) -> str:
        for name, text in files.items():
            path = self.work / name
            if text is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        git(self.work, "add", "-A")
        self.clock += 3600
        name, _, mail = author.partition(" <")
        env = {
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": mail.rstrip(">"),
            "GIT_AUTHOR_DATE": f"{self.clock} {tz}",
            "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": mail.rstrip(">"),
            "GIT_COMMITTER_DATE": f"{self.clock} {tz}",
        }
        args = ["commit", "-q", "-m", message] + (["--allow-empty"] if allow_empty else [])
        git(self.work, *args, env=env)
        return self.rev("HEAD")

    def rev(self, ref: str) -> str:
        return git(self.work, "rev-parse", ref)

    def checkout(self, ref: str, new_branch: str | None = None) -> None:
        if new_branch:
            git(self.work, "checkout", "-q", "-b", new_branch, ref)
        else:
            git(self.work, "checkout", "-q", ref)

    def merge(self, ref: str, message: str) -> str:
        self.clock += 3600
        env = {
            "GIT_AUTHOR_NAME": "Ada Lovelace",
            "GIT_AUTHOR_EMAIL": "ada@example.org",
            "GIT_AUTHOR_DATE": f"{self.clock} +0000",
            "GIT_COMMITTER_NAME": "Ada Lovelace",
            "GIT_COMMITTER_EMAIL": "ada@example.org",
            "GIT_COMMITTER_DATE": f"{self.clock} +0000",
        }
        git(self.work, "merge", "-q", "--no-ff", "-m", message, ref, env=env)
        return self.rev("HEAD")

    def publish(self, prs: dict[int, str] | None = None) -> None:
        """Push main and set refs/pull/N/head in the bare 'GitHub' repo."""
        git(self.work, "push", "-q", "--force", str(self.bare), "main:refs/heads/main")
        for number, branch in (prs or {}).items():
            git(
                self.work,
                "push",
                "-q",
                "--force",
                str(self.bare),
                f"{branch}:refs/pull/{number}/head",
            )

    def github_test_merge(self, number: int) -> str:
        """What GitHub stores as refs/pull/N/merge: main merged with the PR head."""
        scratch = self.root / f"merge-{number}"
        git(self.root, "clone", "-q", str(self.bare), str(scratch))
        git(scratch, "fetch", "-q", "origin", f"refs/pull/{number}/head")
        git(
            scratch,
            "merge",
            "-q",
            "--no-ff",
            "-m",
            f"Merge {number}",
            "FETCH_HEAD",
            env={
                "GIT_AUTHOR_NAME": "GitHub",
                "GIT_AUTHOR_EMAIL": "noreply@github.com",
                "GIT_COMMITTER_NAME": "GitHub",
                "GIT_COMMITTER_EMAIL": "noreply@github.com",
            },
        )
        git(scratch, "push", "-q", str(self.bare), f"HEAD:refs/pull/{number}/merge")
        return git(scratch, "rev-parse", "HEAD^{tree}")


def manifest_text(
    base: str,
    steps: list[dict[str, object]],
    *,
    tree: str | None = None,
    tag: str | None = "stack-1",
    date: str = "2026-10-10T00:00:00+00:00",
    extra: str = "",
) -> str:
    lines = [
        "# test manifest",
        "[upstream]",
        f'url = "{UPSTREAM_URL}"',
        f'commit = "{base}"',
        'branch = "main"',
        "",
        "[identity]",
        'name = "Replay Bot"',
        'email = "replay@example.org"',
        f'date = "{date}"',
        "",
    ]
    for step in steps:
        lines.append("[[step]]")
        for key, value in step.items():
            if isinstance(value, str):
                lines.append(f'{key} = "{value}"')
            elif isinstance(value, list):
                lines.append(f"{key} = [" + ", ".join(f'"{v}"' for v in value) + "]")
            else:
                lines.append(f"{key} = {value}")
        lines.append("")
    lines.append("[result]")
    if tree:
        lines.append(f'tree = "{tree}"')
    if tag:
        lines.append(f'tag = "{tag}"')
    return "\n".join(lines) + "\n" + extra

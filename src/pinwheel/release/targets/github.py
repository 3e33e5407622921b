"""Publishing to a GitHub release: the plan (files, notes, ``gh release create``) the
release workflow runs; the GitHub release gets every file SHA256SUMS lists."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pinwheel import validate
from pinwheel.checksums import SIG, SUMS
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.release.targets.contract import Published, PublishRequest

if TYPE_CHECKING:
    from pinwheel.manifest import Manifest
    from pinwheel.manifest.release import GithubTarget
    from pinwheel.release.assemble import Verified


class Github:
    name = "github"
    summary = "a GitHub release: prints the plan (files, notes, `gh release create`) to run"
    flags = ()

    def publish(self, request: PublishRequest) -> Published:
        target = request.config.github
        if target is None:
            raise UsageError(
                "no GitHub target",
                where="[release.github] repo",
                next='set [release.github] repo = "owner/name"',
            )
        plan = github_plan(request.release, target, request.manifest)
        return Published(plan, " ".join(plan["command"]))


TARGET = Github()


def github_plan(release: Verified, target: GithubTarget, manifest: Manifest) -> dict[str, Any]:
    """Exactly what the workflow uploads: the files SHA256SUMS lists, the sums, the signature."""
    from pinwheel.release import attest
    from pinwheel.release.assemble import NOTES

    tag = target.tag or manifest.result.tag
    if not tag:
        raise PinwheelError(
            "no release tag",
            where="[release.github] tag / [result] tag",
            next="set [result].tag in the manifest",
        )
    problem = validate.tag_problem(tag)
    if problem:
        raise PinwheelError(
            f"refusing release tag {tag[:80]!r}: {problem}",
            where="[release.github] tag / [result] tag",
            next="set a tag name like v1.2.3 in the manifest",
        )
    files = sorted(release.sums) + [SUMS]
    files += [f for f in (SIG, attest.FILENAME) if (release.dir / f).is_file()]
    paths = [str((release.dir / f).absolute()) for f in files]
    return {
        "repo": target.repo,
        "tag": tag,
        "notes": str(release.dir / NOTES),
        "files": paths,
        "command": [
            "gh",
            "release",
            "create",
            "--repo",
            target.repo,
            "--notes-file",
            str((release.dir / NOTES).absolute()),
            # "--": the tag and the file names are never read as options.
            "--",
            tag,
            *paths,
        ],
    }

"""Publishing to a package index: ``twine check --strict``, then ``twine upload``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pinwheel import runner
from pinwheel.errors import PinwheelError, UsageError, VerifyError
from pinwheel.release.targets.contract import Published, PublishRequest, TargetFlag

if TYPE_CHECKING:
    from pinwheel.manifest.release import IndexTarget
    from pinwheel.release.assemble import Verified

REPOSITORY_URL = "--repository-url"


class Index:
    name = "index"
    summary = "a package index, by twine (credentials from TWINE_* variables)"
    flags = (TargetFlag(REPOSITORY_URL, "index upload URL (default: [release.index] url)"),)

    def publish(self, request: PublishRequest) -> Published:
        from pinwheel.manifest.release import IndexTarget

        url = request.flag(REPOSITORY_URL)
        target = IndexTarget(url) if url else request.config.index
        if target is None:
            raise UsageError(
                "no index to publish to",
                where="[release.index] url",
                next="set [release.index] url or pass --repository-url URL",
            )
        wheels = publish_index(request.release, target)
        return Published(
            {"index": target.url, "uploaded": wheels},
            f"uploaded {len(wheels)} wheels to {target.url}",
        )


TARGET = Index()


def publish_index(release: Verified, target: IndexTarget) -> list[str]:
    """Upload the release's wheels with twine; credentials come from TWINE_* variables."""
    wheels = sorted(n for n in release.sums if n.endswith(".whl"))
    cmd = [
        sys.executable,
        "-m",
        "twine",
        "upload",
        "--non-interactive",
        "--disable-progress-bar",
        "--repository-url",
        target.url,
        "--",
        *(str((release.dir / w).resolve()) for w in wheels),
    ]
    try:
        import twine  # noqa: F401
    except ImportError:
        raise PinwheelError(
            "twine is not installed",
            next="install the release extra: `pip install -e '.[release]'` from the checkout",
        ) from None
    twine_check(release.dir, wheels)
    runner.run(
        runner.Command(
            tuple(cmd),
            what="twine upload",
            where=target.url,
            next="check TWINE_USERNAME/TWINE_PASSWORD and the index URL",
            redact=True,
        )
    )
    return wheels


def twine_check(directory: Path, wheels: list[str]) -> None:
    """``twine check --strict`` over the wheels: what the index would warn about, refused first."""
    proc = runner.run(
        runner.Command(
            (sys.executable, "-m", "twine", "check", "--strict", "--")
            + tuple(str((directory / w).resolve()) for w in wheels),
            what="twine check --strict",
            where=str(directory),
            check=False,
            env_set={"NO_COLOR": "1"},
        )
    )
    if proc.returncode != 0:
        raise VerifyError(
            "twine check --strict refused the wheels; nothing was uploaded:\n    "
            + "\n    ".join(line for line in proc.text.splitlines() if line.strip())[:4000],
            where=str(directory),
            next="fix the wheels' metadata (a README as long_description, its content type) "
            "and rebuild, then rerun `pinwheel release` and `pinwheel publish`",
        )

"""What a release target is: a name for ``publish --to``, a line of help, the flags it
reads, and one call that sends a verified release somewhere.

Kept free of heavy imports: the CLI reads every target's name and help to list
``publish`` among the commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pinwheel.manifest import Manifest
    from pinwheel.manifest.release import ReleaseConfig
    from pinwheel.release.assemble import Verified


@dataclass(frozen=True)
class TargetFlag:
    """A ``pinwheel publish`` flag one target reads: a string, or None when not given."""

    flag: str  # "--repository-url"
    help: str
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class PublishRequest:
    """A release ``verify_release`` checked, the ``[release]`` settings and the manifest
    it came from, and the target's own flags (by ``TargetFlag.flag``; None: not given)."""

    release: Verified
    config: ReleaseConfig
    manifest: Manifest
    flags: Mapping[str, str | None] = field(default_factory=dict)

    def flag(self, name: str) -> str | None:
        return self.flags.get(name)


@dataclass(frozen=True)
class Published:
    """What publishing did: the ``--json`` document and the line a person reads."""

    payload: dict[str, Any]
    text: str


class ReleaseTarget(Protocol):
    """One row of ``pinwheel.release.targets.TARGETS``."""

    @property
    def name(self) -> str:
        """The value of ``publish --to``."""
        ...

    @property
    def summary(self) -> str:
        """One line for ``publish --help``."""
        ...

    @property
    def flags(self) -> tuple[TargetFlag, ...]:
        """The flags this target reads (added to ``publish``; each name once in the table)."""
        ...

    def publish(self, request: PublishRequest) -> Published:
        """Send the verified release; errors are PinwheelErrors naming what, where, next."""
        ...

"""Where `pinwheel publish --to NAME` sends a verified release: one module per target,
one row each in ``TARGETS``.

``publish``'s ``--to`` choices, its help and the flags a target reads are all read
from this table; nothing dispatches on a target's name. A new target is a module with
an object that has the ``ReleaseTarget`` shape (see ``contract``) and its row here.
"""

from __future__ import annotations

from pinwheel.errors import UsageError
from pinwheel.release.targets import github, hf, index
from pinwheel.release.targets.contract import (
    Published,
    PublishRequest,
    ReleaseTarget,
    TargetFlag,
)

TARGETS: tuple[ReleaseTarget, ...] = (
    index.TARGET,
    github.TARGET,
    hf.TARGET,
)


def named(name: str) -> ReleaseTarget:
    """The row whose name is ``name`` (the CLI offers only these; a caller may not)."""
    for target in TARGETS:
        if target.name == name:
            return target
    raise UsageError(
        f"no release target named {name[:80]!r}",
        where="pinwheel publish --to",
        next="pass one of: " + ", ".join(t.name for t in TARGETS),
    )


__all__ = ["TARGETS", "Published", "PublishRequest", "ReleaseTarget", "TargetFlag", "named"]

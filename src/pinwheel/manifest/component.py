"""Components: every stack a manifest pins, the engine and each out-of-tree ``[[kernel]]``.

A component (``[[kernel]]`` with ``url``) has its own upstream, commit and
ordered steps (``[[kernel.step]]``: pick / merge / patch, exactly the engine's
``[[step]]`` model; the older ``[[kernel.patch]]`` list reads as patch steps).
:func:`component_manifest` turns it into a sub-:class:`Manifest` so the one
replay engine, ``plan``, ``run``, ``lock``, ``drift`` and ``resolve`` handle it
like the engine; :func:`stacks` lists them all, the engine first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from pinwheel.errors import ManifestError
from pinwheel.manifest.model import DEFAULT_IDENTITY, Identity, Manifest, Result, Upstream
from pinwheel.manifest.steps import Step

if TYPE_CHECKING:
    from pinwheel.manifest.build import KernelSpec

ENGINE = "engine"


class _Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=_Named)


def by_name(
    items: Sequence[N], names: Sequence[str], *, what: str, where: str, next: str
) -> list[N]:
    """``items`` called ``names``, in that order; a name none has is a ManifestError."""
    known = {item.name: item for item in items}
    missing = [n for n in names if n not in known]
    if missing:
        raise ManifestError(
            f"no {what} named {', '.join(missing)} (known: {', '.join(known) or 'none'})",
            where=where,
            next=next,
        )
    return [known[n] for n in names]


@dataclass(frozen=True)
class Stack:
    """One replayable stack: the engine (``kernel`` None) or a component."""

    name: str  # "engine" or the [[kernel]] name
    manifest: Manifest  # what the replay engine takes
    kernel: KernelSpec | None = None

    @property
    def title(self) -> str:
        return "engine" if self.kernel is None else f"component {self.name}"

    @property
    def prefix(self) -> str:
        """Prefix for step labels in lock / drift messages."""
        return "" if self.kernel is None else f"[[kernel]] {self.name} "


def component_steps(spec: KernelSpec) -> tuple[Step, ...]:
    if spec.steps:
        return spec.steps
    return tuple(
        Step(
            number=i,
            action="patch",
            pr=None,
            head=None,
            title=None,
            commits=None,
            patch=p.path,
            patch_sha256=p.sha256,
            at=p.at,
            owner=f"[[kernel]] {spec.name} ",
        )
        for i, p in enumerate(spec.patches, start=1)
    )


def component_manifest(spec: KernelSpec, *, commit: str | None = None) -> Manifest:
    """The out-of-tree kernel as a stack the replay engine understands.

    ``commit`` overrides the pinned base (``lock`` passes the branch tip for an
    unpinned component); without either, the component cannot be replayed.
    """
    if not spec.url:
        raise ManifestError(
            f"[[kernel]] {spec.name} is in-tree: it has no upstream to replay",
            where=spec.where,
            next="give it url + commit to make it a component",
        )
    base = commit or spec.commit
    if not base:
        raise ManifestError(
            f"[[kernel]] {spec.name} has no 'commit': its upstream is not pinned",
            where=spec.where_key("commit"),
            next=f"run `pinwheel lock`: it pins the tip of {spec.branch} and the tree",
        )
    steps = component_steps(spec)
    digest = hashlib.sha256(
        "\n".join(
            [
                spec.url,
                base,
                *(
                    f"{s.action}:{s.pr}:{s.head}:{','.join(s.commits or ())}:{s.patch_sha256}"
                    for s in steps
                ),
            ]
        ).encode()
    ).hexdigest()
    return Manifest(
        path=spec.source,
        sha256=digest,
        name=f"kernel-{spec.name}",
        upstream=Upstream(url=spec.url, commit=base, branch=spec.branch, where=spec.commit_where),
        steps=steps,
        identity=Identity(
            name=DEFAULT_IDENTITY[0], email=DEFAULT_IDENTITY[1], time=None, offset=None
        ),
        result=Result(tree=spec.tree, tag=None),
        origin=spec.where,
    )


def stacks(manifest: Manifest, names: tuple[str, ...] = ()) -> tuple[Stack, ...]:
    """The engine (when the manifest has one), then every component; ``names`` selects."""
    found: list[Stack] = []
    if manifest.has_engine:
        found.append(Stack(ENGINE, manifest))
    for spec in manifest.kernels:
        if spec.url:
            found.append(Stack(spec.name, component_manifest(spec), spec))
    if names:
        return tuple(
            by_name(found, names, what="stack", where="--component",
                    next="name the engine as 'engine', a component by its [[kernel]] name")
        )  # fmt: skip
    return tuple(found)

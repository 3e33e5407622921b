"""``[serve.runtime]``: the prebuilt wheels a venv engine serves with, pinned.

Where they come from (a Hub repository and its commit, as ``[model]`` names the pack) and
each wheel (distribution name, version, sha256); a key left out is the manifest's
``FILL IN``. ``pinwheel preflight`` holds the serving venv to it
(:mod:`pinwheel.serve.runtimepin`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pinwheel import validate
from pinwheel.manifest.table import Table


@dataclass(frozen=True)
class RuntimeWheel:
    """One ``[[serve.runtime.wheel]]``: a distribution the serving venv must hold. ``None``
    is a value the manifest leaves as ``FILL IN`` (preflight reports it unverified)."""

    name: str  # the distribution name (METADATA's Name)
    version: str | None
    sha256: str | None  # of the wheel file that was installed
    where: str  # "manifest.toml:60: [[serve.runtime.wheel]] #1" (the table's line)
    version_where: str
    sha256_where: str


@dataclass(frozen=True)
class RuntimePin:
    """``[serve.runtime]``: where the serving venv's prebuilt wheels come from (a Hub
    repository, as ``[model]`` names the pack) and the wheels themselves."""

    repo: str  # owner/name of the repository that ships the wheels
    revision: str | None  # its full commit; None: FILL IN
    wheels: tuple[RuntimeWheel, ...]
    where: str  # the table's line
    revision_where: str


# A distribution name as METADATA's Name spells it (PEP 508), bounded.
_DIST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._\-]{0,198}[A-Za-z0-9])?")


def _dist_name_problem(value: object) -> str | None:
    if not isinstance(value, str) or not _DIST_NAME.fullmatch(value):
        return "letters, digits, '.', '_' and '-', starting and ending with a letter or digit"
    return None


def parse_runtime(table: Table, *, image_engine: bool) -> RuntimePin:
    """``[serve.runtime]``: repo and revision as ``[model]`` spells them, then one
    ``[[serve.runtime.wheel]]`` per distribution (name, version, sha256). A key left out
    is the manifest's ``FILL IN``: preflight names it unverified, never guesses it."""
    from pinwheel.manifest.release import repo_problem

    t = table.sub("runtime")
    t.only("repo", "revision", "wheel")
    if image_engine:
        raise t.error("repo", "no [serve.runtime] with an image engine (the image digest "
                      "pins its runtime; [serve.runtime] pins a venv's wheels)")  # fmt: skip
    wheels: list[RuntimeWheel] = []
    seen: set[str] = set()
    for w in t.subs("wheel"):
        w.only("name", "version", "sha256")
        name = w.checked("name", _dist_name_problem, "a distribution name")
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            raise w.error("name", "each distribution once", name)
        seen.add(key)
        wheels.append(RuntimeWheel(
            name=name,
            version=w.checked("version", validate.version_problem, "a PEP 440 version", None),
            sha256=w.sha256("sha256", None),
            where=w.where(), version_where=w.where("version"), sha256_where=w.where("sha256"),
        ))  # fmt: skip
    if not wheels:
        raise t.error("wheel", "at least one [[serve.runtime.wheel]] (name, version, sha256)")
    return RuntimePin(
        repo=t.checked("repo", repo_problem, "owner/name"),
        revision=t.sha("revision", None),
        wheels=tuple(wheels),
        where=t.where(),
        revision_where=t.where("revision"),
    )


__all__ = ["RuntimePin", "RuntimeWheel", "parse_runtime"]

"""One path for every wheel: built -> tagged -> checked -> SHA256SUMS -> provenance -> ``wheels/``.

Producers (the engine build, in-tree and out-of-tree kernels, components) only
build: each returns a :class:`Built` whose wheel is still in scratch. Then
:func:`publish` gives each wheel the manylinux tag auditwheel finds for it (or
keeps ``linux_*`` and records why, :mod:`pinwheel.wheels.platformtag`), checks
every new wheel together (its glibc floor included), and places the new set in
the output directory as one unit: wheels from an earlier build that this one
does not replace are kept only if ``SHA256SUMS`` and ``provenance.json`` vouch
for them, SHA256SUMS and provenance.json are written in a staging directory
beside it, and the staging directory replaces the old one by rename. A failed
or interrupted build leaves the previous consistent set (or nothing), never a
wheel without its SHA256SUMS line.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel.checksums import SUMS, parse_sums, sha256_file, write_sums
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import link_or_copy, recover_dir, remove_tree, swap_dir
from pinwheel.wheels import platformtag
from pinwheel.wheels.check import CheckReport, CheckSpec, check_wheels
from pinwheel.wheels.provenance import (
    FILENAME,
    Receipt,
    member_digests,
    read_receipt,
    write_receipt,
)
from pinwheel.wheels.record import BuildRecord
from pinwheel.wheels.relabel import relabel
from pinwheel.wheels.wheelfile import dist_name


@dataclass(frozen=True)
class Built:
    """One wheel a producer made, not yet checked or published."""

    component: str  # "engine" or the [[kernel]] name
    kind: str  # "engine" | "kernel"
    wheel: Path  # in the producer's scratch directory
    seconds: float
    source: Mapping[str, Any]  # url, commit, tree, origin: what it was built from
    build: BuildRecord  # how: version, env, command, epoch, compiled inputs...

    def record(self, sha256: str) -> dict[str, Any]:
        """This wheel's entry under provenance.json ``components``."""
        return {
            "name": self.component,
            "kind": self.kind,
            "wheel": self.wheel.name,
            "sha256": sha256,
            "seconds": round(self.seconds, 1),
            "source": dict(self.source),
            **self.build.to_json(),
        }


@dataclass(frozen=True)
class WheelSet:
    """The consistent set now in ``out_dir``."""

    out_dir: Path
    built: tuple[Path, ...]  # placed by this run
    kept: tuple[str, ...]  # earlier wheels kept (vouched for by the old SUMS + provenance)
    wheels: Mapping[str, str]  # every wheel in the set -> sha256
    sums: Path
    provenance: Path
    report: CheckReport
    components: tuple[Built, ...] = ()  # what was built, as published (manylinux-tagged)

    def to_json(self) -> dict[str, Any]:
        return {
            "wheels": dict(self.wheels),
            "built": [p.name for p in self.built],
            "kept": list(self.kept),
            "sha256sums": str(self.sums),
            "provenance": str(self.provenance),
            "check": self.report.to_json(),
        }

    def human_lines(self) -> list[str]:
        lines = [f"built {len(self.built)} wheel(s):"]
        lines += [f"  {self.wheels[p.name]}  {p.name}" for p in self.built]
        if self.kept:
            lines.append(f"kept {len(self.kept)} earlier wheel(s): {', '.join(self.kept)}")
        lines += self.report.human_lines()
        lines += [f"wrote {self.sums}", f"wrote {self.provenance}"]
        return lines


def recover(out_dir: Path) -> None:
    """Undo a swap that an interrupted run left half done; drop stale staging dirs."""
    recover_dir(out_dir)
    for stale in out_dir.parent.glob(f".{out_dir.name}.staging-*"):
        remove_tree(stale, ignore_errors=True)


def _sibling(out_dir: Path, what: str) -> Path:
    return out_dir.parent / f".{out_dir.name}.{what}"


def vouched(out_dir: Path) -> tuple[dict[str, str], Receipt | None]:
    """Wheels of the current set that SHA256SUMS lists, exist, and match; and the receipt."""
    sums_path = out_dir / SUMS
    if not sums_path.is_file():
        return {}, None
    try:
        listed = parse_sums(sums_path.read_text())
    except (PinwheelError, UnicodeDecodeError):
        return {}, None
    receipt = read_receipt(out_dir / FILENAME) if (out_dir / FILENAME).is_file() else None
    good = {
        name: digest
        for name, digest in listed.items()
        if name.endswith(".whl")
        and (out_dir / name).is_file()
        and sha256_file(out_dir / name) == digest
    }
    return good, receipt


def publish(
    built: Sequence[Built],
    out_dir: Path,
    *,
    spec: CheckSpec,
    receipt: Mapping[str, Any],
    keep_others: bool = True,
    tag: bool = True,
    label: str | Callable[[Built], str] | None = None,
    checker: Callable[..., CheckReport] = check_wheels,
    tagger: Callable[[Sequence[Built]], tuple[list[Built], dict[str, Any]]] | None = None,
    members: Callable[[Path, str], dict[str, str]] | None = None,
) -> WheelSet:
    """Check ``built``, then make ``out_dir`` hold them plus the earlier wheels they don't replace.

    ``receipt`` is the provenance payload for the whole set minus ``components``,
    ``wheels`` and ``built``, which are filled in here. ``label`` (the build's variant,
    :func:`pinwheel.wheels.relabel.variant_label`, or a function giving each wheel its
    own: a kernel that compiles no torch names none): every wheel's version carries it as
    its local label; a wheel built without it (an out-of-tree kernel keeps upstream's
    version) is relabelled, and its record says from what. ``checker``/``tagger``: the
    check and the tagging step (a caller may pass ones that look up work already done
    for the same bytes, :mod:`pinwheel.compile.checkmemo`); ``members``: each member's
    sha256 of a wheel given with its own sha256 (default: read from the wheel).
    """
    out_dir = Path(out_dir).absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    recover(out_dir)
    kept, old_receipt, old_components = _kept(out_dir, built, keep_others)
    # Required members ([build] required_members: the engine's) count over the whole set, and
    # only once the set has an engine: a kernel-only build keeps, or waits for, the engine.
    has_engine = any(b.kind == "engine" for b in built) or any(
        c.get("kind") == "engine" for c in old_components.values()
    )
    relabelled: dict[str, str] = {}
    if label is not None:
        built, relabelled = _labelled(built, label)
    tags: dict[str, platformtag.TagDecision] = {}
    if tag:
        before = [b.wheel.name for b in built]
        built, tags = (tagger or _tagged)(built)
        relabelled = {
            b.wheel.name: relabelled[n]
            for b, n in zip(built, before, strict=True)
            if n in relabelled
        }
    report = checker(
        [b.wheel for b in built], spec, alongside=[out_dir / n for n in kept], has_engine=has_engine
    )
    report.raise_if_failed()  # unchecked wheels never reach out_dir

    staging = _sibling(out_dir, f"staging-{os.getpid()}")
    remove_tree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        for name in kept:
            link_or_copy(out_dir / name, staging / name)
        digests: dict[str, str] = dict(kept)
        components: list[dict[str, Any]] = [old_components[n] for n in sorted(old_components)]
        for b in built:
            target = staging / b.wheel.name
            shutil.copy2(b.wheel, target)
            digests[target.name] = sha256_file(target)
            record = b.record(digests[target.name])
            checked = next(w for w in report.wheels if w.wheel == target.name)
            record["floor"] = checked.floor.to_json()
            # Two builders compare member by member without exchanging wheels.
            record["members"] = (members or _member_digests)(target, digests[target.name])
            components.append(_labels(record, b, tags, label, relabelled))
        names = sorted(digests)
        write_sums(staging, names)
        kept_engine = old_receipt if any(
            c.get("kind") == "engine" for c in old_components.values()) else None  # fmt: skip
        payload = _set_receipt(receipt, built, kept_engine, digests, components)
        write_receipt(staging, payload)
        _fsync_dir(staging)
        _swap(staging, out_dir)
    except BaseException:
        remove_tree(staging, ignore_errors=True)
        raise
    placed = tuple(out_dir / b.wheel.name for b in built)
    return WheelSet(
        out_dir=out_dir,
        built=placed,
        kept=tuple(sorted(kept)),
        wheels={n: digests[n] for n in names},
        sums=out_dir / SUMS,
        provenance=out_dir / FILENAME,
        report=report,
        components=tuple(built),
    )


def _kept(
    out_dir: Path, built: Sequence[Built], keep_others: bool
) -> tuple[dict[str, str], Receipt | None, dict[str, dict[str, Any]]]:
    """The wheels of ``out_dir``'s set (vouched for) that no built wheel replaces, by name
    with their sha256; the set's receipt; and its records of the kept wheels."""
    new_dists = {dist_name(b.wheel.name) for b in built}
    old, old_receipt = vouched(out_dir) if keep_others else ({}, None)
    kept = {n: d for n, d in old.items() if dist_name(n) not in new_dists}
    old_components = {
        c["wheel"]: c
        for c in (old_receipt.entries() if old_receipt else [])
        if c.get("wheel") in kept
    }
    return kept, old_receipt, old_components


def _labels(
    record: dict[str, Any],
    b: Built,
    tags: Mapping[str, platformtag.TagDecision],
    label: str | Callable[[Built], str] | None,
    relabelled: Mapping[str, str],
) -> dict[str, Any]:
    """``record`` with what the set did to the wheel's name: its platform tag, its label,
    the name it had before relabelling."""
    if b.wheel.name in tags:
        record["platform_tag"] = tags[b.wheel.name].to_json()
    if label is not None:
        record["label"] = label(b) if callable(label) else label
    if b.wheel.name in relabelled:
        record["relabelled_from"] = relabelled[b.wheel.name]
    return record


def _set_receipt(
    receipt: Mapping[str, Any],
    built: Sequence[Built],
    kept_engine: Receipt | None,
    digests: Mapping[str, str],
    components: list[dict[str, Any]],
) -> dict[str, Any]:
    """The set's provenance: ``receipt`` plus its wheels, what this run built and every
    component; with no engine built here, what the receipt ``kept_engine`` (the earlier
    run's, whose engine wheel is kept; None: no such wheel) recorded of its replay."""
    payload = dict(receipt)
    if not any(b.kind == "engine" for b in built) and kept_engine is not None:
        # the kept engine wheel was replayed by an earlier run: keep what it recorded
        for key in ("upstream", "steps", "replayed", "head", "tree", "tag"):
            payload[key] = kept_engine.get(key)
    payload["wheels"] = {n: digests[n] for n in sorted(digests)}
    payload["built"] = sorted(b.wheel.name for b in built)
    payload["components"] = sorted(components, key=lambda c: (c["kind"], c["name"]))
    engine = next((c for c in components if c["kind"] == "engine"), None)
    payload["version"] = engine.get("version") if engine else None
    payload["source_date_epoch"] = engine.get("source_date_epoch") if engine else None
    return payload


def _member_digests(wheel: Path, _sha256: str) -> dict[str, str]:
    return member_digests(wheel)


def _labelled(
    built: Sequence[Built], label: str | Callable[[Built], str]
) -> tuple[list[Built], dict[str, str]]:
    """Each wheel with its label in its version (a relabelled copy beside it); and, per
    relabelled wheel, the name it was built with."""
    out: list[Built] = []
    was: dict[str, str] = {}
    for b in built:
        wheel = relabel(b.wheel, label(b) if callable(label) else label, b.wheel.parent)
        if wheel != b.wheel:
            was[wheel.name] = b.wheel.name
        out.append(dataclasses.replace(b, wheel=wheel))
    return out, was


def _tagged(
    built: Sequence[Built],
) -> tuple[list[Built], dict[str, platformtag.TagDecision]]:
    """Each wheel with the manylinux tag auditwheel finds (a retagged copy beside it)."""
    out: list[Built] = []
    tags: dict[str, platformtag.TagDecision] = {}
    for b in built:
        decision = platformtag.decide(b.wheel)
        wheel = b.wheel
        if decision.manylinux:
            wheel = platformtag.retag(b.wheel, decision.platform, b.wheel.parent)
        tags[wheel.name] = decision
        out.append(dataclasses.replace(b, wheel=wheel))
    return out, tags


def _swap(staging: Path, out_dir: Path) -> None:
    """Replace out_dir by staging. Files in out_dir that are not wheels or the set's own
    files (e.g. a user's notes) move over too."""
    if out_dir.exists():
        for entry in out_dir.iterdir():
            if entry.name.endswith(".whl") or entry.name in (SUMS, FILENAME):
                continue
            if not (staging / entry.name).exists():
                link_or_copy(entry, staging / entry.name)
    swap_dir(staging, out_dir)


def _fsync_dir(path: Path) -> None:
    for entry in path.iterdir():
        if entry.is_file():
            with open(entry, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

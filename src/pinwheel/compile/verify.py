"""``pinwheel verify-build``: rebuild what a provenance receipt records and compare, wheel by wheel.

In: a build output directory (wheels + provenance.json) and the manifest it
was built from. Out: a :class:`RebuildComparison` naming every wheel that
differs and, inside it, every member that differs (and diffoscope's view
when it is installed). Every component is rebuilt: the engine from the
replayed stack at the recorded version and SOURCE_DATE_EPOCH, each kernel at
its recorded date.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pinwheel import runner, validate
from pinwheel.checksums import sha256_file
from pinwheel.compile.pipeline import BuildRequest, build
from pinwheel.errors import EXIT_MISMATCH, MismatchError, VerifyError
from pinwheel.fsutil import remove_tree
from pinwheel.progress import SILENT, Reporter
from pinwheel.wheels.provenance import (
    FILENAME,
    environment_differences,
    member_differences,
    read_receipt,
)
from pinwheel.wheels.substitute import from_receipt
from pinwheel.wheels.wheeldiff import MemberDiff, UnreadableWheel, diff_members


@dataclass(frozen=True)
class WheelComparison:
    wheel: str
    recorded: str
    rebuilt: str | None  # None: the rebuild made no wheel of that name
    members: tuple[MemberDiff, ...] = ()
    diffoscope: str | None = None
    environment: tuple[str, ...] = ()  # how the build environments differ (provenance)

    @property
    def same(self) -> bool:
        return self.recorded == self.rebuilt


@dataclass(frozen=True)
class RebuildComparison:
    wheels: tuple[WheelComparison, ...]
    exit_code: int = EXIT_MISMATCH

    @property
    def same(self) -> bool:
        return all(w.same for w in self.wheels)

    def to_json(self) -> dict[str, Any]:
        return {
            "same": self.same,
            "wheels": [
                {
                    "wheel": w.wheel,
                    "recorded": w.recorded,
                    "rebuilt": w.rebuilt,
                    "same": w.same,
                    "members": [m.to_json() for m in w.members],
                    "diffoscope": w.diffoscope,
                    "environment": list(w.environment),
                }
                for w in self.wheels
            ],
        }

    def human_lines(self) -> list[str]:
        lines = []
        for w in self.wheels:
            env = [f"    build environment: {d}" for d in w.environment]
            if w.same:
                lines.append(f"same     {w.recorded}  {w.wheel}")
                lines += env
                continue
            lines += env
            lines.append(f"DIFFERS  {w.wheel}: recorded {w.recorded}, rebuilt {w.rebuilt}")
            lines += [f"    {m.line()}" for m in w.members]
            if w.diffoscope:
                lines += ["    diffoscope:"] + [f"      {ln}" for ln in w.diffoscope.splitlines()]
        verdict = "reproducible" if self.same else "NOT reproducible"
        lines.append(
            f"{verdict}: {sum(w.same for w in self.wheels)}/{len(self.wheels)} wheel(s) identical"
        )
        return lines


def _diffoscope(a: Path, b: Path, limit: int = 60) -> str | None:
    tool = shutil.which("diffoscope")
    if not tool:
        return None
    out = runner.run(
        runner.Command((tool, "--text", "-", "--", str(a), str(b)), timeout=1800, check=False)
    )
    return "\n".join(out.text.splitlines()[:limit]) or None


def compare_builds(recorded_dir: Path, rebuilt_dir: Path) -> RebuildComparison:
    """Compare every wheel the recorded set holds with the rebuild's wheel of the same name."""
    recorded = read_receipt(Path(recorded_dir) / FILENAME)
    names = [c.wheel for c in recorded.components] or list(recorded.doc.built)
    rebuilt_receipt = (
        read_receipt(Path(rebuilt_dir) / FILENAME)
        if (Path(rebuilt_dir) / FILENAME).is_file()
        else {}
    )

    def entry(receipt: Mapping[str, Any], wheel: str) -> Mapping[str, Any]:
        for c in receipt.get("components") or []:
            if isinstance(c, dict) and c.get("wheel") == wheel:
                return c
        return {}

    results = []
    for name in sorted(names):
        if validate.wheel_name_problem(name):
            raise VerifyError(
                f"the receipt names a wheel that is not a plain wheel file name: {name!r}",
                where=str(Path(recorded_dir) / FILENAME),
                next="verify a receipt pinwheel wrote",
            )
        want = recorded.wheels.get(name)
        if want is None:
            raise VerifyError(
                f"the receipt lists {name} but records no sha256 for it",
                where=str(Path(recorded_dir) / FILENAME),
                next="verify a receipt pinwheel wrote",
            )
        ours = Path(recorded_dir) / name
        theirs = Path(rebuilt_dir) / name
        got = sha256_file(theirs) if theirs.is_file() else None
        a, b = entry(recorded, name), entry(rebuilt_receipt, name)
        env = tuple(environment_differences(a.get("environment"), b.get("environment")))
        if got == want:
            results.append(WheelComparison(name, want, got, environment=env))
            continue
        members: tuple[MemberDiff, ...] = ()
        diffo = None
        if got is not None and ours.is_file():
            try:
                members = diff_members(ours, theirs)
            except UnreadableWheel as exc:  # a wheel past the zip limits: no member to name
                members = (MemberDiff("(wheel)", f"unreadable: {exc}"),)
            diffo = _diffoscope(ours, theirs)
        elif a.get("members") and b.get("members"):  # the recorded wheel is not here
            members = tuple(MemberDiff(m, c) for m, c in member_differences(a["members"],
                                                                            b["members"]))
        results.append(WheelComparison(name, want, got, members, diffo, env))
    return RebuildComparison(tuple(results))


def verify_build(
    request: BuildRequest,
    wheels_dir: Path,
    *,
    keep: Path | None = None,
    reporter: Reporter = SILENT,
) -> RebuildComparison:
    """Rebuild every component ``wheels_dir/provenance.json`` records and compare sha256s.

    ``request`` carries the manifest, cache and environment; its ``replay`` (or
    ``replayed``) replays the manifest again when the receipt records an engine wheel.
    The rebuild takes the substitutions the receipt records: the toolchain the build used.
    """
    recorded = read_receipt(Path(wheels_dir) / FILENAME)
    manifest = request.manifest
    if recorded.manifest_sha256 != manifest.sha256:
        raise MismatchError(
            f"{manifest.path.name} changed since this build (sha256 {manifest.sha256[:16]}…, "
            f"the receipt records {(recorded.manifest_sha256 or 'no manifest')[:16]}…)",
            where=str(Path(wheels_dir) / FILENAME),
            next="check out the manifest the build used, or rebuild with `tools/replay build`",
        )
    comps = recorded.components
    kernels = tuple(c.name for c in comps if c.kind == "kernel")
    engine = recorded.component("engine")
    epochs = {c.source_date_epoch for c in comps if c.kind == "kernel"}
    _check_recorded(recorded, engine, epochs, Path(wheels_dir) / FILENAME)
    out = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="pinwheel-rebuild-"))
    try:
        rebuild = replace(
            request,
            out_dir=out,
            kernels=kernels,
            all_kernels=False,
            twice=False,
            replay=request.replay if engine is not None else None,
            replayed=request.replayed if engine is not None else None,
            engine_source=request.engine_source if engine is not None else None,
            engine_workdir=_recorded_workdir(request, engine),
            version=engine.get("version") if engine else None,
            engine_epoch=engine.get("source_date_epoch") if engine else None,
            source_date_epoch=epochs.pop() if len(epochs) == 1 else None,
            reuse_from=None,  # verify-build always rebuilds every member from source
            # the recorded substitutions: the rebuild uses the toolchain the build used
            substitute={s.key: s.used for s in from_receipt(recorded)},
        )
        build(rebuild, reporter)
        return compare_builds(Path(wheels_dir), out)
    finally:
        if not keep:
            remove_tree(out, ignore_errors=True)


def _check_recorded(
    recorded: Mapping[str, Any], engine: Mapping[str, Any] | None, epochs: set[Any], where: Path
) -> None:
    """Receipt values that reach the rebuild (version, dates, names) are validated first."""
    problems = []
    tree = ((engine or {}).get("source") or {}).get("tree")
    if tree is not None and validate.sha_problem(tree):
        problems.append(f"engine source tree {str(tree)[:80]!r} (not a git tree id)")
    if engine is not None and engine.get("version") is not None:
        if validate.version_problem(engine.get("version")):
            problems.append(f"engine version {str(engine.get('version'))[:80]!r}")
        if not isinstance(engine.get("source_date_epoch"), (int, type(None))):
            problems.append("engine source_date_epoch")
    if any(not isinstance(e, (int, type(None))) for e in epochs):
        problems.append("a kernel's source_date_epoch")
    for c in recorded.get("components") or []:
        if not isinstance(c, dict) or validate.identifier_problem(c.get("name")):
            shown = str(c.get("name") if isinstance(c, dict) else c)[:80]
            problems.append(f"component name {shown!r}")
    if problems:
        raise VerifyError(
            "the receipt holds values a rebuild cannot take: " + ", ".join(problems),
            where=str(where),
            next="verify a receipt pinwheel wrote",
        )


def _recorded_workdir(request: BuildRequest, engine: Mapping[str, Any] | None) -> Path | None:
    """The engine's workspace for the rebuild: the default one (one per manifest, at the
    canonical path whatever the cache), wiped first because verify-build is cold."""
    return None

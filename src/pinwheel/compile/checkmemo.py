"""The check and the platform tag of a wheel already checked: looked up, not redone.

:func:`pinwheel.wheels.wheelset.publish` runs, for every wheel, auditwheel's policy
analysis (:func:`pinwheel.wheels.platformtag.decide`, which unpacks the wheel), a
retagged copy, and :func:`pinwheel.wheels.check.check_wheels` (ELF, fatbins,
cuobjdump, ``auditwheel show``). For bytes that were already tagged and checked
under the same rules that work gives the same answer, so :class:`Memo` keeps it:

- the tag, keyed by the sha256 of the wheel the builder made (obtained from its
  :mod:`stamp <pinwheel.compile.stamps>` when it still holds, else by hashing): the
  decision and the retagged copy, reused when that copy's own stamp still holds;
- the check report of a set, keyed by every wheel's sha256 and name, the wheels
  beside them, the check spec, the tools (path and file identity) and the source of
  pinwheel's wheel rules (a changed rule checks again).

Memo files live in the cache; one that is malformed, too large or not a regular file
is a miss (the work is done again), never an error and never trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import confine, untrusted
from pinwheel.compile import derivation, objstore, stamps
from pinwheel.compile.phases import Note
from pinwheel.errors import PinwheelError
from pinwheel.wheels import check as wheelcheck
from pinwheel.wheels import platformtag
from pinwheel.wheels.check import CheckReport, CheckSpec
from pinwheel.wheels.platformtag import TagDecision
from pinwheel.wheels.wheelset import Built

FORMAT = 1
KIND = untrusted.Kind(
    "check memo", 64 * untrusted.MiB, 64, PinwheelError,
    "nothing to do: the wheel is checked again",
)  # fmt: skip


def _rules_digest() -> str:
    """The source of pinwheel's wheel rules (pinwheel/wheels/*.py): a new rule is a miss."""
    digest = hashlib.sha256()
    for path in sorted(Path(wheelcheck.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _tool_identity(tool: str | None) -> list[Any] | None:
    if not tool:
        return None
    try:
        st = os.stat(tool)
    except OSError:
        return [tool, None]
    return [tool, os.path.realpath(tool), st.st_size, st.st_mtime_ns, st.st_ino]


@dataclass(frozen=True)
class _Asked:
    """One call of the checker: what its keys are made of."""

    paths: tuple[Path, ...]
    spec: CheckSpec
    alongside: tuple[Path, ...]
    has_engine: bool | None


class Memo:
    """Tag and check memos under ``root``; each lookup says, in ``note``, what it skipped."""

    def __init__(
        self,
        root: Path,
        note: Note | None = None,
        *,
        scope: Path | None = None,
        store: objstore.Store | None = None,
    ) -> None:
        """``scope``: the folder the confined walk starts from (the cache, for the cache's
        ``memo/``): every folder from there down to a memo file is opened ``O_NOFOLLOW``,
        so ``memo`` itself replaced by a link is never gone through. None: ``root``.
        ``store``: the object store the build took its wheels from: a tag or a passing
        check this cache has not made is taken from there (signed; the tagged copy's
        sha256 checked, the report naming the same wheels), and one made here is stored
        there, so both travel with the stored wheel."""
        self.root = Path(root)
        self.scope = Path(scope) if scope is not None else self.root
        self.note = note or Note()
        self.store = store
        self._rules: str | None = None

    # ------------------------------------------------------------------ storage

    def _rel(self, path: Path) -> str:
        return Path(path).relative_to(self.scope).as_posix()

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:  # bounded, a regular file, no link followed from the scope down
            raw = untrusted.parse_json(
                untrusted.read_beneath(self.scope, self._rel(path), KIND), KIND, str(path)
            )
        except PinwheelError:
            return None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            return None
        return raw

    def _write(self, path: Path, payload: dict[str, Any]) -> None:
        text = json.dumps({"format": FORMAT, **payload}, sort_keys=True)
        try:  # every folder from the scope down opened O_NOFOLLOW
            confine.write_beneath(self.scope, self._rel(path), text.encode())
        except confine.Escape:  # a memo only saves time: without it the work is done again
            return

    # ------------------------------------------------------------------ digests

    def sha(self, path: Path) -> stamps.Digest:
        """``path``'s sha256 by the stamp recorded for it (under the memo root, by its
        absolute path: nothing is written beside a published wheel) when it holds, else
        hashed (and the fresh stamp recorded for next time)."""
        where = hashlib.sha256(os.fsencode(Path(path).absolute())).hexdigest()
        side = self.root / "stamp" / f"{where}.json"
        old = stamps.Stamp.from_json((self._read(side) or {}).get("stamp"))
        got = stamps.sha256_of(path, old)
        if got.stamp is not None and not got.by_stamp:
            self._write(side, {"stamp": got.stamp.to_json()})
        return got

    # ------------------------------------------------------------------ member digests

    def members(self, wheel: Path, sha256: str) -> dict[str, str]:
        """:func:`pinwheel.wheels.provenance.member_digests` of ``wheel`` (whose bytes have
        ``sha256``), looked up by that sha256 first: a no-change build of the engine read
        and hashed every member of its 55 MB wheel again."""
        from pinwheel import validate
        from pinwheel.wheels.provenance import member_digests

        path = self.root / "members" / f"{sha256}.json" if validate.is_sha256(sha256) else None
        memo = self._read(path) if path is not None else None
        got = memo.get("members") if memo is not None else None
        if (
            isinstance(got, dict) and got
            and all(isinstance(k, str) and validate.is_sha256(v) for k, v in got.items())
        ):  # fmt: skip
            self.note.skip(f"member digests of {wheel.name}: its sha256 was listed before")
            return dict(got)
        digests = member_digests(wheel)
        if path is not None:
            self._write(path, {"members": digests})
        return digests

    # ------------------------------------------------------------------ tagging

    def tagged(self, built: Sequence[Built]) -> tuple[list[Built], dict[str, TagDecision]]:
        """:func:`pinwheel.wheels.wheelset._tagged`, each wheel looked up first."""
        out: list[Built] = []
        tags: dict[str, TagDecision] = {}
        for b in built:
            wheel, decision = self._tag_one(b.wheel)
            tags[wheel.name] = decision
            out.append(dataclasses.replace(b, wheel=wheel))
        return out, tags

    def _tag_one(self, wheel: Path) -> tuple[Path, TagDecision]:
        got = self.sha(wheel)
        if got.sha256 is None:  # not a regular file: the tag step reports it as it always did
            return self._tag_fresh(wheel, None)
        memo = self._read(self.root / "tag" / f"{got.sha256}.json")
        if memo is not None:
            try:
                decision = untrusted.decode(TagDecision, memo["decision"], KIND, "tag memo")
                name, want = str(memo["out"]), memo["out_sha256"]
            except (PinwheelError, KeyError, TypeError):
                decision = None
            if decision is not None and Path(name).name == name and name.endswith(".whl"):
                out = wheel.parent / name
                copy = self.sha(out) if out != wheel else got
                if copy.sha256 is not None and copy.sha256 == want:
                    self.note.skip(
                        f"tag of {wheel.name}: its sha256 ({got.how}) was tagged "
                        f"{decision.platform} before; the tagged copy is intact ({copy.how})"
                    )
                    return out, decision
        stored = self._stored_tag(wheel, got.sha256)
        return stored if stored is not None else self._tag_fresh(wheel, got.sha256)

    def _stored_tag(self, wheel: Path, sha: str) -> tuple[Path, TagDecision] | None:
        """The tag the object store holds for these bytes, recorded here as if made here."""
        if self.store is None:
            return None
        got = self.store.take_tag(wheel, sha)
        if isinstance(got, objstore.Miss):
            if got.why != "miss":  # not a plain "none stored": say why it was not taken
                self.note.skip(f"tag of {wheel.name} from the object store: {got.why}")
            return None
        out, raw = got
        try:
            decision = untrusted.decode(TagDecision, raw, KIND, "stored tag")
        except PinwheelError:
            if out != wheel:
                out.unlink(missing_ok=True)
            self.note.skip(f"tag of {wheel.name} from the object store: an unusable decision")
            return None
        if decision.wheel != wheel.name:
            if out != wheel:
                out.unlink(missing_ok=True)
            self.note.skip(f"tag of {wheel.name} from the object store: another wheel's")
            return None
        out_sha = self.sha(out).sha256
        if out_sha is not None:
            self._write(
                self.root / "tag" / f"{sha}.json",
                {"decision": dataclasses.asdict(decision), "out": out.name, "out_sha256": out_sha},
            )
        self.note.skip(
            f"tag of {wheel.name}: taken with the wheel from the object store "
            f"({decision.platform}; signed, the tagged copy's sha256 checked)"
        )
        return out, decision

    def _tag_fresh(self, wheel: Path, sha: str | None) -> tuple[Path, TagDecision]:
        decision = platformtag.decide(wheel)
        out = wheel
        if decision.manylinux:
            out = platformtag.retag(wheel, decision.platform, wheel.parent)
        self.note.did(f"tagged {wheel.name}: {decision.platform} (auditwheel)")
        out_sha = self.sha(out).sha256 if sha is not None else None
        if sha is not None and out_sha is not None:
            record = dataclasses.asdict(decision)
            self._write(
                self.root / "tag" / f"{sha}.json",
                {"decision": record, "out": out.name, "out_sha256": out_sha},
            )
            if self.store is not None:
                self.note.did(f"{wheel.name}: " + self.store.put_tag(wheel, sha, record, out,
                                                                     out_sha))  # fmt: skip
        return out, decision

    # ------------------------------------------------------------------ checking

    def checker(self) -> Callable[..., CheckReport]:
        """A drop-in for :func:`pinwheel.wheels.check.check_wheels` that looks up first."""

        def check(
            paths: Sequence[Path],
            spec: CheckSpec,
            *,
            alongside: Sequence[Path] = (),
            has_engine: bool | None = None,
        ) -> CheckReport:
            asked = _Asked(tuple(paths), spec, tuple(alongside), has_engine)
            key = self._check_key(asked)
            memo_path = self.root / "check" / f"{key}.json" if key else None
            if memo_path is not None and (memo := self._read(memo_path)) is not None:
                try:
                    report = untrusted.decode(CheckReport, memo["report"], KIND, "check memo")
                except (PinwheelError, KeyError):
                    report = None
                names = [Path(p).name for p in paths]
                if report is not None and [w.wheel for w in report.wheels] == names:
                    self.note.skip(
                        f"check of {', '.join(names)}: the same bytes (sha256) were checked "
                        "by the same rules and tools before"
                    )
                    wheels = tuple(
                        dataclasses.replace(w, path=str(p))
                        for w, p in zip(report.wheels, paths, strict=True)
                    )
                    return dataclasses.replace(report, wheels=wheels)
            shared = self._shared_key(asked)
            stored = self._stored_check(shared, paths)
            if stored is not None:
                if memo_path is not None:
                    self._write(memo_path, {"report": dataclasses.asdict(stored)})
                return stored
            report = wheelcheck.check_wheels(
                paths, spec, alongside=alongside, has_engine=has_engine
            )
            self.note.did(f"checked {len(paths)} wheel(s)")
            if memo_path is not None and report.ok:
                self._write(memo_path, {"report": dataclasses.asdict(report)})
            if self.store is not None and shared is not None and report.ok:
                self.note.did(self.store.put_check(shared, dataclasses.asdict(report)))
            return report

        return check

    def _stored_check(self, shared: str | None, paths: Sequence[Path]) -> CheckReport | None:
        """The passing report the object store holds for these wheels (signed, decoded,
        naming the same wheels), with this runner's paths; None when there is none."""
        if self.store is None or shared is None:
            return None
        got = self.store.take_check(shared)
        if isinstance(got, objstore.Miss):
            if got.why != "miss":
                self.note.skip(f"check from the object store: {got.why}")
            return None
        try:
            report = untrusted.decode(CheckReport, got, KIND, "stored check")
        except PinwheelError:
            self.note.skip("check from the object store: an unusable report")
            return None
        names = [Path(p).name for p in paths]
        if not report.ok or [w.wheel for w in report.wheels] != names:
            self.note.skip("check from the object store: a report of other wheels")
            return None
        self.note.skip(
            f"check of {', '.join(names)}: taken with the wheels from the object store "
            "(signed; the same bytes checked by the same rules and tools, by content)"
        )
        wheels = tuple(
            dataclasses.replace(w, path=str(p)) for w, p in zip(report.wheels, paths, strict=True)
        )
        return dataclasses.replace(report, wheels=wheels)

    def _shared_key(self, asked: _Asked) -> str | None:
        """The check's key across runners: :meth:`_check_key`'s facts with each tool known
        by its content (cuobjdump's sha256; auditwheel's installed version, when it is the
        one beside this Python) instead of its path and inode, which a restored toolkit or
        venv does not keep, and the cache's path as ``<cache>``. None (no sharing) for a
        tool known only by its path."""
        if self.store is None:
            return None
        spec = asked.spec
        tools = []
        for tool, kind in ((spec.cuobjdump, "cuobjdump"), (spec.auditwheel, "auditwheel")):
            ident = self._tool_content(tool, kind)
            if tool and ident is None:
                return None
            tools.append(ident)
        # The cache's own path is this runner's: a report that found no RPATH into the
        # storing runner's cache holds for bytes built there, wherever this cache lies.
        dirs = tuple("<cache>" if d == str(self.scope) else d for d in spec.build_dirs)
        bare = repr(dataclasses.replace(spec, cuobjdump=None, auditwheel=None, build_dirs=dirs))
        return self._facts_key(asked, bare, tools)

    def _tool_content(self, tool: str | None, kind: str) -> list[Any] | None:
        if not tool:
            return None
        if kind == "auditwheel":
            import importlib.metadata
            import sys

            if Path(tool).parent != Path(sys.executable).parent:
                return None
            try:
                return [kind, importlib.metadata.version("auditwheel")]
            except importlib.metadata.PackageNotFoundError:
                return None
        sha = self.sha(Path(os.path.realpath(tool))).sha256
        return [kind, sha] if sha is not None else None

    def _check_key(self, asked: _Asked) -> str | None:
        """This cache's key of a check: the facts, with each tool by path and inode."""
        spec = asked.spec
        tools = [_tool_identity(spec.cuobjdump), _tool_identity(spec.auditwheel)]
        return self._facts_key(asked, repr(spec), tools)

    def _facts_key(self, asked: _Asked, spec: str, tools: list[Any]) -> str | None:
        paths = asked.paths
        wheels = []
        for p in [*paths, *asked.alongside]:
            sha = self.sha(Path(p)).sha256
            if sha is None:
                return None  # let the check itself say what is wrong with it
            wheels.append([Path(p).name, sha])
        if self._rules is None:
            self._rules = _rules_digest()
        facts = {
            "wheels": wheels[: len(paths)],
            "alongside": wheels[len(paths) :],
            "has_engine": asked.has_engine,
            "spec": spec,
            "tools": tools,
            "rules": self._rules,
        }
        return derivation.digest(facts)


__all__ = ["Memo"]

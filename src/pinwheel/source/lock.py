"""``pinwheel lock``: pin everything the manifest leaves loose, rewriting it in place.

Resolves short SHAs, missing PR heads and pick commit lists, re-pins patch
checksums and writes the replayed ``[result].tree``, for the engine and for
every component (``[[kernel]]`` with ``url``: its ``commit``, ``[[kernel.step]]``
heads and commits, and its ``tree``; an unpinned component gets its branch tip).
Comments and layout survive (tomlkit). The file is replaced only after the new
manifest replayed cleanly.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomlkit

from pinwheel.checksums import sha256_file
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_write_bytes
from pinwheel.manifest import FULL_SHA, Manifest, load, loads
from pinwheel.manifest.component import ENGINE, component_manifest
from pinwheel.source.buildpins import pin
from pinwheel.source.buildsources import NO, Declared, discover
from pinwheel.source.cache import Cache
from pinwheel.source.libgit2 import pygit2
from pinwheel.source.picks import pick_commits
from pinwheel.source.replay import Replayer, check_result_tree, fetch_for, write_result_refs


@dataclass(frozen=True)
class LockChange:
    where: str
    old: Any
    new: Any


@dataclass(frozen=True)
class LockOutcome:
    path: Path
    changes: tuple[LockChange, ...]
    head: str  # of the first stack (the engine, when the manifest has one)
    tree: str
    stacks: tuple[StackLock, ...] = ()


def _full(repo: pygit2.Repository, value: str, where: str) -> str:
    if FULL_SHA.fullmatch(value):
        return value
    try:
        return str(repo.revparse_single(value).peel(pygit2.Commit).id)
    except (KeyError, ValueError):
        raise PinwheelError(
            f"cannot resolve {value!r} to one commit (unknown or ambiguous)",
            where=where,
            next="give a longer SHA",
        ) from None


def _pin_build_sources(
    doc: Any, loose: Any, declared: tuple[Declared, ...], cache: Cache, changes: list[LockChange]
) -> None:
    """Add a ``[[build.source]]`` for every used (or maybe used) declaration the manifest
    does not pin yet; existing tables (pins, omissions) are left as written."""
    have = {s.name for s in loose.build.sources}
    build = doc["build"]
    for d in declared:
        if d.used == NO or d.name in have:
            continue
        try:
            p = pin(d, cache)
        except PinwheelError as exc:
            raise PinwheelError(
                f"cannot pin build source {d.name} ({d.url} @ {d.ref}): {exc.what}",
                where=d.where,
                next=f"fetch it into a mirror and pass --mirror {d.url}=PATH, or add "
                f'[[build.source]] name = "{d.name}" omit = true reason = "..."',
            ) from None
        table = tomlkit.table()
        table["name"] = p.name
        table["url"] = p.url
        if p.ref:
            table["ref"] = p.ref
        table["commit"] = p.commit
        if p.variables:
            table["variables"] = list(p.variables)
        if p.patches:
            table["patches"] = list(p.patches)
        table["used"] = p.used
        if p.submodules:
            subs = tomlkit.aot()
            for path, url, commit in p.submodules:
                sub = tomlkit.table()
                sub.update({"path": path, "url": url, "commit": commit})
                subs.append(sub)
            table["submodule"] = subs
        if "source" not in build:
            build["source"] = tomlkit.aot()
        build["source"].append(table)
        changes.append(LockChange(f"[[build.source]] {p.name}", d.ref, p.commit))


# fsutil.atomic_write_bytes stages ".<name>.<random>.tmp" beside the target; one older
# than this was left by a killed run (a live write takes milliseconds).
STALE_TMP_S = 60


@dataclass(frozen=True)
class ManifestFile:
    """How the manifest is stored, so the rewrite keeps it: target, mode, newlines, BOM."""

    target: Path  # the file itself; a symlink is written through, never replaced
    mode: int
    crlf: bool
    bom: bool
    text: str  # LF newlines, no BOM: what tomlkit edits

    @classmethod
    def read(cls, path: Path) -> ManifestFile:
        target = Path(path).resolve()
        raw = target.read_bytes()
        bom = raw.startswith(b"\xef\xbb\xbf")
        text = raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
        return cls(
            target=target,
            mode=target.stat().st_mode & 0o7777,
            crlf=b"\r\n" in raw,
            bom=bom,
            text=text.replace("\r\n", "\n"),
        )

    def encode(self, text: str) -> bytes:
        if self.crlf:
            text = text.replace("\r\n", "\n").replace("\n", "\r\n")
        return (b"\xef\xbb\xbf" if self.bom else b"") + text.encode("utf-8")

    def write(self, text: str) -> None:
        atomic_write_bytes(self.target, self.encode(text), mode=self.mode)


def remove_stale_temps(target: Path, *, now: float | None = None) -> list[Path]:
    """Temp files an interrupted lock left beside ``target`` (``.<name>.*.tmp``)."""
    removed = []
    cutoff = (now or time.time()) - STALE_TMP_S
    for tmp in target.parent.glob(f".{target.name}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if tmp.is_file() and tmp.stat().st_mtime < cutoff:
                tmp.unlink()
                removed.append(tmp)
    return removed


@dataclass(frozen=True)
class StackLock:
    """What ``lock`` pinned for one stack (the engine or a component)."""

    name: str
    head: str
    tree: str


@dataclass
class _Target:
    """One stack and the TOML tables ``lock`` rewrites for it."""

    name: str
    loose: Manifest  # lock-mode view: short SHAs, missing heads, maybe no commit
    prefix: str  # for change labels: "" (engine) or "[[kernel]] NAME "
    base_table: Any  # holds 'commit': [upstream] or the [[kernel]] table
    step_tables: list[Any]  # [[step]], [[kernel.step]] or [[kernel.patch]]
    tree_table: Callable[[], Any]  # holds 'tree': [result] or the [[kernel]] table
    kernel_index: int | None
    unpinned: bool = False  # a component without 'commit': pin the branch tip


def _const(value: Any) -> Callable[[], Any]:
    return lambda: value


def _targets(loose: Manifest, doc: Any, names: tuple[str, ...]) -> list[_Target]:
    targets: list[_Target] = []
    if loose.has_engine:

        def result_table() -> Any:
            if "result" not in doc:
                doc["result"] = tomlkit.table()
            return doc["result"]

        targets.append(
            _Target(ENGINE, loose, "", doc["upstream"], list(doc.get("step", [])), result_table,
                    None)
        )  # fmt: skip
    for spec in loose.kernels:
        if not spec.url:
            continue
        kt = doc["kernel"][spec.index]
        steps = list(kt.get("step", kt.get("patch", [])))
        unpinned = not spec.commit
        sub = component_manifest(spec, commit=None if spec.commit else "0" * 40)
        targets.append(
            _Target(spec.name, sub, f"[[kernel]] {spec.name} ", kt, steps, _const(kt),
                    spec.index, unpinned)
        )  # fmt: skip
    if names:
        known = {t.name for t in targets}
        missing = [n for n in names if n not in known]
        if missing:
            raise PinwheelError(
                f"no stack named {', '.join(missing)} (known: {', '.join(sorted(known))})",
                where="pinwheel lock --component",
                next="name the engine as 'engine', a component by its [[kernel]] name",
            )
        targets = [t for t in targets if t.name in names]
    return targets


def _pin(
    target: _Target,
    cache: Cache,
    setv: Callable[[Any, str, Any, str], None],
    *,
    update_base: bool,
    update_heads: bool,
) -> None:
    """Resolve the base, heads, pick commits and patch checksums of one stack, in the doc."""
    loose = target.loose
    p = target.prefix
    where = "[upstream] commit" if not p else f"{p}commit"
    # Every full SHA the manifest already pins must exist: all missing ones in one error.
    want: dict[str, str] = {}
    if not (update_base or target.unpinned) and FULL_SHA.fullmatch(loose.upstream.commit):
        want[loose.upstream.commit] = loose.base_where
    for step in loose.steps:
        if step.head and FULL_SHA.fullmatch(step.head) and not update_heads:
            want.setdefault(step.head, f"{step.where} head")
    fetched = cache.fetch(
        loose.upstream.url, loose.upstream.branch, loose.prs, want, where=loose.stack_where
    )
    repo = fetched.open()
    base = (
        fetched.branch_tip
        if update_base or target.unpinned
        else _full(repo, loose.upstream.commit, loose.base_where)
    )
    setv(target.base_table, "commit", base, where)
    for step, table in zip(loose.steps, target.step_tables, strict=True):
        label = f"{p}{step.label}"
        if step.action == "patch":
            assert step.patch is not None  # the manifest model requires it for patch steps
            setv(table, "sha256", sha256_file(step.patch), f"{label} sha256")
        else:
            assert step.pr is not None
            current = fetched.pr_heads.get(step.pr)
            head = step.head
            if head is not None:
                head = _full(repo, head, f"{step.where} head")
            if head is None or (update_heads and current):
                if current is None:
                    raise PinwheelError(
                        f"PR #{step.pr} has no head upstream",
                        where=step.where,
                        next=f"check PR #{step.pr} upstream, or remove the step",
                    )
                head = current
            setv(table, "head", head, f"{label} head")
            if step.action == "pick":
                probe = replace(step, head=head, commits=None)
                shas = [str(c.id) for c in pick_commits(repo, probe, base, fetched.branch_tip)]
                if list(table.get("commits", [])) != shas:
                    arr = tomlkit.array()
                    arr.extend(shas)
                    arr.multiline(True)
                    setv(table, "commits", arr, f"{label} commits")
        for r_table, res in zip(table.get("resolve", []), step.resolutions, strict=True):
            setv(r_table, "sha256", sha256_file(res.patch), f"{label} resolve {res.commit[:12]}")


def _locked_stack(final: Manifest, target: _Target) -> Manifest:
    if target.kernel_index is None:
        return final
    spec = next(k for k in final.kernels if k.index == target.kernel_index)
    return component_manifest(spec)


def lock_manifest(
    manifest_path: Path,
    cache: Cache,
    *,
    update_base: bool = False,
    update_heads: bool = False,
    components: tuple[str, ...] = (),
) -> LockOutcome:
    """Pin every stack (the engine, then each component) and the engine's build sources,
    replay each stack, then write the file (line endings, BOM, mode and symlink kept)."""
    loose = load(manifest_path, allow_short=True)
    stored = ManifestFile.read(Path(manifest_path))
    remove_stale_temps(stored.target)
    doc = tomlkit.parse(stored.text)
    changes: list[LockChange] = []

    def setv(table: Any, key: str, value: Any, where: str) -> None:
        old = table.get(key)
        if old != value:
            table[key] = value
            changes.append(LockChange(where, old, value))

    targets = _targets(loose, doc, components)
    for target in targets:
        with cache.locked(target.loose.upstream.url):
            _pin(target, cache, setv, update_base=update_base, update_heads=update_heads)

    # Replay each locked stack before writing anything.
    path = Path(manifest_path).absolute()
    locked = loads(tomlkit.dumps(doc).encode(), path)
    results = []
    for target in targets:
        stack = _locked_stack(locked, target)
        with cache.locked(stack.upstream.url):
            result = Replayer(stack, fetch_for(stack, cache)).run()
        tree_label = "[result] tree" if not target.prefix else f"{target.prefix}tree"
        setv(target.tree_table(), "tree", result.tree, tree_label)
        results.append((target, result))
        if target.name == ENGINE and loose.build is not None:
            repo = pygit2.Repository(str(result.repo_path))
            declared = discover(repo, result.tree, loose.build.arches, loose.build.cuda)
            _pin_build_sources(doc, loose, declared, cache, changes)
    text = tomlkit.dumps(doc)
    final = loads(text.encode(), path)
    stacks: list[StackLock] = []
    for target, result in results:
        # The result as the locked manifest describes it (now with its tree).
        locked_result = replace(result, manifest=_locked_stack(final, target))
        check_result_tree(locked_result)
        with cache.locked(result.manifest.upstream.url):
            # Only the stack ref: the release tag is made by `pinwheel run` on the locked file.
            write_result_refs(locked_result, tag=False)
        stacks.append(StackLock(target.name, result.head, result.tree))
    stored.write(text)
    first = stacks[0] if stacks else StackLock("", "", "")
    return LockOutcome(Path(manifest_path), tuple(changes), first.head, first.tree, tuple(stacks))

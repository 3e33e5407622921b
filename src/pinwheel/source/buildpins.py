"""The build sources a tree declares, pinned and planned: ``lock`` resolves each
declaration (:mod:`pinwheel.source.buildsources` finds them) to a commit with its
submodules (:func:`pin`); ``plan`` says which are pinned, used and drifting
(:func:`plan_sources`, :func:`drift_lines`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pinwheel import validate
from pinwheel.errors import PinwheelError
from pinwheel.manifest import Manifest
from pinwheel.manifest.build import BuildSource
from pinwheel.source.buildsources import NO, Declared, discover
from pinwheel.source.cache import Cache
from pinwheel.source.libgit2 import pygit2
from pinwheel.urls import redact


@dataclass(frozen=True)
class Pin:
    """What ``lock`` writes as one ``[[build.source]]`` table."""

    name: str
    url: str
    ref: str | None
    commit: str
    variables: tuple[str, ...]
    patches: tuple[str, ...]
    submodules: tuple[tuple[str, str, str], ...]  # (path, url, commit)
    used: str


def pin(declared: Declared, cache: Cache) -> Pin:
    """Resolve a declaration's ref to a commit (through the cache and its mirrors), with the
    submodules it asks for at the commits its tree gitlinks."""
    if declared.url is None:
        raise PinwheelError(
            f"build source {declared.name} names no URL",
            where=declared.where,
            next="pin it by hand in a [[build.source]] table, or omit it with a reason",
        )
    # The declaration comes from the replayed tree (a repository's CMake): validated like a
    # manifest value before git sees it.
    _refuse(
        declared.name, "URL", declared.url, validate.git_url_problem(declared.url), declared.where
    )
    if declared.ref is not None:
        _refuse(
            declared.name, "ref", declared.ref, validate.ref_problem(declared.ref), declared.where
        )
    commit = cache.resolve_ref(declared.url, declared.ref or "HEAD")
    with cache.locked(declared.url):
        repo_path = cache.ensure_commits(declared.url, [commit])
    repo = pygit2.Repository(str(repo_path))
    subs = _submodules(repo, commit, declared.submodules, declared.name)
    return Pin(
        name=declared.name,
        url=declared.url,
        ref=declared.ref,
        commit=commit,
        variables=declared.variables,
        patches=declared.patches,
        submodules=subs,
        used=declared.used,
    )


def _refuse(name: str, what: str, value: object, problem: str | None, where: str) -> None:
    if problem is None:
        return
    raise PinwheelError(
        f"build source {name}: refusing {what} {redact(str(value))!r}: {problem}",
        where=where,
        next="pin the source by hand in [[build.source]] with a safe URL, or omit it with a reason",
    )


def _submodules(
    repo: pygit2.Repository, commit: str, wanted: Sequence[str], name: str
) -> tuple[tuple[str, str, str], ...]:
    tree = repo[commit].peel(pygit2.Tree)
    urls: dict[str, str] = {}
    if ".gitmodules" in tree:
        blob = repo[tree[".gitmodules"].id]
        assert isinstance(blob, pygit2.Blob)
        text = blob.data.decode(errors="replace")
        current = None
        for line in text.splitlines():
            line = line.strip()
            if m := re.fullmatch(r"path\s*=\s*(.+)", line):
                current = m.group(1).strip()
            elif (m := re.fullmatch(r"url\s*=\s*(.+)", line)) and current:
                urls[current] = m.group(1).strip()
    paths = list(wanted) or list(urls)
    out = []
    for path in paths:
        try:
            entry = tree[path]
        except KeyError:
            raise PinwheelError(
                f"build source {name} has no submodule at {path} in {commit[:12]}",
                where=f"GIT_SUBMODULES of {name}",
                next="check the declaration's GIT_SUBMODULES",
            ) from None
        if entry.filemode != pygit2.enums.FileMode.COMMIT or path not in urls:
            continue
        url = urls[path]
        where = f"{name} .gitmodules"
        _refuse(name, f"submodule {path!r} path", path, validate.rel_path_problem(path), where)
        if url.startswith("../"):
            raise PinwheelError(
                f"submodule {path} of {name} has a relative URL {url!r}",
                where=f"{name} .gitmodules",
                next="pin it by hand in [[build.source.submodule]]",
            )
        _refuse(name, f"submodule {path} URL", url, validate.git_url_problem(url), where)
        out.append((path, url, str(entry.id)))
    return tuple(out)


def status(declared: Declared, pinned: Mapping[str, BuildSource]) -> str:
    """How the manifest covers one declaration."""
    have = pinned.get(declared.name)
    if have is not None and have.omit:
        return f"omitted ({have.reason})"
    if have is not None:
        return f"pinned {have.commit[:12] if have.commit else '?'}"
    if declared.used == NO:
        return "not used"
    return "pinned by the tree (not in manifest)" if declared.pinned else "UNPINNED"


@dataclass(frozen=True)
class SourcesPlan:
    tree: str
    judged_on: str  # "replayed tree" or why the base was used instead
    arches: tuple[str, ...]
    declared: tuple[Declared, ...]
    pinned: Mapping[str, BuildSource]

    def to_json(self) -> dict[str, object]:
        return {
            "tree": self.tree,
            "judged_on": self.judged_on,
            "arches": list(self.arches),
            "sources": [{**d.to_json(), "status": status(d, self.pinned)} for d in self.declared],
        }

    def human_lines(self) -> list[str]:
        lines = [
            f"build-time sources declared by tree {self.tree[:12]} ({self.judged_on}), "
            f"for arches {', '.join(self.arches)}:"
        ]
        for d in self.declared:
            what = f"{d.url or '(override only)'} @ {d.ref or d.url_hash or '?'}"
            over = f"; override {', '.join(d.variables)}" if d.variables else ""
            lines.append(
                f"  {d.name}: {what}; used: {d.used}; {status(d, self.pinned)}{over} ({d.where})"
            )
        loose = [
            d.name for d in self.declared if d.used != NO and not d.pinned and d.name not in
            self.pinned
        ]  # fmt: skip
        if loose:
            lines.append(f"  ! unpinned: {', '.join(loose)}: run `pinwheel lock` to pin them")
        return lines


def drift_lines(
    declared: Sequence[Declared], pinned: Sequence[BuildSource], cache: Cache
) -> list[dict[str, object]]:
    """Per pinned source: does the declaration still say the same, does its ref still point
    at the pinned commit?"""
    by_name = {d.name: d for d in declared}
    out: list[dict[str, object]] = []
    for src in pinned:
        row: dict[str, object] = {"name": src.name, "commit": src.commit, "ref": src.ref}
        d = by_name.get(src.name)
        if d is None:
            row["state"] = "no longer declared by the tree"
        elif (
            src.url
            and d.url
            and _norm(d.url) != _norm(src.url)
            or (d.ref or None) != (src.ref or None)
        ):
            row["state"] = f"declaration changed: now {d.url} @ {d.ref}"
        elif src.omit:
            row["state"] = "omitted"
        else:
            try:
                now = cache.resolve_ref(src.url or "", src.ref or "HEAD") if src.ref else None
            except PinwheelError as exc:
                row["state"] = f"cannot check: {exc.what}"
                out.append(row)
                continue
            row["ref_now"] = now
            row["state"] = "ok" if now in (None, src.commit) else f"ref moved to {now[:12]}"
        out.append(row)
    return out


def _norm(url: str) -> str:
    return url.rstrip("/").removesuffix(".git").lower()


def plan_sources(manifest: Manifest, cache: Cache) -> SourcesPlan | None:
    """The sources the manifest's replayed tree declares, judged for ``[build]``; None
    without a ``[build]`` table. Falls back to the base tree if the stack does not replay."""
    from pinwheel.source.replay import Replayer, fetch_for

    config = manifest.build
    if config is None:
        return None
    with cache.locked(manifest.upstream.url):
        fetched = fetch_for(manifest, cache)
        repo = fetched.open()
        try:
            tree, judged_on = Replayer(manifest, fetched).run().tree, "replayed tree"
        except PinwheelError as exc:
            tree = str(repo[manifest.upstream.commit].peel(pygit2.Tree).id)
            judged_on = f"base commit: the stack does not replay ({exc.what})"
        declared = discover(repo, tree, config.arches, config.cuda)
    return SourcesPlan(
        tree=tree,
        judged_on=judged_on,
        arches=config.arches,
        declared=declared,
        pinned={s.name: s for s in config.sources},
    )

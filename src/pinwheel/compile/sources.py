"""Build-time sources, supplied offline: ``[[build.source]]`` in, directories + variables out.

An engine's CMake fetches more source at build time (cutlass by a moving tag,
a flash-attention fork, ...). ``lock`` pins each one; here each pinned source
is exported from the cache (with its submodules at their gitlinked commits),
the declaration's patches are applied (an override skips CMake's own
PATCH_COMMAND), and the project is pointed at it through its ``*_SRC_DIR``
variables and ``FETCHCONTENT_SOURCE_DIR_<NAME>``. An omitted source gets a
stand-in directory holding only :data:`OMITTED_MARKER` (CMake refuses an empty
SOURCE_DIR; the marker is no source file any build step picks up) and is listed
as missing. Every export is hashed, so
provenance says exactly what went in.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tarfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel import archive, confine, runner
from pinwheel.checksums import feed, sha256_file
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_dir
from pinwheel.manifest.build import BuildSource
from pinwheel.progress import SILENT, Reporter
from pinwheel.source import gitcli
from pinwheel.source.cache import Cache
from pinwheel.source.export import neutral_attributes

OMITTED_MARKER = "PINWHEEL-OMITTED.txt"


class SourceError(PinwheelError):
    """A build source could not be supplied."""


@dataclass(frozen=True)
class Supplied:
    """One build source as handed to the build."""

    name: str
    path: Path
    url: str | None
    commit: str | None
    ref: str | None
    tree: str | None  # git tree of the commit (before patches)
    sha256: str  # of the exported, patched directory (sorted paths, modes, bytes)
    patches: tuple[tuple[str, str], ...] = ()  # (tree path, sha256)
    submodules: tuple[tuple[str, str, str], ...] = ()  # (path, url, commit)
    excluded: tuple[str, ...] = ()
    omitted: bool = False
    reason: str | None = None
    variables: tuple[str, ...] = field(default=())

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "commit": self.commit,
            "ref": self.ref,
            "tree": self.tree,
            "sha256": self.sha256,
            "patches": [{"path": p, "sha256": d} for p, d in self.patches],
            "submodules": [{"path": p, "url": u, "commit": c} for p, u, c in self.submodules],
            "excluded": list(self.excluded),
            "omitted": self.omitted,
            "reason": self.reason,
            "variables": list(self.variables),
        }


def supply(
    sources: Sequence[BuildSource],
    *,
    project: Path,
    dest: Path,
    cache: Cache,
    reporter: Reporter = SILENT,
) -> tuple[Supplied, ...]:
    """Export every source under ``dest/<name>``; ``project`` is the exported engine tree
    (the patches live there)."""
    out = []
    for src in sources:
        target = dest / src.name
        if src.omit:
            with atomic_dir(target) as tmp:
                (tmp / OMITTED_MARKER).write_text(
                    f"{src.name} was omitted from this build by pinwheel: {src.reason}\n"
                )
            out.append(
                Supplied(
                    name=src.name, path=target, url=src.url, commit=src.commit, ref=src.ref,
                    tree=None, sha256=tree_digest(target), omitted=True, reason=src.reason,
                    variables=_variables(src),
                )
            )  # fmt: skip
            reporter.info(f"build source {src.name}: omitted ({src.reason})")
            continue
        assert src.url is not None and src.commit is not None  # the manifest insists
        with reporter.status(f"exporting build source {src.name} {src.commit[:12]}"):
            out.append(_export(src, target, project, cache))
    return tuple(out)


def _variables(src: BuildSource) -> tuple[str, ...]:
    """The project's own override variables; CMake's generic one when it names none."""
    return src.variables or (src.fetchcontent_var,)


def _export(src: BuildSource, target: Path, project: Path, cache: Cache) -> Supplied:
    assert src.url and src.commit
    with cache.locked(src.url):
        repo = cache.ensure_commits(src.url, [src.commit])
        tree = _tree_of(repo, src.commit)
    subs: list[tuple[str, str, str]] = []
    patches: list[tuple[str, str]] = []
    with atomic_dir(target) as tmp:
        _archive(repo, src.commit, tmp, src.exclude, what=f"build source {src.name}")
        for sub in src.submodules:
            with cache.locked(sub.url):
                sub_repo = cache.ensure_commits(sub.url, [sub.commit])
            # The gitlink exports as an empty directory: emptied and filled by resolved
            # path, never through a link (`up -> a/a/../..`, then path = "up/x").
            confine.resolve(sub.path, confine.disk_readlink(tmp), root=f"build source {src.name}")
            confine.remove_beneath(tmp, sub.path)
            confine.mkdir_beneath(tmp, sub.path)
            where = tmp / sub.path
            _archive(sub_repo, sub.commit, where, sub.exclude, what=f"{src.name}/{sub.path}")
            subs.append((sub.path, sub.url, sub.commit))
        for rel in src.patches:
            patch = project / rel
            if not patch.is_file():
                raise SourceError(
                    f"patch {rel} for build source {src.name} is not in the replayed tree",
                    where=f"[[build.source]] {src.name} patches",
                    next="fix the path (relative to the engine's tree), then `tools/replay build`",
                )
            _apply(patch, tmp, src.name)
            patches.append((rel, sha256_file(patch)))
    return Supplied(
        name=src.name,
        path=target,
        url=src.url,
        commit=src.commit,
        ref=src.ref,
        tree=tree,
        sha256=tree_digest(target),
        patches=tuple(patches),
        submodules=tuple(subs),
        excluded=src.exclude,
        variables=_variables(src),
    )


def _tree_of(repo: Path, commit: str) -> str:
    proc = gitcli.git(["rev-parse", "--verify", "--end-of-options", f"{commit}^{{tree}}"],
                      git_dir=repo, check=False)  # fmt: skip
    return proc.stdout.decode().strip() if proc.returncode == 0 else ""


def _archive(repo: Path, commit: str, dest: Path, exclude: Sequence[str], *, what: str) -> None:
    """``git archive`` of ``commit`` into ``dest``, leaving out ``exclude`` pathspecs."""
    specs = ["--", "."] + [f":(exclude){e}" for e in exclude] if exclude else []
    neutral_attributes(repo)  # exactly the pinned blobs: no in-tree export rules
    proc = gitcli.git(["archive", "--format=tar", commit, *specs], git_dir=repo, check=False)
    if proc.returncode != 0 or not proc.stdout:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        why = ([ln for ln in err if "invalid object" in ln or "missing" in ln] or err or ["?"])[-1]
        raise SourceError(
            f"cannot export {what} at {commit[:12]}: {why}",
            where=f"{what} ({repo.name})",
            next=f"the mirror lacks blobs: add the paths to `exclude` of {what} in "
            "[[build.source]] (or its [[build.source.submodule]]), or point --mirror at a "
            "complete mirror",
        )
    with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:") as tar:
        # The one archive reader: in-tree symlinks kept, anything leading out refused.
        archive.extract_tar(tar, dest, f"{what} ({repo.name})", inner_links=True)


def _apply(patch: Path, root: Path, name: str) -> None:
    """What CMake's PATCH_COMMAND does: GNU patch -p1 (-l: whitespace-tolerant, as upstream)."""
    tool = shutil.which("patch")
    if tool is None:
        raise SourceError(
            "GNU patch is not installed; build source patches need it",
            where=f"[[build.source]] {name}",
            next="install it (Debian: apt-get install patch)",
        )
    proc = runner.run(
        runner.Command(
            (
                tool,
                "--batch",
                "--forward",
                "--no-backup-if-mismatch",
                "-p1",
                "-l",
                "-i",
                str(patch),
            ),
            cwd=root,
            check=False,
        )
    )
    if proc.returncode != 0:
        tail = (proc.text + "\n" + proc.err_text).strip().splitlines()[-5:]
        raise SourceError(
            f"patch {patch.name} does not apply to build source {name}: " + " | ".join(tail),
            where=f"[[build.source]] {name} patches",
            next="re-pin the source's commit with `pinwheel lock` or update the patch",
        )


def tree_digest(root: Path) -> str:
    """sha256 over a directory: every path (sorted), its type, mode bits and bytes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            digest.update(f"L {rel} {os.readlink(path)}\n".encode())
        elif path.is_dir():
            digest.update(f"D {rel}\n".encode())
        else:
            mode = "x" if os.access(path, os.X_OK) else "-"
            digest.update(f"F {rel} {mode} {path.stat().st_size}\n".encode())
            feed(digest, path)
    return digest.hexdigest()


def source_env(supplied: Sequence[Supplied]) -> dict[str, str]:
    """Environment for the build: each project variable (``VLLM_CUTLASS_SRC_DIR``) -> its dir."""
    return {
        var: str(s.path)
        for s in supplied
        for var in s.variables
        if not var.startswith("FETCHCONTENT_SOURCE_DIR_")
    }


def cmake_defines(supplied: Sequence[Supplied]) -> list[str]:
    """``-DFETCHCONTENT_SOURCE_DIR_<NAME>=...`` for CMAKE_ARGS: CMake's generic override."""
    return [
        f"-D{var}={s.path}"
        for s in supplied
        for var in s.variables
        if var.startswith("FETCHCONTENT_SOURCE_DIR_")
    ]


_DISCONNECTED = re.compile(r"requires the source directory for dependency\s+(\S+)", re.I)
_DOWNLOADS = ("Performing download step", "-- Downloading ", "Failed to clone repository")


def undeclared_downloads(log_text: str, supplied: Collection[str]) -> list[str]:
    """Dependencies CMake wanted but nobody supplied, read from the build log.

    Under FETCHCONTENT_FULLY_DISCONNECTED CMake 4.x only warns (CMP0170) and drops
    the dependency's targets; pinwheel turns that warning into a failed build.
    A download attempt (which the network namespace makes fail) is named too.
    """
    names = {s.lower() for s in supplied}
    joined = " ".join(line.strip() for line in log_text.splitlines())
    found = []
    for m in _DISCONNECTED.finditer(joined):
        name = m.group(1).strip("'\".,:()")
        if name.lower() not in names and name not in found:
            found.append(name)
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        if not any(key in line for key in _DOWNLOADS):
            continue
        text = line.strip()
        if text.endswith(":"):  # CMake 4 puts the URL on a line of its own below
            after = next((n.strip() for n in lines[i + 1 : i + 4] if n.strip()), "")
            text = f"{text} {after}".strip()
        if text not in found:
            found.append(text)
    return found


def plan_env(
    supplied: Sequence[Supplied], base_cmake_args: str | None, *, disconnected: bool
) -> Mapping[str, str]:
    """Environment additions: the variables, and CMAKE_ARGS with the generic overrides.

    ``disconnected`` adds FETCHCONTENT_FULLY_DISCONNECTED: only where no network
    namespace is available, since under it CMake skips a missing source silently (3.x)
    or with a warning (4.x); in a namespace an attempted download fails loudly instead.
    """
    env = source_env(supplied)
    args = [base_cmake_args] if base_cmake_args else []
    if disconnected:
        args.append("-DFETCHCONTENT_FULLY_DISCONNECTED=ON")
    args += cmake_defines(supplied)
    if args:
        env["CMAKE_ARGS"] = " ".join(args)
    return env


def unpinned(declared: Sequence[Any], sources: Sequence[BuildSource]) -> list[Any]:
    """Declarations the build may use (``yes``/``unknown``) that ``[[build.source]]`` lacks."""
    have = {s.name.lower() for s in sources}
    return [d for d in declared if d.used != "no" and d.name.lower() not in have]

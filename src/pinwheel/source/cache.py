"""The fetch cache: one bare repository per upstream URL, guarded by a file lock.

Layout: ``<cache>/repos/<slug>.git`` and ``<cache>/locks/<slug>.lock``. Fetched
refs live under ``refs/pinwheel/`` so they never clash with tags the replay
writes. A local mirror (``--mirror URL=PATH``) is attached as an alternate
object store, so fetching from it copies no objects (0.1 s for the 17k-commit
1Cat-vLLM mirror) and a partial (promisor) mirror works: objects it lacks are
only an error if a merge actually needs their content.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pinwheel import cachelayout, confine, locking, validate
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_write_text, remove_tree
from pinwheel.progress import SILENT, Reporter
from pinwheel.source import gitcli, stamp
from pinwheel.urls import redact

if TYPE_CHECKING:  # libgit2 is loaded where it is called (pinwheel.source.libgit2)
    from pinwheel.source.libgit2 import pygit2

LOCK_TIMEOUT_S = 600
UPSTREAM_PREFIX = "refs/pinwheel/upstream/"
PULL_PREFIX = "refs/pinwheel/pull/"


def _normalize(url: str) -> str:
    return url.rstrip("/").removesuffix(".git").lower()


def slug(url: str) -> str:
    # The readable part never carries credentials (https://user:token@host/...).
    readable = _normalize(redact(url)).split("://")[-1].split("@")[-1]
    name = re.sub(r"[^A-Za-z0-9]+", "-", readable).strip("-")
    return f"{name[-60:]}-{hashlib.sha256(_normalize(url).encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Source:
    """Where the objects for ``url`` really come from."""

    url: str
    location: str  # mirror path or the URL itself
    local: bool  # a directory on this machine (no network needed)


def resolve_source(url: str, mirrors: Mapping[str, str]) -> Source:
    wanted = _normalize(url)
    for key, path in mirrors.items():
        if _normalize(key) == wanted:
            location = path.removeprefix("file://")
            if not Path(location).exists():
                raise PinwheelError(
                    f"mirror for {redact(url)} does not exist: {location}",
                    where="--mirror / PINWHEEL_MIRRORS",
                    next="fix the mapping or create the mirror (git clone --mirror URL PATH)",
                )
            return Source(url=url, location=str(Path(location).resolve()), local=True)
    if url.startswith("file://") or Path(url).exists():
        return Source(
            url=url, location=str(Path(url.removeprefix("file://")).resolve()), local=True
        )
    return Source(url=url, location=url, local=False)


def _objects_dir(location: str) -> Path:
    path = Path(location)
    for candidate in (path / "objects", path / ".git" / "objects"):
        if candidate.is_dir():
            return candidate
    kind = "a file" if path.is_file() else "a directory without objects/ or .git/objects/"
    raise PinwheelError(
        f"{location} is not a git repository ({kind})",
        where="--mirror / PINWHEEL_MIRRORS",
        next="point the mapping at a repository (a bare mirror: git clone --mirror URL PATH), "
        "or drop it to fetch from the URL",
    )


@dataclass(frozen=True)
class Fetched:
    """What a fetch left in the cache: the repo and the refs as the source had them."""

    repo_path: Path
    source: Source
    branch: str
    branch_tip: str
    pr_heads: Mapping[int, str]  # PR -> current refs/pull/N/head
    missing_prs: tuple[int, ...] = ()  # PRs without refs/pull/N/head (missing_ok fetches)

    def open(self) -> pygit2.Repository:
        from pinwheel.source.libgit2 import pygit2

        return pygit2.Repository(str(self.repo_path))


@dataclass(frozen=True)
class Refs:
    """What :meth:`Cache.fetch_refs` did: the cache repository, the source, whether it
    could fetch (a mirror, or online) and the PRs the source has no ref for."""

    repo_path: Path
    source: Source
    can_fetch: bool
    missing_prs: tuple[int, ...]


# The cache's marker: a CACHEDIR.TAG (https://bford.info/cachedir/: backup tools skip
# the folder) whose second line names pinwheel. `cache clean` empties only a folder that
# bears it: a mistyped --cache pointing at a home or project folder is refused.
TAG = "CACHEDIR.TAG"
TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by pinwheel (its cache: repos, toolchains,\n"
    "# builds). For information about cache directory tags see https://bford.info/cachedir/\n"
)


def _no_links(root: Path, path: Path) -> None:
    """Refuse a cache repository reached through a link or holding one (``objects ->
    /elsewhere``): git and libgit2 follow links inside a repository, so its objects and
    refs would be written outside the cache. A bare repository pinwheel made holds none;
    its folders are listed without following any. Its ``pinwheel/`` folder (replay
    stamps) is pinwheel's, never git's: its writer walks it ``O_NOFOLLOW`` (a link there:
    no stamp is saved, the replay goes on)."""
    rel = f"repos/{path.name}"
    bad: str | None = None
    try:
        with confine.folder_beneath(root, rel):
            pass
    except (confine.Escape, FileNotFoundError, NotADirectoryError):
        bad = rel
    pending = [path] if bad is None else []
    while pending and bad is None:
        with os.scandir(pending.pop()) as it:
            for entry in it:
                if entry.name == stamp.FOLDER and Path(entry.path).parent == path:
                    continue
                if entry.is_symlink():
                    bad = str(Path(entry.path).relative_to(root))
                    break
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
    if bad is not None:
        raise confine.Escape(
            f"refusing the cache repository {path}: {root / bad} is a symlink (or not a "
            "folder); a cache repository holds no links",
            where=str(root / bad),
            next=f"remove {path} (pinwheel fetches it again) and run again",
        )


def mark(root: Path) -> None:
    """Make ``root`` pinwheel's cache: create it and write its marker (once)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tag = root / TAG
    if not is_marked(root):
        atomic_write_text(tag, TAG_TEXT)


def is_marked(root: Path) -> bool:
    """Whether ``root`` bears pinwheel's cache marker (a regular file, read bounded)."""
    from pinwheel import untrusted

    try:
        data = untrusted.read_regular(Path(root) / TAG, 4096)
    except OSError:
        return False
    return isinstance(data, bytes) and data.startswith(TAG_TEXT.split("\n", 2)[0].encode()) and (
        b"created by pinwheel" in data
    )


class Cache:
    def __init__(
        self,
        root: Path,
        mirrors: Mapping[str, str],
        offline: bool = False,
        reporter: Reporter = SILENT,
    ):
        # Absolute: a cache path never reaches git looking like an option.
        self.root = Path(root).absolute()
        self.mirrors = dict(mirrors)
        self.offline = offline
        # Network fetches of a large upstream take minutes: they are shown as a
        # step through the reporter (local mirrors take 0.1 s).
        self.reporter = reporter

    def repo_path(self, url: str) -> Path:
        return cachelayout.bucket(self.root, "repos") / f"{slug(url)}.git"

    @contextlib.contextmanager
    def locked(self, url: str) -> Iterator[Path]:
        """Hold the cache lock for ``url``: two runs never write one repo at once."""
        lock_path = cachelayout.bucket(self.root, "locks") / f"{slug(url)}.lock"
        mark(self.root)
        confine.mkdir_beneath(self.root, "locks")  # a link planted as locks/ is refused
        with locking.held(
            lock_path,
            timeout_s=LOCK_TIMEOUT_S,
            what="another pinwheel run has held the cache lock",
            next="wait for it to finish, or pass --cache DIR to use a separate cache",
        ):
            path = self._ensure_repo(url)
            _no_links(self.root, path)
            yield path

    def _ensure_repo(self, url: str) -> Path:
        path = self.repo_path(url)
        confine.folder_in_cache(self.root, "repos", what="repositories folder")
        if os.path.lexists(path):
            _no_links(self.root, path)  # before anything is read or written in it
        if not (path / "HEAD").exists():
            tmp = path.with_name(path.name + ".init")
            remove_tree(tmp, ignore_errors=True)  # left by a run that was killed
            try:
                gitcli.git(
                    ["init", "-q", "--bare", "--", str(tmp)], cwd=path.parent, what="git init"
                )
            except BaseException:
                remove_tree(tmp, ignore_errors=True)
                raise
            tmp.rename(path)  # atomic: a half-initialised cache repo never has the final name
        return path

    def fetching(self, url: str, prs: Sequence[int]) -> contextlib.AbstractContextManager[None]:
        """The one line a network fetch shows, closed by its outcome: "done" only when every
        ref and pinned commit arrived (a local mirror takes 0.1 s and shows none). Around
        :meth:`fetch_refs` and the :meth:`fetch` given its answer; :meth:`fetch` alone
        opens its own."""
        source = resolve_source(url, self.mirrors)
        if source.local or self.offline:
            return contextlib.nullcontext()
        return self.reporter.status(
            f"fetching {len(prs) + 1} ref(s) from {redact(source.location)}"
        )

    def fetch_refs(self, url: str, branch: str, prs: Sequence[int]) -> Refs:
        """Fetch ``branch`` and ``refs/pull/N/head`` for ``prs`` (git only, no libgit2).

        The first half of :meth:`fetch`, for a caller that looks at the refs before it
        decides to load libgit2 (a replay recalled from its stamp): pass the answer to
        :meth:`fetch` as ``refs`` and nothing is fetched twice. Call inside :meth:`locked`
        (and :meth:`fetching`).
        """
        path = self.repo_path(url)
        source = resolve_source(url, self.mirrors)
        if source.local:
            self._attach_alternate(path, source)
        can_fetch = source.local or not self.offline
        if not can_fetch:
            return Refs(path, source, can_fetch, ())
        refspecs = [f"+refs/heads/{branch}:{UPSTREAM_PREFIX}{branch}"]
        refspecs += [f"+refs/pull/{n}/head:{PULL_PREFIX}{n}/head" for n in prs]
        missing = self._fetch(path, source, refspecs, prs, missing_ok=True)
        return Refs(path, source, can_fetch, tuple(missing))

    def fetch(
        self,
        url: str,
        branch: str,
        prs: Sequence[int],
        want: Sequence[str] | Mapping[str, str] = (),
        *,
        progress: object = None,
        missing_ok: bool = False,
        where: str | None = None,
        refs: Refs | None = None,
    ) -> Fetched:
        """Fetch ``branch`` and ``refs/pull/N/head`` for ``prs``; make sure ``want`` commits exist.

        ``want`` may map each commit to what names it (``[upstream] commit``, ``step 2
        (PR #7) head``) so an error says which is missing. Call inside :meth:`locked`.
        Everything missing is reported at once: the base, every PR ref and every pinned
        commit, in one error. With ``missing_ok`` a PR without a ref and a ``want``
        commit that cannot be found are reported in the result (``missing_prs``), not
        raised: drift reports every PR. ``where`` names the stack in the manifest
        (``manifest.toml:12: [[kernel]] kern``) for errors about it. ``refs``: what
        :meth:`fetch_refs` already fetched for the same ``url``, ``branch`` and ``prs``.
        """
        from pinwheel.source.libgit2 import pygit2

        labels = dict(want) if isinstance(want, Mapping) else {sha: "" for sha in want}
        step = self.fetching(url, prs) if refs is None else contextlib.nullcontext()
        with step:
            if refs is None:
                refs = self.fetch_refs(url, branch, prs)
            path, source, can_fetch = refs.repo_path, refs.source, refs.can_fetch
            missing_refs = list(refs.missing_prs)
            repo = pygit2.Repository(str(path))
            self._check_fetched(repo, path, source, branch, missing_refs, labels, can_fetch,
                                missing_ok=missing_ok, where=where)  # fmt: skip
        pr_heads = {}
        for n in prs:
            ref = f"{PULL_PREFIX}{n}/head"
            if ref in repo.references and n not in missing_refs:
                pr_heads[n] = str(repo.references[ref].target)
        return Fetched(
            repo_path=path,
            source=source,
            branch=branch,
            branch_tip=str(repo.references[f"{UPSTREAM_PREFIX}{branch}"].target),
            pr_heads=pr_heads,
            missing_prs=tuple(n for n in prs if n not in pr_heads),
        )

    def _check_fetched(
        self,
        repo: pygit2.Repository,
        path: Path,
        source: Source,
        branch: str,
        missing_refs: list[int],
        labels: Mapping[str, str],
        can_fetch: bool,
        *,
        missing_ok: bool,
        where: str | None,
    ) -> None:
        """The fetch's checks: every ``want`` commit there (fetched by id when missing),
        every PR ref, the branch."""
        missing = [sha for sha in labels if sha not in repo]
        if missing and can_fetch:
            # Pinned commits no longer reachable from a ref (force-pushed PRs):
            # upload-pack still serves them by id on GitHub and local mirrors.
            gitcli.git(
                ["fetch", "-q", "--no-tags", "--", source.location, *missing],
                git_dir=path,
                check=False,
            )
            missing = [sha for sha in labels if sha not in repo]
        url = source.url
        if (missing or missing_refs) and not missing_ok:
            raise missing_objects_error(
                url, path, [(sha, labels[sha]) for sha in missing], missing_refs, can_fetch,
                where=where,
            )  # fmt: skip
        tip_ref = f"{UPSTREAM_PREFIX}{branch}"
        if tip_ref not in repo.references:
            raise PinwheelError(
                f"branch '{branch}' of {redact(url)} is not in the cache"
                + ("" if can_fetch else " (offline)"),
                where=where or f"[upstream] {redact(url)}",
                next="run without --offline once to fill the cache"
                if not can_fetch
                else f"check the branch in {where or '[upstream]'}",
            )

    def ensure_commits(self, url: str, commits: Sequence[str]) -> Path:
        """Make ``commits`` (and what they reach) present in the cache repo of ``url``.

        For pinned sources that are no branch tip: a mirror is attached as an
        alternate; otherwise the commits are fetched by id. Call inside :meth:`locked`.
        """
        path = self.repo_path(url)
        source = resolve_source(url, self.mirrors)
        if source.local:
            self._attach_alternate(path, source)
        from pinwheel.source.libgit2 import pygit2

        repo = pygit2.Repository(str(path))
        missing = [sha for sha in commits if sha not in repo]
        if missing and (source.local or not self.offline):
            gitcli.git(
                ["fetch", "-q", "--no-tags", "--", source.location, *missing],
                git_dir=path,
                check=False,
            )
            missing = [sha for sha in commits if sha not in repo]
        if missing:
            raise PinwheelError(
                f"commit(s) {', '.join(missing)} not found in {redact(url)}"
                + (" (offline: cache only)" if self.offline and not source.local else ""),
                where=f"cache {path.name}",
                next="run without --offline, or point --mirror URL=PATH at a mirror that has them",
            )
        return path

    def resolve_ref(self, url: str, ref: str) -> str:
        """The commit ``ref`` (a tag, branch or SHA) names at ``url`` now (for ``lock``)."""
        if validate.is_git_sha(ref):
            return ref
        source = resolve_source(url, self.mirrors)
        if self.offline and not source.local:
            raise PinwheelError(
                f"cannot resolve {ref!r} of {url} offline",
                where=f"build source {url}",
                next="run without --offline, or pass --mirror URL=PATH",
            )
        proc = gitcli.git(
            ["ls-remote", "--", source.location, ref, f"{ref}^{{}}"],
            check=False,
        )
        rows = [line.split("\t") for line in proc.stdout.decode().splitlines() if "\t" in line]
        peeled = [sha for sha, name in rows if name.endswith("^{}")]
        plain = [sha for sha, name in rows if not name.endswith("^{}")]
        if proc.returncode != 0 or not (peeled or plain):
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            raise PinwheelError(
                f"{url} has no ref {ref!r}" + (f" ({err[-1]})" if err else ""),
                where=f"build source {url}",
                next="check the declared ref, or pin the commit by hand in [[build.source]]",
            )
        return (peeled or plain)[0]

    @staticmethod
    def _attach_alternate(path: Path, source: Source) -> None:
        alternates = path / "objects" / "info" / "alternates"
        objects = str(_objects_dir(source.location).resolve())
        current = alternates.read_text().split() if alternates.exists() else []
        if objects not in current:
            atomic_write_text(alternates, "\n".join([*current, objects]) + "\n")

    def _fetch(
        self,
        path: Path,
        source: Source,
        refspecs: list[str],
        prs: Sequence[int],
        *,
        missing_ok: bool = False,
    ) -> list[int]:
        """Fetch the refspecs; the PRs whose ref is missing (raised unless ``missing_ok``)."""
        # "--": the location comes from a manifest or a flag and must never be an option.
        args = ["fetch", "-q", "--no-tags", "--no-write-fetch-head", "--", source.location]
        proc = gitcli.git([*args, *refspecs], git_dir=path, check=False, reporter=self.reporter)
        if proc.returncode == 0:
            return []
        # Find what failed so the error can name it: the source itself (network,
        # bad URL, missing branch) or one PR's ref.
        branch = gitcli.git(
            [*args, refspecs[0]], git_dir=path, check=False
        )
        proc = branch
        if branch.returncode == 0:
            missing = []
            for spec, n in zip(refspecs[1:], prs, strict=True):
                one = gitcli.git(
                    [*args, spec], git_dir=path, check=False
                )
                if one.returncode != 0 and missing_ok:
                    # Forget a ref fetched earlier: upstream no longer has it.
                    gitcli.git(
                        ["update-ref", "-d", f"{PULL_PREFIX}{n}/head"], git_dir=path, check=False
                    )
                    missing.append(n)
                elif one.returncode != 0:
                    raise PinwheelError(
                        f"PR #{n} has no refs/pull/{n}/head at {redact(source.location)}",
                        where=f"fetch PR #{n}",
                        next="check the PR number, or fetch PR refs into your mirror "
                        "(git fetch origin '+refs/pull/*/head:refs/pull/*/head')",
                    )
            return missing  # each ref fetched one by one
        err = gitcli.stderr_lines(proc)
        raise PinwheelError(
            f"fetch failed: {err[-1] if err else proc.returncode}",
            where=f"fetch {redact(source.location)}",
            next="check the network or use --mirror URL=PATH with a local mirror",
        )


def missing_objects_error(
    url: str,
    repo_path: Path,
    commits: Sequence[tuple[str, str]],
    prs: Sequence[int],
    can_fetch: bool,
    *,
    where: str | None = None,
) -> PinwheelError:
    """One error naming everything a fetch could not supply: each commit as the manifest
    gives it (full, never cut to a prefix) with what names it, and each PR without a ref.

    Its ``where`` is the manifest's: the one missing commit's label when only one is
    missing and it has one (``manifest.toml:14: [[kernel]] kern commit``), else ``where``
    (the stack); the cache repository is named in the text, not as the place to edit."""
    lines = [f"    {sha}" + (f"  ({label})" if label else "") for sha, label in commits] + [
        f"    PR #{n} has no refs/pull/{n}/head" for n in prs
    ]
    count = len(commits) + len(prs)
    offline = "" if can_fetch else " (offline: cache only)"
    if not can_fetch:
        hint = "run again without --offline"
    elif prs and not commits:
        hint = (
            "check the PR numbers, or fetch PR refs into your mirror "
            "(git fetch origin '+refs/pull/*/head:refs/pull/*/head')"
        )
    elif len(commits) == 1 and not prs and commits[0][1].endswith((" commit", " head")):
        label = commits[0][1]
        repin = (
            "`pinwheel lock --update-heads` pins the PR's current head"
            if label.endswith(" head")
            else "`pinwheel lock --update-base` pins the branch tip"
        )
        hint = (
            f"check that commit ({label}), or re-pin it: {repin}; or point --mirror URL=PATH "
            "at a mirror that has it"
        )
    else:
        hint = (
            "check these SHAs and PR numbers in the manifest, or point --mirror URL=PATH "
            "at a mirror that has them (with PR refs: "
            "git fetch origin '+refs/pull/*/head:refs/pull/*/head')"
        )
    if len(commits) == 1 and not prs and commits[0][1]:
        where = commits[0][1]
    return PinwheelError(
        f"{count} object(s) missing from {redact(url)}{offline} (cache {repo_path.name}):\n"
        + "\n".join(lines),
        where=where or f"cache {repo_path.name}",
        next=hint,
    )

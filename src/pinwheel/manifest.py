"""The manifest model: ``manifest.toml`` parsed and validated once, into frozen dataclasses.

Commands never read TOML themselves; they take a :class:`Manifest`. Every
validation error names the file, line, table and key, and says what was
expected (``manifest.toml:14: [[step]] #2 (PR 1159): key 'head': expected a
full 40-hex commit SHA, got 'abc123'``).

Tables owned by later stages (``[build]``, ``[[kernel]]``, ``[release]``,
``[model]``, ``[serve]``, ``[qualify]``) are parsed by the stage that owns
them, through :data:`STAGE_TABLES`, with the same :class:`Table` reader, so
their errors look the same and are raised at load time too.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import hashlib
import importlib
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import ManifestError

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
SHORT_SHA = re.compile(r"^[0-9a-f]{4,39}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
ACTIONS = ("pick", "merge", "patch")

# Table's typed getters are named after the types they return (t.str, t.int),
# so inside its body the builtins are spelled builtins.str etc.

# Stage tables: name -> (module, parser). The parser takes the raw Table (or a
# list of Tables for arrays of tables) and returns a frozen dataclass. A table
# whose stage has no parser yet is carried raw (as Table) and not rejected.
STAGE_TABLES: dict[str, str] = {
    "build": "pinwheel.toolchain:parse_build_table",
    "kernel": "pinwheel.kernels:parse_kernel_tables",
    "release": "pinwheel.release:parse_release_table",
    "model": "pinwheel.modelpack:parse_model_table",
    "serve": "pinwheel.serve:parse_serve_table",
    "qualify": "pinwheel.qualify:parse_qualify_table",
}
CORE_TABLES = ("upstream", "step", "identity", "result", "manifest")


# --------------------------------------------------------------------------- locating keys


def _key_lines(text: str) -> dict[tuple[str, int, str], int]:
    """Map (table path, array index, key) -> 1-based line, for keys written as ``key = ...``.

    tomllib gives no positions, so we scan the text: good enough for the plain
    style manifests use (headers on their own line, one key per line).
    """
    lines: dict[tuple[str, int, str], int] = {}
    counters: dict[str, int] = {}
    table, index = "", 0
    header = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\]?\s*(#.*)?$")
    keyline = re.compile(r"^\s*([A-Za-z0-9_\-]+|\"[^\"]*\")\s*=")
    for n, raw in enumerate(text.splitlines(), start=1):
        m = header.match(raw)
        if m:
            table = m.group(2).replace('"', "").replace(" ", "")
            if m.group(1) == "[[":
                counters[table] = counters.get(table, -1) + 1
                index = counters[table]
            else:
                index = 0
            lines[(table, index, "")] = n
            continue
        k = keyline.match(raw)
        if k:
            lines.setdefault((table, index, k.group(1).strip('"')), n)
    return lines


_MISSING = object()


@dataclass(frozen=True)
class Table:
    """A TOML table with enough context to blame a key: file, line, display name."""

    path: builtins.str  # TOML path, e.g. "step" or "serve.profile"
    index: builtins.int  # position in an array of tables, else 0
    label: builtins.str  # what users read, e.g. "[[step]] #2 (PR 1159)"
    data: Mapping[builtins.str, Any]
    source: Path
    lines: Mapping[tuple[builtins.str, builtins.int, builtins.str], builtins.int] = field(
        repr=False, default_factory=dict
    )

    # -- blame ---------------------------------------------------------------
    def line(self, key: builtins.str = "") -> builtins.int | None:
        return self.lines.get((self.path, self.index, key)) or self.lines.get(
            (self.path, self.index, "")
        )

    def where(self, key: builtins.str = "") -> builtins.str:
        n = self.line(key)
        loc = f"{self.source.name}:{n}" if n else self.source.name
        return f"{loc}: {self.label}" + (f" key '{key}'" if key else "")

    def error(
        self, key: builtins.str, expected: builtins.str, got: Any = _MISSING
    ) -> ManifestError:
        what = f"expected {expected}" + ("" if got is _MISSING else f", got {got!r}")
        return ManifestError(
            what, where=self.where(key), next=f"edit {self.source.name} and run `pinwheel plan`"
        )

    # -- typed getters -------------------------------------------------------
    def has(self, key: builtins.str) -> builtins.bool:
        return key in self.data

    def raw(self, key: builtins.str, default: Any = _MISSING) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise self.error(key, "this key (it is required)")
        return default

    def str(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str) or not value:
            raise self.error(key, "a non-empty string", value)
        return value

    def int(
        self, key: builtins.str, default: Any = _MISSING, *, minimum: builtins.int | None = None
    ) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(key, "an integer", value)
        if minimum is not None and value < minimum:
            raise self.error(key, f"an integer >= {minimum}", value)
        return value

    def float(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.error(key, "a number", value)
        return float(value)

    def bool(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, "true or false", value)
        return value

    def choice(
        self, key: builtins.str, choices: tuple[builtins.str, ...], default: Any = _MISSING
    ) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if value not in choices:
            raise self.error(key, "one of " + ", ".join(repr(c) for c in choices), value)
        return value

    def str_list(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return tuple(value) if value is not None else value  # type: ignore[no-any-return]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.error(key, "a list of non-empty strings", value)
        return tuple(value)

    def str_map(
        self, key: builtins.str, default: Any = _MISSING
    ) -> dict[builtins.str, builtins.str]:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return dict(value)
        if not isinstance(value, dict) or not all(
            isinstance(v, (str, int, float, bool)) for v in value.values()
        ):
            raise self.error(key, "a table of key = value strings", value)
        return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items()}

    def sha(
        self, key: builtins.str, default: Any = _MISSING, *, allow_short: builtins.bool = False
    ) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, str) and FULL_SHA.match(value):
            return value
        if allow_short and isinstance(value, str) and SHORT_SHA.match(value):
            return value
        if isinstance(value, str) and SHORT_SHA.match(value):
            raise ManifestError(
                f"expected a full 40-hex commit SHA, got short {value!r}",
                where=self.where(key),
                next="run `pinwheel lock` to resolve short SHAs in place",
            )
        raise self.error(key, "a full 40-hex lowercase commit SHA", value)

    def sha256(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str) or not SHA256.match(value):
            raise self.error(key, "a 64-hex lowercase sha256", value)
        return value

    def sub(self, key: builtins.str, label: builtins.str | None = None) -> Table:
        """A nested table (``[serve.profile.card]`` or an inline table)."""
        value = self.raw(key)
        if not isinstance(value, dict):
            raise self.error(key, "a table", value)
        return Table(
            path=f"{self.path}.{key}",
            index=0,
            label=label or f"[{self.path}.{key}]",
            data=value,
            source=self.source,
            lines=self.lines,
        )

    def subs(self, key: builtins.str) -> tuple[Table, ...]:
        """An array of tables nested in this one (``[[serve.profile]]``)."""
        value = self.raw(key, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.error(key, "an array of tables", value)
        return tuple(
            Table(
                path=f"{self.path}.{key}",
                index=i,
                label=f"[[{self.path}.{key}]] #{i + 1}",
                data=v,
                source=self.source,
                lines=self.lines,
            )
            for i, v in enumerate(value)
        )

    def only(self, *allowed: builtins.str) -> None:
        """Reject unknown keys: a typo must not silently drop a setting."""
        for key in self.data:
            if key not in allowed:
                raise ManifestError(
                    f"unknown key '{key}' (known: {', '.join(allowed)})",
                    where=self.where(key),
                    next=f"fix the key name in {self.source.name}",
                )

    def path_under(self, key: builtins.str, root: Path, folder: builtins.str) -> Path:
        """A relative path that must stay inside ``root/folder`` (no absolute, no ``..``)."""
        value = self.str(key)
        rel = PurePosixPath(value)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or rel.parts[0] != folder:
            raise self.error(key, f"a relative path under {folder}/", value)
        resolved = (root / rel).resolve()
        if not resolved.is_relative_to((root / folder).resolve()):
            raise self.error(key, f"a path that stays under {folder}/", value)
        return resolved


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Upstream:
    url: str
    commit: str  # full SHA (short only while locking)
    branch: str


@dataclass(frozen=True)
class Resolution:
    """A recorded conflict fix: apply ``patch`` instead of merging ``commit``."""

    commit: str  # the original commit whose replay conflicted ("merge" for a merge step)
    patch: Path
    sha256: str


@dataclass(frozen=True)
class Step:
    number: int  # 1-based position in the stack
    action: str  # pick | merge | patch
    pr: int | None
    head: str | None
    title: str | None
    commits: tuple[str, ...] | None  # expected original commits (audit)
    patch: Path | None
    patch_sha256: str | None
    resolutions: tuple[Resolution, ...] = ()

    @property
    def label(self) -> str:
        if self.pr is not None:
            return f"step {self.number} ({self.action} PR #{self.pr})"
        name = self.patch.name if self.patch else "?"
        return f"step {self.number} ({self.action} {name})"


@dataclass(frozen=True)
class Identity:
    name: str
    email: str
    # Unix time + UTC offset in minutes; None = the base commit's committer date.
    time: int | None
    offset: int | None


@dataclass(frozen=True)
class Result:
    tree: str | None
    tag: str | None


@dataclass(frozen=True)
class Manifest:
    path: Path
    sha256: str  # of the manifest file bytes, recorded in receipts
    name: str
    upstream: Upstream
    steps: tuple[Step, ...]
    identity: Identity
    result: Result
    # Stage tables, parsed by their owners (see STAGE_TABLES); absent -> None.
    stages: Mapping[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.path.parent

    def stage(self, name: str) -> Any:
        return self.stages.get(name)

    @property
    def prs(self) -> tuple[int, ...]:
        return tuple(s.pr for s in self.steps if s.pr is not None)


DEFAULT_IDENTITY = ("pinwheel", "pinwheel@replay.invalid")


def parse_date(table: Table, key: str) -> tuple[int, int]:
    value = table.raw(key)
    if isinstance(value, _dt.datetime):
        stamp = value
    elif isinstance(value, str):
        try:
            stamp = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise table.error(
                key, "an RFC 3339 date like 2026-10-10T00:00:00+00:00", value
            ) from None
    else:
        raise table.error(key, "an RFC 3339 date with an explicit offset", value)
    if stamp.tzinfo is None or stamp.utcoffset() is None:
        # Without an offset the commit time would follow the machine's TZ.
        raise table.error(key, "a date with an explicit UTC offset (e.g. +00:00)", str(value))
    offset = int(stamp.utcoffset().total_seconds() // 60)  # type: ignore[union-attr]
    return int(stamp.timestamp()), offset


def _parse_upstream(t: Table, allow_short: bool) -> Upstream:
    t.only("url", "commit", "branch")
    return Upstream(
        url=t.str("url"),
        commit=t.sha("commit", allow_short=allow_short),
        branch=t.str("branch", "main"),
    )


def _parse_step(t: Table, number: int, root: Path, allow_short: bool) -> Step:
    t.only("action", "pr", "head", "title", "commits", "path", "sha256", "resolve")
    action = t.choice("action", ACTIONS)
    pr = t.int("pr", None, minimum=1)
    head = t.sha("head", None, allow_short=allow_short)
    title = t.str("title", None)
    commits = None
    if t.has("commits"):
        commits = t.str_list("commits")
        for c in commits:
            if not (FULL_SHA.match(c) or (allow_short and SHORT_SHA.match(c))):
                raise t.error("commits", "a list of full 40-hex commit SHAs", c)
    patch = patch_sha = None
    if action in ("pick", "merge"):
        if pr is None:
            raise t.error("pr", f"a PR number (action '{action}' replays a pull request)")
        if head is None and not allow_short:
            raise ManifestError(
                f"PR #{pr} has no 'head'",
                where=t.where("head"),
                next="run `pinwheel lock` to pin the PR's current head",
            )
        for k in ("path", "sha256"):
            if t.has(k):
                raise t.error(k, f"no '{k}' on a '{action}' step (only 'patch' steps take one)")
    else:
        patch = t.path_under("path", root, "patches")
        patch_sha = t.sha256("sha256")
        check_file_sha(t, "path", patch, patch_sha, verify=not allow_short)
    resolutions = []
    for r in t.subs("resolve"):
        r.only("commit", "path", "sha256")
        commit = r.str("commit")
        if commit != "merge" and not FULL_SHA.match(commit):
            raise r.error("commit", 'a full commit SHA, or "merge" for a merge step', commit)
        p = r.path_under("path", root, "patches")
        digest = r.sha256("sha256")
        check_file_sha(r, "path", p, digest, verify=not allow_short)
        resolutions.append(Resolution(commit=commit, patch=p, sha256=digest))
    return Step(
        number=number,
        action=action,
        pr=pr,
        head=head,
        title=title,
        commits=commits,
        patch=patch,
        patch_sha256=patch_sha,
        resolutions=tuple(resolutions),
    )


def check_file_sha(
    t: Table,
    key: str,
    path: Path,
    expected: str,
    *,
    verify: bool = True,
    repin: str = "run `pinwheel lock` to re-pin it",
) -> None:
    """A pinned file (a patch) must exist and match its sha256.

    In lock mode (verify=False) a changed file is re-pinned, not refused.
    """
    if not path.is_file():
        raise ManifestError(
            f"patch file {path.name} does not exist",
            where=t.where(key),
            next="restore the file under patches/ or fix the path",
        )
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if verify and actual != expected:
        raise ManifestError(
            f"sha256 of {path.name} is {actual}, manifest pins {expected}",
            where=t.where("sha256"),
            next=f"if the patch change is intended, {repin}",
        )


def _resolve_parser(spec: str) -> Callable[[Any], Any] | None:
    module, _, func = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:  # stage not built yet: carry the table raw
            return None
        raise
    return getattr(mod, func, None)


def load(path: str | Path, *, allow_short: bool = False) -> Manifest:
    """Read and validate a manifest.

    ``allow_short`` is lock mode (``pinwheel lock`` only): short SHAs and missing
    heads are accepted, and patch checksums are left for lock to re-pin.
    """
    path = Path(path).absolute()
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(
            f"no manifest at {path}",
            next="pass --manifest PATH, or run from the directory that holds manifest.toml",
        ) from None
    return loads(blob, path, allow_short=allow_short)


def loads(blob: bytes, path: Path, *, allow_short: bool = False) -> Manifest:
    text = blob.decode("utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(
            f"TOML syntax error: {exc}", where=path.name, next=f"fix the syntax of {path.name}"
        ) from None
    lines = _key_lines(text)
    root = path.parent

    def table(name: str, label: str | None = None, index: int = 0, value: Any = None) -> Table:
        return Table(
            path=name,
            index=index,
            label=label or f"[{name}]",
            data=data.get(name, {}) if value is None else value,
            source=path,
            lines=lines,
        )

    top = table("", "top level", value=data)
    for key in data:
        if key not in CORE_TABLES and key not in STAGE_TABLES:
            raise ManifestError(
                f"unknown table [{key}] (known: {', '.join(CORE_TABLES + tuple(STAGE_TABLES))})",
                where=f"{path.name}:{lines.get((key, 0, ''), '?')}",
                next=f"fix the table name in {path.name}",
            )
    if "upstream" not in data:
        raise top.error("upstream", "an [upstream] table with url, commit and branch")
    name = path.stem
    if "manifest" in data:
        meta = table("manifest")
        meta.only("name", "note")
        name = meta.str("name", name)
    upstream = _parse_upstream(table("upstream"), allow_short)

    raw_steps = data.get("step", [])
    if not isinstance(raw_steps, list):
        raise top.error("step", "an array of tables written [[step]]")
    steps: list[Step] = []
    seen_prs: dict[int, int] = {}
    for i, raw in enumerate(raw_steps):
        pr = raw.get("pr") if isinstance(raw, dict) else None
        label = f"[[step]] #{i + 1}" + (f" (PR {pr})" if isinstance(pr, int) else "")
        t = table("step", label, index=i, value=raw)
        step = _parse_step(t, i + 1, root, allow_short)
        if step.pr is not None:
            if step.pr in seen_prs:
                raise ManifestError(
                    f"PR #{step.pr} appears twice (steps {seen_prs[step.pr]} and {step.number})",
                    where=t.where("pr"),
                    next="remove the duplicate step",
                )
            seen_prs[step.pr] = step.number
        steps.append(step)

    ident = table("identity")
    ident.only("name", "email", "date")
    time = offset = None
    if ident.has("date"):
        time, offset = parse_date(ident, "date")
    identity = Identity(
        name=ident.str("name", DEFAULT_IDENTITY[0]),
        email=ident.str("email", DEFAULT_IDENTITY[1]),
        time=time,
        offset=offset,
    )
    res = table("result")
    res.only("tree", "tag")
    result = Result(tree=res.sha("tree", None, allow_short=False), tag=res.str("tag", None))
    if result.tag is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._\-/]*$", result.tag):
        raise res.error("tag", "a git tag name (letters, digits, . _ - /)", result.tag)

    stages: dict[str, Any] = {}
    for key, spec in STAGE_TABLES.items():
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, list):
            raw_tables: Any = tuple(
                table(key, f"[[{key}]] #{i + 1}", index=i, value=v) for i, v in enumerate(value)
            )
        else:
            raw_tables = table(key)
        parser = _resolve_parser(spec)
        stages[key] = parser(raw_tables) if parser else raw_tables

    return Manifest(
        path=path,
        sha256=hashlib.sha256(blob).hexdigest(),
        name=name,
        upstream=upstream,
        steps=tuple(steps),
        identity=identity,
        result=result,
        stages=stages,
    )

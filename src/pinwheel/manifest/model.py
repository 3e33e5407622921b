"""The manifest model: ``manifest.toml`` parsed and validated once, into frozen dataclasses.

Commands never read TOML themselves; they take a :class:`Manifest`. Every
validation error names the file, line, table and key, and says what was
expected (``manifest.toml:14: [[step]] #2 (PR 1159): key 'head': expected a
full 40-hex commit SHA, got 'abc123'``).

The stage tables (``[build]``, ``[[kernel]]``, ``[release]``, ``[model]``,
``[serve]``, ``[qualify]``) are typed here too (``manifest.build``,
``manifest.release``, ``manifest.serve``), read by the same :class:`Table`
reader, so their errors look the same and are raised at load time.
A stage asks for its table with :meth:`Manifest.require`.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from pinwheel import untrusted
from pinwheel.errors import ManifestError
from pinwheel.manifest.steps import Step, parse_step
from pinwheel.manifest.table import (
    SAFE_NAME,
    Table,
    _key_lines,
    parse_date,
)
from pinwheel.printable import shown_cmd

if TYPE_CHECKING:  # the stage tables' modules load when a manifest has the table (start-up)
    from pinwheel.manifest.build import BuildConfig, KernelSpec
    from pinwheel.manifest.release import ModelConfig, ReleaseConfig
    from pinwheel.manifest.serve import QualifyConfig, ServeConfig

CORE_TABLES = ("upstream", "step", "identity", "result", "manifest")
# Stage table name in the TOML -> Manifest field, and its parser.
STAGE_TABLES = {
    "build": "build",
    "kernel": "kernels",
    "release": "release",
    "model": "model",
    "serve": "serve",
    "qualify": "qualify",
}
def _parser(table: str) -> Callable[..., Any]:
    """The parser of a stage table; its module is imported only for a manifest that has the
    table (start-up), by a plain import every reader and tool sees."""
    if table in ("build", "kernel"):
        from pinwheel.manifest import build

        return build.parse_build_table if table == "build" else build.parse_kernel_tables
    if table in ("release", "model"):
        from pinwheel.manifest import release

        return release.parse_release_table if table == "release" else release.parse_model_table
    if table in ("serve", "qualify"):
        from pinwheel.manifest import serve

        return serve.parse_serve_table if table == "serve" else serve.parse_qualify_table
    raise KeyError(table)


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Upstream:
    url: str
    commit: str  # full SHA (short only while locking)
    branch: str
    # Blame, not identity: what names the commit, with its file and line
    # ("manifest.toml:3: [upstream] commit", "manifest.toml:14: [[kernel]] kern commit").
    where: str = field(default="", compare=False)


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
    # Stage tables; None when the manifest has no such table.
    build: BuildConfig | None = None
    kernels: tuple[KernelSpec, ...] = ()
    release: ReleaseConfig | None = None
    model: ModelConfig | None = None
    serve: ServeConfig | None = None
    qualify: QualifyConfig | None = None
    # False: no [upstream] (the manifest builds components only); ``upstream`` is then
    # the first out-of-tree [[kernel]]'s, for code that names a source.
    has_engine: bool = True
    # Where this stack is pinned, for errors about the whole stack: "manifest.toml:2:
    # [upstream]", or "manifest.toml:12: [[kernel]] kern" for a component.
    origin: str = field(default="", compare=False)

    @property
    def root(self) -> Path:
        return self.path.parent

    @overload
    def require(self, table: Literal["build"]) -> BuildConfig: ...
    @overload
    def require(self, table: Literal["kernel"]) -> tuple[KernelSpec, ...]: ...
    @overload
    def require(self, table: Literal["release"]) -> ReleaseConfig: ...
    @overload
    def require(self, table: Literal["model"]) -> ModelConfig: ...
    @overload
    def require(self, table: Literal["serve"]) -> ServeConfig: ...
    @overload
    def require(self, table: Literal["qualify"]) -> QualifyConfig: ...

    def require(self, table: str) -> object:
        """The parsed ``[table]``, or the one error for a manifest that lacks it (typed per
        table: ``require("build")`` is a :class:`BuildConfig`)."""
        value = getattr(self, STAGE_TABLES[table])
        if value is None or value == ():
            header = f"[[{table}]]" if table == "kernel" else f"[{table}]"
            raise ManifestError(
                f"manifest has no {header} table",
                where=self.path.name,
                next=f"add a {header} table to {self.path.name} (see README: The manifest)",
            )
        return value

    @property
    def prs(self) -> tuple[int, ...]:
        return tuple(s.pr for s in self.steps if s.pr is not None)

    @property
    def base_where(self) -> str:
        """What names the base commit, for errors: file, line and table."""
        return self.upstream.where or f"{self.path.name} [upstream] commit"

    @property
    def stack_where(self) -> str:
        """Where the stack is pinned, for errors that concern all of it."""
        return self.origin or f"{self.path.name} [upstream]"


DEFAULT_IDENTITY = ("pinwheel", "pinwheel@replay.invalid")


def _parse_upstream(t: Table, allow_short: bool) -> Upstream:
    t.only("url", "commit", "branch")
    return Upstream(
        url=t.url("url"),
        commit=t.sha("commit", allow_short=allow_short),
        branch=t.ref("branch", "main"),
        where=f"{t.at('commit')}: [upstream] commit",
    )


def load(path: str | Path, *, allow_short: bool = False) -> Manifest:
    """Read and validate a manifest.

    ``allow_short`` is lock mode (``pinwheel lock`` only): short SHAs and missing
    heads are accepted, and patch checksums are left for lock to re-pin.
    """
    path = Path(path).absolute()
    try:
        blob = untrusted.read_regular(path, untrusted.MANIFEST.max_bytes)
    except untrusted.NotRegular as exc:
        raise ManifestError(
            f"{path} is {exc}, not a manifest file",
            where="--manifest",
            next="pass --manifest PATH to a regular manifest.toml file",
        ) from None
    except FileNotFoundError:
        raise ManifestError(
            f"no manifest at {path}",
            next="pass --manifest PATH, or run from the directory that holds manifest.toml "
            "(or one below it)",
        ) from None
    except IsADirectoryError:
        inside = path / "manifest.toml"
        raise ManifestError(
            f"{path} is a directory, not a manifest file",
            where="--manifest",
            next=f"pass {shown_cmd('--manifest', inside)}"
            if inside.is_file()
            else "pass --manifest PATH/manifest.toml (the file)",
        ) from None
    except OSError as exc:
        raise ManifestError(
            f"cannot read {path}: {exc.strerror or exc}",
            where="--manifest",
            next="check the file's permissions, then run again",
        ) from None
    if isinstance(blob, int):
        cap = untrusted.MANIFEST.max_bytes
        raise ManifestError(
            f"{path} is {blob} bytes, more than the {cap} a manifest may have",
            where="--manifest",
            next="pass --manifest PATH to the project's manifest.toml (a few kilobytes)",
        )
    return loads(blob, path, allow_short=allow_short)


def _decode(blob: bytes, path: Path) -> str:
    """UTF-8 text; a leading byte-order mark (Windows editors write one) is accepted."""
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = blob[: exc.start].count(b"\n") + 1
        raise ManifestError(
            f"not UTF-8: byte 0x{blob[exc.start]:02x} at offset {exc.start}",
            where=f"{path.name}:{line}",
            next=f"save {path.name} as UTF-8 (TOML requires it)",
        ) from None
    return text.removeprefix("\ufeff")


def _safe_default_name(stem: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._\-]+", "-", stem).strip(".-")
    return name[:100] if name and ".." not in name else "manifest"


MAX_DEPTH = 32  # a default: tables and arrays nested deeper than any manifest needs


def _too_deep(path: Path) -> ManifestError:
    return ManifestError(
        f"tables or arrays nested more than {MAX_DEPTH} deep: not a manifest",
        where=path.name,
        next=f"fix {path.name}: a manifest's tables nest a few levels (see docs/manifest.md)",
    )


def _depth(data: Any) -> int:
    """How deep tables and arrays nest in ``data``, found without recursing."""
    deepest, pending = 0, [(data, 1)]
    while pending:
        value, depth = pending.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        children = value.values() if isinstance(value, dict) else value
        pending += [(v, depth + 1) for v in children if isinstance(v, (dict, list))]
    return deepest


def loads(blob: bytes, path: Path, *, allow_short: bool = False) -> Manifest:
    text = _decode(blob, path)
    data = _toml(text, path)
    lines = _key_lines(text)

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
    _check_tables(data, top, path, lines)
    has_engine = "upstream" in data
    name = _manifest_name(data, table, path)
    upstream = _parse_upstream(table("upstream"), allow_short) if has_engine else None
    origin = table("upstream").where() if has_engine else ""
    steps = _steps(data, table, top, path.parent, allow_short)
    identity = _identity(table("identity"))
    res = table("result")
    res.only("tree", "tag")
    result = Result(tree=res.sha("tree", None, allow_short=False), tag=res.ref("tag", None))
    stages = _stages(data, table, allow_short)
    if upstream is None:
        first = next(k for k in stages["kernels"] if k.url)
        upstream = Upstream(url=first.url, commit=first.commit or "", branch=first.branch,
                            where=first.commit_where)  # fmt: skip
        origin = first.where

    return Manifest(
        path=path,
        sha256=hashlib.sha256(blob).hexdigest(),
        name=name,
        upstream=upstream,
        steps=tuple(steps),
        identity=identity,
        result=result,
        has_engine=has_engine,
        origin=origin,
        **stages,
    )


def _toml(text: str, path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(
            f"TOML syntax error: {exc}", where=path.name, next=f"fix the syntax of {path.name}"
        ) from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise _too_deep(path) from None
    if _depth(data) > MAX_DEPTH:  # dotted keys and [a.b.c] headers nest without recursing
        raise _too_deep(path)
    return data


def _check_tables(
    data: dict[str, Any], top: Table, path: Path, lines: dict[tuple[str, int, str], int]
) -> None:
    """Known tables only, each of its kind; an engine, or out-of-tree kernels."""
    for key in data:
        if key not in CORE_TABLES and key not in STAGE_TABLES:
            raise ManifestError(
                f"unknown table [{key}] (known: {', '.join(CORE_TABLES + tuple(STAGE_TABLES))})",
                where=f"{path.name}:{lines.get((key, 0, ''), '?')}",
                next=f"fix the table name in {path.name}",
            )
    has_engine = "upstream" in data
    if not has_engine and not any(
        isinstance(k, dict) and "url" in k
        for k in data.get("kernel", [])
        if isinstance(data.get("kernel"), list)
    ):
        raise top.error(
            "upstream",
            "an [upstream] table with url, commit and branch "
            "(only a manifest of out-of-tree [[kernel]] components may leave it out)",
        )
    if not has_engine and data.get("step"):
        raise top.error("step", "no [[step]] without an [upstream] engine to replay it on")
    # A key that should be a table but is a number, string or array: exit 2, not a traceback.
    for key in ("upstream", "identity", "result", "manifest", *STAGE_TABLES):
        if key not in data:
            continue
        if key == "kernel":
            if not isinstance(data[key], list) or not all(isinstance(v, dict) for v in data[key]):
                raise top.error(key, "an array of tables written [[kernel]]", data[key])
        elif not isinstance(data[key], dict):
            raise top.error(key, f"a table written [{key}]", data[key])


def _manifest_name(data: dict[str, Any], table: Callable[..., Table], path: Path) -> str:
    name = _safe_default_name(path.stem)
    if "manifest" in data:
        meta = table("manifest")
        meta.only("name", "note")
        name = meta.str("name", name)
        if not SAFE_NAME.fullmatch(name) or ".." in name or name.endswith(".lock"):
            raise meta.error(
                "name",
                "a name of letters, digits, '.', '_' and '-' (no '/', no '..'; it names refs "
                "and files)",
                name,
            )
    return name


def _steps(
    data: dict[str, Any], table: Callable[..., Table], top: Table, root: Path, allow_short: bool
) -> list[Step]:
    raw_steps = data.get("step", [])
    if not isinstance(raw_steps, list) or not all(isinstance(r, dict) for r in raw_steps):
        raise top.error("step", "an array of tables written [[step]]", raw_steps)
    steps: list[Step] = []
    seen_prs: dict[int, int] = {}
    for i, raw in enumerate(raw_steps):
        pr = raw.get("pr") if isinstance(raw, dict) else None
        label = f"[[step]] #{i + 1}" + (f" (PR {pr})" if isinstance(pr, int) else "")
        t = table("step", label, index=i, value=raw)
        step = parse_step(t, i + 1, root, allow_short)
        if step.pr is not None:
            if step.pr in seen_prs:
                raise ManifestError(
                    f"PR #{step.pr} appears twice (steps {seen_prs[step.pr]} and {step.number})",
                    where=t.where("pr"),
                    next="remove the duplicate step",
                )
            seen_prs[step.pr] = step.number
        steps.append(step)
    return steps


def _identity(ident: Table) -> Identity:
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
    for key in ("name", "email"):
        value = getattr(identity, key)
        # Both go into the commit header verbatim: no line breaks, no angle brackets.
        if any(ord(c) < 32 or c in "<>" for c in value):
            raise ident.error(key, "one line without '<' or '>'", value)
    return identity


def _stages(
    data: dict[str, Any], table: Callable[..., Table], allow_short: bool
) -> dict[str, Any]:
    """Each stage table present, parsed by its stage's parser."""
    stages: dict[str, Any] = {}
    for key in STAGE_TABLES:
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, list):
            raw_tables: Any = tuple(
                table(key, f"[[{key}]] #{i + 1}", index=i, value=v) for i, v in enumerate(value)
            )
        else:
            raw_tables = table(key)
        if key == "kernel":
            stages["kernels"] = _parser(key)(raw_tables, allow_short=allow_short)
        else:
            stages[STAGE_TABLES[key]] = _parser(key)(raw_tables)
    return stages

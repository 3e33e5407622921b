"""The table reader every manifest table uses: typed getters, errors with file, line and key.

In: one TOML table (a dict) and where it came from. Out: validated values, or a
:class:`~pinwheel.errors.ManifestError` that names the file, line, table and key
and says what was expected.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pinwheel import validate
from pinwheel.checksums import sha256_file
from pinwheel.errors import ManifestError
from pinwheel.urls import redact

# Validate with .fullmatch(): "$" would accept a trailing newline.
FULL_SHA = validate.GIT_SHA
SHORT_SHA = re.compile(r"[0-9a-f]{4,39}")
SHA256 = validate.SHA256
# A name that becomes part of refs and file names: [manifest].name.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,99}")


# Table's typed getters are named after the types they return (t.str, t.int),
# so inside its body the builtins are spelled builtins.str etc.


# --------------------------------------------------------------------------- locating keys


def _key_lines(text: str) -> dict[tuple[str, int, str], int]:
    """Map (table scope, array index, key) -> 1-based line, for keys written as ``key = ...``.

    tomllib gives no positions, so we scan the text: good enough for the plain
    style manifests use (headers on their own line, one key per line). A nested
    table is scoped by the index of the table it sits in (``kernel#1.step`` is a
    ``[[kernel.step]]`` of the second ``[[kernel]]``): :attr:`Table.scope` spells
    the same, so a second kernel's steps are not blamed on the first's lines.
    """
    lines: dict[tuple[str, int, str], int] = {}
    counters: dict[str, int] = {}
    current: dict[str, int] = {}  # scope -> index of the table last opened there
    table, index = "", 0
    header = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\]?\s*(#.*)?$")
    keyline = re.compile(r"^\s*([A-Za-z0-9_\-]+|\"[^\"]*\")\s*=")
    for n, raw in enumerate(text.splitlines(), start=1):
        m = header.match(raw)
        if m:
            parts = m.group(2).replace('"', "").replace(" ", "").split(".")
            table = parts[0]
            for part in parts[1:]:
                table = f"{table}#{current.get(table, 0)}.{part}"
            if m.group(1) == "[[":
                counters[table] = counters.get(table, -1) + 1
                index = counters[table]
            else:
                index = 0
            current[table] = index
            lines[(table, index, "")] = n
            continue
        k = keyline.match(raw)
        if k:
            lines.setdefault((table, index, k.group(1).strip('"')), n)
    return lines


_MISSING = object()
REQUIRED: Any = _MISSING  # pass as a getter's default: the key must be present


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
    # Where its lines are looked up: the path, with the index of each table it is nested
    # in (``kernel#1.step``); empty means ``path`` (a top-level table).
    scope: builtins.str = ""

    # -- blame ---------------------------------------------------------------
    def line(self, key: builtins.str = "") -> builtins.int | None:
        scope = self.scope or self.path
        return self.lines.get((scope, self.index, key)) or self.lines.get((scope, self.index, ""))

    def at(self, key: builtins.str = "") -> builtins.str:
        """``manifest.toml:14``: the file and the line of ``key`` (else of the table)."""
        n = self.line(key)
        return f"{self.source.name}:{n}" if n else self.source.name

    def where(self, key: builtins.str = "") -> builtins.str:
        return f"{self.at(key)}: {self.label}" + (f" key '{key}'" if key else "")

    def _nested(self, key: builtins.str) -> builtins.str:
        return f"{self.scope or self.path}#{self.index}.{key}"

    def error(
        self, key: builtins.str, expected: builtins.str, got: Any = _MISSING
    ) -> ManifestError:
        if isinstance(got, builtins.str):
            got = redact(got)
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
        if not math.isfinite(value):  # nan never compares true, inf always does: no gate
            raise self.error(key, "a finite number (nan and inf are not thresholds)", value)
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
            return tuple(value) if value is not None else value
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

    def url(self, key: builtins.str, default: Any = _MISSING) -> Any:
        """A git remote: a known scheme, scp-style or an absolute path; never an option."""
        value = self.str(key, default)
        if value is default and default is not _MISSING:
            return value
        problem = validate.git_url_problem(value)
        if problem:
            raise ManifestError(
                f"unsafe or unsupported repository URL {redact(value)!r}: {problem}",
                where=self.where(key),
                next=f"use an https://, ssh://, git://, file:// URL, user@host:path or an "
                f"absolute path in {self.source.name}",
            )
        return value

    def ref(self, key: builtins.str, default: Any = _MISSING) -> Any:
        """A branch or tag name, by git's ref-format rules (never an option, never a refspec)."""
        value = self.str(key, default)
        if value is default and default is not _MISSING:
            return value
        problem = validate.ref_problem(value)
        if problem:
            raise self.error(key, f"a git ref name ({problem})", value)
        return value

    def checked(
        self,
        key: builtins.str,
        problem: Any,
        expected: builtins.str,
        default: Any = _MISSING,
    ) -> Any:
        """A string checked by a :mod:`pinwheel.validate` ``*_problem`` function."""
        value = self.str(key, default)
        if value is default and default is not _MISSING:
            return value
        why = problem(value)
        if why:
            raise self.error(key, f"{expected} ({why})", value)
        return value

    def checked_list(
        self, key: builtins.str, problem: Any, expected: builtins.str, default: Any = _MISSING
    ) -> Any:
        values = self.str_list(key, default)
        for value in values or ():
            why = problem(value)
            if why:
                raise self.error(key, f"{expected} ({why})", value)
        return values

    def env_map(
        self, key: builtins.str, default: Any = _MISSING
    ) -> dict[builtins.str, builtins.str]:
        """``{ NAME = "value" }``: variable names checked, values one line each."""
        env = self.str_map(key, default)
        for name, value in env.items():
            why = validate.env_key_problem(name)
            if why:
                raise self.error(key, f"environment variable names ({why})", name)
            if validate.line_problem(value):
                raise self.error(key, "values without newlines or control characters", value)
        return env

    def sha(
        self, key: builtins.str, default: Any = _MISSING, *, allow_short: builtins.bool = False
    ) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, str) and FULL_SHA.fullmatch(value):
            return value
        if allow_short and isinstance(value, str) and SHORT_SHA.fullmatch(value):
            return value
        if isinstance(value, str) and SHORT_SHA.fullmatch(value):
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
        if not isinstance(value, str) or not SHA256.fullmatch(value):
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
            scope=self._nested(key),
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
                scope=self._nested(key),
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


def check_file_sha(
    t: Table,
    key: str,
    path: Path,
    expected: str,
    *,
    verify: bool = True,
    repin: str = "run `pinwheel lock` to re-pin it",
    kind: str = "patch",
) -> None:
    """A pinned file (a patch, a hashed lock) must exist and match its sha256.

    In lock mode (verify=False) a changed file is re-pinned, not refused.
    """
    if not path.is_file():
        where = "under patches/ " if kind == "patch" else ""
        raise ManifestError(
            f"{kind} file {path.name} does not exist (looked for {path})",
            where=t.where(key),
            next=f"paths in a manifest resolve relative to its own folder ({t.source.parent}): "
            f"restore the file {where}there, copy it along with a copied manifest, or fix "
            "the path",
        )
    actual = sha256_file(path)
    if verify and actual != expected:
        raise ManifestError(
            f"sha256 of {path.name} is {actual}, manifest pins {expected}",
            where=t.where("sha256"),
            next=f"if the {kind} change is intended, {repin}",
        )

"""Read a manifest's source labels: which value sits on which line, and what it cites.

Every key line of the three system manifests ends in a comment naming its source:
``# card:`` (the system card), ``# default:`` (pinwheel's own choice), ``# lock``
(pinned or verified by ``pinwheel lock``), ``# FILL IN`` (what fills it) or
``# measured:`` (read from an upstream tree), or ``# facts:`` (the card's linked
repository, as a companion file beside the card lists it). :func:`labelled` returns
each key's path, line, value and label; :func:`drift` compares the ``# card:`` (or
``# facts:``) values with a per-system table (``tests/cards/*.toml``), both ways.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any

_LABEL = re.compile(r"card:|facts:|default\b|lock\b|FILL IN|measured:")
_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r'^\s*([A-Za-z0-9_\-]+|"[^"]*")\s*=')


@dataclass(frozen=True)
class Entry:
    path: str  # dotted; array-of-table indices as numbers: "step.0.pr"
    line: int
    value: Any
    label: str | None  # the comment after the value, from its label on; None: unlabelled


def split_key(text: str) -> list[str]:
    """``a.b."c.d"`` -> ``["a", "b", "c.d"]``."""
    return [m.group(1) if m.group(1) is not None else m.group(2)
            for m in re.finditer(r'"([^"]*)"|([^."\s]+)', text)]  # fmt: skip


def join_key(parts: list[Any]) -> str:
    return ".".join(f'"{p}"' if isinstance(p, str) and "." in p else str(p) for p in parts)


def comment(line: str) -> str | None:
    """The comment of a TOML line: the first '#' outside a string."""
    quote: str | None = None
    escaped = False
    for i, ch in enumerate(line):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[i + 1 :].strip()
    return None


def labelled(text: str) -> list[Entry]:
    """Every key line of the manifest, with its resolved path, value and source label."""
    data = tomllib.loads(text)
    counts: dict[tuple[Any, ...], int] = {}
    node: Any = data
    current: list[Any] = []
    out = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if raw.lstrip().startswith("#"):
            continue
        h = _HEADER.match(raw)
        if h and not _KEY.match(raw):
            segs = split_key(h.group(2))
            node, current = data, []
            for i, seg in enumerate(segs):
                node = node[seg]
                current.append(seg)
                if isinstance(node, list):
                    key = tuple(current)
                    if i == len(segs) - 1 and h.group(1) == "[[":
                        counts[key] = counts.get(key, -1) + 1
                    node = node[counts[key]]
                    current.append(counts[key])
            continue
        k = _KEY.match(raw)
        if not k or not isinstance(node, dict):
            continue
        name = k.group(1).strip('"')
        if name not in node:
            continue  # a line inside a multi-line value
        note = comment(raw[k.end() :]) or ""
        first = _LABEL.search(note)
        label = note[first.start() :] if first else None
        out.append(Entry(join_key([*current, name]), n, node[name], label))
    return out


def matches(value: Any, fact: Any) -> bool:
    if isinstance(fact, dict) and set(fact) == {"prefix"}:
        return isinstance(value, str) and value.startswith(fact["prefix"])
    if isinstance(fact, bool) or isinstance(value, bool):
        return type(fact) is type(value) and fact == value
    return bool(value == fact)


def drift(
    text: str, facts: dict[str, Any], name: str = "manifest", kind: str = "card"
) -> list[str]:
    """Every way the manifest's ``# card:`` (``kind``) values and the table disagree."""
    problems = []
    card = {e.path: e for e in labelled(text) if e.label and e.label.startswith(kind + ":")}
    for path, e in card.items():
        if path not in facts:
            problems.append(
                f"{name}:{e.line}: {path} cites the {kind} but the {kind} table has no fact"
            )
        elif not matches(e.value, facts[path]):
            problems.append(
                f"{name}:{e.line}: {path} = {e.value!r}, the {kind} says {facts[path]!r}"
            )
    for path, fact in facts.items():
        if path not in card:
            problems.append(
                f"{name}: {path} (the {kind}'s {fact!r}) is missing or not cited as {kind}"
            )
    return problems


def unlabelled(text: str) -> list[str]:
    return [f"line {e.line}: {e.path}" for e in labelled(text) if e.label is None]

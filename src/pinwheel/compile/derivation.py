"""One derivation record per build: every input a build reads, hashed once.

Nix's derivation is the model. A build names what it reads (the toolkit and host
compiler, the Python, the declared environment, the build sources' digests, the
build venv's lock, how paths are made canonical, the ``[build]`` values that reach
the compilers) in one frozen :class:`Derivation`; its :attr:`Derivation.key` is the
one canonical digest (:func:`digest`), and the same function hashes every other
record the compile stage keys by (the object store's identity, kept sources, the
check memo, a locked venv's listing), so there is one spelling of "the same inputs"
instead of one per module.

Because the record itself is kept beside what it keys (the workspace stamp holds it),
"why did this rebuild" has one answer: :func:`changed` diffs the record a kept
workspace was built from against this build's, field by field
(``identity.nvcc``, ``config.arches``, ``canonical.method``), and the phase table
says "rebuilt because: FIELD changed".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FORMAT = 1
MAX_FIELDS = 8  # fields named in one "rebuilt because" line; the rest are counted


def canonical(value: Any) -> Any:
    """``value`` as the JSON it is hashed as: mappings with string keys, lists, strings,
    numbers, booleans and None (anything else by its ``str``, as it always was)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def digest(value: Any) -> str:
    """The one canonical digest: sha256 of ``value``'s JSON with sorted keys (the spelling
    every compile key has used, so keys recorded before this module still match)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Derivation:
    """What one component's build reads, as recorded: ``inputs`` is canonical JSON."""

    component: str
    inputs: Mapping[str, Any]

    @classmethod
    def of(cls, component: str, **inputs: Any) -> Derivation:
        return cls(component, canonical(inputs))

    @property
    def key(self) -> str:
        """The key of everything this build reads (a kept workspace is valid for it)."""
        return digest(dict(self.inputs))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "component": self.component, "inputs": dict(self.inputs)}


def changed(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The dotted names of the fields that differ between two records: a mapping is
    compared key by key (a key only one side has is a change), anything else whole."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for name in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{name}" if prefix else str(name)
            if name not in old or name not in new:
                out.append(path)
            else:
                out.extend(changed(old[name], new[name], path))
        return out
    return [] if old == new else [prefix or "(the whole record)"]


def because(fields: list[str]) -> str:
    """``rebuilt because: a, b changed`` (at most :data:`MAX_FIELDS` named)."""
    if not fields:
        return "rebuilt because: unknown (no earlier record)"
    shown = ", ".join(fields[:MAX_FIELDS])
    more = f" and {len(fields) - MAX_FIELDS} more" if len(fields) > MAX_FIELDS else ""
    return f"rebuilt because: {shown}{more} changed"


__all__ = ["FORMAT", "Derivation", "because", "canonical", "changed", "digest"]

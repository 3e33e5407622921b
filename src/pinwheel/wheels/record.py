"""How one wheel was built: the typed record a producer returns beside its wheel.

Kernels and the engine fill the fields they have; the pipeline adds the
compiler-cache numbers. :meth:`BuildRecord.to_json` is what provenance.json
holds for the component (fields that do not apply are left out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class BuildRecord:
    """One component's build facts (every path in them is a placeholder, never this machine's)."""

    source_date_epoch: int
    env: Mapping[str, str]  # what pinwheel set for the build (not the caller's environment)
    arches: tuple[str, ...]
    compiled_inputs: Mapping[str, Any]  # reuse.Recorder: what reached the compilers
    builder: str | None = None  # kernels: "cmake" | "torch"
    version: str | None = None  # engine: the wheel's version
    command: tuple[str, ...] | None = None  # engine: the build command
    torch: str | None = None  # the torch whose headers were compiled in
    torch_index: str | None = None
    reused: Mapping[str, Any] | None = None  # members taken from an earlier wheel
    compiler_cache: Mapping[str, Any] | None = None  # sccache numbers, or why it was off
    canonical: Mapping[str, str] | None = None  # the fixed build path and how it was made
    excluded: tuple[str, ...] | None = None  # engine: paths left out of the export
    requirements: Mapping[str, Any] | None = None  # engine: the hashed build venv
    sources: tuple[Mapping[str, Any], ...] | None = None  # engine: supplied build sources
    network: str | None = None  # engine: "none" | "allowed" | "host (...)"
    # kernels: the build's Python environment: its lock (name, sha256) and every package it
    # imports (name, version, RECORD sha256, from the lock or the machine)
    environment: Mapping[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BuildRecord:
        """What :meth:`to_json` wrote, read back (a kept workspace's last build)."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"build record fields unknown here: {sorted(unknown)}")
        values = dict(data)
        for name in ("arches", "command", "excluded", "sources"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, tuple):
                value = [dict(v) if isinstance(v, Mapping) else v for v in value]
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out

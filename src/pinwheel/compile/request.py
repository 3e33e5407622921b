"""The build stage's request and outcome: what a build is asked, and what it made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel.compile.phases import Phase
from pinwheel.compile.phases import human_lines as phase_lines
from pinwheel.compile.toolchain import (
    ToolchainChoice,
    Toolkit,
)
from pinwheel.manifest import Manifest
from pinwheel.options import HostEnvironment
from pinwheel.source.result import ReplayRequest
from pinwheel.wheels.substitute import Substitution, headline
from pinwheel.wheels.substitute import to_json as substitutions_json
from pinwheel.wheels.wheelset import Built, WheelSet


@dataclass(frozen=True)
class BuildRequest:
    """Everything a build needs, resolved once from flags, environment and manifest."""

    manifest: Manifest
    cache: Path
    out_dir: Path
    host: HostEnvironment = field(repr=False)  # the environment, typed (pinwheel.options.host)
    mirrors: Mapping[str, str] = field(default_factory=dict)
    offline: bool = False
    provision: bool = True
    reach: bool = False  # fetch every upstream the build reads first: one error for all
    replay: ReplayRequest | None = None  # engine: replay this stack, then build its tree
    replayed: Any = None  # ReplayResult of the manifest: build the engine from it
    kernels: tuple[str, ...] | None = None  # names; None = the default ones; () = none
    all_kernels: bool = False
    twice: bool = False  # kernels: build twice, fail unless identical
    source_date_epoch: int | None = None  # kernels: override the source's date
    version: str | None = None  # engine: override (verify-build replays the recorded one)
    engine_epoch: int | None = None  # engine: override SOURCE_DATE_EPOCH (verify-build)
    engine_source: Path | None = None  # engine: build this directory instead of exporting
    wheelhouse: Path | None = None  # offline source of the pinned build requirements
    build_python: str | None = None  # the engine's interpreter without [build.requirements]
    engine_workdir: Path | None = None  # engine: scratch path (default: by manifest and tree)
    toolkit: Toolkit | None = None  # resolved already by this stage (attribute's variants)
    cuda: bool = True  # False: no CUDA toolkit at all (CPU-only projects, stand-in builds)
    compiler_cache: bool = True  # sccache per [build.cache]; False: --no-cache (verify-build)
    reuse_from: str | None = None  # release dir | URL | wheel: reuse unchanged compiled members
    # --substitute: build with this CUDA / gcc instead of [build]'s (recorded, never silent)
    substitute: Mapping[str, str] = field(default_factory=dict)
    # a toolchain choice made already (`pinwheel toolchain`'s survey, which reports a missing
    # gcc or Python beside the toolkit rather than stopping at them); None: the stage chooses
    chosen: ToolchainChoice | None = None


@dataclass(frozen=True)
class BuildOutcome:
    toolkit: Toolkit | None
    built: tuple[Built, ...]
    wheels: WheelSet
    twice: Mapping[str, float] = field(default_factory=dict)  # kernel -> first build seconds
    substitutions: tuple[Substitution, ...] = ()  # the toolchain [build] pins, replaced on purpose
    phases: tuple[Phase, ...] = ()  # each step timed, with what it did and skipped
    replayed: Any = None  # the ReplayResult the engine was built from (None: no replay)

    def to_json(self) -> dict[str, Any]:
        floors = {w.wheel: w.floor.to_json() for w in self.wheels.report.wheels}
        return {
            "phases": [p.to_json() for p in self.phases],
            "toolkit": self.toolkit.facts() if self.toolkit else None,
            "substitutions": substitutions_json(self.substitutions),
            **self.wheels.to_json(),
            "components": [
                {
                    "name": b.component,
                    "kind": b.kind,
                    "wheel": b.wheel.name,
                    "sha256": self.wheels.wheels[b.wheel.name],
                    "seconds": round(b.seconds, 1),
                    "first_build_seconds": self.twice.get(b.component),
                    "reproduced": b.component in self.twice,
                    "compiler_cache": b.build.compiler_cache,
                    "reused": sorted((b.build.reused or {}).get("members", {})),
                    "floor": floors.get(b.wheel.name),
                    **dict(b.source),
                }
                for b in self.built
            ],
        }

    def human_lines(self) -> list[str]:
        tk = self.toolkit
        lines = [line] if (line := headline(self.substitutions)) else []
        lines.append(f"CUDA {tk.version} ({tk.source}) at {tk.root}" if tk else "no CUDA toolkit")
        for b in self.built:
            first = self.twice.get(b.component)
            extra = f", first build {first:.1f} s, identical" if first is not None else ""
            lines.append(f"{b.kind} {b.component}: {b.seconds:.1f} s{extra}{_cache_note(b)}")
        return lines + self.wheels.human_lines() + phase_lines(self.phases)


def _cache_note(b: Built) -> str:
    cc = b.build.compiler_cache or {}
    note = ""
    if cc.get("enabled"):
        note = f", compiler cache ({cc.get('backend')}): {cc.get('hits')} hits, "
        note += f"{cc.get('misses')} misses"
    elif cc:
        note = f", no compiler cache: {cc.get('reason')}"
    reused = (b.build.reused or {}).get("members") or {}
    if reused and b.build.reused:
        note += f", reused {len(reused)} compiled member(s) from {b.build.reused['wheel']}"
    return note


__all__ = ["BuildOutcome", "BuildRequest"]

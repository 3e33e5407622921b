"""What a kernel attribution measured, as data: the variants, the timing processes, the
per-step and per-case effects and the outcome
:func:`pinwheel.flows.kernel_attribute.attribute_kernel` returns
(:mod:`pinwheel.flows.kernel_report` writes it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel.manifest import Step
from pinwheel.serve import pairstats

FULL = "full"


@dataclass(frozen=True)
class KernelVariant:
    name: str  # "full", "without-2"
    steps: tuple[int, ...]  # the [[kernel.step]] numbers it replays
    wheel: Path | None = None
    sha256: str | None = None
    seconds: float = 0.0  # build
    site: Path | None = None  # where its wheel is installed
    blocked: str | None = None  # why it could not be built


@dataclass(frozen=True)
class KernelRun:
    """One timing process of one variant."""

    variant: str
    round: int
    times: Mapping[str, tuple[float, ...]]  # case -> ms per call, one per sample
    error: Mapping[str, float]
    seconds: float = 0.0


@dataclass(frozen=True)
class KernelEffect:
    number: int
    label: str
    title: str | None
    case: str
    with_: str
    without: str
    effect: pairstats.Effect | None
    error: tuple[float | None, float | None]  # the case's reported error with, without


@dataclass(frozen=True)
class KernelAttributeOutcome:
    kernel: str
    manifest: Mapping[str, str]
    rounds: int
    samples: int
    iters: int
    variants: tuple[KernelVariant, ...]
    runs: tuple[KernelRun, ...]
    effects: tuple[KernelEffect, ...]
    blocked: tuple[tuple[Step, str], ...]
    settings: Mapping[str, Any]
    files: Mapping[str, str] = field(default_factory=dict)

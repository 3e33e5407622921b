"""What an attribution measured, as data: the servings, the builds, the per-step effects
and the outcome :func:`pinwheel.flows.attribute.attribute` returns
(:mod:`pinwheel.flows.attribute_report` writes it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel.serve import pairstats
from pinwheel.serve.receipt import DecodeSample, FidelityResult, NeedleResult
from pinwheel.source.variants import VariantPlan

SCHEMA = "pinwheel.attribution/1"


@dataclass(frozen=True)
class Serving:
    """One variant served once: its decode samples (and, first round, needles and KLD)."""

    variant: str
    round: int
    command: tuple[str, ...]
    samples: tuple[DecodeSample, ...]
    texts: tuple[str, ...]  # sha256 of each sample's greedy text
    needles: tuple[NeedleResult, ...] = ()
    fidelity: FidelityResult | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Built:
    """A variant's wheel set and what building it cost."""

    variant: str
    wheels: Path
    wheel: str
    sha256: str
    seconds: float  # the engine producer's seconds
    wall_s: float  # the whole build() call
    reused: tuple[str, ...]  # compiled members taken from the full stack's wheel
    changed: tuple[str, ...]  # files that differ from the tree built before it
    venv: Path | None = None
    install: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class StepEffect:
    number: int
    label: str
    title: str | None
    with_: str
    without: str
    ms_per_pass: pairstats.Effect | None
    acceptance: pairstats.Effect | None
    tok_s: pairstats.Effect | None
    kld: tuple[float | None, float | None]  # mean KLD with, without (first round)
    needles: tuple[str, str]  # "2/2 pass" with, without
    text: str  # "same" | "differs" | "unmeasured"

    @property
    def delta_kld(self) -> float | None:
        a, b = self.kld
        return a - b if a is not None and b is not None else None


@dataclass(frozen=True)
class AttributeOutcome:
    manifest: Mapping[str, str]
    mode: str
    rounds: int
    samples: int
    plan: VariantPlan = field(repr=False)
    builds: tuple[Built, ...]
    servings: tuple[Serving, ...]
    effects: tuple[StepEffect, ...]
    settings: Mapping[str, Any]
    files: Mapping[str, str] = field(default_factory=dict)  # kind -> file name in out

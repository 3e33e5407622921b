"""``pinwheel attribute --kernel NAME``: what each ``[[kernel.step]]`` does to the kernels'
times, with the statistics and report of the engine's steps.

In: a :class:`KernelAttributeRequest` (the kernel, the build request as ``pinwheel
kernels`` makes it, a timing program and the Python that runs it). Out: a
:class:`KernelAttributeOutcome`, written to ``--out`` as ``attribution.json`` and
``attribution.md`` (:mod:`pinwheel.flows.kernel_report`; the data:
:mod:`pinwheel.flows.kernel_attribution`).

1. **Variants**: the component with every step (``full``) and, per attributed step,
   without it (``without-N``, N the step's number in the ``[[kernel]]``); the pinned
   ``tree`` is dropped from the variants, which no longer end at it.
2. **Builds**: each through :func:`pinwheel.compile.pipeline.build` with that kernel
   only, in the component's one kept workspace: a variant after the first recompiles what
   its step changed. A variant whose replay fails is reported, not measured.
3. **Install**: each wheel into its own directory (``pip install --target``, by the
   timing Python).
4. **Time**, in a balanced order (:func:`pinwheel.serve.pairstats.balanced_order`): per
   round every variant's timing program runs once, as its own process, with the
   variant's directory as ``PYTHONPATH``: ``PYTHON PROGRAM --samples S --iters I``
   prints one line ``RESULT {"times": {"case": [ms, ...]}, "error": {"case": x}}`` (S
   samples per case; ``error``: optional, e.g. the largest |difference| from a reference).
5. **Statistics**: the unit is the process (the start): per step and case, one difference
   per round of the per-process means (with - without), a t interval over rounds, verdicts
   by Holm over every step and case, the smallest effect the design detects.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel import confine, runner, untrusted
from pinwheel.compile.pipeline import BuildRequest, build
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.flows.kernel_attribution import (
    FULL,
    KernelAttributeOutcome,
    KernelEffect,
    KernelRun,
    KernelVariant,
)
from pinwheel.manifest import Manifest, Step
from pinwheel.manifest.build import KernelSpec
from pinwheel.progress import SILENT, Reporter
from pinwheel.serve import pairstats

MAX_CASES = 256  # cases one timing program may report
MAX_SAMPLES = 1000
MAX_ITERS = 1_000_000


class KernelTimingError(PinwheelError):
    """A timing program printed something other than its one RESULT line."""


RESULT = untrusted.Kind(
    name="kernel timing result",
    max_bytes=4 * 1024 * 1024,
    max_depth=4,
    error=KernelTimingError,
    next='fix the timing program: one line RESULT {"times": {"case": [ms, ...]}}',
)


@dataclass(frozen=True)
class KernelAttributeRequest:
    """One kernel attribution, resolved once by the CLI."""

    build: BuildRequest  # as `pinwheel kernels` makes it; per variant manifest, kernels
    #                      and out_dir are set here
    kernel: str  # the [[kernel]] name
    out: Path
    timing: Path  # the timing program
    python: Path  # the Python that runs it (torch with CUDA, the kernel's dependencies)
    environ: Mapping[str, str] = field(repr=False)
    steps: tuple[int, ...] | None = None  # [[kernel.step]] numbers; None: every step
    rounds: int | None = None  # None: the smallest balanced number >= 4
    samples: int = 4  # per case and process
    iters: int = 50  # calls per sample
    confidence: float = 0.95
    min_effect_ms: float = 0.0
    timeout_s: float = 900.0  # one timing process


def attribute_kernel(
    request: KernelAttributeRequest, reporter: Reporter = SILENT
) -> KernelAttributeOutcome:
    """Build every variant, install, time in a balanced order, compare; write the report."""
    from pinwheel.flows.attribute import design_rounds
    from pinwheel.flows.kernel_report import write_outputs

    check(request)
    manifest = request.build.manifest
    spec, chosen = kernel_steps(manifest, request.kernel, request.steps)
    design_rounds(request.rounds, 1 + len(chosen))  # before any work: a blocked step may
    #                                                 change the count, checked again below
    out = request.out.absolute()
    confine.mkdirs(out.parent, out)
    built = build_kernel_variants(request, kernel_variants(spec, chosen), out, reporter)
    ready = [v for v in built if v.wheel is not None]
    rounds = design_rounds(request.rounds, len(ready))
    ready = install_sites(request, ready, out, reporter)
    runs = time_variants(request, ready, rounds, reporter)
    names = {v.name for v in ready}
    steps = [s for s in chosen if f"without-{s.number}" in names]
    blocked = tuple(
        (s, v.blocked or "not built")
        for s in chosen
        for v in built
        if v.name == f"without-{s.number}" and v.wheel is None
    )
    outcome = KernelAttributeOutcome(
        kernel=request.kernel,
        manifest={"name": manifest.name, "path": manifest.path.name, "sha256": manifest.sha256},
        rounds=rounds,
        samples=request.samples,
        iters=request.iters,
        variants=tuple(ready) + tuple(v for v in built if v.wheel is None),
        runs=tuple(runs),
        effects=kernel_effects(steps, runs, request.confidence, request.min_effect_ms, len(ready)),
        blocked=blocked,
        settings=settings(request, len(ready)),
    )
    files = write_outputs(outcome, out)
    return dataclasses.replace(outcome, files=files)


def settings(request: KernelAttributeRequest, variants: int) -> dict[str, Any]:
    from pinwheel.flows.attribute import ORDER

    return {
        "timing": request.timing.name,
        "python": str(request.python),
        "confidence": request.confidence,
        "min_effect_ms": request.min_effect_ms,
        "order": ORDER.replace("server start", "process"),
        "unit": "the process: one difference per round (mean of its samples, with - without)",
        "method": pairstats.METHOD,
        "rounds_needed": pairstats.rounds_needed(variants),
    }


def check(request: KernelAttributeRequest) -> None:
    for flag, value, top in (
        ("--rounds", request.rounds, 1000),
        ("--samples", request.samples, MAX_SAMPLES),
        ("--iters", request.iters, MAX_ITERS),
    ):
        if value is not None and not 1 <= value <= top:
            raise UsageError(
                f"{flag} {value} is outside 1..{top}", where=flag, next=f"pass e.g. {flag} 4"
            )
    if not math.isfinite(request.min_effect_ms) or request.min_effect_ms < 0:
        raise UsageError(
            "--min-effect-ms must be a number >= 0",
            where="--min-effect-ms",
            next="pass e.g. --min-effect-ms 0.01, or leave it out",
        )
    pairstats.check_confidence(request.confidence)
    if not request.timing.is_absolute() or not request.timing.is_file():
        raise UsageError(
            f"the timing program {request.timing} is not a file",
            where="--timing",
            next="pass the program that times the kernel, e.g. "
            "--timing bench/kernel_times_exllamav3.py",
        )


# --------------------------------------------------------------------------- variants


def kernel_steps(
    manifest: Manifest, name: str, wanted: Sequence[int] | None
) -> tuple[KernelSpec, tuple[Step, ...]]:
    """The [[kernel]] called ``name`` and the steps to attribute (usage errors name them)."""
    specs = {k.name: k for k in manifest.kernels}
    spec = specs.get(name)
    if spec is None:
        known = ", ".join(sorted(specs)) or "none"
        raise UsageError(
            f"no [[kernel]] named {name!r} in {manifest.path.name} (it has: {known})",
            where="--kernel",
            next="pass one of the [[kernel]] names",
        )
    if not spec.steps:
        raise UsageError(
            f"[[kernel]] {name} has no [[kernel.step]]: nothing to attribute",
            where=spec.where,
            next="add the PR steps to the kernel, then run `pinwheel attribute --kernel`",
        )
    if wanted is None:
        return spec, spec.steps
    known_numbers = {s.number for s in spec.steps}
    unknown = sorted(set(wanted) - known_numbers)
    if unknown:
        raise UsageError(
            f"no step {', '.join(map(str, unknown))} in [[kernel]] {name} "
            f"(it has steps 1-{len(spec.steps)})",
            where="--step",
            next="pass [[kernel.step]] numbers as `pinwheel plan` lists them",
        )
    return spec, tuple(s for s in spec.steps if s.number in set(wanted))


def kernel_variants(spec: KernelSpec, chosen: Sequence[Step]) -> list[tuple[str, KernelSpec]]:
    """``full`` (the component as pinned) and ``without-N`` per chosen step (no tree pin)."""
    out = [(FULL, spec)]
    for step in chosen:
        keep = tuple(s for s in spec.steps if s.number != step.number)
        out.append((f"without-{step.number}", dataclasses.replace(spec, steps=keep, tree=None)))
    return out


def build_kernel_variants(
    request: KernelAttributeRequest,
    variants: Sequence[tuple[str, KernelSpec]],
    out: Path,
    reporter: Reporter = SILENT,
) -> list[KernelVariant]:
    """Each variant's wheel under ``out/variants/NAME/wheels``; the full one's failure raises,
    another's is kept as why it is blocked."""
    manifest = request.build.manifest
    built = []
    for name, spec in variants:
        kernels = tuple(spec if k.name == spec.name else k for k in manifest.kernels)
        req = dataclasses.replace(
            request.build,
            manifest=dataclasses.replace(manifest, kernels=kernels),
            kernels=(spec.name,),
            out_dir=out / "variants" / name / "wheels",
        )
        steps = tuple(s.number for s in spec.steps)
        reporter.info(f"building {spec.name} {name} (steps {', '.join(map(str, steps)) or '-'})")
        started = time.monotonic()
        try:
            outcome = build(req, reporter)
        except PinwheelError as exc:
            if name == FULL:
                raise
            built.append(KernelVariant(name, steps, blocked=exc.what))
            continue
        kernel = next(b for b in outcome.built if b.component == spec.name)
        wheel = req.out_dir / kernel.wheel.name
        built.append(
            KernelVariant(
                name,
                steps,
                wheel=wheel,
                sha256=outcome.wheels.wheels[kernel.wheel.name],
                seconds=time.monotonic() - started,
            )
        )
    return built


def install_sites(
    request: KernelAttributeRequest,
    variants: Sequence[KernelVariant],
    out: Path,
    reporter: Reporter = SILENT,
) -> list[KernelVariant]:
    """Each variant's wheel into ``out/variants/NAME/site`` (``pip install --target``)."""
    done = []
    for v in variants:
        assert v.wheel is not None
        site = out / "variants" / v.name / "site"
        confine.inside(out, site, what="variant site")
        if site.exists():
            from pinwheel.fsutil import remove_tree

            remove_tree(site)
        runner.run(
            runner.Command(
                (str(request.python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                 "--target", str(site), str(v.wheel)),
                what=f"pip install {v.name}",
                env=request.environ,
                where=str(v.wheel),
                next=f"check that {request.python} has pip",
            ),
            reporter,
        )  # fmt: skip
        done.append(dataclasses.replace(v, site=site))
    return done


# --------------------------------------------------------------------------- timing


def time_variants(
    request: KernelAttributeRequest,
    variants: Sequence[KernelVariant],
    rounds: int,
    reporter: Reporter = SILENT,
) -> list[KernelRun]:
    """Per round, every variant's timing process in the round's balanced order."""
    runs = []
    for r, order in enumerate(pairstats.balanced_order(len(variants), rounds)):
        for v in (variants[i] for i in order):
            reporter.info(f"round {r + 1}/{rounds}: timing {v.name}")
            runs.append(time_once(request, v, r, reporter))
    return runs


def time_once(
    request: KernelAttributeRequest, v: KernelVariant, r: int, reporter: Reporter = SILENT
) -> KernelRun:
    assert v.site is not None
    started = time.monotonic()
    done = runner.run(
        runner.Command(
            (str(request.python), str(request.timing), "--samples", str(request.samples),
             "--iters", str(request.iters)),
            what=f"timing {v.name}",
            env={**request.environ, "PYTHONPATH": str(v.site)},
            timeout=request.timeout_s,
            where=f"{v.name}, round {r + 1}",
            next=f"run the timing program by hand with PYTHONPATH={v.site}",
        ),
        reporter,
    )  # fmt: skip
    where = f"{request.timing.name} for {v.name}, round {r + 1}"
    times, error = parse_result(done.stdout, where, request.samples)
    return KernelRun(v.name, r, times, error, time.monotonic() - started)


def parse_result(
    stdout: bytes, where: str, samples: int
) -> tuple[dict[str, tuple[float, ...]], dict[str, float]]:
    """The ``RESULT {...}`` line of a timing program, checked: cases, finite times."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(b"RESULT ")]
    if len(lines) != 1:
        raise RESULT.error(
            f"the timing program printed {len(lines)} RESULT line(s), not 1",
            where=where,
            next='print one line: RESULT {"times": {"case": [ms, ...]}}',
        )
    doc = untrusted.parse_json(lines[0][7:], RESULT, where)
    times_doc = doc.get("times") if isinstance(doc, dict) else None
    error_doc = doc.get("error", {}) if isinstance(doc, dict) else None
    if not isinstance(times_doc, dict) or not isinstance(error_doc, dict):
        raise _bad(where, "no object 'times' (and 'error', if any) in it")
    if not times_doc or len(times_doc) > MAX_CASES:
        raise _bad(where, f"{len(times_doc)} cases, not 1..{MAX_CASES}")
    times: dict[str, tuple[float, ...]] = {}
    for case, values in times_doc.items():
        if not (isinstance(values, list) and len(values) == samples):
            raise _bad(where, f"case {case[:80]!r}: not a list of {samples} times")
        if not all(_number(x) and x >= 0 for x in values):
            raise _bad(where, f"case {case[:80]!r}: a time that is not a number >= 0")
        times[_case(case, where)] = tuple(float(x) for x in values)
    error = {_case(k, where): float(x) for k, x in error_doc.items() if _number(x)}
    return times, error


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _case(name: str, where: str) -> str:
    if not (0 < len(name) <= 200 and name.isprintable()):
        raise _bad(where, f"case name {name[:80]!r} is empty, too long or not printable")
    return name


def _bad(where: str, what: str) -> PinwheelError:
    return RESULT.error(f"kernel timing result: {what}", where=where, next=RESULT.next)


# --------------------------------------------------------------------------- effects


def kernel_effects(
    steps: Sequence[Step],
    runs: Sequence[KernelRun],
    confidence: float,
    min_effect_ms: float,
    variants: int,
) -> tuple[KernelEffect, ...]:
    """Per step and case: the effect over processes, Holm over every step and case."""
    needed = pairstats.rounds_needed(variants)
    cases = sorted({c for run in runs if run.variant == FULL for c in run.times})
    rows: list[tuple[Step, str, pairstats.Effect | None]] = []
    for step in steps:
        without = f"without-{step.number}"
        for case in cases:
            a, b = _starts(runs, FULL, case), _starts(runs, without, case)
            shared = sorted(set(a) & set(b))
            effect = pairstats.by_starts(
                [a[r] for r in shared], [b[r] for r in shared],
                confidence=confidence, needed=needed,
            )  # fmt: skip
            rows.append((step, case, effect))
    adjusted = pairstats.holm([e for *_, e in rows], min_effect=min_effect_ms)
    return tuple(
        KernelEffect(
            number=step.number,
            label=step.label,
            title=step.title,
            case=case,
            with_=FULL,
            without=f"without-{step.number}",
            effect=effect,
            error=(_error(runs, FULL, case), _error(runs, f"without-{step.number}", case)),
        )
        for (step, case, _), effect in zip(rows, adjusted, strict=True)
    )


def _starts(runs: Sequence[KernelRun], variant: str, case: str) -> dict[int, list[float]]:
    return {r.round: list(r.times[case]) for r in runs if r.variant == variant and case in r.times}


def _error(runs: Sequence[KernelRun], variant: str, case: str) -> float | None:
    values = [r.error[case] for r in runs if r.variant == variant and case in r.error]
    return max(values) if values else None

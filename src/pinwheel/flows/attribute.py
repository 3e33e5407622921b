"""``pinwheel attribute``: what each step of the stack does, measured on the serving box.

In: an :class:`AttributeRequest` (the variants to replay, the build request of the full
stack as ``pinwheel build`` would make it, the model, rounds and samples). Out: an
:class:`AttributeOutcome`, written to ``--out`` as ``attribution.json``, ``attribution.md``
and a plot (:mod:`pinwheel.flows.attribute_report`).

1. **Variants** (:mod:`pinwheel.source.variants`): the full stack and, per attributed
   step, the stack without it (or the prefixes), replayed in memory; a step that cannot
   be left out is reported with the later step and the files it conflicts in.
2. **Builds**: the full stack first, then each variant, all through
   :func:`pinwheel.compile.pipeline.build` in the engine's one kept workspace (the
   export is updated in place, only what changed is rebuilt) and with the full stack's
   wheels as ``reuse_from`` (a step that touched no compiled input takes the compiled
   members from the full stack's wheel). Each variant's build seconds are recorded.
3. **Install**: each wheel set into its own venv (:func:`pinwheel.release.install.install`).
4. **Serve**, interleaved: per round every variant is started in turn from its venv with
   the ``[serve]`` profile's launch command, in the round's row of a Williams design
   (:func:`pinwheel.serve.pairstats.balanced_order`: every variant in every place once per
   block of rounds, so an effect of the place cancels), measured, stopped. Per serving:
   ``[qualify]`` warm-up, then ``samples`` greedy decodes of ``[qualify].max_tokens``
   tokens, each measured as ``pinwheel qualify`` measures it
   (:func:`pinwheel.serve.qualify.decode_sample`: ms per forward pass from the engine-step
   counter, acceptance length from the spec-decode counters); in the first round also the
   needles of the ``[qualify.profile]`` and the KLD on the pinned panel.
5. **Statistics** (:mod:`pinwheel.serve.pairstats`): the unit is the server start. Per
   step and metric (ms per pass, acceptance length, tok/s), one difference per round (the
   with-start's mean minus the without-start's), a t interval over rounds, verdicts by
   Holm over the steps, and the smallest effect the design could detect; fewer rounds
   than a verdict needs are reported as "not enough starts". The greedy text of each
   prompt is compared too (same or differs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel import confine
from pinwheel.compile.pipeline import (
    BuildOutcome,
    BuildRequest,
    build,
    engine_workdir,
    toolchain,
)
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.flows.attribution import AttributeOutcome, Built, Serving, StepEffect
from pinwheel.fsutil import remove_tree
from pinwheel.manifest import Manifest
from pinwheel.manifest.serve import QualifyConfig, QualifyProfile, ServeConfig, ServeProfile
from pinwheel.progress import SILENT, Reporter
from pinwheel.release.install import InstallRequest, install, venv_python
from pinwheel.serve import capture, fidelity, pairstats
from pinwheel.serve.client import Client, Stream
from pinwheel.serve.qualify import decode_sample, run_needles, wait_healthy, wait_idle
from pinwheel.serve.receipt import DecodeSample, NeedleResult
from pinwheel.serve.recipe import launch
from pinwheel.serve.supervise import free_port, started_server
from pinwheel.source.variants import FULL, Variant, VariantPlan, VariantRequest, replay_variants

MAX_ROUNDS = 1000
MAX_SAMPLES = 1000
DEFAULT_ROUNDS = 4  # at least: rounded up to a whole block of the balanced order


@dataclass(frozen=True)
class AttributeRequest:
    """One attribution, resolved once by the CLI (flags, environment, manifest)."""

    variants: VariantRequest
    build: BuildRequest  # the full stack's, as `pinwheel build` makes it; per variant:
    #                      replayed, out_dir, reuse_from and kernels=() are set here
    out: Path
    model: str  # what the [serve] profile's --model gets
    environ: Mapping[str, str] = field(repr=False)  # the servers' environment
    profile: str | None = None  # [serve.profile.NAME]; None: [serve].default
    rounds: int | None = None  # None: the smallest balanced number >= DEFAULT_ROUNDS
    samples: int = 4  # decodes per serving
    installer: str = "auto"
    torch_backend: str | None = None
    no_deps: bool = False
    confidence: float = 0.95
    min_effect_ms: float = 0.0  # a |delta ms/pass| below this is within noise (0: CI only)
    needles: bool = True  # the [qualify.profile]'s needles, first round
    kld: bool = True  # the pinned panel's KLD, first round


def attribute(request: AttributeRequest, reporter: Reporter = SILENT) -> AttributeOutcome:
    """Replay, build, install, serve interleaved, compare; write the report; return it."""
    from pinwheel.flows.attribute_report import write_outputs

    manifest = request.variants.replay.manifest
    scfg, sprof, qcfg, qprof = _configs(manifest, request.profile)
    _check(request)
    out = request.out.absolute()
    plan = replay_variants(request.variants, reporter)
    confine.mkdirs(out.parent, out)
    for step, why in plan.blocked:
        reporter.info(f"{step.label} cannot be left out: {why.label}: {why.what}")
    needed = [v for v in plan.variants if v.result is not None and _used(plan, v.name)]
    rounds = design_rounds(request.rounds, len(needed))
    request = dataclasses.replace(request, rounds=rounds)
    builds = install_variants(
        request, build_variants(request, needed, out, reporter), out, reporter
    )
    servings = _serve_all(request, builds, out, scfg, sprof, qcfg, qprof, reporter)
    effects = step_effects(request, plan, servings, len(builds))
    outcome = AttributeOutcome(
        manifest={"name": manifest.name, "path": manifest.path.name, "sha256": manifest.sha256},
        mode=plan.mode,
        rounds=rounds,
        samples=request.samples,
        plan=plan,
        builds=tuple(builds),
        servings=tuple(servings),
        effects=effects,
        settings={
            "profile": sprof.name,
            "model": request.model,
            "max_tokens": qcfg.max_tokens,
            "warmup": qcfg.warmup,
            "prompts": len(qcfg.prompts),
            "confidence": request.confidence,
            "min_effect_ms": request.min_effect_ms,
            "order": ORDER,
            "unit": UNIT,
            "method": pairstats.METHOD,
            "rounds_needed": pairstats.rounds_needed(len(builds)),
        },
    )
    files = write_outputs(outcome, out)
    return dataclasses.replace(outcome, files=files)


# --------------------------------------------------------------------------- checks


def _configs(
    manifest: Manifest, profile: str | None
) -> tuple[ServeConfig, ServeProfile, QualifyConfig, QualifyProfile | None]:
    scfg = manifest.require("serve")
    if scfg.engine.image is not None:
        raise UsageError(
            "[serve.engine] runs an image: an attribution installs each variant's wheels "
            "into a venv and serves from it",
            where=f"{manifest.path.name} [serve.engine]",
            next="attribute a venv engine ([serve.engine] module), not a container image",
        )
    sprof = scfg.profile(profile)
    qcfg = manifest.require("qualify")
    qprof = next((p for p in qcfg.profiles if p.name == sprof.name), None)
    return scfg, sprof, qcfg, qprof


ORDER = (
    "each round starts every variant once, in the round's row of a Williams design: every "
    "variant takes every place once per block of rounds"
)
UNIT = "the server start: one difference per round (mean of its samples, with - without)"


def design_rounds(rounds: int | None, variants: int) -> int:
    """``rounds``, checked to balance the order of ``variants``; None: the default."""
    if rounds is None:
        b = pairstats.block(variants)
        return b * -(-DEFAULT_ROUNDS // b)
    pairstats.check_rounds(rounds, variants)
    return rounds


def _check(request: AttributeRequest) -> None:
    if request.rounds is not None and not 1 <= request.rounds <= MAX_ROUNDS:
        raise UsageError(
            f"--rounds {request.rounds} is outside 1..{MAX_ROUNDS}",
            where="--rounds",
            next="pass e.g. --rounds 5",
        )
    if not 1 <= request.samples <= MAX_SAMPLES:
        raise UsageError(
            f"--samples {request.samples} is outside 1..{MAX_SAMPLES}",
            where="--samples",
            next="pass e.g. --samples 4",
        )
    if request.min_effect_ms < 0 or request.min_effect_ms != request.min_effect_ms:
        raise UsageError(
            "--min-effect-ms must be a number >= 0",
            where="--min-effect-ms",
            next="pass e.g. --min-effect-ms 0.05, or leave it out",
        )
    pairstats.check_confidence(request.confidence)
    if not request.variants.replay.manifest.has_engine:
        raise UsageError(
            "the manifest pins no engine stack ([upstream] + [[step]]): nothing to attribute",
            where=request.variants.replay.manifest.path.name,
            next="attribute a manifest with an engine stack",
        )


def _used(plan: VariantPlan, name: str) -> bool:
    return name == FULL or any(name in (c.with_, c.without) for c in plan.comparisons)


# --------------------------------------------------------------------------- build + install


def build_variants(
    request: AttributeRequest, variants: Sequence[Variant], out: Path, reporter: Reporter = SILENT
) -> list[Built]:
    """The full stack first (``variants[0]``), then each variant in the same kept workspace,
    with the full stack's wheels as ``reuse_from``; wheels under ``out/variants/NAME/wheels``."""
    template = request.build
    if template.toolkit is None and template.cuda:  # once, not once per variant
        template = dataclasses.replace(template, toolkit=toolchain(template, reporter).toolkit)
    work = engine_workdir(template)
    full_wheels = out / "variants" / FULL / "wheels"
    builds: list[Built] = []
    previous: Variant | None = None
    for v in variants:
        assert v.result is not None
        wheels = out / "variants" / v.name / "wheels"
        reuse_from = template.reuse_from if v.name == FULL else str(full_wheels)
        req = dataclasses.replace(
            template,
            replayed=v.result,
            out_dir=wheels,
            kernels=(),
            engine_workdir=work,
            reuse_from=reuse_from,
        )
        changed = _changed(previous, v)
        reporter.info(
            f"building {v.name} (tree {v.result.tree[:12]}; {len(changed)} file(s) differ "
            f"from the tree built before it)"
        )
        started = time.monotonic()
        outcome = build(req, reporter)
        wall = time.monotonic() - started
        builds.append(_built(v.name, wheels, outcome, wall, changed))
        previous = v
    return builds


def install_variants(
    request: AttributeRequest, built: Sequence[Built], out: Path, reporter: Reporter = SILENT
) -> list[Built]:
    """Each variant's wheel set into its own venv, ``out/variants/NAME/venv``."""
    builds = list(built)
    for i, b in enumerate(builds):
        venv = out / "variants" / b.variant / "venv"
        if venv.exists():  # a venv from an earlier run may already hold another build
            confine.inside(out, venv, what="variant venv")
            remove_tree(venv)
        reporter.info(f"installing {b.variant} into {venv}")
        done = install(
            InstallRequest(
                wheel_dir=b.wheels,
                venv=venv,
                torch_backend=request.torch_backend,
                installer=request.installer,
                no_deps=request.no_deps,
                # wheels this command built itself a moment ago, in its own output: no
                # release server stands between, so there is no SHA256SUMS.sig to check
                allow_unsigned=True,
            )
        )
        builds[i] = dataclasses.replace(b, venv=venv, install=done.commands)
    return builds


def _changed(previous: Variant | None, v: Variant) -> tuple[str, ...]:
    if previous is None or previous.result is None or v.result is None:
        return ()
    from pinwheel.source.variants import changed_files

    return changed_files(v.result.repo_path, previous.result.tree, v.result.tree)


def _built(
    name: str, wheels: Path, outcome: BuildOutcome, wall: float, changed: tuple[str, ...]
) -> Built:
    engine = next(b for b in outcome.built if b.kind == "engine")
    reused = tuple(sorted((engine.build.reused or {}).get("members", {})))
    return Built(
        variant=name,
        wheels=wheels,
        wheel=engine.wheel.name,
        sha256=outcome.wheels.wheels[engine.wheel.name],
        seconds=engine.seconds,
        wall_s=wall,
        reused=reused,
        changed=changed,
    )


# --------------------------------------------------------------------------- serve


def _serve_all(
    request: AttributeRequest,
    builds: Sequence[Built],
    out: Path,
    scfg: ServeConfig,
    sprof: ServeProfile,
    qcfg: QualifyConfig,
    qprof: QualifyProfile | None,
    reporter: Reporter,
) -> list[Serving]:
    servings = []
    assert request.rounds is not None
    for r, order in enumerate(pairstats.balanced_order(len(builds), request.rounds)):
        for b in (builds[i] for i in order):
            reporter.info(f"round {r + 1}/{request.rounds}: serving {b.variant}")
            servings.append(_serve(request, b, r, out, scfg, sprof, qcfg, qprof, reporter))
    return servings


def _serve(
    request: AttributeRequest,
    b: Built,
    r: int,
    out: Path,
    scfg: ServeConfig,
    sprof: ServeProfile,
    qcfg: QualifyConfig,
    qprof: QualifyProfile | None,
    reporter: Reporter,
) -> Serving:
    assert b.venv is not None
    port = free_port()
    run = launch(
        scfg,
        sprof,
        model=request.model,
        python=str(venv_python(b.venv)),
        host="127.0.0.1",
        port=port,
    )
    fid = qcfg.fidelity if request.kld and r == 0 else None
    if fid is not None and fid.panel is not None:
        run = dataclasses.replace(run, argv=run.argv + capture.server_flags(fid, sprof.args))
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    streams: list[Stream] = []
    samples: list[DecodeSample] = []
    needles: tuple[NeedleResult, ...] = ()
    fid_result = None
    logs = out / "variants" / b.variant / f"round-{r + 1}"
    with started_server(run, logs, environ=request.environ, url=url, reporter=reporter) as target:
        client = Client(url)
        try:
            wait_healthy(client, target, qcfg.health_timeout_s, poll_s=0.2, reporter=reporter)
            models = client.models()
            model = str(models[0]["id"])
            wait_idle(client, qcfg.idle_timeout_s)
            for w in range(qcfg.warmup):
                client.stream_chat(model, qcfg.prompts[w % len(qcfg.prompts)], qcfg.max_tokens)
            for i in range(request.samples):
                p = i % len(qcfg.prompts)
                samples.append(
                    decode_sample(client, model, qcfg.prompts[p], qcfg.max_tokens, p, r, streams)
                )
            if r == 0 and request.needles and qprof is not None and qprof.needle_lengths:
                max_len = models[0].get("max_model_len")
                needles = run_needles(
                    client, model, qprof, max_len if isinstance(max_len, int) else None, reporter
                )
            if fid is not None and fid.panel is not None:
                fid_result = fidelity.measure(client, model, fid)
        except PinwheelError as exc:
            raise PinwheelError(
                f"{b.variant}, round {r + 1}: {exc.what}",
                where=exc.where or url,
                next=f"look at the server log {logs / 'server.log'}; {exc.next or ''}".strip(),
            ) from None
        finally:
            client.close()
    texts = tuple(hashlib.sha256(s.text.encode()).hexdigest() for s in streams)
    return Serving(
        b.variant,
        r,
        run.argv,
        tuple(samples),
        texts,
        needles,
        fid_result,
        time.monotonic() - started,
    )


# --------------------------------------------------------------------------- effects


def _starts(servings: Sequence[Serving], name: str, metric: str) -> dict[int, list[float]]:
    """Per round, the ``metric`` of each sample of ``name``'s start."""
    out: dict[int, list[float]] = {}
    for s in servings:
        if s.variant != name:
            continue
        values = [getattr(d, metric) for d in s.samples]
        out[s.round] = [float(v) for v in values if v is not None]
    return out


def _pair(
    servings: Sequence[Serving],
    with_: str,
    without: str,
    metric: str,
    confidence: float,
    needed: int,
) -> pairstats.Effect | None:
    a, b = _starts(servings, with_, metric), _starts(servings, without, metric)
    rounds = sorted(set(a) & set(b))
    return pairstats.by_starts(
        [a[r] for r in rounds], [b[r] for r in rounds], confidence=confidence, needed=needed
    )


METRICS = ("ms_per_pass", "acceptance_length", "tok_s")


def step_effects(
    request: AttributeRequest, plan: VariantPlan, servings: Sequence[Serving], variants: int
) -> tuple[StepEffect, ...]:
    """Every comparison's effects, each metric corrected by Holm over the steps."""
    needed = pairstats.rounds_needed(variants)
    by_metric = {}
    for metric in METRICS:
        raw = [
            _pair(servings, c.with_, c.without, metric, request.confidence, needed)
            for c in plan.comparisons
        ]
        floor = request.min_effect_ms if metric == "ms_per_pass" else 0.0
        by_metric[metric] = pairstats.holm(raw, min_effect=floor)
    return tuple(
        _effect(c, servings, *(by_metric[m][i] for m in METRICS))
        for i, c in enumerate(plan.comparisons)
    )


def _first(servings: Sequence[Serving], name: str) -> Serving | None:
    return next((s for s in servings if s.variant == name and s.round == 0), None)


def _needles(s: Serving | None) -> str:
    if s is None or not s.needles:
        return "not run"
    passed = sum(n.status == "pass" for n in s.needles)
    counted = sum(n.status != "skipped" for n in s.needles)
    return f"{passed}/{counted} pass"


def _texts(servings: Sequence[Serving], with_: str, without: str) -> str:
    a = [s.texts for s in servings if s.variant == with_]
    b = [s.texts for s in servings if s.variant == without]
    if not a or not b or not a[0] or not b[0]:
        return "unmeasured"
    return "same" if a[0] == b[0] else "differs"


def _effect(
    c: Any,
    servings: Sequence[Serving],
    ms: pairstats.Effect | None,
    acceptance: pairstats.Effect | None,
    tok_s: pairstats.Effect | None,
) -> StepEffect:
    fa, fb = _first(servings, c.with_), _first(servings, c.without)
    return StepEffect(
        number=c.step.number,
        label=c.step.label,
        title=c.step.title,
        with_=c.with_,
        without=c.without,
        ms_per_pass=ms,
        acceptance=acceptance,
        tok_s=tok_s,
        kld=(
            fa.fidelity.mean_kld if fa is not None and fa.fidelity is not None else None,
            fb.fidelity.mean_kld if fb is not None and fb.fidelity is not None else None,
        ),
        needles=(_needles(fa), _needles(fb)),
        text=_texts(servings, c.with_, c.without),
    )


__all__ = [
    "AttributeOutcome", "AttributeRequest", "StepEffect", "attribute", "build_variants",
    "install_variants",
]  # fmt: skip

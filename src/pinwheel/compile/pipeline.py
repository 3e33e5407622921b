"""The build stage's entry point: a frozen :class:`BuildRequest` in, a :class:`BuildOutcome` out.

Order, cheapest check first: choose the toolchain (``[build]`` after substitutions, its
gcc found: a second), reach every upstream the build reads (all missing commits in one
error), replay the engine stack, resolve the toolkit once (it refuses one that cannot
compile the manifest's arches), build the selected ``[[kernel]]`` wheels, export the
replayed tree and build the engine wheel, then hand every wheel to
:func:`pinwheel.wheels.wheelset.publish` (check -> SHA256SUMS -> provenance ->
``wheels/`` as one set). ``tools/replay build``, ``pinwheel kernels``,
``pinwheel verify-build`` and ``pinwheel attribute`` all come through here;
``pinwheel toolchain`` through :func:`toolchain` (the same choice and resolution).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel import cachelayout, confine, runner, untrusted
from pinwheel.checksums import sha256_file
from pinwheel.compile import (
    canonical,
    checkmemo,
    compcache,
    headerview,
    invalidate,
    keptsources,
    listing,
    lockedvenv,
    objstore,
    reuse,
    workspace,
)
from pinwheel.compile.buildenv import SYSTEM_PATH, engine_base
from pinwheel.compile.buildvenv import READY as BUILD_VENV_READY
from pinwheel.compile.buildvenv import BuildVenv, ensure_build_venv
from pinwheel.compile.derivation import Derivation
from pinwheel.compile.engine import (
    EngineBuildRequest,
    build_engine,
    build_python,
    commit_time,
    engine_version,
)
from pinwheel.compile.kernels import (
    TORCH_VENV_READY,
    BuildOptions,
    build_kernel,
    build_twice,
    select,
)
from pinwheel.compile.phases import Phase, Phases
from pinwheel.compile.phases import human_lines as phase_lines
from pinwheel.compile.sources import plan_env, supply, unpinned
from pinwheel.compile.toolchain import (
    ToolchainChoice,
    Toolkit,
    ToolkitRequest,
    choose,
    resolve_toolkit,
)
from pinwheel.compile.toolchain.choose import ToolchainReport, one_report
from pinwheel.compile.toolchain.pins import LOCKS
from pinwheel.compile.toolchain.pins import MARKER as TOOLKIT_MARKER
from pinwheel.compile.toolchain.survey import cudas_here
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.errors import ManifestError, PinwheelError
from pinwheel.fsutil import atomic_write_text, remove_tree
from pinwheel.manifest import Manifest
from pinwheel.manifest.build import BuildConfig
from pinwheel.manifest.component import Stack, stacks
from pinwheel.manifest.targets import target_problems
from pinwheel.options import HostEnvironment
from pinwheel.progress import SILENT, Reporter
from pinwheel.source.cache import Cache
from pinwheel.source.cache import mark as mark_cache
from pinwheel.source.replay import ReplayRequest, reach_all, replay, replaying
from pinwheel.wheels.check import check_wheels, find_tools, spec_from_build
from pinwheel.wheels.provenance import receipt, toolchain_facts
from pinwheel.wheels.relabel import variant_label
from pinwheel.wheels.substitute import Substitution, apply, headline
from pinwheel.wheels.substitute import to_json as substitutions_json
from pinwheel.wheels.wheelset import Built, WheelSet, publish


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


def build(
    request: BuildRequest, reporter: Reporter = SILENT, phases: Phases | None = None
) -> BuildOutcome:
    """Choose the toolchain, reach the upstreams, replay, resolve the toolkit; then kernels
    and the engine, every wheel checked and published as one set.

    ``phases``: a collector the caller already timed earlier steps into;
    the outcome's ``phases`` are its rows plus this build's."""
    phases = phases if phases is not None else Phases()
    mark_cache(request.cache)  # what `pinwheel cache clean` checks before emptying it
    manifest = request.manifest
    # Before anything else: a bad [build] or a missing gcc fails in a second.
    choice = _choose(request, reporter)
    config = choice.config
    request = dataclasses.replace(request, host=choice.environment(request.host))
    engine = (
        request.replayed is not None
        or request.replay is not None
        or request.engine_source is not None
    )
    specs = select(manifest.kernels, list(request.kernels or []), all_=request.all_kernels)
    if request.kernels == ():
        specs = []
    if not specs and not engine:
        raise ManifestError(
            "nothing to build: no [[kernel]] selected and no engine tree",
            where=manifest.path.name,
            next="add a [[kernel]] table, pass --all for the non-default ones, "
            "or run `tools/replay build` for the engine",
        )
    if request.reach:
        # Fail fast, cheapest first: reach every upstream and resolve every pinned commit
        # (engine and components, all missing ones in one error) before a toolkit download.
        with phases.phase("reach upstreams"):
            reach_all(_reached(request, specs), _cache(request, reporter))
    if request.replay is not None and request.replayed is None:
        with phases.phase("replay"):
            reporter.info(replaying(request.replay.manifest))
            request = dataclasses.replace(request, replayed=replay(request.replay, reporter))
    toolkit = request.toolkit
    if toolkit is None and request.cuda:
        with phases.phase("toolkit"):
            toolkit = _toolkit(request, config, reporter)

    earlier = reuse.candidates(request.reuse_from, request.cache) if request.reuse_from else {}
    cache_plan = compcache.plan(
        config.cache, request.cache, request.host, enabled=request.compiler_cache
    )
    canon = canonical.choose(request.cache, request.host)
    canon = canon.with_toolkit(toolkit.root if toolkit is not None else None)
    canon = canon.with_views(request.cache, foreign_header_dirs(request, config, engine, canon))
    if canon.foreign_headers and not canon.views:
        reporter.info(
            f"{canon.foreign_headers} header directories outside the cache keep this machine's "
            "file times (no mount namespace): their cubins' line tables can differ elsewhere"
        )
    if canon.why:
        reporter.info(f"canonical build path by prefix maps: {canon.why}")
    with phases.phase("compiler cache") as cache_note:
        if cache_plan.disabled:  # off before it starts (--no-cache, config, no binary)
            session = None
            reporter.info(f"building without the compiler cache: {cache_plan.disabled}")
        else:
            with reporter.status(f"starting the compiler cache ({cache_plan.backend})"):
                session, cache_plan = compcache.start(
                    cache_plan,
                    cachelayout.bucket(request.cache, "sccache-run"),
                    request.host,
                    canon,
                )
            if cache_plan.disabled:
                reporter.info(f"building without the compiler cache: {cache_plan.disabled}")
        if session is not None:
            cache_note.did(f"sccache server started ({cache_plan.backend})")
        else:
            cache_note.skip(f"no compiler cache: {cache_plan.disabled}")
        store, why = objstore.for_plan(
            cache_plan, cold=not request.compiler_cache, turned_off=not config.cache.enabled,
            aws=request.host.sccache.aws,
        )
        if store is not None:
            cache_note.did(f"object store: {why}")
        else:
            cache_note.skip(f"object store: {why}")
    # The interpreter the engine builds in: the [build.requirements] venv when there is
    # one, else $PINWHEEL_BUILD_PYTHON or this one. Provenance (python, torch) and the
    # torch pin `install` reads come from it, not from the interpreter running pinwheel.
    venv = None
    if engine and config.requirements is not None:
        with phases.phase("build venv"):
            venv = ensure_build_venv(
                config.requirements,
                request.cache,
                environ=request.host.child,
                offline=request.offline,
                wheelhouse=request.wheelhouse,
                reporter=reporter,
            )
    python = str(venv.python) if venv is not None else build_python(request.build_python, engine)
    try:
        built, twice = _produce(
            Production(
                request=request, config=config, specs=tuple(specs), engine=engine,
                toolkit=toolkit, reporter=reporter, session=session, cache_plan=cache_plan,
                earlier=earlier, canon=canon, venv=venv, phases=phases, store=store,
            )
        )  # fmt: skip
    finally:
        if session is not None:
            session.stop()

    cuobjdump, auditwheel = find_tools(toolkit.root if toolkit else None)
    check_spec = spec_from_build(
        config,
        build_dirs=(str(request.cache),),
        cuobjdump=cuobjdump,
        auditwheel=auditwheel,
    )
    with phases.phase("provenance facts") as note:
        facts = toolchain_facts(
            python,
            toolkit.nvcc if toolkit else None,
            toolkit.version if toolkit else None,
            request.host.cxx,
        )
        note.did("asked the build python and nvcc for their versions")
    payload = receipt(
        manifest,
        request.replayed,
        toolchain=facts,
        arches=[str(a) for a in config.targets],
        pinwheel_env=_own_environment(),
    )
    payload["torch"] = torch_pin(config, facts.torch, built)
    payload["substitutions"] = substitutions_json(choice.substitutions)
    with reporter.status(f"checking {len(built)} wheel(s)"):
        wheels = _publish(request, built, check_spec, payload, phases,
                          label=lambda b: build_variant(manifest, config, toolkit, b))  # fmt: skip
    return BuildOutcome(
        toolkit=toolkit,
        built=wheels.components,
        wheels=wheels,
        twice=twice,
        substitutions=choice.substitutions,
        phases=phases.rows(),
        replayed=request.replayed,
    )


@dataclass(frozen=True)
class ToolkitOutcome:
    """`pinwheel toolchain`: the effective ``[build]`` and the toolkit it builds with."""

    config: BuildConfig
    toolkit: Toolkit
    seconds: float  # finding (or provisioning) and probing the toolkit
    substitutions: tuple[Substitution, ...] = ()


def toolchain(request: BuildRequest, reporter: Reporter = SILENT) -> ToolkitOutcome:
    """The toolchain a build of ``request`` would use (``request.chosen`` when the caller
    chose it already), the toolkit found or provisioned (``request.provision``) and probed:
    the same choice and resolution :func:`build` makes."""
    choice = _choose(request, reporter)
    started = time.monotonic()
    toolkit = _toolkit(request, choice.config, reporter)
    return ToolkitOutcome(choice.config, toolkit, time.monotonic() - started, choice.substitutions)


def _choose(request: BuildRequest, reporter: Reporter) -> ToolchainChoice:
    """``request.chosen`` when the caller chose already (`pinwheel toolchain`'s survey), else
    [build] after --substitute / [build.substitute], its gcc found: fails in a second.
    A substitution is said before anything long runs, when this call resolves the toolkit
    (a build handed one, like attribute's variants, was told already)."""
    if request.chosen is not None:
        return request.chosen
    config = request.manifest.require("build")
    # No usable toolkit, nothing to provision: said now, with gcc's, Python's and the arch
    # table's problems in one report (as `pinwheel toolchain` does), before any fetch.
    more = [] if request.toolkit is not None else _toolkit_problem(request, config)
    try:
        choice = choose(config, request.host, request.substitute)
    except ToolchainError as exc:
        raise one_report([*_problems(exc), *more]) from None
    if request.toolkit is None and (line := headline(choice.substitutions)):
        reporter.info(line)
    if more:
        raise one_report(more)
    return choice


def _problems(exc: ToolchainError) -> list[ToolchainError]:
    """The problems one error reports (a :class:`ToolchainReport` holds several)."""
    return list(exc.parts) if isinstance(exc, ToolchainReport) else [exc]


def _toolkit_problem(request: BuildRequest, config: BuildConfig) -> list[ToolchainError]:
    """Why no toolkit of ``config`` (substitutions applied) would be found or provisioned,
    as resolving it would say; none when one is installed, in the cache or provisionable
    (or when the arch table is wrong: resolving would only repeat that). Runs no download."""
    effective, _ = apply(config, request.substitute, provisionable=tuple(LOCKS))
    if target_problems(effective.cuda, effective.arches, effective.torch, effective.torch_index):
        return []
    seen = cudas_here(effective, request.cache, request.host)
    if any(c.pinned and c.builds and not c.refuses for c in seen if c.state != "unusable"):
        return []
    try:
        _toolkit(dataclasses.replace(request, provision=False), effective, SILENT)
    except ToolchainError as exc:
        return [exc]
    return []


def _toolkit(request: BuildRequest, config: BuildConfig, reporter: Reporter) -> Toolkit:
    """The one place the build stage finds or provisions its CUDA toolkit."""
    with reporter.status(f"resolving CUDA {config.cuda} for {', '.join(config.arches)}"):
        return resolve_toolkit(
            ToolkitRequest(
                config,
                request.cache,
                request.host,
                provision=request.provision,
                reporter=reporter,
            )
        )


def _reached(request: BuildRequest, specs: list[Any]) -> tuple[Stack, ...]:
    """The stacks this build reads: the engine's when it replays one, and each selected
    [[kernel]]'s with an upstream of its own."""
    names = {spec.name for spec in specs}
    return tuple(
        s
        for s in stacks(request.manifest)
        if (s.kernel is None and request.replay is not None)
        or (s.kernel is not None and s.name in names)
    )


def _cache(request: BuildRequest, reporter: Reporter) -> Cache:
    return Cache(request.cache, request.mirrors, request.offline, reporter=reporter)


def _publish(
    request: BuildRequest,
    built: list[Built],
    spec: Any,
    payload: Mapping[str, Any],
    phases: Phases,
    label: str | Callable[[Built], str] | None = None,
) -> WheelSet:
    """publish(), timed as two phases: tag + check (looked up by sha256 when the same
    bytes were checked before; a cold build, ``--no-cache``, checks everything), then
    SHA256SUMS, provenance and the swap into ``wheels/``."""
    check = Phases()
    with check.phase("check") as note:
        spent = [0.0]
        memo_dir = cachelayout.bucket(request.cache, "memo")
        memo = checkmemo.Memo(memo_dir, note) if request.compiler_cache else None

        def timed(step: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any, **kw: Any) -> Any:
                started = time.monotonic()
                try:
                    return step(*args, **kw)
                finally:
                    spent[0] += time.monotonic() - started

            return run

        started = time.monotonic()
        wheels = publish(
            built, request.out_dir, spec=spec, receipt=payload, label=label,
            checker=timed(memo.checker() if memo else check_wheels),
            tagger=timed(memo.tagged) if memo else timed(_plain_tagger),
            members=memo.members if memo else None,
        )  # fmt: skip
        total = time.monotonic() - started
        if memo is None:
            note.did("cold build: every wheel tagged and checked")
    (row,) = check.rows()
    phases.add(dataclasses.replace(row, seconds=spent[0]))
    phases.add(
        Phase("publish", total - spent[0],
              did=(f"{len(wheels.built)} wheel(s) copied and hashed; SHA256SUMS, "
                   "provenance.json written; wheels/ swapped in",))
    )  # fmt: skip
    return wheels


def _plain_tagger(built: Any) -> Any:
    from pinwheel.wheels.wheelset import _tagged

    return _tagged(built)


def _own_environment() -> dict[str, Any]:
    """pinwheel's own environment for provenance: tools/replay's lock and its digest, whether
    the running packages match it, pygit2 and libgit2 (they make the replayed commits)."""
    from pinwheel.compile.toollocks import LOCK_DIR, repo_root
    from pinwheel.wheels.provenance import pinwheel_environment

    root = repo_root()
    lock = root / LOCK_DIR / "replay.txt" if root is not None else None
    return pinwheel_environment(lock, f"{LOCK_DIR}/replay.txt" if lock is not None else None)


def foreign_header_dirs(
    request: BuildRequest, config: BuildConfig, engine: bool, canon: canonical.Canonical
) -> list[Path]:
    """Header directories the build reads that pinwheel did not install: a toolkit outside
    the cache, and torch's (and the nvidia wheels') of a Python the caller named
    (``PINWHEEL_TORCH_PYTHON``; the engine's ``PINWHEEL_BUILD_PYTHON`` or this interpreter
    when no ``[build.requirements]`` venv is made)."""
    dirs: list[Path] = []
    # A toolkit pinwheel provisioned (in this cache or another) keeps its pinned archive
    # times, and a venv it made has fixed header times: neither needs a view.
    if canon.toolkit is not None and not (canon.toolkit / TOOLKIT_MARKER).is_file():
        dirs += headerview.toolkit_include_dirs(canon.toolkit)
    torch_python = request.host.torch_python
    pythons = [str(torch_python) if torch_python is not None else None]
    if engine and config.requirements is None:
        pythons.append(build_python(request.build_python, check=False))
    for python in dict.fromkeys(p for p in pythons if p):
        prefix = Path(python).absolute().parent.parent
        if not any((prefix / m).is_file() for m in (TORCH_VENV_READY, BUILD_VENV_READY)):
            dirs += headerview.torch_include_dirs(Path(python))
    return dirs


def build_variant(
    manifest: Any, config: BuildConfig, toolkit: Toolkit | None, built: Built | None = None
) -> str:
    """The label a wheel of this build carries: the system ([build] label, else the
    manifest's name), the CUDA that compiled it (after --substitute) and the torch it
    compiled against: the pinned torch for the engine, the torch a kernel's record names
    (none for a CMake kernel, which links no torch: its name must not claim one)."""
    torch = config.torch if built is None or built.kind == "engine" else built.build.torch
    return variant_label(
        config.label or manifest.name, toolkit.version if toolkit else None, torch
    )


def torch_pin(
    config: BuildConfig, build_python_torch: str | None, built: list[Built]
) -> dict[str, Any]:
    """The torch the wheels were built against, and its index: what ``install`` pins.

    A torch-extension kernel records the torch of its build venv; otherwise the
    build interpreter's torch counts.
    """
    version = next((b.build.torch for b in built if b.build.torch), build_python_torch)
    return {"version": version, "index": config.torch_index, "requested": config.torch}


@dataclass(frozen=True)
class Production:
    """What the producers of one build share, decided by :func:`build` before anything
    compiles: the request after the toolchain choice, the effective ``[build]``, the
    kernels and whether the engine builds, the toolkit, the compiler cache (its running
    server, plan and object store), earlier wheels to reuse, the canonical path method, the
    engine's build venv and the phase collector."""

    request: BuildRequest
    config: BuildConfig
    specs: tuple[Any, ...]
    engine: bool
    toolkit: Toolkit | None
    reporter: Reporter
    session: compcache.Session | None
    cache_plan: compcache.Plan
    earlier: Mapping[str, Any]
    canon: canonical.Canonical
    venv: BuildVenv | None
    phases: Phases
    store: objstore.Store | None = None


def _produce(job: Production) -> tuple[list[Built], dict[str, float]]:
    """Run the producers; each wheel records its compiler-cache numbers."""
    request, config, toolkit, reporter = job.request, job.config, job.toolkit, job.reporter
    session, cache_plan, phases = job.session, job.cache_plan, job.phases
    built: list[Built] = []
    twice: dict[str, float] = {}

    def measure(produce: Callable[[Any], Built]) -> Built:
        if session is None:
            b = produce(None)
            return _with_cache(b, cache_plan.record())
        session.zero()
        try:
            b = produce(session)
        except PinwheelError as err:
            failed = compcache.cache_failure(err)
            if failed is None:
                raise  # the build itself is broken: no second, uncached attempt
            reporter.info(f"the compiler cache failed ({failed}); building again without it")
            b = produce(None)
            why = f"failed during the build ({failed}); rebuilt without it"
            off = dataclasses.replace(cache_plan, disabled=why)
            return _with_cache(b, off.record())
        return _with_cache(b, session.stats())

    opts = BuildOptions(
        cache=request.cache,
        mirrors=request.mirrors,
        host=request.host,
        offline=request.offline,
        source_date_epoch=request.source_date_epoch,
        reporter=reporter,
        launcher=session,
        canonical=job.canon,
        cold=not request.compiler_cache,
        store=job.store,
        wheelhouse=request.wheelhouse,
    )
    for spec in job.specs:
        if toolkit is None:
            raise ManifestError(
                f"[[kernel]] {spec.name} needs a CUDA toolkit",
                where=spec.where,
                next="build it with the toolkit (drop cuda=False from the request)",
            )
        with (
            phases.phase(f"builder {spec.name}") as note,
            reporter.status(f"building kernel {spec.name} ({spec.builder})"),
        ):
            begun = time.time()
            if request.twice:
                first, second = build_twice(spec, config, toolkit, opts)
                twice[spec.name] = round(first.seconds, 1)
                built.append(measure(lambda _: second))  # noqa: B023
            else:
                one = dataclasses.replace(opts, reuse=job.earlier.get(spec.name))
                built.append(measure(functools.partial(_kernel, spec, config, toolkit, one)))
            _kernel_note(note, built[-1], begun, spec.builder)

    if job.engine:
        with _engine_lock(request):
            built.append(measure(functools.partial(_engine, job)))
    return built, twice


def _engine_lock(request: BuildRequest) -> contextlib.AbstractContextManager[object]:
    """The kept engine workspace held for the whole engine build (workspace.locked); a
    plain source tree has no workspace to share."""
    if request.engine_source is not None:
        return contextlib.nullcontext()
    return workspace.locked(engine_workdir(request))


def _kernel_note(note: Any, b: Built, begun: float, builder: str) -> None:
    """What the kernel's builder phase did: stored build, last build, or a build."""
    if (b.build.reused or {}).get("from") == "the object store":
        n = len(b.build.reused.get("members") or {}) if b.build.reused else 0
        note.skip(f"compiling: the object store holds this build ({n} compiled member(s)): "
                  "nothing configured, compiled or linked")  # fmt: skip
    elif b.wheel.stat().st_mtime < begun:  # written before this phase: not built by it
        note.skip("the builder: nothing changed since the last build; its wheel is the build")
    else:
        note.did(f"built by {builder}")


def _with_cache(b: Built, numbers: Mapping[str, Any]) -> Built:
    """``b`` with the compiler cache's numbers (or why it was off) in its record."""
    return dataclasses.replace(b, build=dataclasses.replace(b.build, compiler_cache=numbers))


def _kernel(
    spec: Any, config: BuildConfig, toolkit: Toolkit, opts: BuildOptions, launcher: Any
) -> Built:
    return build_kernel(spec, config, toolkit, dataclasses.replace(opts, launcher=launcher))


def engine_workdir(request: BuildRequest) -> Path:
    """The engine's kept workspace, one per manifest: each new tree updates its export in
    place, so a rebuild compiles only what the new tree changed (the compilers see it at
    the canonical path, so its location does not reach the bytes)."""
    if request.engine_workdir is not None:
        return request.engine_workdir
    return cachelayout.bucket(request.cache, "build") / request.manifest.name


def engine_key(config: BuildConfig, toolkit: Toolkit | None, canon: canonical.Canonical) -> str:
    """The key of :func:`engine_derivation`."""
    return engine_derivation(config, toolkit, canon).key


def engine_derivation(
    config: BuildConfig, toolkit: Toolkit | None, canon: canonical.Canonical
) -> Derivation:
    """What a kept engine build tree is valid for: every [build] value that can reach the
    compilers (conservatively all but the version label), the toolkit and the path method."""
    # [build.torch_lock] is the out-of-tree kernels' torch: it never reaches the engine.
    values = {
        k: v
        for k, v in dataclasses.asdict(config).items()
        if k not in ("version", "label", "torch_lock")
    }
    if config.requirements is not None:  # its bytes (pinned by sha256), not the checkout's path
        values["requirements"] = {"sha256": config.requirements.sha256}
    nvcc = None
    if toolkit is not None:
        nvcc = [toolkit.version, _nvcc_digest(Path(toolkit.nvcc))]
    return Derivation.of("engine", config=values, nvcc=nvcc, canonical=canon.record())


def _nvcc_digest(path: Path) -> str | None:
    return sha256_file(path.resolve()) if path.is_file() else None


def _engine(job: Production, session: compcache.Session | None) -> Built:
    """The engine wheel, its compilers through ``session`` (None: no compiler cache; the
    caller holds the kept workspace: :func:`_engine_lock`)."""
    request, config, toolkit, reporter = job.request, job.config, job.toolkit, job.reporter
    earlier, canon, venv, phases, store = job.earlier, job.canon, job.venv, job.phases, job.store
    replayed = request.replayed
    work = engine_workdir(request)
    export_digest: str | None = None
    kept = interrupted = False
    changed: tuple[str, ...] = ()
    if request.engine_source is not None:
        source = request.engine_source
    else:
        with phases.phase("export") as note:
            derivation = engine_derivation(config, toolkit, canon)
            cold = not request.compiler_cache
            why = workspace.rebuild_reason(work, derivation, cold=cold)
            kept = workspace.prepare(work, derivation, cold=cold)
            interrupted = workspace.begin_update(work)
            state = "kept workspace (incremental)" if kept else f"fresh workspace (cold; {why})"
            reporter.info(f"engine: {state}, canonical path by {canon.method}")
            with reporter.status(f"exporting tree {replayed.tree[:12]}"):
                synced = workspace.sync_tree(
                    replayed, work / "src", work / "export.json", exclude=config.exclude
                )
            note.did(f"{state}: {len(synced.written)} file(s) written, "
                     f"{len(synced.removed)} removed")  # fmt: skip
            if synced.kept:
                note.skip(f"rewriting {synced.kept} unchanged file(s) (bytes compared)")
            if kept:
                reporter.info(f"engine export: {len(synced.written)} file(s) changed, "
                              f"{len(synced.removed)} removed, {synced.kept} kept")  # fmt: skip
            export_digest, changed = synced.digest, synced.changed
        source = work / "src"
    version = request.version or engine_version(
        config, replayed, build_variant(request.manifest, config, toolkit)
    )
    if request.engine_epoch is not None:
        epoch = request.engine_epoch
    elif replayed is not None:
        epoch = commit_time(replayed.repo_path, replayed.base)
    else:
        raise ManifestError(
            "SOURCE_DATE_EPOCH unknown for a plain source tree",
            where=str(source),
            next="pass the base commit's date",
        )
    origin = {
        "url": request.manifest.upstream.url,
        "commit": replayed.base if replayed is not None else request.manifest.upstream.commit,
        "head": replayed.head if replayed is not None else None,
        "tree": replayed.tree if replayed is not None else None,
        "origin": "replayed stack" if replayed is not None else str(source),
    }
    extra_env: dict[str, str] = {}
    record: dict[str, Any] = {"excluded": list(config.exclude)}
    python = str(venv.python) if venv is not None else build_python(request.build_python)
    if venv is not None:
        record["requirements"] = venv.record()
    # Declared values only (buildenv.engine_base): a PATH of the toolkit, the build Python's
    # folder, the chosen compiler's and the system's; a HOME under the cache; nothing else of
    # the caller's. PATH and HOME are recorded (the cache as $CACHE).
    placeholders = machine_placeholders(request.cache, python)
    home = confine.inside(request.cache, Path("build") / ".home", what="engine build HOME")
    home.mkdir(parents=True, exist_ok=True)
    base = engine_base(request.host, python=python, home=str(home))
    path = base["PATH"]
    if toolkit is not None:
        path = f"{toolkit.root / 'bin'}{os.pathsep}{path}"
    extra_env.update({"PATH": path, "HOME": base["HOME"]})
    cmake_args = request.host.cmake_args_text  # declared (pinwheel.options): recorded as set
    if cmake_args:
        extra_env["CMAKE_ARGS"] = cmake_args
    # The build Python's include directory and its torch's headers, when outside the cache,
    # reach the objects under canonical names (headerview.prefix_maps), as the cache does.
    canon = canon.with_outside(headerview.prefix_maps(
        [Path(python)], canonical.CANONICAL_ROOT, request.cache
    ))
    sources_phase = phases.start("build sources")
    sources_note = sources_phase.note
    if replayed is not None:  # every source the tree declares for these arches must be pinned
        if _check_declared(replayed, config, work if request.engine_source is None else None):
            sources_note.did("checked the sources the tree declares are pinned")
        else:
            sources_note.skip("declared-sources check: same tree, arches and pins as the "
                              "last build that passed it")  # fmt: skip
    wrapper: tuple[str, ...] = ()
    if canon.method == canonical.NAMESPACE and config.network == "none":
        # The canonical namespace gets a network namespace too (one unshare).
        network, netns = "none", True
    else:
        (wrapper, network), netns = network_wrapper(config.network), False
    supplied, deps_changed = _supply_in_place(config, source, work, request, reporter, sources_note)
    if kept and (changed or deps_changed or interrupted):
        # File times are fixed (workspace.SOURCE_MTIME): pinwheel tells the tree what changed.
        gone = invalidate.after_update(
            (source / "build",), changed, roots=(source, canon.to_build(source)),
            path=extra_env["PATH"],
            build_dir_spellings=((work, canon.to_build(work)),), interrupted=interrupted,
            changed_sources=deps_changed,
        )  # fmt: skip
        reporter.info(f"engine: {len(changed)} file(s) changed: {gone.summary()}")
        sources_note.did(f"invalidated what {len(changed)} changed file(s) reached")
    if request.engine_source is None:
        workspace.end_update(work)
    sources_phase.end()
    if supplied:
        extra_env.update(
            plan_env(supplied, cmake_args, disconnected=network != "none")
        )
    record["sources"] = [s.record() for s in supplied]
    record["network"] = network
    record["canonical"] = canon.record()
    if network != "none" and config.network == "none":
        reporter.info("no network namespace here (unshare -rn failed): building with network")
    environment = None
    if venv is not None and config.requirements is not None:
        with phases.phase("build venv check") as venv_note:
            environment = lockedvenv.engine_environment(
                venv.python, config.requirements.path.name, venv.digest, venv.requirements
            )
            venv_note.did(f"listed {len(environment['packages'])} package(s): the lock's")
    with phases.phase("builder") as note, reporter.status(f"building the engine wheel {version}"):
        built = build_engine(
            EngineBuildRequest(
                config=config,
                source=source,
                work=work,
                toolkit=toolkit,
                version=version,
                source_date_epoch=epoch,
                environ=base,
                origin=origin,
                python=python,
                extra_env=extra_env,
                wrapper=wrapper,
                record=record,
                supplied=tuple(s.name for s in supplied),
                launcher=session,
                reuse_from=earlier.get("engine"),
                placeholders=placeholders,
                reporter=reporter,
                canonical=canon,
                no_network=netns,
                listing_hook=str(listing.install(request.cache)),
                export_digest=export_digest,
                kept=kept,
                note=note,
                store=store,
            )
        )
    # Recorded without this machine's paths, as the identity is: provenance travels with
    # the release.
    env = {k: reuse.portable(v, placeholders) for k, v in built.build.env.items()}
    made = dataclasses.replace(built.build, env=env)
    if built.build.command is not None:
        command = tuple(reuse.portable(c, placeholders) for c in built.build.command)
        made = dataclasses.replace(made, command=command)
    # The venv as listed for this build (a no-change build's record is the last build's,
    # its environment listed again now); outside the inputs digest: the lock's sha256 is in.
    if environment is not None:
        made = dataclasses.replace(made, environment=environment)
    return dataclasses.replace(built, build=made)


def machine_placeholders(cache: Path, python: str) -> dict[str, str]:
    """This machine's paths in what the engine build records, and their names: the cache
    (as given and resolved) ``$CACHE``; the folder of a build Python outside it
    (``PINWHEEL_BUILD_PYTHON``, a declared input: its version is recorded)
    ``$BUILD_PYTHON_DIR``, unless it is one of the system's directories."""
    caches = {str(Path(cache).absolute()), os.path.realpath(cache)}
    out = dict.fromkeys(caches, "$CACHE")
    folder = str(Path(python).parent)
    if folder not in SYSTEM_PATH and not any(Path(folder).is_relative_to(c) for c in caches):
        out[folder] = "$BUILD_PYTHON_DIR"
    return out


def _supply_in_place(
    config: BuildConfig,
    source: Path,
    work: Path,
    request: BuildRequest,
    reporter: Reporter,
    note: Any = None,
) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """The build sources under ``work/deps``, updated in place: a source whose pins and
    files still hold is kept as it is (:mod:`pinwheel.compile.keptsources`); the others are
    exported into a staging directory, then only changed files are written (a kept build
    tree sees the others unchanged). Also: the names of the sources that changed."""
    found: dict[str, Any] = {}
    for src in config.sources:
        last = keptsources.kept(work, src, source)
        if last is not None:
            found[src.name] = last
            reporter.info(f"build source {src.name}: unchanged since the last build, kept")
            if note is not None:
                note.skip(f"export of build source {src.name}: its pins and files hold")
    todo = tuple(src for src in config.sources if src.name not in found)
    staged = work / ".deps-staged"
    remove_tree(staged, ignore_errors=True)
    supplied = supply(
        todo,
        project=source,
        dest=staged,
        cache=Cache(request.cache, request.mirrors, request.offline),
        reporter=reporter,
    )
    changed = []
    for src, s in zip(todo, supplied, strict=True):
        final = work / "deps" / s.name
        exported = work / f"deps-{s.name}.json"
        fresh = not exported.is_file()
        if fresh or not final.is_dir():  # nothing kept to compare with: one rename
            remove_tree(final, ignore_errors=True)
            synced = workspace.adopt(s.path, final, exported)
        else:
            synced = workspace.sync(final, workspace.dir_entries(s.path, skip=()), exported)
        if synced.changed and not fresh:
            changed.append(s.name)
        found[s.name] = dataclasses.replace(s, path=final)
        keptsources.remember(work, keptsources.key_of(src, source), found[s.name])
    remove_tree(staged, ignore_errors=True)
    out = [found[src.name] for src in config.sources]
    return tuple(out), tuple(changed)


DECLARED = "declared-sources.json"


def _check_declared(replayed: Any, config: BuildConfig, work: Path | None) -> bool:
    """Refuse a tree that declares sources [build] does not pin. False when skipped:
    ``work`` records the last passing check's (tree, arches, CUDA, pins), and the tree
    (a git tree id: its bytes) and those are the same now."""
    from pinwheel.source.buildsources import discover
    from pinwheel.source.libgit2 import pygit2

    facts = json.dumps(
        [replayed.tree, list(config.arches), config.cuda,
         [dataclasses.asdict(s) for s in config.sources]],
        sort_keys=True, default=str,
    )  # fmt: skip
    key = hashlib.sha256(facts.encode()).hexdigest()
    if work is not None:
        try:
            if untrusted.read_json(work / DECLARED, checkmemo.KIND).get("key") == key:
                return False
        except (PinwheelError, AttributeError):
            pass
    repo = pygit2.Repository(str(replayed.repo_path))
    missing = unpinned(discover(repo, replayed.tree, config.arches, config.cuda), config.sources)
    if missing:
        names = "; ".join(
            f"{d.name} ({d.url} @ {d.ref}, used: {d.used}, {d.where})" for d in missing
        )
        raise ManifestError(
            f"the tree declares build-time sources [build] does not pin: {names}",
            where="[[build.source]]",
            next="run `pinwheel lock` to pin them (or add them with omit = true and a reason); "
            "`pinwheel plan` lists them",
        )
    if work is not None:
        atomic_write_text(work / DECLARED, json.dumps({"key": key}) + "\n")
    return True


def network_wrapper(mode: str) -> tuple[tuple[str, ...], str]:
    """(command prefix, what provenance records): a user+network namespace when asked and
    possible, so an undeclared download fails loudly instead of fetching."""
    if mode != "none":
        return (), "allowed"
    unshare = shutil.which("unshare")
    if unshare and runner.run(runner.Command((unshare, "-rn", "true"), check=False)).ok:
        return (unshare, "-rn"), "none"
    return (), "host (no network namespace available)"


__all__ = ["BuildOutcome", "BuildRequest", "ToolkitOutcome", "build", "toolchain"]

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

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import cachelayout, confine
from pinwheel.compile import (
    canonical,
    checkmemo,
    compcache,
    headerview,
    objstore,
    reuse,
)
from pinwheel.compile.buildvenv import READY as BUILD_VENV_READY
from pinwheel.compile.buildvenv import ensure_build_venv
from pinwheel.compile.engine import (
    build_python,
)
from pinwheel.compile.kernels import (
    TORCH_VENV_READY,
    select,
)
from pinwheel.compile.phases import Phase, Phases
from pinwheel.compile.produce import Production, build_variant, engine_workdir, produce
from pinwheel.compile.request import BuildOutcome, BuildRequest
from pinwheel.compile.toolchain import (
    ToolchainChoice,
    Toolkit,
    ToolkitRequest,
    choose,
    resolve_toolkit,
)
from pinwheel.compile.toolchain.choose import ToolchainReport, one_report, python_needed
from pinwheel.compile.toolchain.pins import LOCKS
from pinwheel.compile.toolchain.pins import MARKER as TOOLKIT_MARKER
from pinwheel.compile.toolchain.survey import cudas_here
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.errors import ManifestError
from pinwheel.manifest.build import BuildConfig
from pinwheel.manifest.component import Stack, stacks
from pinwheel.manifest.targets import target_problems
from pinwheel.progress import SILENT, Reporter
from pinwheel.source.cache import Cache
from pinwheel.source.cache import mark as mark_cache
from pinwheel.source.replay import reach_all, replay, replaying
from pinwheel.wheels.check import check_wheels, find_tools, spec_from_build
from pinwheel.wheels.provenance import receipt, toolchain_facts
from pinwheel.wheels.substitute import Substitution, apply, headline
from pinwheel.wheels.substitute import to_json as substitutions_json
from pinwheel.wheels.wheelset import Built, WheelSet, publish


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
    canon = _canonical(request, config, engine, toolkit, reporter)
    session, cache_plan, store = _compiler_cache(request, config, canon, phases, reporter)
    try:  # the server stops on every way out, the build venv's failures included
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
        python = (
            str(venv.python) if venv is not None else build_python(request.build_python, engine)
        )
        built, twice = produce(
            Production(
                request=request, config=config, specs=tuple(specs), engine=engine,
                toolkit=toolkit, reporter=reporter, session=session, cache_plan=cache_plan,
                earlier=earlier, canon=canon, venv=venv, phases=phases, store=store,
            )
        )  # fmt: skip
    finally:
        if session is not None:
            session.stop()

    wheels = _checked_set(request, choice, toolkit, python, built, phases, reporter, store)
    return BuildOutcome(
        toolkit=toolkit,
        built=wheels.components,
        wheels=wheels,
        twice=twice,
        substitutions=choice.substitutions,
        phases=phases.rows(),
        replayed=request.replayed,
    )


def _checked_set(
    request: BuildRequest, choice: ToolchainChoice, toolkit: Toolkit | None, python: str,
    built: list[Built], phases: Phases, reporter: Reporter, store: objstore.Store | None,
) -> WheelSet:
    """The wheels tagged, checked and published as one set with their provenance (a tag
    taken from ``store`` with a stored wheel, and stored there when made here)."""
    manifest, config = request.manifest, choice.config
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
        wheels = _publish(request, built, check_spec, payload, phases, store,
                          label=lambda b: build_variant(manifest, config, toolkit, b))  # fmt: skip
    return wheels


def _canonical(
    request: BuildRequest, config: BuildConfig, engine: bool, toolkit: Toolkit | None,
    reporter: Reporter,
) -> canonical.Canonical:
    """How the compilers see fixed paths: the cache, the toolkit and header views."""
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
    return canon


def _compiler_cache(
    request: BuildRequest, config: BuildConfig, canon: canonical.Canonical, phases: Phases,
    reporter: Reporter,
) -> tuple[compcache.Session | None, compcache.Plan, objstore.Store | None]:
    """The compiler cache's server started (or why not) and the object store it names."""
    cache_plan = compcache.plan(
        config.cache, request.cache, request.host, enabled=request.compiler_cache
    )
    with phases.phase("compiler cache") as cache_note:
        if cache_plan.disabled:  # off before it starts (--no-cache, config, no binary)
            session = None
            reporter.info(f"building without the compiler cache: {cache_plan.disabled}")
        else:
            with reporter.status(f"starting the compiler cache ({cache_plan.backend})"):
                for sub in ("bin", "masq"):  # the server's folders: no link on the way
                    confine.folder_in_cache(request.cache, f"sccache-run/{sub}",
                                            what="compiler cache's run folder")  # fmt: skip
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
    return session, cache_plan, store


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
    # The Python [build] pins is needed only where a wheel is for it (issue 53: the
    # selftest's py3-none wheel builds on a Debian 12 without Python 3.12).
    engine = any(x is not None for x in (request.replayed, request.replay, request.engine_source))
    specs = [] if request.kernels == () else select(
        request.manifest.kernels, list(request.kernels or []), all_=request.all_kernels
    )  # fmt: skip
    try:
        choice = choose(config, request.host, request.substitute,
                        python_needed=python_needed(specs, engine))  # fmt: skip
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
    store: objstore.Store | None,
    label: str | Callable[[Built], str] | None = None,
) -> WheelSet:
    """publish(), timed as two phases: tag + check (looked up by sha256 when the same
    bytes were checked before; a cold build, ``--no-cache``, checks everything), then
    SHA256SUMS, provenance and the swap into ``wheels/``."""
    check = Phases()
    with check.phase("check") as note:
        spent = [0.0]
        memo_dir = cachelayout.bucket(request.cache, "memo")
        memo = (checkmemo.Memo(memo_dir, note, scope=request.cache,  # links refused from
                               store=store)  # the cache root down; a tag travels with a wheel
                if request.compiler_cache else None)  # fmt: skip

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


def torch_pin(
    config: BuildConfig, build_python_torch: str | None, built: list[Built]
) -> dict[str, Any]:
    """The torch the wheels were built against, and its index: what ``install`` pins.

    A torch-extension kernel records the torch of its build venv; otherwise the
    build interpreter's torch counts.
    """
    version = next((b.build.torch for b in built if b.build.torch), build_python_torch)
    return {"version": version, "index": config.torch_index, "requested": config.torch}


__all__ = [
    "BuildOutcome",
    "BuildRequest",
    "ToolkitOutcome",
    "build",
    "build_variant",
    "engine_workdir",
    "toolchain",
]

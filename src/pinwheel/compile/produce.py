"""The build stage's producers: what one build compiles once :mod:`pinwheel.compile.pipeline`
has planned it (toolchain, toolkit, replay, compiler cache, canonical path).

:func:`produce` runs the ``[[kernel]]`` producers and the engine's, each wheel with its
compiler-cache numbers; the engine's kept workspace is keyed by its derivation
(:func:`engine_derivation`), its export synced in place, its build sources supplied, then
:func:`pinwheel.compile.engine.build_engine` runs the backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import cachelayout, confine, options, runner, untrusted
from pinwheel.checksums import sha256_file
from pinwheel.compile import (
    canonical,
    checkmemo,
    compcache,
    derivation,
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
from pinwheel.compile.buildvenv import BuildVenv
from pinwheel.compile.derivation import Derivation
from pinwheel.compile.engine import (
    EngineBuildRequest,
    build_engine,
    build_python,
    commit_time,
    engine_version,
)
from pinwheel.compile.kernels import (
    BuildOptions,
    build_kernel,
    build_twice,
)
from pinwheel.compile.phases import Phases
from pinwheel.compile.request import BuildRequest
from pinwheel.compile.sources import plan_env, supply, unpinned
from pinwheel.compile.toolchain import (
    Toolkit,
)
from pinwheel.errors import ManifestError, PinwheelError
from pinwheel.fsutil import atomic_write_text, remove_tree
from pinwheel.manifest.build import BuildConfig
from pinwheel.progress import Reporter
from pinwheel.source.cache import Cache
from pinwheel.wheels.relabel import variant_label
from pinwheel.wheels.wheelset import Built


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


def produce(job: Production) -> tuple[list[Built], dict[str, float]]:
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
    if request.engine_workdir is None:  # the cache's: made folder by folder, links refused
        confine.folder_in_cache(request.cache, f"build/{request.manifest.name}",
                                what="engine workspace")  # fmt: skip
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


@dataclass(frozen=True)
class _Export:
    """The engine's tree as the builder will see it: where, and what changed since the
    kept workspace's last build (nothing kept: a plain ``engine_source``)."""

    source: Path
    kept: bool = False
    interrupted: bool = False
    changed: tuple[str, ...] = ()
    digest: str | None = None


def _export(job: Production, work: Path) -> _Export:
    """The kept workspace keyed by the engine's derivation (a rebuild says which field
    made it), the replayed tree synced into ``work/src`` in place."""
    request, reporter = job.request, job.reporter
    if request.engine_source is not None:
        return _Export(request.engine_source)
    replayed = request.replayed
    with job.phases.phase("export") as note:
        derivation = engine_derivation(job.config, job.toolkit, job.canon)
        cold = not request.compiler_cache
        why = workspace.rebuild_reason(work, derivation, cold=cold)
        kept = workspace.prepare(work, derivation, cold=cold)
        interrupted = workspace.begin_update(work)
        state = "kept workspace (incremental)" if kept else f"fresh workspace (cold; {why})"
        reporter.info(f"engine: {state}, canonical path by {job.canon.method}")
        with reporter.status(f"exporting tree {replayed.tree[:12]}"):
            synced = workspace.sync_tree(
                replayed, work / "src", work / "export.json", exclude=job.config.exclude
            )
        note.did(f"{state}: {len(synced.written)} file(s) written, "
                 f"{len(synced.removed)} removed")  # fmt: skip
        if synced.kept:
            note.skip(f"rewriting {synced.kept} unchanged file(s) (bytes compared)")
        if kept:
            reporter.info(f"engine export: {len(synced.written)} file(s) changed, "
                          f"{len(synced.removed)} removed, {synced.kept} kept")  # fmt: skip
    return _Export(work / "src", kept, interrupted, synced.changed, synced.digest)


def _epoch(request: BuildRequest, source: Path) -> int:
    """SOURCE_DATE_EPOCH: asked for (verify-build), else the replayed base commit's date."""
    if request.engine_epoch is not None:
        return request.engine_epoch
    if request.replayed is not None:
        return commit_time(request.replayed.repo_path, request.replayed.base)
    raise ManifestError(
        "SOURCE_DATE_EPOCH unknown for a plain source tree",
        where=str(source),
        next="pass the base commit's date",
    )


def _origin(request: BuildRequest, source: Path) -> dict[str, Any]:
    replayed = request.replayed
    return {
        "url": request.manifest.upstream.url,
        "commit": replayed.base if replayed is not None else request.manifest.upstream.commit,
        "head": replayed.head if replayed is not None else None,
        "tree": replayed.tree if replayed is not None else None,
        "origin": "replayed stack" if replayed is not None else str(source),
    }


@dataclass(frozen=True)
class _Declared:
    """What the engine's builder is given from outside the tree: the environment pinwheel
    declares (PATH, HOME, CMAKE_ARGS), the Python, the paths provenance names by
    placeholder, and the network it may use."""

    python: str
    base: Mapping[str, str]
    extra_env: Mapping[str, str]
    placeholders: Mapping[str, str]
    canon: canonical.Canonical
    wrapper: tuple[str, ...]
    network: str
    netns: bool


def _declared(job: Production) -> _Declared:
    """Declared values only (buildenv.engine_base): a PATH of the toolkit, the build
    Python's folder, the chosen compiler's and the system's; a HOME under the cache;
    nothing else of the caller's. PATH and HOME are recorded (the cache as $CACHE)."""
    request, toolkit, venv = job.request, job.toolkit, job.venv
    python = str(venv.python) if venv is not None else build_python(request.build_python)
    home = confine.inside(request.cache, Path("build") / ".home", what="engine build HOME")
    home.mkdir(parents=True, exist_ok=True)
    base = engine_base(request.host, python=python, home=str(home))
    path = options.value(base, "PATH")
    if toolkit is not None:
        path = f"{toolkit.root / 'bin'}{os.pathsep}{path}"
    extra_env = {"PATH": path, "HOME": options.value(base, "HOME")}
    if request.host.cmake_args_text:  # declared (pinwheel.options): recorded as set
        extra_env["CMAKE_ARGS"] = request.host.cmake_args_text
    # The build Python's include directory and its torch's headers, when outside the cache,
    # reach the objects under canonical names (headerview.prefix_maps), as the cache does.
    canon = job.canon.with_outside(
        headerview.prefix_maps([Path(python)], canonical.CANONICAL_ROOT, request.cache)
    )
    wrapper: tuple[str, ...] = ()
    if canon.method == canonical.NAMESPACE and job.config.network == "none":
        # The canonical namespace gets a network namespace too (one unshare).
        network, netns = "none", True
    else:
        (wrapper, network), netns = network_wrapper(job.config.network), False
    return _Declared(python, base, extra_env, machine_placeholders(request.cache, python),
                     canon, wrapper, network, netns)  # fmt: skip


def _sources(
    job: Production, work: Path, exported: _Export, declared: _Declared
) -> tuple[tuple[Any, ...], dict[str, str]]:
    """The build sources supplied in place (the tree's declared ones checked pinned), a kept
    build tree told what changed; their variables for the builder."""
    request, reporter, config = job.request, job.reporter, job.config
    extra_env: dict[str, str] = {}
    with job.phases.phase("build sources") as note:
        if request.replayed is not None:  # every source the tree declares must be pinned
            if _check_declared(request.replayed, config,
                               work if request.engine_source is None else None):  # fmt: skip
                note.did("checked the sources the tree declares are pinned")
            else:
                note.skip("declared-sources check: same tree, arches and pins as the "
                          "last build that passed it")  # fmt: skip
        supplied, deps_changed = _supply_in_place(
            config, exported.source, work, request, reporter, note
        )
        changed = exported.changed
        if exported.kept and (changed or deps_changed or exported.interrupted):
            # File times are fixed (workspace.SOURCE_MTIME): pinwheel says what changed.
            source, canon = exported.source, declared.canon
            gone = invalidate.after_update(
                (source / "build",), changed, roots=(source, canon.to_build(source)),
                path=options.value(declared.extra_env, "PATH"),
                build_dir_spellings=((work, canon.to_build(work)),),
                interrupted=exported.interrupted, changed_sources=deps_changed,
            )  # fmt: skip
            reporter.info(f"engine: {len(changed)} file(s) changed: {gone.summary()}")
            note.did(f"invalidated what {len(changed)} changed file(s) reached")
        if request.engine_source is None:
            workspace.end_update(work)
    if supplied:
        disconnected = declared.network != "none"
        extra_env.update(
            plan_env(supplied, request.host.cmake_args_text, disconnected=disconnected)
        )
    return supplied, extra_env


def _engine(job: Production, session: compcache.Session | None) -> Built:
    """The engine wheel, its compilers through ``session`` (None: no compiler cache; the
    caller holds the kept workspace: :func:`_engine_lock`)."""
    request, config, reporter, venv = job.request, job.config, job.reporter, job.venv
    work = engine_workdir(request)
    exported = _export(job, work)
    version = request.version or engine_version(
        config, request.replayed, build_variant(request.manifest, config, job.toolkit)
    )
    epoch = _epoch(request, exported.source)  # before anything is supplied
    declared = _declared(job)
    supplied, sources_env = _sources(job, work, exported, declared)
    record: dict[str, Any] = {"excluded": list(config.exclude)}
    if venv is not None:
        record["requirements"] = venv.record()
    record["sources"] = [s.record() for s in supplied]
    record["network"] = declared.network
    record["canonical"] = declared.canon.record()
    if declared.network != "none" and config.network == "none":
        reporter.info("no network namespace here (unshare -rn failed): building with network")
    environment = None
    if venv is not None and config.requirements is not None:
        with job.phases.phase("build venv check") as venv_note:
            environment = lockedvenv.engine_environment(
                venv.python, config.requirements.path.name, venv.digest, venv.requirements,
                cache=request.cache, note=venv_note,
            )
            venv_note.did(f"listed {len(environment['packages'])} package(s): the lock's")
    with job.phases.phase("builder") as note, reporter.status(
        f"building the engine wheel {version}"
    ):
        built = build_engine(
            EngineBuildRequest(
                config=config, source=exported.source, work=work, toolkit=job.toolkit,
                version=version, source_date_epoch=epoch,
                environ=declared.base, origin=_origin(request, exported.source),
                python=declared.python, extra_env={**declared.extra_env, **sources_env},
                wrapper=declared.wrapper, record=record,
                supplied=tuple(s.name for s in supplied), launcher=session,
                reuse_from=job.earlier.get("engine"), placeholders=declared.placeholders,
                reporter=reporter, canonical=declared.canon, no_network=declared.netns,
                listing_hook=str(listing.install(request.cache)),
                export_digest=exported.digest, kept=exported.kept, note=note, store=job.store,
            )
        )  # fmt: skip
    return _portable(built, declared.placeholders, environment)


def _portable(
    built: Built, placeholders: Mapping[str, str], environment: Mapping[str, Any] | None
) -> Built:
    """``built`` recorded without this machine's paths, as the identity is (provenance
    travels with the release); the venv as listed for this build (a no-change build's
    record is the last build's, its environment listed again now; outside the inputs
    digest: the lock's sha256 is in)."""
    env = {k: reuse.portable(v, placeholders) for k, v in built.build.env.items()}
    made = dataclasses.replace(built.build, env=env)
    if built.build.command is not None:
        command = tuple(reuse.portable(c, placeholders) for c in built.build.command)
        made = dataclasses.replace(made, command=command)
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

    key = derivation.digest(
        [replayed.tree, list(config.arches), config.cuda,
         [dataclasses.asdict(s) for s in config.sources]]
    )  # fmt: skip
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


__all__ = [
    "Production",
    "build_variant",
    "engine_derivation",
    "engine_key",
    "engine_workdir",
    "machine_placeholders",
    "network_wrapper",
    "produce",
]

"""The engine producer: an exported, replayed tree in, one engine wheel (in scratch) out.

:func:`build_engine` runs ``python -m build --wheel --no-isolation`` (never a
direct ``setup.py bdist_wheel``) in the exported tree with the environment from
:mod:`pinwheel.compile.buildenv`: TORCH_CUDA_ARCH_LIST / CUDAARCHS from ``[build]
arches``, the version ``<version>+<label>`` in SETUPTOOLS_SCM_PRETEND_VERSION
and VLLM_VERSION_OVERRIDE, MAX_JOBS / NVCC_THREADS, CUDA_HOME from the toolkit,
and SOURCE_DATE_EPOCH = the base commit's committer date. The wheel is then
checked and published by :mod:`pinwheel.wheels.wheelset`, like every other.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel import options, runner
from pinwheel.compile import objstore, reuse, workspace
from pinwheel.compile.buildenv import build_env
from pinwheel.compile.canonical import Canonical
from pinwheel.compile.phases import Note
from pinwheel.compile.sources import undeclared_downloads
from pinwheel.cudaarch import CudaArch
from pinwheel.errors import ManifestError, PinwheelError
from pinwheel.fsutil import remove_tree
from pinwheel.manifest.build import BuildConfig
from pinwheel.progress import SILENT, Reporter
from pinwheel.source import gitcli
from pinwheel.wheels.record import BuildRecord
from pinwheel.wheels.wheelset import Built

LOG_TAIL = 25


class BuildError(PinwheelError):
    """The wheel build itself failed (compiler, backend, missing build dependency)."""


@dataclass(frozen=True)
class BuildPlan:
    """Everything one wheel build needs, resolved once."""

    source: Path
    out_dir: Path
    work: Path  # scratch: the backend's --outdir and the build log
    python: str
    command: tuple[str, ...]
    version: str  # "1.5.2.dev1486+glm53card"
    arches: tuple[CudaArch, ...]
    set_env: Mapping[str, str]  # what pinwheel set (recorded in provenance)
    env: Mapping[str, str] = field(repr=False)  # the full environment of the build
    source_date_epoch: int = 0
    toolkit: Any = None  # pinwheel.compile.toolchain.Toolkit, or None for a CUDA-free build
    canonical: Canonical | None = None  # run where the compilers see the canonical path
    no_network: bool = False  # with canonical's namespace: a network namespace too

    def invocation(self) -> tuple[tuple[str, ...], Path, Mapping[str, str]]:
        """(argv, directory, environment) to start the build with."""
        if self.canonical is None:
            return self.command, self.source, self.env
        argv, cwd = self.canonical.wrap(self.command, self.source, network=not self.no_network)
        return tuple(argv), cwd, self.canonical.env(self.env)

    @property
    def log(self) -> Path:
        return self.work / "build.log"


@dataclass(frozen=True)
class EngineBuildRequest:
    """One engine wheel build, as :func:`pinwheel.compile.pipeline.build` resolved it.

    ``extra_env``/``wrapper``: what the build sources, the build venv and the network
    fence add; ``supplied`` names the build sources handed over (a download the log
    shows beyond them fails the build); ``launcher``: a
    :class:`pinwheel.compile.compcache.Session` (compiler cache); ``reuse_from``: a
    :class:`pinwheel.compile.reuse.Candidate` (earlier wheel); ``placeholders``: machine
    paths (the cache) and their names in the recorded identity; ``export_digest``: the
    export's digest when ``work`` is the engine's workspace (each build is stamped with
    what it was given) and ``kept`` when that workspace was kept: a build given exactly
    what the last one was hands back its wheel, nothing compiled. ``note``: a
    :class:`pinwheel.compile.phases.Note` told what ran and what was skipped;
    ``store``: a :class:`pinwheel.compile.objstore.Store` (a hit compiles nothing).
    """

    config: BuildConfig
    source: Path
    work: Path  # scratch: the backend's --outdir (work/dist) and the build log
    toolkit: Any  # pinwheel.compile.toolchain.Toolkit, or None for a CUDA-free build
    version: str
    source_date_epoch: int
    environ: Mapping[str, str] = field(repr=False)
    origin: Mapping[str, Any] = field(repr=False)
    python: str | None = None  # None: the interpreter running pinwheel
    extra_env: Mapping[str, str] | None = None
    wrapper: Sequence[str] = ()
    record: Mapping[str, Any] | None = None
    supplied: Sequence[str] = ()
    launcher: Any = None
    reuse_from: Any = None
    placeholders: Mapping[str, str] | None = None
    reporter: Reporter = SILENT
    canonical: Canonical | None = None
    no_network: bool = False
    listing_hook: str | None = None
    export_digest: str | None = None
    kept: bool = False
    note: Any = None
    store: Any = None


# --------------------------------------------------------------------------- inputs


def commit_time(repo_path: Path, commit: str) -> int:
    """Committer time of ``commit``: the SOURCE_DATE_EPOCH of a build of its tree."""
    from pinwheel.source.libgit2 import pygit2

    return int(pygit2.Repository(str(repo_path))[commit].peel(pygit2.Commit).commit_time)


def scm_version(repo_path: Path, commit: str) -> str:
    """setuptools-scm's guess-next-dev version of ``commit``: v1.5.1 + 1486 -> 1.5.2.dev1486.

    The exported tree has no .git, so the build cannot compute this itself.
    """
    out = gitcli.git(
        ["describe", "--tags", "--long", "--match", "v*", "--end-of-options", commit],
        git_dir=repo_path,
        check=False,
        what="git describe",
    )
    if out.returncode != 0:
        raise ManifestError(
            f"cannot derive a version for {commit[:12]}: no v* tag below it "
            f"({out.err_text.splitlines()[-1] if out.err_text else 'git describe'})",
            where="[build] version",
            next='set [build] version = "1.5.2.devN" in the manifest',
        )
    tag, distance, _ = out.text.rsplit("-", 2)
    parts = tag.lstrip("v").split(".")
    if int(distance) == 0:
        return ".".join(parts)
    parts[-1] = str(int(parts[-1]) + 1)
    return ".".join(parts) + f".dev{distance}"


def build_python(given: str | None, check: bool = True) -> str:
    """The interpreter that builds: ``given`` ($PINWHEEL_BUILD_PYTHON, resolved by the CLI:
    a venv with torch and the project's build requirements), else the one running pinwheel
    (``check``: it must run)."""
    chosen = given or sys.executable
    if check and not shutil.which(chosen):
        raise BuildError(
            f"PINWHEEL_BUILD_PYTHON={chosen} is not an executable",
            where="PINWHEEL_BUILD_PYTHON",
            next="point it at the python of the build venv (with torch and build installed)",
        )
    return chosen


def wheel_command(python: str, source: Path, outdir: Path) -> tuple[str, ...]:
    """`python -m build --wheel --no-isolation`: PyPA's build frontend, in the build's Python.

    No fallback to ``setup.py bdist_wheel``: calling setup.py directly is deprecated by
    setuptools, skips the tree's [build-system] backend, and would make a wheel by another
    route (other metadata, other bytes) on a machine that only lacks ``build``; the engine's
    locked build requirements hold ``build``, so its absence is an error with its fix."""
    has_build = runner.run(runner.Command((python, "-c", "import build"), check=False)).ok
    if has_build:
        return (python, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(outdir), ".")
    raise BuildError(
        f"{python} has no `build` module (the engine wheel is built with "
        "`python -m build --wheel --no-isolation`)",
        where=str(source),
        next="add build to the engine's hashed build requirements ([build.requirements]) and "
        "build again, or point PINWHEEL_BUILD_PYTHON at a Python that has it",
    )


def plan_build(request: EngineBuildRequest) -> BuildPlan:
    """The build's command and environment: ``request.extra_env`` (what the build sources
    and the build venv add) is recorded as set; ``request.wrapper`` prefixes the command
    (``unshare -rn``: no network for the build); ``request.canonical``: where the compilers
    see the cache (``no_network``: and no network); ``listing_hook``:
    :mod:`pinwheel.compile.listing`'s directory (sorted listings)."""
    config, source, work = request.config, request.source, request.work
    python = request.python or build_python(None)
    probe = (python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])")
    running = runner.run(runner.Command(probe, what="the build python", error=BuildError)).text
    if running != config.python:
        raise BuildError(
            f"[build] python pins {config.python}, the build interpreter {python} is {running}",
            where="[build] python",
            next=f"run pinwheel from a Python {config.python} environment that has torch and build",
        )
    env, set_env = build_env(
        config,
        version=request.version,
        source_date_epoch=request.source_date_epoch,
        toolkit=request.toolkit,
        base=request.environ,
        listing_hook=request.listing_hook,
    )
    if request.extra_env:
        env.update(request.extra_env)
        set_env.update(request.extra_env)
    outdir = work / "dist"
    return BuildPlan(
        source=Path(source),
        out_dir=outdir,
        work=work,
        python=python,
        command=(*request.wrapper, *wheel_command(python, Path(source), outdir)),
        version=request.version,
        arches=config.targets,
        set_env=set_env,
        env=env,
        source_date_epoch=request.source_date_epoch,
        toolkit=request.toolkit,
        canonical=request.canonical,
        no_network=request.no_network,
    )


# --------------------------------------------------------------------------- running


_NINJA_STEP = re.compile(rb"^\[(\d+)/(\d+)\] (.*)$", re.M)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
PROGRESS_EVERY = 30.0  # seconds between two progress lines of a long build (a default)


def ninja_progress(tail: bytes) -> tuple[int, int, str] | None:
    """The last ``[N/M] what`` step line ninja printed in ``tail``, if any."""
    steps = _NINJA_STEP.findall(tail)
    if not steps:
        return None
    n, m, what = steps[-1]
    text = _CONTROL.sub("?", what.decode(errors="replace")).strip()  # no escapes to a terminal
    return int(n), int(m), text


def run_build(plan: BuildPlan, reporter: Reporter = SILENT) -> tuple[Path, ...]:
    """Run the backend; return the wheels it wrote (still in the scratch dir).

    ``reporter`` gets the build log's path first, then a line every
    :data:`PROGRESS_EVERY` seconds: the compile step ninja last reported (objects
    done/total), or, before ninja's first step, that the backend is still configuring
    (an engine build runs for an hour or more on a small builder: never a silent wait).
    """
    outdir = plan.work / "dist"
    remove_tree(outdir, ignore_errors=True)
    outdir.mkdir(parents=True)
    started = time.monotonic()
    argv, cwd, env = plan.invocation()
    cmd = runner.Command(
        argv, what="the wheel build", cwd=cwd, env=env, output="log",
        log_file=plan.log, new_session=True, error=BuildError,  # one group: killed as one
    )  # fmt: skip
    reporter.info(f"build log: {plan.log}")
    proc = runner.spawn(cmd, reporter)
    try:
        last = started
        while proc.poll() is None:
            time.sleep(1.0)
            if time.monotonic() - last >= PROGRESS_EVERY:
                last = time.monotonic()
                step = ninja_progress(runner.read_tail(plan.log))
                minutes = (last - started) / 60
                if step is not None:
                    n, m, what = step
                    reporter.info(f"compiling [{n}/{m}] {what[:100]} ({minutes:.0f} min)")
                else:
                    reporter.info(
                        f"configuring (no compile step yet; {minutes:.1f} min; log: {plan.log})"
                    )
    except BaseException:  # interrupted: stop the whole build (cmake, ninja, nvcc) too
        proc.kill()  # its whole group (new_session)
        raise
    wheels = tuple(sorted(outdir.glob("*.whl")))
    if proc.returncode != 0 or not wheels:
        tail = runner.tail_of(plan.log, LOG_TAIL)
        what = (
            f"wheel build failed (exit {proc.returncode})"
            if proc.returncode
            else "the build wrote no wheel"
        )
        raise BuildError(
            what + ":\n    " + "\n    ".join(tail),
            where=f"{plan.source} (log: {plan.log})",
            next=f"read {plan.log}; rerun by hand: cd {plan.source} && {' '.join(plan.command)}",
        )
    return wheels


def engine_version(config: BuildConfig, replayed: Any, variant: str | None = None) -> str:
    """``[build] version`` (else setuptools-scm's guess for the base commit) + the build's
    variant label (:func:`pinwheel.wheels.relabel.variant_label`), else ``[build] label``."""
    base_version = config.version or (
        scm_version(replayed.repo_path, replayed.base) if replayed is not None else None
    )
    if base_version is None:
        raise ManifestError(
            "no version for the wheel",
            where="[build] version",
            next='set [build] version = "1.5.2.devN"',
        )
    local = variant or config.label
    return f"{base_version}+{local}" if local else base_version


def build_engine(request: EngineBuildRequest) -> Built:
    """Build the engine wheel from ``request.source`` into ``work/dist``; nothing is
    published here (the fields: :class:`EngineBuildRequest`).

    In order, the first that gives a wheel is the build: the last build when it was given
    exactly this (:func:`_last_wheel`), the object store (:func:`_stored_wheel`), an
    earlier wheel (:func:`_earlier_wheel`), else the builder runs (:func:`_compile`)."""
    request.work.mkdir(parents=True, exist_ok=True)
    attempt = _begin(request)
    made = _last_wheel(attempt)
    if made is not None:
        return made
    workspace.forget(request.work)
    extra: dict[str, str] = {}
    if request.launcher is not None:
        nvcc = str(request.toolkit.nvcc) if request.toolkit is not None else None
        path = options.value(attempt.plan.env, "PATH")
        extra.update(request.launcher.launch_env(path, nvcc=nvcc))
    known = _known_by(attempt)
    extra.update(known.recorder.env())
    made = _stored_wheel(attempt, known)
    if made is not None:
        return made
    earlier = _earlier_wheel(attempt, known, extra) if request.reuse_from is not None else None
    if isinstance(earlier, Built):
        return earlier
    if earlier is not None:
        extra.update(earlier.env)
    return _compile(attempt, known, extra, earlier)


@dataclass(frozen=True)
class _Attempt:
    """One :func:`build_engine` call: its request and what each of its steps reads."""

    request: EngineBuildRequest
    plan: BuildPlan
    note: Any  # pinwheel.compile.phases.Note: told what ran and what was skipped
    started: float  # time.monotonic() when the build began
    given: str  # workspace.inputs_digest: everything this build is given

    def built(
        self,
        wheel: Path,
        inputs: Mapping[str, Any],
        reused: Mapping[str, Any] | None,
        seconds: float | None = None,
    ) -> Built:
        """The :class:`Built` of ``wheel``; ``seconds``: since :attr:`started` when None."""
        r = self.request
        took = time.monotonic() - self.started if seconds is None else seconds
        return _built(
            self.plan, r.origin, wheel, took, r.version, r.source_date_epoch, inputs, reused,
            r.record,
        )  # fmt: skip


@dataclass(frozen=True)
class _KnownBy:
    """What a compiled build is known by: the recorder of its compiled inputs (made before
    the build starts), its reuse identity and the object store's facts beside it."""

    recorder: reuse.Recorder
    ident: dict[str, Any]
    match: dict[str, Any]


@dataclass(frozen=True)
class _Precompiled:
    """An earlier wheel's compiled members taken by the project's own precompiled path."""

    env: dict[str, str]  # reuse.precompiled_env: what points the build at the wheel
    reused: dict[str, Any]  # reuse.reuse_record
    inputs: dict[str, Any]  # the earlier build's compiled inputs, still holding


def _begin(request: EngineBuildRequest) -> _Attempt:
    plan = plan_build(request)
    started = time.monotonic()
    given = workspace.inputs_digest(
        key=str(plan.work), sources=[request.export_digest or ""],
        env=workspace.builder_env(plan.env, plan.set_env), command=list(plan.command),
        version=request.version, epoch=request.source_date_epoch,
        record=json.loads(json.dumps(request.record or {}, sort_keys=True, default=str)),
    )  # fmt: skip
    note = request.note if request.note is not None else Note()
    return _Attempt(request, plan, note, started, given)


def _last_wheel(attempt: _Attempt) -> Built | None:
    """The last build's wheel when this build is given exactly what that one was."""
    request = attempt.request
    usable = request.kept and request.export_digest is not None and request.reuse_from is None
    last = workspace.last_build(request.work, attempt.given) if usable else None
    if last is None:
        return None
    attempt.note.skip(
        f"the builder: same tree, sources, toolchain and environment as the last "
        f"build; its wheel is the build (sha256 confirmed by {last.how})"
    )
    request.reporter.info(
        f"engine: nothing changed since the last build (same tree, sources, toolchain and "
        f"environment): its wheel {last.wheel.name} is the build, nothing compiled"
    )
    return dataclasses.replace(
        attempt.built(last.wheel, {}, None), build=BuildRecord.from_json(last.record)
    )


def _known_by(attempt: _Attempt) -> _KnownBy:
    request, plan = attempt.request, attempt.plan
    source = Path(request.source)
    canonical = request.canonical
    alias = Path(canonical.to_build(source.resolve())) if canonical is not None else None
    recorder = reuse.Recorder(source, (source / "build",), alias=alias)
    ident = reuse.identity(
        plan.set_env, toolkit=request.toolkit, python=plan.python, builder="engine",
        inputs=_outside_inputs(request.record or {}),
        placeholders={**(request.placeholders or {}), str(plan.work): "$WORK",
                      str(plan.source): "$SRC"},
    )  # fmt: skip
    # Beside the identity: the exported tree (its digest), what reaches the wheel's
    # metadata (version, date) and the caller's compiler settings (objstore.caller_flags).
    match = {"tree": request.export_digest, "version": request.version,
             "source_date_epoch": request.source_date_epoch,
             "flags": objstore.caller_flags(request.environ)}  # fmt: skip
    return _KnownBy(recorder, ident, match)


def _stored_wheel(attempt: _Attempt, known: _KnownBy) -> Built | None:
    """The object store's wheel of this build (nothing compiles), or None: a miss."""
    request = attempt.request
    store = request.store
    if request.reuse_from is not None or store is None or request.export_digest is None:
        return None
    expect = objstore.Expect(name=objstore.project_name(Path(request.source)),
                             version=request.version, tree=request.origin.get("tree"))  # fmt: skip
    hit = store.lookup(known.ident, known.match, expect=expect)
    got = store.take(hit, request.work / "dist") if isinstance(hit, objstore.Hit) else hit
    if isinstance(hit, objstore.Hit) and isinstance(got, Path):
        wheel = got
        n = len(hit.record.get("compiled_members") or {})
        attempt.note.skip(
            f"compiling: the object store holds this build ({n} compiled member(s)): "
            "nothing preprocessed, configured, compiled or linked"
        )
        request.reporter.info(
            f"engine: object store hit: {n} compiled member(s) reused, 0 compiled"
        )
        made = attempt.built(wheel, hit.record, hit.reused())
        workspace.remember(request.work, attempt.given, wheel, made.build.to_json())
        remove_tree(known.recorder.depfile.parent, ignore_errors=True)  # nothing to record
        return made
    assert isinstance(got, objstore.Miss)
    attempt.note.did(f"object store: {got.why}")
    return None


def _earlier_wheel(
    attempt: _Attempt, known: _KnownBy, extra: Mapping[str, str]
) -> Built | _Precompiled | None:
    """``request.reuse_from``'s compiled members: the wheel itself when they all still hold,
    or what the project's precompiled path needs to take them; None: compile."""
    request, plan = attempt.request, attempt.plan
    reuse_from, source = request.reuse_from, Path(request.source)
    ok, why, rec = reuse.unchanged(reuse_from, source, known.ident)
    request.reporter.info(f"reuse from {reuse_from.wheel.name}: {'yes' if ok else 'no'}: {why}")
    pre = reuse.precompiled_env(source, reuse_from) if ok and rec else None
    if ok and rec is not None and pre is None:
        taken = reuse.try_reuse(
            reuse_from, source, known.ident, request.work / "dist", python=plan.python,
            env={**plan.env, **extra},
        )  # fmt: skip
        if taken is not None:
            return attempt.built(taken.wheel, taken.inputs, taken.members)
    if pre is not None and rec is not None:
        return _Precompiled(
            pre, reuse.reuse_record(reuse_from, rec, why + "; VLLM_USE_PRECOMPILED"), rec
        )
    return None


def _compile(
    attempt: _Attempt, known: _KnownBy, extra: Mapping[str, str], pre: _Precompiled | None
) -> Built:
    """Run the builder; record, remember and store the one wheel it writes."""
    request = attempt.request
    plan = dataclasses.replace(attempt.plan, env={**attempt.plan.env, **extra})
    attempt = dataclasses.replace(attempt, plan=plan)
    attempt.note.did(
        f"ran the wheel build ({'kept, incremental' if request.kept else 'fresh'} workspace)"
    )
    try:
        built = run_build(plan, request.reporter)
    except BuildError:
        _raise_if_downloads(plan, request.supplied)  # the more useful reason, when it is this one
        raise
    seconds = time.monotonic() - attempt.started
    _raise_if_downloads(plan, request.supplied)
    if len(built) != 1:
        raise BuildError(
            f"expected one engine wheel, the build wrote {[p.name for p in built]}",
            where=f"{plan.source} (log: {plan.log})",
            next="check the project's build backend: one distribution per build",
        )
    inputs: Mapping[str, Any] = known.recorder.collect(built[0], known.ident,
                                                       tree=request.origin.get("tree"))  # fmt: skip
    reused: dict[str, Any] | None = None
    if pre is not None:  # keep only what the precompiled path took
        new, _ = reuse.members_of(built[0], Path(request.source))
        kept = {m: d for m, d in pre.reused["members"].items() if new.get(m) == d}
        reused = {**pre.reused, "members": kept}
        inputs = pre.inputs  # nothing was compiled: the reused members' inputs still hold
    made = attempt.built(built[0], inputs, reused, seconds)
    if request.export_digest is not None:
        workspace.remember(request.work, attempt.given, built[0], made.build.to_json())
    if request.store is not None and reused is None and request.export_digest is not None:
        attempt.note.did(request.store.put(built[0], inputs, known.match)[1])
    return made


def _built(
    plan: BuildPlan,
    origin: Mapping[str, Any],
    wheel: Path,
    seconds: float,
    version: str,
    source_date_epoch: int,
    inputs: Mapping[str, Any],
    reused: Mapping[str, Any] | None,
    record: Mapping[str, Any] | None = None,
) -> Built:
    facts = dict(record or {})
    unknown = set(facts) - {"excluded", "requirements", "sources", "network", "canonical"}
    assert not unknown, f"engine build facts without a BuildRecord field: {sorted(unknown)}"
    return Built(
        component="engine",
        kind="engine",
        wheel=wheel,
        seconds=seconds,
        source=dict(origin),
        build=BuildRecord(
            version=version,
            source_date_epoch=source_date_epoch,
            env=dict(sorted(plan.set_env.items())),
            command=tuple(_portable(plan.command, plan)),
            arches=tuple(str(a) for a in plan.arches),
            compiled_inputs=dict(inputs),
            reused=dict(reused) if reused is not None else None,
            excluded=tuple(facts["excluded"]) if "excluded" in facts else None,
            requirements=facts.get("requirements"),
            sources=tuple(facts["sources"]) if "sources" in facts else None,
            network=facts.get("network"),
            canonical=facts.get("canonical"),
        ),
    )


def _outside_inputs(record: Mapping[str, Any]) -> dict[str, Any]:
    """What reaches the compilers from outside the tree: each build source's exported,
    patched digest and the build requirements' hash (torch's headers, cmake, ...)."""
    sources = [
        {"name": s.get("name"), "commit": s.get("commit"), "sha256": s.get("sha256")}
        for s in record.get("sources") or []
    ]
    requirements = (record.get("requirements") or {}).get("requirements_sha256")
    return {
        **({"sources": sources} if sources else {}),
        **({"requirements": requirements} if requirements else {}),
    }


def _portable(command: Sequence[str], plan: BuildPlan) -> list[str]:
    """The command as recorded: scratch paths replaced by placeholders."""
    scratch = {str(plan.work): "$WORK", str(plan.source): "$SRC"}
    return [reuse.portable(c, scratch) for c in command]


def _raise_if_downloads(plan: BuildPlan, supplied: Sequence[str]) -> None:
    """A build that tried to fetch source nobody supplied fails, naming what it wanted."""
    wanted = undeclared_downloads(plan.log.read_text(errors="replace"), supplied)
    if wanted:
        raise BuildError(
            f"the build tried to download sources no [[build.source]] supplies: "
            f"{'; '.join(wanted[:5])}",
            where=f"{plan.source} (log: {plan.log})",
            next="declare and pin them: `pinwheel plan` lists the sources, `pinwheel lock` "
            "pins them; a source CMake hides (a macro, ExternalProject) needs a "
            "[[build.source]] written by hand",
        )

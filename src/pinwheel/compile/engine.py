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
    published here (the fields: :class:`EngineBuildRequest`)."""
    source, work, toolkit = request.source, request.work, request.toolkit
    version, source_date_epoch = request.version, request.source_date_epoch
    environ, origin, record = request.environ, request.origin, request.record
    supplied, reuse_from, reporter = request.supplied, request.reuse_from, request.reporter
    canonical, export_digest, kept = request.canonical, request.export_digest, request.kept
    launcher, placeholders, store = request.launcher, request.placeholders, request.store
    note = request.note if request.note is not None else Note()
    work.mkdir(parents=True, exist_ok=True)
    plan = plan_build(request)
    started = time.monotonic()
    given = workspace.inputs_digest(
        key=str(plan.work), sources=[export_digest or ""],
        env=workspace.builder_env(plan.env, plan.set_env), command=list(plan.command),
        version=version, epoch=source_date_epoch,
        record=json.loads(json.dumps(record or {}, sort_keys=True, default=str)),
    )  # fmt: skip
    usable = kept and export_digest is not None and reuse_from is None
    last = workspace.last_build(work, given) if usable else None
    if last is not None:
        note.skip(f"the builder: same tree, sources, toolchain and environment as the last "
                  f"build; its wheel is the build (sha256 confirmed by {last.how})")  # fmt: skip
        reporter.info(
            f"engine: nothing changed since the last build (same tree, sources, toolchain and "
            f"environment): its wheel {last.wheel.name} is the build, nothing compiled"
        )
        return dataclasses.replace(
            _built(plan, origin, last.wheel, time.monotonic() - started, version,
                   source_date_epoch, {}, None, record),
            build=BuildRecord.from_json(last.record),
        )  # fmt: skip
    workspace.forget(work)
    extra: dict[str, str] = {}
    if launcher is not None:
        nvcc = str(toolkit.nvcc) if toolkit is not None else None
        extra.update(launcher.launch_env(options.value(plan.env, "PATH"), nvcc=nvcc))
    alias = Path(canonical.to_build(Path(source).resolve())) if canonical is not None else None
    recorder = reuse.Recorder(Path(source), (Path(source) / "build",), alias=alias)
    extra.update(recorder.env())
    ident = reuse.identity(
        plan.set_env, toolkit=toolkit, python=plan.python, builder="engine",
        inputs=_outside_inputs(record or {}),
        placeholders={**(placeholders or {}), str(plan.work): "$WORK", str(plan.source): "$SRC"},
    )  # fmt: skip
    reused: dict[str, Any] | None = None
    rec: dict[str, Any] | None = None
    # Beside the identity: the exported tree (its digest), what reaches the wheel's
    # metadata (version, date) and the caller's compiler settings (objstore.caller_flags).
    match = {"tree": export_digest, "version": version, "source_date_epoch": source_date_epoch,
             "flags": objstore.caller_flags(environ)}  # fmt: skip
    if reuse_from is None and store is not None and export_digest is not None:
        expect = objstore.Expect(name=objstore.project_name(Path(source)), version=version,
                                 tree=origin.get("tree"))  # fmt: skip
        hit = store.lookup(ident, match, expect=expect)
        got = store.take(hit, work / "dist") if isinstance(hit, objstore.Hit) else hit
        if isinstance(hit, objstore.Hit) and isinstance(got, Path):
            wheel = got
            n = len(hit.record.get("compiled_members") or {})
            note.skip(f"compiling: the object store holds this build ({n} compiled member(s)): "
                      "nothing preprocessed, configured, compiled or linked")  # fmt: skip
            reporter.info(f"engine: object store hit: {n} compiled member(s) reused, 0 compiled")
            made = _built(plan, origin, wheel, time.monotonic() - started, version,
                          source_date_epoch, hit.record, hit.reused(), record)  # fmt: skip
            workspace.remember(work, given, wheel, made.build.to_json())
            remove_tree(recorder.depfile.parent, ignore_errors=True)  # nothing to record
            return made
        assert isinstance(got, objstore.Miss)
        note.did(f"object store: {got.why}")
    if reuse_from is not None:
        ok, why, rec = reuse.unchanged(reuse_from, Path(source), ident)
        reporter.info(f"reuse from {reuse_from.wheel.name}: {'yes' if ok else 'no'}: {why}")
        pre = reuse.precompiled_env(Path(source), reuse_from) if ok and rec else None
        if ok and rec is not None and pre is None:
            taken = reuse.try_reuse(
                reuse_from, Path(source), ident, work / "dist", python=plan.python,
                env={**plan.env, **extra},
            )  # fmt: skip
            if taken is not None:
                return _built(plan, origin, taken.wheel, time.monotonic() - started, version,
                              source_date_epoch, taken.inputs, taken.members, record)  # fmt: skip
        if pre is not None and rec is not None:
            extra.update(pre)
            reused = reuse.reuse_record(reuse_from, rec, why + "; VLLM_USE_PRECOMPILED")
    plan = dataclasses.replace(plan, env={**plan.env, **extra})
    note.did(f"ran the wheel build ({'kept, incremental' if kept else 'fresh'} workspace)")
    try:
        built = run_build(plan, reporter)
    except BuildError:
        _raise_if_downloads(plan, supplied)  # the more useful reason, when it is this one
        raise
    seconds = time.monotonic() - started
    _raise_if_downloads(plan, supplied)
    if len(built) != 1:
        raise BuildError(
            f"expected one engine wheel, the build wrote {[p.name for p in built]}",
            where=f"{plan.source} (log: {plan.log})",
            next="check the project's build backend: one distribution per build",
        )
    inputs: Mapping[str, Any] = recorder.collect(built[0], ident, tree=origin.get("tree"))
    if reused is not None and rec is not None:  # keep only what the precompiled path took
        new, _ = reuse.members_of(built[0], Path(source))
        reused["members"] = {m: d for m, d in reused["members"].items() if new.get(m) == d}
        inputs = rec  # nothing was compiled: the reused members' inputs still hold
    made = _built(
        plan, origin, built[0], seconds, version, source_date_epoch, inputs, reused, record
    )
    if export_digest is not None:
        workspace.remember(work, given, built[0], made.build.to_json())
    if store is not None and reused is None and export_digest is not None:
        note.did(store.put(built[0], inputs, match)[1])
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

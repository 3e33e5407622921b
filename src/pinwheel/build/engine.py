"""The engine build driver: replayed tree -> checked wheels + SHA256SUMS + provenance.json.

``tools/replay build`` replays the manifest, then calls :func:`build_wheels`:

1. resolve the CUDA toolkit once (``pinwheel.toolchain.resolve_toolkit``; it
   refuses one that cannot compile the manifest's arches);
2. export the replayed tree (``pinwheel.export.export_tree``);
3. run ``python -m build --wheel --no-isolation`` (or ``setup.py bdist_wheel``)
   with TORCH_CUDA_ARCH_LIST / CUDAARCHS from ``[build] arches``, the version
   ``<version>+<label>`` in SETUPTOOLS_SCM_PRETEND_VERSION and
   VLLM_VERSION_OVERRIDE, MAX_JOBS / NVCC_THREADS, CUDA_HOME from the toolkit,
   and SOURCE_DATE_EPOCH = the base commit's committer date;
4. check the wheels (:mod:`pinwheel.check`) *before* they reach ``wheels/``;
5. write SHA256SUMS and the provenance receipt beside them.

``pinwheel verify-build`` (:func:`verify_build`) does it again and compares.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel.build.check import (
    CheckReport,
    arches_from_build,
    check_wheels,
    find_tools,
    spec_from_build,
)
from pinwheel.build.cudaarch import CudaArch
from pinwheel.build.provenance import (
    FILENAME,
    read_receipt,
    receipt,
    toolchain_facts,
    write_receipt,
)
from pinwheel.checksums import sha256_file, write_sums
from pinwheel.errors import EXIT_MISMATCH, ManifestError, MismatchError, PinwheelError
from pinwheel.manifest import Manifest
from pinwheel.manifest.build import BuildConfig

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
    toolkit: Any = None  # pinwheel.toolchain.Toolkit, or None for a CUDA-free build

    @property
    def log(self) -> Path:
        return self.work / "build.log"


@dataclass(frozen=True)
class BuildOutcome:
    wheels: tuple[Path, ...]  # built by this run, now in out_dir
    sums: Path
    provenance: Path
    report: CheckReport
    seconds: float

    def __int__(self) -> int:
        """Exit status for ``tools/replay build`` (a failed build raises instead)."""
        return 0

    def to_json(self) -> dict[str, Any]:
        return {
            "wheels": {p.name: sha256_file(p) for p in self.wheels},
            "sha256sums": str(self.sums),
            "provenance": str(self.provenance),
            "check": self.report.to_json(),
            "seconds": round(self.seconds, 1),
        }

    def human_lines(self) -> list[str]:
        lines = [f"built {len(self.wheels)} wheel(s) in {self.seconds:.1f} s:"]
        lines += [f"  {sha256_file(p)}  {p.name}" for p in self.wheels]
        lines += self.report.human_lines()
        lines += [f"wrote {self.sums}", f"wrote {self.provenance}"]
        return lines


# --------------------------------------------------------------------------- inputs


def commit_time(repo_path: Path, commit: str) -> int:
    """Committer time of ``commit``: the SOURCE_DATE_EPOCH of a build of its tree."""
    import pygit2

    return int(pygit2.Repository(str(repo_path))[commit].peel(pygit2.Commit).commit_time)


def scm_version(repo_path: Path, commit: str) -> str:
    """setuptools-scm's guess-next-dev version of ``commit``: v1.5.1 + 1486 -> 1.5.2.dev1486.

    The exported tree has no .git, so the build cannot compute this itself.
    """
    out = subprocess.run(
        [
            "git",
            "--git-dir",
            str(repo_path),
            "describe",
            "--tags",
            "--long",
            "--match",
            "v*",
            "--end-of-options",
            commit,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise ManifestError(
            f"cannot derive a version for {commit[:12]}: no v* tag below it "
            f"({out.stderr.strip().splitlines()[-1] if out.stderr.strip() else 'git describe'})",
            where="[build] version",
            next='set [build] version = "1.5.2.devN" in the manifest',
        )
    tag, distance, _ = out.stdout.strip().rsplit("-", 2)
    parts = tag.lstrip("v").split(".")
    if int(distance) == 0:
        return ".".join(parts)
    parts[-1] = str(int(parts[-1]) + 1)
    return ".".join(parts) + f".dev{distance}"


def build_python(environ: Mapping[str, str] | None = None) -> str:
    """The interpreter that builds: $PINWHEEL_BUILD_PYTHON (a venv with torch and the
    project's build requirements), else the one running pinwheel."""
    env = os.environ if environ is None else environ
    chosen = env.get("PINWHEEL_BUILD_PYTHON") or sys.executable
    if not shutil.which(chosen):
        raise BuildError(
            f"PINWHEEL_BUILD_PYTHON={chosen} is not an executable",
            where="PINWHEEL_BUILD_PYTHON",
            next="point it at the python of the build venv (with torch and build installed)",
        )
    return chosen


def wheel_command(python: str, source: Path, outdir: Path) -> tuple[str, ...]:
    """`python -m build --wheel --no-isolation`, or `setup.py bdist_wheel` without `build`."""
    has_build = subprocess.run([python, "-c", "import build"], capture_output=True).returncode == 0
    if has_build:
        return (python, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(outdir), ".")
    if (source / "setup.py").is_file():
        return (python, "setup.py", "bdist_wheel", "--dist-dir", str(outdir))
    raise BuildError(
        f"{python} has no `build` module and {source} has no setup.py",
        where=str(source),
        next=f"{python} -m pip install build",
    )


def build_env(
    config: Any,
    *,
    version: str,
    source_date_epoch: int,
    toolkit: Any,
    base: Mapping[str, str],
) -> tuple[dict[str, str], dict[str, str]]:
    """(full environment, the part pinwheel set). [build] env wins over pinwheel's defaults."""
    arches = arches_from_build(config)
    set_env = {
        "TORCH_CUDA_ARCH_LIST": config.torch_arch_list,
        "CUDAARCHS": config.cmake_architectures,  # CMake's default CMAKE_CUDA_ARCHITECTURES
        "SETUPTOOLS_SCM_PRETEND_VERSION": version,
        "VLLM_VERSION_OVERRIDE": version,
        "SOURCE_DATE_EPOCH": str(source_date_epoch),
        "MAX_JOBS": str(os.cpu_count() or 1),
        "NVCC_THREADS": "1",
        "PYTHONHASHSEED": "0",
        "TZ": "UTC",
        "LC_ALL": "C",
    }
    set_env.update(config.env)
    full = dict(base)
    if toolkit is not None:
        full = toolkit.env(full)
        set_env.update({k: full[k] for k in ("CUDA_HOME", "CUDACXX") if k in full})
    full.update(set_env)
    assert arches  # parse_build_table insists on one
    return full, set_env


def plan_build(
    config: Any,
    source: Path,
    out_dir: Path,
    *,
    version: str,
    source_date_epoch: int,
    toolkit: Any,
    work: Path,
    python: str = sys.executable,
    base_env: Mapping[str, str] | None = None,
) -> BuildPlan:
    running = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if running != config.python:
        raise BuildError(
            f"[build] python pins {config.python}, the build interpreter {python} is {running}",
            where="[build] python",
            next=f"run pinwheel from a Python {config.python} environment that has torch and build",
        )
    env, set_env = build_env(
        config,
        version=version,
        source_date_epoch=source_date_epoch,
        toolkit=toolkit,
        base=os.environ if base_env is None else base_env,
    )
    outdir = work / "dist"
    return BuildPlan(
        source=Path(source),
        out_dir=Path(out_dir),
        work=work,
        python=python,
        command=wheel_command(python, Path(source), outdir),
        version=version,
        arches=arches_from_build(config),
        set_env=set_env,
        env=env,
        source_date_epoch=source_date_epoch,
        toolkit=toolkit,
    )


# --------------------------------------------------------------------------- running


def run_build(plan: BuildPlan) -> tuple[Path, ...]:
    """Run the backend; return the wheels it wrote (still in the scratch dir)."""
    outdir = plan.work / "dist"
    shutil.rmtree(outdir, ignore_errors=True)
    outdir.mkdir(parents=True)
    with open(plan.log, "wb") as log:
        log.write(("$ " + " ".join(plan.command) + "\n").encode())
        log.flush()
        proc = subprocess.run(
            plan.command,
            cwd=plan.source,
            env=dict(plan.env),
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    wheels = tuple(sorted(outdir.glob("*.whl")))
    if proc.returncode != 0 or not wheels:
        tail = plan.log.read_text(errors="replace").splitlines()[-LOG_TAIL:]
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


def _publish(built: Sequence[Path], out_dir: Path) -> tuple[Path, ...]:
    """Move checked wheels into out_dir, replacing older wheels of the same distributions."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dists = {w.name.split("-", 1)[0] for w in built}
    for old in out_dir.glob("*.whl"):
        if old.name.split("-", 1)[0] in dists:
            old.unlink()
    placed = []
    for wheel in built:
        target = out_dir / wheel.name
        shutil.move(str(wheel), target)
        placed.append(target)
    return tuple(placed)


def build_from_source(
    manifest: Any,
    source: Path,
    out_dir: Path,
    *,
    toolkit: Any,
    replayed: Any = None,
    version: str | None = None,
    source_date_epoch: int | None = None,
    work: Path | None = None,
    python: str | None = None,
) -> BuildOutcome:
    """Build, check, publish, checksum and record one source tree."""
    config = _build_config(manifest)
    if version is None:
        base_version = config.version or (
            scm_version(replayed.repo_path, replayed.base) if replayed is not None else None
        )
        if base_version is None:
            raise ManifestError(
                "no version for the wheel",
                where="[build] version",
                next='set [build] version = "1.5.2.devN"',
            )
        version = f"{base_version}+{config.label}" if config.label else base_version
    if source_date_epoch is None:
        if replayed is None:
            raise BuildError(
                "SOURCE_DATE_EPOCH unknown for a plain source tree",
                where=str(source),
                next="pass the base commit's date",
            )
        source_date_epoch = commit_time(replayed.repo_path, replayed.base)
    work = work or Path(tempfile.mkdtemp(prefix="pinwheel-build-"))
    work.mkdir(parents=True, exist_ok=True)
    plan = plan_build(
        config,
        source,
        out_dir,
        version=version,
        source_date_epoch=source_date_epoch,
        toolkit=toolkit,
        work=work,
        python=python or build_python(),
    )
    started = time.monotonic()
    built = run_build(plan)
    seconds = time.monotonic() - started

    cuobjdump, auditwheel = find_tools(plan.toolkit.root if plan.toolkit is not None else None)
    spec = spec_from_build(
        config,
        build_dirs=(str(plan.source), str(plan.work)),
        cuobjdump=cuobjdump,
        auditwheel=auditwheel,
    )
    report = check_wheels(built, spec)
    report.raise_if_failed()  # unchecked wheels never reach out_dir

    placed = _publish(built, Path(out_dir))
    everything = sorted(p.name for p in Path(out_dir).glob("*.whl"))
    sums = write_sums(Path(out_dir), everything)
    digests = {name: sha256_file(Path(out_dir) / name) for name in everything}
    facts = toolchain_facts(
        plan.python,
        toolkit.nvcc if toolkit is not None else None,
        toolkit.version if toolkit is not None else None,
    )
    payload = receipt(
        manifest,
        replayed,
        version=version,
        toolchain=facts,
        arches=[str(a) for a in plan.arches],
        env=plan.set_env,
        wheels=digests,
        built=[p.name for p in placed],
        command=_portable(plan.command, plan),
        source_date_epoch=source_date_epoch,
    )
    prov = write_receipt(Path(out_dir), payload)
    return BuildOutcome(placed, sums, prov, report, seconds)


def _portable(command: Sequence[str], plan: BuildPlan) -> list[str]:
    """The command as recorded: scratch paths replaced by placeholders."""
    return [c.replace(str(plan.work), "$WORK").replace(str(plan.source), "$SRC") for c in command]


def _build_config(manifest: Manifest) -> BuildConfig:
    config: BuildConfig = manifest.require("build")
    return config


def build_wheels(ctx: Any, manifest: Any, replayed: Any, out_dir: Path) -> BuildOutcome:
    """The wheel half of ``tools/replay build``: export, build, check, SHA256SUMS, provenance."""
    from pinwheel.build.toolchain import resolve_toolkit
    from pinwheel.source.export import export_tree

    config = _build_config(manifest)
    toolkit = resolve_toolkit(config, ctx.cache, provision=not ctx.offline)
    work = ctx.cache / "build" / f"{manifest.name}-{replayed.tree[:12]}"
    source = export_tree(replayed, work / "src")
    outcome = build_from_source(
        manifest, source, Path(out_dir), toolkit=toolkit, replayed=replayed, work=work
    )
    ctx.emit(outcome.to_json(), "\n".join(outcome.human_lines()))
    return outcome


# --------------------------------------------------------------------------- verify-build


@dataclass(frozen=True)
class MemberDiff:
    member: str
    change: str  # "differs" | "only in recorded" | "only in rebuilt"


@dataclass(frozen=True)
class WheelComparison:
    wheel: str
    recorded: str
    rebuilt: str | None  # None: the rebuild made no wheel of that name
    members: tuple[MemberDiff, ...] = ()
    diffoscope: str | None = None

    @property
    def same(self) -> bool:
        return self.recorded == self.rebuilt


@dataclass(frozen=True)
class RebuildComparison:
    wheels: tuple[WheelComparison, ...]
    exit_code: int = EXIT_MISMATCH

    @property
    def same(self) -> bool:
        return all(w.same for w in self.wheels)

    def to_json(self) -> dict[str, Any]:
        return {
            "same": self.same,
            "wheels": [
                {
                    "wheel": w.wheel,
                    "recorded": w.recorded,
                    "rebuilt": w.rebuilt,
                    "same": w.same,
                    "members": [{"member": m.member, "change": m.change} for m in w.members],
                    "diffoscope": w.diffoscope,
                }
                for w in self.wheels
            ],
        }

    def human_lines(self) -> list[str]:
        lines = []
        for w in self.wheels:
            if w.same:
                lines.append(f"same     {w.recorded}  {w.wheel}")
                continue
            lines.append(f"DIFFERS  {w.wheel}: recorded {w.recorded}, rebuilt {w.rebuilt}")
            lines += [f"    {m.change}: {m.member}" for m in w.members]
            if w.diffoscope:
                lines += ["    diffoscope:"] + [f"      {ln}" for ln in w.diffoscope.splitlines()]
        verdict = "reproducible" if self.same else "NOT reproducible"
        lines.append(
            f"{verdict}: {sum(w.same for w in self.wheels)}/{len(self.wheels)} wheel(s) identical"
        )
        return lines


def diff_members(a: Path, b: Path) -> tuple[MemberDiff, ...]:
    """Zip members whose bytes or metadata (time, mode) differ between two wheels."""
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia = {i.filename: i for i in za.infolist()}
        ib = {i.filename: i for i in zb.infolist()}
        diffs = [MemberDiff(n, "only in recorded") for n in sorted(ia.keys() - ib.keys())]
        diffs += [MemberDiff(n, "only in rebuilt") for n in sorted(ib.keys() - ia.keys())]
        for name in sorted(ia.keys() & ib.keys()):
            x, y = ia[name], ib[name]
            if x.CRC != y.CRC or x.file_size != y.file_size or za.read(x) != zb.read(y):
                diffs.append(MemberDiff(name, "differs"))
            elif (x.date_time, x.external_attr) != (y.date_time, y.external_attr):
                diffs.append(MemberDiff(name, "differs (zip metadata: time or mode)"))
        if not diffs and [i.filename for i in za.infolist()] != [i.filename for i in zb.infolist()]:
            diffs.append(MemberDiff("(member order)", "differs"))
    return tuple(diffs)


def _diffoscope(a: Path, b: Path, limit: int = 60) -> str | None:
    tool = shutil.which("diffoscope")
    if not tool:
        return None
    out = subprocess.run(
        [tool, "--text", "-", str(a), str(b)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    return "\n".join(out.stdout.splitlines()[:limit]) or None


def compare_builds(recorded_dir: Path, rebuilt_dir: Path) -> RebuildComparison:
    """Compare every wheel the recorded build made with the rebuild's wheel of the same name."""
    recorded = read_receipt(Path(recorded_dir) / FILENAME)
    results = []
    for name in recorded["built"]:
        want = recorded["wheels"][name]
        ours = Path(recorded_dir) / name
        theirs = Path(rebuilt_dir) / name
        got = sha256_file(theirs) if theirs.is_file() else None
        if got == want:
            results.append(WheelComparison(name, want, got))
            continue
        members: tuple[MemberDiff, ...] = ()
        diffo = None
        if got is not None and ours.is_file():
            members = diff_members(ours, theirs)
            diffo = _diffoscope(ours, theirs)
        results.append(WheelComparison(name, want, got, members, diffo))
    return RebuildComparison(tuple(results))


def verify_build(
    ctx: Any,
    wheels_dir: Path,
    *,
    source: Path | None = None,
    keep: Path | None = None,
    toolkit: Any = None,
) -> RebuildComparison:
    """Rebuild what ``wheels_dir/provenance.json`` records and compare sha256s."""
    from pinwheel.build.toolchain import resolve_toolkit

    recorded = read_receipt(Path(wheels_dir) / FILENAME)
    manifest = ctx.manifest()
    if recorded["manifest"]["sha256"] != manifest.sha256:
        raise MismatchError(
            f"{manifest.path.name} changed since this build (sha256 {manifest.sha256[:16]}…, "
            f"the receipt records {recorded['manifest']['sha256'][:16]}…)",
            where=str(Path(wheels_dir) / FILENAME),
            next="check out the manifest the build used, or rebuild with `tools/replay build`",
        )
    config = _build_config(manifest)
    if toolkit is None and config is not None:
        toolkit = resolve_toolkit(config, ctx.cache, provision=not ctx.offline)
    out = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="pinwheel-rebuild-"))
    replayed = None
    # Same scratch path as the first build: compilers embed source paths in objects.
    tree = str(recorded.get("tree") or "source")[:12]
    work = ctx.cache / "build" / f"{manifest.name}-{tree}"
    if source is None:
        from pinwheel.source.export import export_tree
        from pinwheel.source.replay import replay_manifest

        replayed = replay_manifest(
            manifest, cache=ctx.cache, mirrors=ctx.mirrors, offline=ctx.offline, write_refs=False
        )
        source = export_tree(replayed, work / "src")
    build_from_source(
        manifest,
        source,
        out,
        toolkit=toolkit,
        replayed=replayed,
        version=recorded["version"],
        source_date_epoch=int(recorded["source_date_epoch"]),
        work=work,
    )
    comparison = compare_builds(Path(wheels_dir), out)
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return comparison

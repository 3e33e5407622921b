"""Kernel packages: the manifest's ``[[kernel]]`` tables, and one reproducible wheel for each.

A kernel is either in-tree (``path = "kernels/NAME"``, a scikit-build-core +
CMake package) or out-of-tree (``url`` + ``commit`` + ``[[kernel.patch]]``),
replayed with the same engine as the main stack and built with torch's
CUDAExtension in a venv holding ``[build].torch``.

Each build returns a :class:`~pinwheel.wheels.wheelset.Built` (the wheel still
in scratch); :mod:`pinwheel.wheels.wheelset` checks and publishes it with the
rest. Builds run with ``SOURCE_DATE_EPOCH`` set, in the component's kept
workspace (:mod:`pinwheel.compile.workspace`: the export updated in place with
fixed file times, the build tree kept while the compiled-input identity holds and
told what changed by :mod:`pinwheel.compile.invalidate`, so a rebuild compiles only
what changed; unchanged inputs hand back the last wheel), seen by the compilers
at the canonical path (:mod:`pinwheel.compile.canonical`) with sorted directory
listings (:mod:`pinwheel.compile.listing`), so two builds of the same inputs give
the same bytes from any cache path (``--twice`` proves it on one machine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import cachelayout, confine, options, runner
from pinwheel.checksums import sha256_file
from pinwheel.compile import (
    frontend,
    headerview,
    listing,
    lockedvenv,
    objstore,
    reuse,
    toollocks,
    torchlocks,
    workspace,
)
from pinwheel.compile.buildenv import build_env, declared_base
from pinwheel.compile.buildvenv import ensure_build_venv
from pinwheel.compile.canonical import CANONICAL_ROOT, Canonical
from pinwheel.compile.canonical import choose as canonical_paths
from pinwheel.compile.derivation import Derivation
from pinwheel.compile.invalidate import after_update
from pinwheel.compile.toolchain import Toolkit
from pinwheel.compile.toolchain.pythons import find_python, how_to_get, python_version
from pinwheel.errors import ManifestError, MismatchError, PinwheelError
from pinwheel.fsutil import remove_tree
from pinwheel.manifest import Manifest
from pinwheel.manifest.build import (  # noqa: F401
    BuildConfig,
    KernelPatch,
    KernelSpec,
    Requirements,
    parse_kernel_tables,
)
from pinwheel.manifest.component import by_name, component_manifest
from pinwheel.options import HostEnvironment
from pinwheel.printable import shown_cmd
from pinwheel.progress import SILENT, Reporter
from pinwheel.source import gitcli
from pinwheel.source.cache import mark as mark_cache
from pinwheel.urls import redact
from pinwheel.wheels.record import BuildRecord
from pinwheel.wheels.wheeldiff import diff_members
from pinwheel.wheels.wheelset import Built

# Earliest time a zip member can carry; used when nothing better dates the source.
ZIP_EPOCH = 315532800  # 1980-01-01T00:00:00Z


class KernelBuildError(PinwheelError):
    """A kernel package failed to build."""


# --------------------------------------------------------------------------- building


@dataclass(frozen=True)
class SourceTree:
    """A kernel's source, staged at a fixed path so outputs do not depend on the checkout."""

    directory: Path
    source_date_epoch: int
    origin: str  # "kernels/NAME" or "URL@COMMIT"
    tree: str | None  # replayed git tree (out-of-tree kernels)
    digest: str = ""  # workspace.Synced.digest of the export
    changed: tuple[str, ...] = ()  # files the sync wrote or removed (relative)


@dataclass(frozen=True)
class BuildOptions:
    """Resolved once by the CLI (or a test) and passed down."""

    cache: Path
    mirrors: Mapping[str, str]
    host: HostEnvironment  # the caller's environment, typed once (pinwheel.options.host)
    offline: bool = False
    source_date_epoch: int | None = None  # None: date of the kernel's source
    reporter: Reporter = SILENT
    launcher: Any = None  # compcache.Session: wrap the compilers in sccache
    reuse: Any = None  # reuse.Candidate: take compiled members from an earlier wheel
    canonical: Canonical | None = None  # None: chosen for the cache on first use
    cold: bool = False  # True: wipe the kept workspace first (--no-cache, verify-build)
    store: Any = None  # objstore.Store: a hit reuses compiled members, nothing compiles
    wheelhouse: Path | None = None  # offline machines: the locked wheels from this folder

    def canon(self) -> Canonical:
        return self.canonical or canonical_paths(self.cache, self.host)


def workdir(spec: KernelSpec, opts: BuildOptions) -> Path:
    """The kernel's kept workspace: ``src/`` (the export), ``build/``, ``dist/``, the log."""
    return cachelayout.bucket(opts.cache, "kernels") / spec.name


def stage_in_tree(spec: KernelSpec, opts: BuildOptions) -> SourceTree:
    """The checkout's kernel directory, synced into the workspace (changed files only)."""
    assert spec.path is not None
    work = workdir(spec, opts)
    dest = work / "src"
    synced = workspace.sync(dest, workspace.dir_entries(spec.path), work / "export.json")
    epoch = opts.source_date_epoch
    if epoch is None:
        epoch = _git_date(spec.path) or ZIP_EPOCH
    rel = f"{spec.path.parent.name}/{spec.path.name}"
    return SourceTree(dest, epoch, rel, None, synced.digest, synced.changed)


def _git_date(path: Path) -> int | None:
    """Committer time of the last commit touching ``path`` (its checkout's history)."""
    # The user's own checkout: its config is theirs (not refused); the policy's overrides apply.
    out = gitcli.git(
        ["log", "-1", "--format=%ct", "--", "."], cwd=path, check=False, own_checkout=True
    )
    value = out.text
    return int(value) if out.returncode == 0 and value.isdigit() else None


def kernel_manifest(spec: KernelSpec) -> Manifest:
    """The out-of-tree kernel as a stack the replay engine understands (its own steps)."""
    return component_manifest(spec)


def stage_out_of_tree(spec: KernelSpec, opts: BuildOptions) -> SourceTree:
    from pinwheel.source.libgit2 import pygit2  # the replay engine's; kept off parsing
    from pinwheel.source.replay import replay_manifest

    result = replay_manifest(
        kernel_manifest(spec),
        cache=opts.cache,
        mirrors=dict(opts.mirrors),
        offline=opts.offline,
        write_refs=False,
    )
    work = workdir(spec, opts)
    dest = work / "src"
    synced = workspace.sync_tree(result, dest, work / "export.json")
    epoch = opts.source_date_epoch
    if epoch is None:
        base = pygit2.Repository(str(result.repo_path))[result.base]
        epoch = base.commit_time  # type: ignore[attr-defined]
    origin = f"{redact(spec.url or '')}@{spec.commit[:12]}"  # type: ignore[index]
    if spec.steps:
        origin += f" + {len(spec.steps)} step(s) -> {result.head[:12]}"
    return SourceTree(dest, epoch, origin, result.tree, synced.digest, synced.changed)


def _run(
    cmd: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    what: str,
    log_file: Path,
    canonical: Canonical | None = None,
) -> None:
    """Run ``cmd``; with ``canonical``, where the compilers see the cache at its fixed path."""
    if canonical is not None:
        cmd, cwd = canonical.wrap(cmd, cwd)
        env = canonical.env(env)
    runner.run(
        runner.Command(
            tuple(cmd),
            what=what,
            cwd=cwd,
            env=env,
            output="log",
            log_file=log_file,
            error=KernelBuildError,
            where=f"{' '.join(cmd[:4])} ... (full log: {log_file})",
            next="read the log; `pinwheel toolchain` shows the toolkit in use",
            redact=True,
        )
    )


TORCH_VENV_READY = ".pinwheel-ready"  # in a torch venv pinwheel made (its headers' times fixed)

# Beside torch, what setup.py-based CUDA extensions import at build time (setuptools,
# wheel, ninja, packaging, numpy, psutil) and the CMake kernels' scikit-build-core, cmake
# and ninja: from the hashed locks locks/torch-build.txt and locks/cmake-build.txt, in a
# venv of their own (pinwheel.compile.lockedvenv), never from the machine or pinwheel's venv.
TORCH_BUILD_LOCK = "torch-build"
CMAKE_BUILD_LOCK = "cmake-build"


def locked_build_venv(
    lock: str,
    interpreter: str,
    opts: BuildOptions,
    *,
    overlay_from: str | None = None,
    overlay_lock: tuple[str, str] | None = None,
) -> lockedvenv.LockedVenv:
    """The build tools' venv from ``locks/<lock>.txt`` on ``interpreter`` (made once)."""
    path = toollocks.lock_path(lock)
    req = lockedvenv.LockedVenvRequest(
        lock=path, lock_name=f"{toollocks.LOCK_DIR}/{path.name}", interpreter=interpreter,
        cache=opts.cache, environ=opts.host.child, kind=lock, overlay_from=overlay_from,
        overlay_lock=overlay_lock,
        # offline machines: the locked wheels from a folder (hashes still required)
        wheelhouse=opts.wheelhouse,
    )  # fmt: skip
    return lockedvenv.ensure(req, opts.reporter)


@dataclass(frozen=True)
class TorchPython:
    """The Python a torch extension compiles against."""

    python: Path
    # (the lock's name as provenance says it, its sha256) when pinwheel made this Python from
    # a hashed lock; None for a machine's (PINWHEEL_TORCH_PYTHON)
    lock: tuple[str, str] | None


def torch_venv(
    config: BuildConfig, cache: Path, reporter: Reporter, host: HostEnvironment
) -> TorchPython:
    """A Python with ``[build].torch`` installed by hash (a venv made once), or the machine's;
    the build tools come from :func:`locked_build_venv` in front of it.

    torch is installed only from a hashed lock: the manifest's ``[build.torch_lock]`` (a
    ``pip --require-hashes`` file pinned by its sha256, for the out-of-tree kernels only),
    else its ``[build.requirements]`` (the venv the engine builds in), which must pin
    ``torch==[build] torch`` and everything it needs, built with a CUDA of ``[build] cuda``'s
    major that carries the arches (:func:`torch_lock`); it is installed with
    ``--require-hashes --no-deps`` from ``[build] torch_index`` when the manifest names one
    (a cu130 build gets the cu130 torch whose file the lock hashed), else pip's default
    index, or offline from ``PINWHEEL_WHEELHOUSE``. No lock, no install: :func:`torch_lock`
    says how to write one. ``PINWHEEL_TORCH_PYTHON`` names an interpreter that already holds
    that torch (an offline build machine): it is checked and used instead.
    """
    if not config.torch:
        raise ManifestError(
            "a torch-extension kernel needs [build] torch: the torch its extension compiles "
            "against, installed from a hashed lock ([build.torch_lock])",
            where="[build] torch",
            next='set [build] torch (e.g. "2.10.0") to the torch the kernel\'s wheels are built '
            "against, then write its lock (docs/build.md, \"torch by hash\")",
        )
    if host.torch_python is not None:
        return TorchPython(_given_torch_python(host.torch_python, config), None)
    reqs = torch_lock(config)
    base = build_interpreter(config, host)
    # its size before and its progress during: ensure_build_venv (pinwheel.compile.pipwatch)
    venv = ensure_build_venv(
        reqs, cache, environ=host.child, offline=False, reporter=reporter,
        wheelhouse=host.wheelhouse, interpreter=base, index_url=config.torch_index,
    )  # fmt: skip
    return TorchPython(venv.python, (reqs.path.name, reqs.sha256))  # beside the manifest



def how_to_lock_torch(config: BuildConfig, machine: str | None = None) -> str:
    """The commands that write ``[build.torch_lock]`` for ``[build] torch``, run where its
    index (``[build] torch_index``, else PyPI) can be reached."""
    machine = machine or platform.machine()
    name = f"torch-{config.torch}-cp{config.python.replace('.', '')}-{machine}.txt"
    command = torchlocks.by_hand(
        str(config.torch), config.python, f"{machine}-{torchlocks.PLATFORM_TAIL}",
        config.torch_index, name,
    )  # fmt: skip
    return (
        f"write the lock where {config.torch_index or 'PyPI'} can be reached: "
        f"{command}; then set [build.torch_lock] "
        f'path = "{name}" (beside the manifest) and sha256 = the output of '
        f"`{shown_cmd('sha256sum', name)}` "
        "(docs/build.md, \"torch by hash\"); or point PINWHEEL_TORCH_PYTHON at a Python "
        f"that holds torch {config.torch}"
    )


def torch_lock(config: BuildConfig) -> Requirements:
    """``[build.torch_lock]``, else ``[build.requirements]``, when it pins ``torch==[build]
    torch`` with hashes and that torch's CUDA (the runtime the lock pins) fits ``[build]
    cuda`` and the arches; else a :class:`pinwheel.errors.ManifestError` naming the key and
    the commands that write the lock."""
    key = "torch_lock" if config.torch_lock is not None else "requirements"
    reqs = config.torch_lock or config.requirements
    if reqs is None:
        raise ManifestError(
            f"[build] torch = {config.torch} is installed only by hash, and the manifest has no "
            "hashed lock for it",
            where="[build.torch_lock]",
            next=how_to_lock_torch(config),
        )
    where = f"[build.{key}] ({reqs.path.name})"
    bad = torchlocks.misfit(config, reqs.path.read_text(), reqs.path.name)
    if bad is not None:
        raise ManifestError(bad.what, where=where, next=bad.fix or how_to_lock_torch(config))
    return reqs


def _torch_version(python: Path) -> str | None:
    """The torch the build compiles against, from its distribution metadata: importing
    torch to ask (about two seconds) was paid on every build, no-change ones included."""
    probe = (
        "import importlib.metadata as m, sys\n"
        "v = m.version('torch')\n"
        "sys.exit(1) if not v else print(v)"
    )
    out = runner.run(runner.Command((str(python), "-c", probe), check=False))
    return out.text or None if out.returncode == 0 else None


def build_interpreter(config: BuildConfig, host: HostEnvironment) -> str:
    """A Python of ``[build] python`` for the torch-extension venv: its wheels are cpXY of it
    (the V100 card's are cp312). This interpreter when it matches, else one found on PATH,
    among uv's or pyenv's interpreters (:mod:`pinwheel.compile.toolchain.pythons`)."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if here == config.python:
        return sys.executable
    found = find_python(config.python, host)
    if found is not None:
        return found.path
    raise KernelBuildError(
        f"no Python {config.python} for the torch-extension build ([build] python pins it; "
        f"this interpreter is {here}; looked on PATH, in uv's and pyenv's interpreters; "
        f"its wheels are cp{config.python.replace('.', '')})",
        where="[build] python",
        next=f"{how_to_get(config.python)} (the wheels are cp{config.python.replace('.', '')}); "
        "or point PINWHEEL_TORCH_PYTHON at a "
        f"Python {config.python} that holds torch {config.torch}",
    )


def _given_torch_python(python: Path, config: BuildConfig) -> Path:
    running = python_version(str(python))
    if running != config.python:
        raise ManifestError(
            f"PINWHEEL_TORCH_PYTHON={python} is Python {running or '?'}, "
            f"[build] python pins {config.python}",
            where="[build] python",
            next=f"point PINWHEEL_TORCH_PYTHON at a Python {config.python}, or unset it",
        )
    version = _torch_version(python)
    if version is None or version.split("+")[0] != str(config.torch).split("+")[0]:
        raise ManifestError(
            f"PINWHEEL_TORCH_PYTHON={python} has torch {version or 'none'}, "
            f"[build] torch pins {config.torch}",
            where="[build] torch",
            next="point PINWHEEL_TORCH_PYTHON at a Python with that torch, or unset it",
        )
    return python


def torch_library_headers(python: Path, existing: str | None) -> str:
    """CPATH for torch's CUDA headers (cusparse.h, cublas_v2.h...) from its own nvidia wheels.

    The provisioned toolkit carries the compiler and runtime only; torch's
    ATen/cuda headers also include the math libraries' headers, which the
    torch venv already holds, matching the libraries torch links against.
    CPATH comes after -I, so the toolkit's own runtime headers still win.
    """
    lib = python.parent.parent / "lib"
    found = sorted(str(p) for p in lib.glob("python3*/site-packages/nvidia/*/include"))
    return os.pathsep.join([*found, *([existing] if existing else [])])


def _with_declared(
    set_env: Mapping[str, str], base: Mapping[str, str], toolkit: Toolkit | None
) -> dict[str, str]:
    """What pinwheel set plus the declared PATH, HOME and link lines: the whole build
    environment is recorded (canonical spellings), since nothing else is in it."""
    full = toolkit.env(base) if toolkit is not None else dict(base)
    links = options.select(base, ("LDSHARED", "LDCXXSHARED"))
    return {**set_env, "PATH": options.value(full, "PATH"), "HOME": options.value(base, "HOME"),
            **links}  # fmt: skip


_LINK_PROBE = (
    "import json, sys, sysconfig\n"
    "v = sysconfig.get_config_var\n"
    "print(json.dumps([v('LDSHARED'), v('LDCXXSHARED'), v('CC'), v('CXX'), v('prefix'),"
    " sys.base_prefix]))"
)


def python_link_env(python: Path, base: Mapping[str, str]) -> dict[str, str]:
    """LDSHARED and LDCXXSHARED for a setuptools build: the build interpreter's own link
    lines less every word naming its install prefix (and the chosen CC/CXX in front, as
    setuptools would put them), so no machine's Python location reaches an extension's
    RUNPATH (pyenv's LDSHARED carries ``-Wl,-rpath,<prefix>/lib``)."""
    probe = runner.Command((str(python), "-I", "-c", _LINK_PROBE), timeout=120,
                           error=KernelBuildError, what="the build's link lines")  # fmt: skip
    out = runner.run(probe)
    try:
        ldshared, ldcxx, cc, cxx, prefix, base_prefix = json.loads(out.text.splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise KernelBuildError(f"the build Python gave no link lines ({exc})",
                               where=str(python)) from exc  # fmt: skip
    env: dict[str, str] = {}
    chosen_cc, chosen_cxx = options.value(base, "CC") or None, options.value(base, "CXX") or None
    for key, line, compiler, chosen in (("LDSHARED", ldshared, cc, chosen_cc),
                                        ("LDCXXSHARED", ldcxx, cxx, chosen_cxx)):  # fmt: skip
        if not isinstance(line, str) or not line:
            continue
        if chosen and isinstance(compiler, str) and compiler and line.startswith(compiler):
            line = chosen + line[len(compiler):]
        prefixes = [p for p in (prefix, base_prefix) if isinstance(p, str) and len(p) > 1]
        # -L<prefix>/lib and -Wl,-rpath,<prefix>/lib: dropped (an extension module never links
        # libpython on Linux, and a RUNPATH under a world-writable /tmp would be a hijack).
        words = [w for w in shlex.split(line) if not any(p in w for p in prefixes)]
        env[key] = shlex.join(words)
    return env


def build_kernel(
    spec: KernelSpec, config: BuildConfig, toolkit: Toolkit, opts: BuildOptions
) -> Built:
    """:func:`_build_kernel` with the kernel's workspace held (workspace.locked)."""
    mark_cache(opts.cache)  # what `pinwheel cache clean` checks before emptying it
    confine.folder_in_cache(opts.cache, f"kernels/{spec.name}", what="kernel workspace")
    with workspace.locked(workdir(spec, opts)):
        return _build_kernel(spec, config, toolkit, opts)


def _build_kernel(
    spec: KernelSpec, config: BuildConfig, toolkit: Toolkit, opts: BuildOptions
) -> Built:
    """Build the kernel's wheel into scratch (``<cache>/kernels/NAME/dist``).

    The workspace is kept while the identity (toolchain, flags, builder, Python, torch,
    canonical-path method) holds and ``opts.cold`` is off: the export is updated in
    place and the builder's own build tree is reused, so only changed sources compile.
    In order, the first that gives a wheel is the build: the last build when it was given
    exactly this (:func:`_last_wheel`), the object store (:func:`_stored_wheel`), an
    earlier wheel (``opts.reuse``, :func:`_earlier_wheel`), else the backend runs
    (:func:`_compile`).
    """
    kernel = _resolve(spec, config, toolkit, opts, time.monotonic())
    st = _stage(kernel)
    made = _last_wheel(kernel, st)
    if made is not None:
        return made
    _refresh(kernel, st)
    env, extra = _with_launcher(kernel, st)
    made = _stored_wheel(kernel, st)
    if made is not None:
        return made
    inputs = reuse.Recorder(
        st.tree.directory, (kernel.work / "build", st.tree.directory / "build"),
        alias=Path(kernel.canon.to_build(st.tree.directory)),
    )  # fmt: skip
    env.update(inputs.env())
    if opts.reuse is not None:
        made = _earlier_wheel(kernel, st, env)
        if made is not None:
            return made
    return _compile(kernel, st, env, extra, inputs)


@dataclass(frozen=True)
class _Kernel:
    """One kernel build, resolved before its workspace is touched: the four parts it was
    asked with and what each later step of :func:`_build_kernel` reads."""

    spec: KernelSpec
    config: BuildConfig
    toolkit: Toolkit
    opts: BuildOptions
    started: float  # time.monotonic() when the build began
    work: Path  # the kept workspace (workdir)
    venv: lockedvenv.LockedVenv  # the locked build backend (over torch's Python for torch)
    torch_python: Path | None  # the Python torch extensions compile against; None: cmake
    torch_version: str | None
    canon: Canonical  # with the interpreters' prefix maps (headerview.prefix_maps)
    environment: dict[str, Any]  # lockedvenv.checked: what the build's Python imports
    hook: str  # listing.install: sorted directory listings
    base: dict[str, str]  # buildenv.declared_base (+ the interpreter's link flags)
    identity: dict[str, Any]  # reuse.identity
    derivation: Derivation

    @property
    def python(self) -> Path:
        return self.venv.python

    @property
    def dist(self) -> Path:
        return self.work / "dist"

    def torch_facts(self) -> dict[str, Any]:
        """The torch version and index a torch extension's record carries."""
        return {"torch": self.torch_version,
                "torch_index": self.config.torch_index if self.torch_version else None}  # fmt: skip

    def record(self, st: _Staged, compiled_inputs: Mapping[str, Any], **more: Any) -> BuildRecord:
        canon = self.canon
        return BuildRecord(
            builder=self.spec.builder, source_date_epoch=st.tree.source_date_epoch,
            env={k: canon.recorded(v) for k, v in sorted(st.set_env.items())},
            arches=tuple(str(a) for a in self.config.targets), canonical=canon.record(),
            compiled_inputs=compiled_inputs, environment=self.environment, **more,
        )  # fmt: skip

    def built(self, wheel: Path, st: _Staged, build: BuildRecord) -> Built:
        return Built(
            component=self.spec.name, kind="kernel", wheel=wheel,
            seconds=time.monotonic() - self.started, source=st.source, build=build,
        )  # fmt: skip


@dataclass(frozen=True)
class _Staged:
    """The kernel's source staged in its workspace, and the builder's environment for it."""

    tree: SourceTree
    kept: bool  # the workspace was kept: an incremental build
    interrupted: bool  # an earlier update of the export never finished
    env: Mapping[str, str]  # the builder's whole environment (before the launcher's)
    set_env: Mapping[str, str]  # what pinwheel set (recorded)
    extra: tuple[str, ...]  # the backend's config settings (cmake)
    source: dict[str, Any]  # the Built's record of what it was built from
    given: str  # workspace.inputs_digest: everything this build is given
    match: dict[str, Any]  # the object store's facts beside the identity


def _resolve(
    spec: KernelSpec, config: BuildConfig, toolkit: Toolkit, opts: BuildOptions, started: float
) -> _Kernel:
    """The build's Python, canonical paths, environment and identity; its derivation says
    whether the kept workspace still holds."""
    work = workdir(spec, opts)
    torch_version: str | None = None
    if spec.builder == "cmake":
        venv = locked_build_venv(CMAKE_BUILD_LOCK, sys.executable, opts)
        torch_python = None
    else:
        torch = torch_venv(config, opts.cache, opts.reporter, opts.host)
        torch_python = torch.python
        venv = locked_build_venv(
            TORCH_BUILD_LOCK, str(torch_python), opts, overlay_from=str(torch_python),
            overlay_lock=torch.lock,
        )
    python = venv.python
    # The base interpreter's include directory and a machine torch's headers keep no machine
    # path in the objects: prefix maps to canonical names (headerview.prefix_maps).
    pythons = [python, *([torch_python] if torch_python is not None else [])]
    canon = opts.canon().with_outside(headerview.prefix_maps(pythons, CANONICAL_ROOT, opts.cache))
    # Before anything compiles: the build's Python imports exactly the lock (and, for a
    # torch extension, torch and its dependencies from the machine); listed for provenance.
    environment = lockedvenv.checked(venv, spec.where)
    if torch_python is not None:
        torch_version = _torch_version(python)
    # SOURCE_DATE_EPOCH is left out of the identity: the staged tree's date does not
    # change what compiles.
    hook = str(listing.install(opts.cache))
    # Declared values only: nothing of the caller's PATH, PYTHONPATH or flags (buildenv).
    home = confine.inside(opts.cache, Path("kernels") / ".home", what="build HOME")
    home.mkdir(parents=True, exist_ok=True)
    base = declared_base(opts.host, tool_dirs=(str(python.parent),), home=str(home))
    if spec.builder != "cmake":  # setuptools links with the interpreter's own LDSHARED
        base.update(python_link_env(python, base))
    _, set_env = build_env(
        config, toolkit=toolkit, source_date_epoch=0, base=base, listing_hook=hook
    )
    set_env = _with_declared(set_env, base, toolkit)
    placeholders = {str(Path(work).absolute()): "$WORK", str(opts.cache.absolute()): "$CACHE"}
    identity = reuse.identity(
        {k: canon.recorded(v) for k, v in set_env.items()}, toolkit=toolkit, python=str(python),
        builder=spec.builder, placeholders=placeholders,
        inputs={"build_env": venv.lock_sha256,  # the locked backend writes the wheel
                **({"torch": torch_version,  # its headers compile in: the version and
                    # every file of torch and its dependencies (the torch lock's venv or
                    # the machine's), so a rebuilt torch of the same version is another build
                    "torch_env": lockedvenv.outside_lock(environment)} if torch_version else {})},
    )  # fmt: skip
    derivation = Derivation.of(spec.name, identity=identity, canonical=canon.record())
    return _Kernel(
        spec, config, toolkit, opts, started, work, venv, torch_python, torch_version, canon,
        environment, hook, base, identity, derivation,
    )  # fmt: skip


def _stage(kernel: _Kernel) -> _Staged:
    """Keep the workspace (or start it fresh, saying why), stage the source into it and
    make the builder's environment and settings for it."""
    spec, opts, work, config = kernel.spec, kernel.opts, kernel.work, kernel.config
    why = workspace.rebuild_reason(work, kernel.derivation, cold=opts.cold)
    kept = workspace.prepare(work, kernel.derivation, cold=opts.cold)
    state = "kept workspace (incremental)" if kept else f"fresh workspace (cold; {why})"
    opts.reporter.info(f"{spec.name}: {state}, canonical path by {kernel.canon.method}")
    interrupted = workspace.begin_update(work)
    staged = stage_in_tree(spec, opts) if spec.in_tree else stage_out_of_tree(spec, opts)
    env, set_env = build_env(
        config, toolkit=kernel.toolkit, source_date_epoch=staged.source_date_epoch,
        base=kernel.base, listing_hook=kernel.hook,
    )  # fmt: skip
    set_env = _with_declared(set_env, kernel.base, kernel.toolkit)
    if spec.builder == "cmake":
        extra = [
            f"--config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES={config.cmake_architectures}",
            f"--config-settings=cmake.define.CMAKE_CUDA_COMPILER={kernel.toolkit.nvcc}",
            f"--config-settings=build-dir={work / 'build'}",
        ]
    else:
        extra = []
        assert kernel.torch_python is not None
        env["CPATH"] = torch_library_headers(
            kernel.torch_python, options.value(env, "CPATH") or None
        )
    source = {"origin": staged.origin, "url": spec.url, "commit": spec.commit,
              "tree": staged.tree, "path": str(spec.path.relative_to(spec.source.parent))
              if spec.path else None}  # fmt: skip
    given = workspace.inputs_digest(
        key=kernel.derivation.key, sources=[staged.digest],
        env=workspace.builder_env(env, set_env), command=extra, torch=kernel.torch_version,
        torch_index=config.torch_index,
    )  # fmt: skip
    match = {"tree": staged.digest, "source_date_epoch": staged.source_date_epoch,
             "flags": objstore.caller_flags(opts.host.child)}  # fmt: skip
    return _Staged(staged, kept, interrupted, env, set_env, tuple(extra), source, given, match)


def _last_wheel(kernel: _Kernel, st: _Staged) -> Built | None:
    """The last build's wheel when it was given exactly this: nothing compiles."""
    opts = kernel.opts
    last = workspace.last_build(kernel.work, st.given) if st.kept and opts.reuse is None else None
    if last is None:
        return None
    workspace.end_update(kernel.work)  # the stamp's build tree matches this export
    opts.reporter.info(
        f"{kernel.spec.name}: nothing changed since the last build (same sources, toolchain "
        f"and environment): its wheel {last.wheel.name} is the build, nothing compiled"
    )
    return kernel.built(last.wheel, st, BuildRecord.from_json(last.record))


def _refresh(kernel: _Kernel, st: _Staged) -> None:
    """Tell a kept build tree what changed in the export; start ``dist`` empty."""
    work, staged, canon = kernel.work, st.tree, kernel.canon
    workspace.forget(work)
    if st.kept and (staged.changed or st.interrupted):
        # File times are fixed (workspace.SOURCE_MTIME): pinwheel tells the tree what changed.
        gone = after_update(
            (work / "build", staged.directory / "build"), staged.changed,
            roots=(staged.directory, canon.to_build(staged.directory)),
            path=options.value(st.env, "PATH"),
            build_dir_spellings=((work, canon.to_build(work)),), interrupted=st.interrupted,
        )  # fmt: skip
        kernel.opts.reporter.info(
            f"{kernel.spec.name}: {len(staged.changed)} file(s) changed: {gone.summary()}"
        )
    workspace.end_update(work)
    remove_tree(kernel.dist, ignore_errors=True)
    kernel.dist.mkdir(parents=True)


def _with_launcher(kernel: _Kernel, st: _Staged) -> tuple[dict[str, str], list[str]]:
    """The builder's environment and config settings, with the compiler launcher's
    (``opts.launcher``: sccache) when there is one."""
    env, extra, launcher = dict(st.env), list(st.extra), kernel.opts.launcher
    if launcher is not None and kernel.spec.builder == "cmake":
        extra += [f"--config-settings=cmake.define.{d}" for d in launcher.cmake_defines()]
        env.update(launcher.launch_env(options.value(env, "PATH")))
    elif launcher is not None:
        env.update(launcher.launch_env(options.value(env, "PATH"), nvcc=str(kernel.toolkit.nvcc),
                                       cxx=True))  # fmt: skip
    return env, extra


def _stored_wheel(kernel: _Kernel, st: _Staged) -> Built | None:
    """The object store's wheel of this build (nothing compiles), or None."""
    opts, staged, name = kernel.opts, st.tree, kernel.spec.name
    expect = objstore.Expect(name=objstore.project_name(staged.directory), tree=staged.tree)
    hit = (
        opts.store.lookup(kernel.identity, st.match, expect=expect)
        if opts.store and not opts.cold
        else None
    )
    got = opts.store.take(hit, kernel.dist) if isinstance(hit, objstore.Hit) else hit
    if isinstance(got, objstore.Miss) and got.why != "miss":  # a reason worth a line
        opts.reporter.info(f"{name}: object store: {got.why}")
    if not (isinstance(hit, objstore.Hit) and isinstance(got, Path)):
        return None
    wheel = got
    opts.reporter.info(f"{name}: object store hit: the same build, nothing compiled")
    made = kernel.record(st, hit.record, reused=hit.reused(), **kernel.torch_facts())
    workspace.remember(kernel.work, st.given, wheel, made.to_json())
    return kernel.built(wheel, st, made)


def _earlier_wheel(kernel: _Kernel, st: _Staged, env: Mapping[str, str]) -> Built | None:
    """``opts.reuse``'s wheel when its compiled members still hold, or None."""
    opts = kernel.opts
    taken = reuse.try_reuse(
        opts.reuse, st.tree.directory, kernel.identity, kernel.dist,
        python=str(kernel.python), env=env, reporter=opts.reporter,
    )  # fmt: skip
    if taken is None:
        return None
    return kernel.built(taken.wheel, st, kernel.record(st, taken.inputs, reused=taken.members))


def _compile(
    kernel: _Kernel,
    st: _Staged,
    env: Mapping[str, str],
    extra: Sequence[str],
    inputs: reuse.Recorder,
) -> Built:
    """The backend's build_wheel alone, in the tree (what `pip wheel --no-build-isolation`
    ends in, without pip and its second setup.py run for metadata); the one wheel it
    writes recorded, remembered and stored."""
    spec, opts, canon, dist = kernel.spec, kernel.opts, kernel.canon, kernel.dist
    opts.reporter.info(f"building {spec.name} ({spec.builder}) from {st.tree.origin}")

    def run_hook(cmd: Sequence[str], cwd: str, added: Mapping[str, str]) -> None:
        _run(list(cmd), cwd=Path(cwd), env={**env, **added}, what=f"building kernel {spec.name}",
             log_file=kernel.work / "build.log", canonical=canon)  # fmt: skip

    name = frontend.build_wheel(
        str(kernel.python), st.tree.directory, canon.to_build(dist),
        # the hook reads its settings from a file, not argv: spelled as the build sees them
        frontend.config_settings([canon.to_build(x) for x in extra]), run_hook, opts.reporter.info,
    )  # fmt: skip
    built = sorted(dist.glob("*.whl"))
    if [p.name for p in built] != [name]:
        raise KernelBuildError(
            f"expected the one wheel the backend named ({name}), found {[p.name for p in built]}",
            where=f"{spec.where} ({dist})",
        )
    recorded = inputs.collect(built[0], kernel.identity, tree=st.tree.tree)
    made = kernel.record(st, recorded, **kernel.torch_facts())
    workspace.remember(kernel.work, st.given, built[0], made.to_json())
    if opts.store is not None:
        stored, line = opts.store.put(built[0], recorded, st.match)
        if not stored:
            opts.reporter.info(f"{spec.name}: {line}")
    return kernel.built(built[0], st, made)


def build_twice(
    spec: KernelSpec, config: BuildConfig, toolkit: Toolkit, opts: BuildOptions
) -> tuple[Built, Built]:
    """Build, keep a copy, build again; raise naming the members if the bytes differ.

    Both builds are cold (a wiped workspace): the second proves the bytes, not the
    incremental path.
    """
    opts = dataclasses.replace(opts, cold=True)
    first = build_kernel(spec, config, toolkit, opts)
    with tempfile.TemporaryDirectory(prefix="pinwheel-twice-") as tmp:
        kept = Path(tmp) / first.wheel.name
        shutil.copy2(first.wheel, kept)
        first = dataclasses.replace(first, wheel=kept)
        second = build_kernel(spec, config, toolkit, opts)
        a, b = sha256_file(kept), sha256_file(second.wheel)
        if a != b:
            members = [m.line() for m in diff_members(kept, second.wheel)]
            raise MismatchError(
                f"two builds of {spec.name} differ: {a[:16]} vs {b[:16]}; "
                f"members: {', '.join(members)}",
                where=f"{spec.where} ({second.wheel.name})",
                next="compare them with diffoscope; fix the non-deterministic step",
            )
    return first, second


def select(
    specs: tuple[KernelSpec, ...], names: list[str] | None, *, all_: bool
) -> list[KernelSpec]:
    if names:
        return by_name(specs, names, what="[[kernel]]", where="--name",
                       next="pick one of the known names")  # fmt: skip
    return [s for s in specs if all_ or s.default]

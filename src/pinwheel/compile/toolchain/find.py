"""Find the toolkit ``[build]`` asks for: installed ones first, then the provisioned one.

In: a :class:`ToolkitRequest` (``[build]``, the cache, whether provisioning is
allowed, and the caller's environment: nothing here reads ``os.environ``).
Out: a probed :class:`~pinwheel.compile.toolchain.toolkit.Toolkit`.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pinwheel import cachelayout
from pinwheel.compile.toolchain.pins import DEV_PROBES, LOCKS, MARKER, NOT_PROVISIONABLE
from pinwheel.compile.toolchain.provision import provision_toolkit
from pinwheel.compile.toolchain.toolkit import ToolchainError, Toolkit, nvcc_version, probe_arches
from pinwheel.manifest.build import BuildConfig
from pinwheel.manifest.targets import TargetProblem, target_problems
from pinwheel.options import HostEnvironment
from pinwheel.progress import SILENT, Reporter
from pinwheel.wheels.substitute import cuda_advice, no_cuda_fits


def candidates(host: HostEnvironment) -> list[tuple[str, Path]]:
    """(source, root) for toolkits installed on this machine, most explicit first."""
    found: list[tuple[str, Path]] = []
    for var, given in (("CUDA_HOME", host.cuda_home), ("CUDA_PATH", host.cuda_path)):
        if given is not None:
            found.append((var, given))
    on_path = shutil.which("nvcc", path=host.path)
    if on_path:
        found.append(("PATH", Path(on_path).resolve().parent.parent))
    found.append(("/usr/local/cuda", Path("/usr/local/cuda")))
    unique: dict[Path, tuple[str, Path]] = {}
    for source, root in found:
        key = root.resolve() if root.exists() else root
        unique.setdefault(key, (source, root))
    return list(unique.values())


def _named(source: str, root: Path) -> str:
    """``PATH /usr/local``; one found at a fixed path is named once (``/usr/local/cuda``)."""
    return str(root) if source == str(root) else f"{source} {root}"


@dataclass(frozen=True)
class ToolkitRequest:
    """What to find: ``[build]``, where the cache is, and the environment to search and probe
    with (``CUDA_HOME``, ``CUDA_PATH``, ``PATH``: typed by :func:`pinwheel.options.host`)."""

    config: BuildConfig
    cache: Path
    host: HostEnvironment
    provision: bool = True
    reporter: Reporter = SILENT  # download plan, bytes, phases


def installed(host: HostEnvironment) -> list[tuple[str, Path, str | ToolchainError]]:
    """(source, root, version) for each :func:`candidates` root holding an nvcc, its nvcc
    asked for its version; the error in place of the version where nvcc cannot say."""
    out: list[tuple[str, Path, str | ToolchainError]] = []
    for source, root in candidates(host):
        nvcc = root / "bin" / "nvcc"
        if not nvcc.is_file():
            continue
        try:
            out.append((source, root, nvcc_version(nvcc, env=host.child)))
        except ToolchainError as exc:
            out.append((source, root, exc))
    return out


def resolve_toolkit(request: ToolkitRequest) -> Toolkit:
    """The first toolkit matching ``config.cuda`` that compiles every arch; provision if none."""
    config, cache, provision = request.config, request.cache, request.provision
    environ = dict(request.host.child)
    _refuse_impossible(config)
    rejected: list[str] = []
    for source, root, version in installed(request.host):
        if isinstance(version, ToolchainError):
            rejected.append(f"{_named(source, root)}: {version.what}")
            continue
        if not _same_minor(version, config.cuda):
            rejected.append(
                f"{_named(source, root)}: CUDA {version}, [build] cuda pins {config.cuda}"
            )
            continue
        if config.cuda_dev and (lacks := [p for p in DEV_PROBES if not (root / p).exists()]):
            rejected.append(f"{_named(source, root)}: no {', '.join(lacks)} ([build] cuda_dev)")
            continue
        nvcc = root / "bin" / "nvcc"
        probe_arches(nvcc, config.arches, env=environ, cache=cache)
        return Toolkit(root, nvcc, version, config.arches, source)

    lock = LOCKS.get(config.cuda)
    if lock is not None and config.cuda_dev:
        lock = lock.with_dev()
    cached = cachelayout.bucket(cache, "toolchains") / lock.dirname if lock else None
    if lock and cached and (cached / MARKER).is_file():
        return _checked(cached, config, "provisioned", environ, cache)
    if not provision or lock is None:
        tried = "; ".join(rejected) or "no nvcc found (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)"
        advice = cuda_advice(config, tuple(LOCKS))
        raise ToolchainError(
            f"no usable CUDA {config.cuda} toolkit: {tried}",
            where="[build] cuda",
            next=(
                "run `pinwheel toolchain`: it provisions a pinned CUDA "
                f"{lock.version} into the cache"
                if lock
                else f"install CUDA {config.cuda} (NVIDIA's CUDA repository: cuda-toolkit-"
                f"{config.cuda.replace('.', '-')}) and set CUDA_HOME to it, "
                + (
                    f"or build with an explicit substitution: {advice}"
                    if advice
                    else f"({no_cuda_fits(config, tuple(LOCKS))})"
                )
                + (
                    f"; CUDA {config.cuda} is not provisioned: {NOT_PROVISIONABLE[config.cuda]}"
                    if config.cuda in NOT_PROVISIONABLE
                    else ""
                )
            ),
        )
    root = provision_toolkit(lock, cache, environ, request.reporter)
    return _checked(root, config, "provisioned", environ, cache)


def target_fix(problem: TargetProblem, config: BuildConfig) -> str:
    """A problem's fix, and for a CUDA the arches refuse, the substitution that fits (only a
    provisionable CUDA that compiles every arch is offered)."""
    advice = cuda_advice(config, tuple(LOCKS)) if problem.key == "cuda" else None
    return problem.fix + (f", or build with an explicit substitution: {advice}" if advice else "")


def _refuse_impossible(config: BuildConfig) -> None:
    """The arch / CUDA / torch table (:mod:`pinwheel.manifest.targets`) before any probe."""
    problems = target_problems(config.cuda, config.arches, config.torch, config.torch_index)
    if problems:
        raise ToolchainError(
            problems[0].what,
            where=f"[build] {problems[0].key}",
            next=target_fix(problems[0], config),
        )


def _checked(
    root: Path, config: BuildConfig, source: str, environ: Mapping[str, str], cache: Path
) -> Toolkit:
    nvcc = root / "bin" / "nvcc"
    version = nvcc_version(nvcc, env=environ)
    probe_arches(nvcc, config.arches, env=environ, cache=cache)
    return Toolkit(root, nvcc, version, config.arches, source)


def _same_minor(version: str, wanted: str) -> bool:
    return version.split(".")[:2] == wanted.split(".")[:2]

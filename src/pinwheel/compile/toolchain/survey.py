"""Everything about the toolchain ``[build]`` asks for, in one report (``pinwheel toolchain``).

In: ``[build]``, the ``--substitute`` flags, the caller's environment and the cache.
Out: a :class:`Survey`: the substitutions, the gcc and Python found (or not), and every
CUDA toolkit seen here, installed (``CUDA_HOME``, ``CUDA_PATH``, PATH,
``/usr/local/cuda``), provisioned in the cache, or provisionable, each with the arches
NVIDIA's table says it compiles and which of ``[build] arches`` it can build; plus every
problem with its own way on. Nothing here raises for a missing part or downloads: the
caller resolves (and may provision) the toolkit after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pinwheel import cachelayout
from pinwheel.compile.toolchain.choose import check
from pinwheel.compile.toolchain.find import installed
from pinwheel.compile.toolchain.hostcc import HostCompiler
from pinwheel.compile.toolchain.pins import LOCKS, MARKER
from pinwheel.compile.toolchain.provision import kept
from pinwheel.compile.toolchain.pythons import FoundPython
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.cudaarch import names, parse_arch
from pinwheel.manifest.build import BuildConfig
from pinwheel.manifest.targets import compiled_by
from pinwheel.options import HostEnvironment
from pinwheel.wheels.substitute import Substitution, apply


@dataclass(frozen=True)
class CudaSeen:
    """One CUDA toolkit this machine has or can have."""

    state: str  # "installed" | "provisioned" | "provisionable" | "unusable"
    source: str  # "CUDA_HOME", "PATH", "/usr/local/cuda", "cache", "pinned download"
    root: str | None  # None for a provisionable one (not on disk yet)
    version: str | None  # "12.4.131"; None when its nvcc does not run
    compiles: tuple[int, ...]  # every sm NVIDIA's table says its nvcc targets
    builds: tuple[str, ...]  # the [build] arches it compiles
    refuses: tuple[str, ...]  # the [build] arches it cannot compile
    pinned: bool  # its major.minor is the (effective) [build] cuda
    note: str = ""  # why unusable, or what a download costs

    @property
    def usable(self) -> bool:
        """Compiles every [build] arch and is there or can be had."""
        return self.state != "unusable" and self.version is not None and not self.refuses

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state,
            "source": self.source,
            "root": self.root,
            "version": self.version,
            "compiles": [f"sm_{sm}" for sm in self.compiles],
            "builds": list(self.builds),
            "refuses": list(self.refuses),
            "pinned": self.pinned,
            "note": self.note,
        }


# The wheres of the CUDA/arch/torch table's problems (choose.check): with one of them,
# resolving the toolkit would only repeat it.
TABLE_KEYS = ("[build] cuda", "[build] torch", "[build] torch_index")


@dataclass(frozen=True)
class Survey:
    config: BuildConfig  # the effective [build] (substitutions applied)
    substitutions: tuple[Substitution, ...]
    gcc: HostCompiler | None
    python: FoundPython | None
    cudas: tuple[CudaSeen, ...]
    problems: tuple[ToolchainError, ...]  # gcc, Python and the CUDA/arch table

    @property
    def table_ok(self) -> bool:
        """No CUDA/arch/torch table problem (resolving the toolkit would repeat it)."""
        return not any(p.where in TABLE_KEYS for p in self.problems)


def _seen(
    state: str,
    source: str,
    root: Path | None,
    version: str | None,
    config: BuildConfig,
    note: str = "",
) -> CudaSeen:
    sms = compiled_by(version) if version else ()
    builds = tuple(a for a in config.arches if parse_arch(a).sm in sms)
    return CudaSeen(
        state=state,
        source=source,
        root=str(root) if root else None,
        version=version,
        compiles=sms,
        builds=builds,
        refuses=tuple(a for a in config.arches if a not in builds) if version else (),
        pinned=version is not None and version.split(".")[:2] == config.cuda.split(".")[:2],
        note=note,
    )


def cudas_here(config: BuildConfig, cache: Path, machine: HostEnvironment) -> list[CudaSeen]:
    """Every CUDA toolkit seen: installed ones (their nvcc run for its version), the ones
    provisioned in ``cache``, then the pinned ones that can be provisioned."""
    seen: list[CudaSeen] = []
    for source, root, version in installed(machine):
        if isinstance(version, ToolchainError):
            seen.append(_seen("unusable", source, root, None, config, version.what))
        else:
            seen.append(_seen("installed", source, root, version, config))
    for _, base in sorted(LOCKS.items()):
        lock = base.with_dev() if config.cuda_dev else base
        tree = cachelayout.bucket(cache, "toolchains") / lock.dirname
        if (tree / MARKER).is_file():
            seen.append(_seen("provisioned", "cache", tree, lock.version, config, kept(tree)))
            continue
        size = sum(n for _, n in lock.files_to_fetch())
        cost = f"{size / 2**20:.1f} MiB to download" if size else "download size not measured"
        seen.append(
            _seen("provisionable", "pinned download", None, lock.version, config,
                  f"not in the cache: `pinwheel toolchain` provisions it ({cost})")
        )  # fmt: skip
    return seen


def survey(
    config: BuildConfig,
    machine: HostEnvironment,
    cache: Path,
    substitute: Mapping[str, str] | None = None,
) -> Survey:
    """The whole toolchain report; a bad ``--substitute`` is still a usage error."""
    effective, subs = apply(config, substitute, provisionable=tuple(LOCKS))
    host, python, problems = check(effective, machine)
    return Survey(
        effective, subs, host, python, tuple(cudas_here(effective, cache, machine)),
        tuple(problems),
    )  # fmt: skip


def report_lines(s: Survey) -> list[str]:
    """The report's lines before the toolkit that was resolved (the caller adds those)."""
    c = s.config
    by_where = {p.where: p for p in s.problems}

    def row(label: str, where: str, found: str | None) -> str:
        problem = by_where.get(where)
        if problem is not None:
            return f"  {label:<14} PROBLEM: {problem.what}"
        return f"  {label:<14} {found or 'not pinned'}"

    py = s.python
    gcc = s.gcc
    targets = ", ".join(str(a) for a in c.targets)
    lines = ["[build] toolchain:"]
    lines += [f"  substituted:   {sub.sentence()}" for sub in s.substitutions]
    lines.append(row(f"python {c.python}", "[build] python",
                     f"{py.path} (Python {py.version}, {py.source})" if py else None))  # fmt: skip
    lines.append(
        row(f"gcc {c.gcc}" if c.gcc else "gcc", "[build] gcc",
            f"{gcc.cxx} {gcc.version} ({gcc.source})" if gcc else "the build's default compiler")
    )  # fmt: skip
    lines.append(
        row("arches", "[build] arches",
            f"{', '.join(c.arches)} -> {targets}; CMAKE_CUDA_ARCHITECTURES={c.cmake_architectures}"
            f", TORCH_CUDA_ARCH_LIST={c.torch_arch_list}")
    )  # fmt: skip
    for key in ("cuda", "torch", "torch_index"):
        problem = by_where.get(f"[build] {key}")
        if problem is not None:
            lines.append(f"  {key + ' ' + str(getattr(c, key) or ''):<14} PROBLEM: {problem.what}")
    lines.append(f"CUDA toolkits (here, in the cache, provisionable) for [build] cuda {c.cuda}:")
    for t in s.cudas:
        where = t.source if t.root is None or t.root == t.source else f"{t.source}: {t.root}"
        pin = "  ([build] cuda)" if t.pinned else ""
        head = f"  {t.version or '?':<10} {t.state:<13} {where}{pin}"
        if t.version is None:
            lines.append(f"{head}\n      {t.note}")
            continue
        verdict = (
            f"builds {', '.join(t.builds)}" if not t.refuses
            else f"cannot build {', '.join(t.refuses)}"
        )  # fmt: skip
        lines.append(f"{head}\n      compiles {names(t.compiles)}; {verdict}")
        if t.note:
            lines.append(f"      {t.note}")
    return lines

"""The host C/C++ compiler ``[build] gcc`` pins: found, never assumed.

In: the wanted GCC major (``"14"``) and the caller's environment (``CC``, ``CXX``,
``PATH``). Out: a :class:`HostCompiler` whose ``env()`` points ``CC``, ``CXX`` and
``CUDAHOSTCXX`` (nvcc's host compiler) at it, or a :class:`ToolchainError` that names
what was found and the two ways on: install it, or an explicit ``--substitute gcc=N``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from pinwheel import runner
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.errors import PinwheelError
from pinwheel.options import HostEnvironment


@dataclass(frozen=True)
class HostCompiler:
    cc: str
    cxx: str
    version: str  # "14.2.0"
    source: str  # "CXX", "PATH g++-14", "PATH g++"

    def env(self) -> dict[str, str]:
        return {"CC": self.cc, "CXX": self.cxx, "CUDAHOSTCXX": self.cxx}


def compiler_version(program: str, host: HostEnvironment) -> str | None:
    """``-dumpfullversion`` of a gcc/g++ found on the caller's PATH, or None."""
    path = shutil.which(program, path=host.path) if "/" not in program else program
    if not path:
        return None
    try:
        out = runner.run(
            runner.Command(
                (path, "-dumpfullversion"),
                what=f"{program} -dumpfullversion",
                timeout=60,
                check=False,
                env=dict(host.child),
            )  # fmt: skip
        )
    except PinwheelError:
        return None
    text = out.stdout.decode(errors="replace").strip()
    return text if out.returncode == 0 and text[:1].isdigit() else None


def _major(version: str | None) -> str | None:
    return version.split(".")[0] if version else None


def find_host_compiler(major: str | None, host: HostEnvironment) -> HostCompiler | None:
    """The gcc/g++ of ``major`` (None: no pin, the build's default compiler)."""
    if major is None:
        return None
    candidates: list[tuple[str, str, str]] = []
    if host.cxx:
        candidates.append(("CXX", host.cc or f"gcc-{major}", host.cxx))
    candidates += [
        (f"PATH g++-{major}", f"gcc-{major}", f"g++-{major}"),
        ("PATH g++", "gcc", "g++"),
    ]
    seen: list[str] = []
    for source, cc, cxx in candidates:
        version = compiler_version(cxx, host)
        if version is None:
            continue
        seen.append(f"{cxx} {version} ({source})")
        if _major(version) != major or _major(compiler_version(cc, host)) != major:
            continue
        resolve = shutil.which
        return HostCompiler(
            cc=resolve(cc, path=host.path) or cc,
            cxx=resolve(cxx, path=host.path) or cxx,
            version=version,
            source=source,
        )
    found = "; ".join(seen) or "no g++ on PATH"
    have = _major(seen[0].split()[1]) if seen else "N"
    raise ToolchainError(
        f"no gcc/g++ {major}, which [build] gcc pins (found: {found})",
        where="[build] gcc",
        next=f"install gcc-{major} and g++-{major} (or point CC and CXX at them), or build "
        f"with an explicit substitution: --substitute gcc={have} "
        "(provenance.json, `pinwheel check` and the release notes' first line then say so)",
    )

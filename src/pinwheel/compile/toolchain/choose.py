"""The toolchain a build uses: ``[build]`` after explicit substitutions, and its host compiler.

In: ``[build]``, the ``--substitute`` flags and the caller's environment. Out: a frozen
:class:`ToolchainChoice`. Checked before anything long runs (the replay, a toolkit
download), so a missing gcc 14 stops the build in a second with its way on. Every problem
is found at once: the gcc, the CUDA/arch table and the Python ``[build]`` pins are checked
together and reported in one error, each with its own way on.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pinwheel.compile.toolchain.find import target_fix
from pinwheel.compile.toolchain.hostcc import HostCompiler, find_host_compiler
from pinwheel.compile.toolchain.pins import LOCKS
from pinwheel.compile.toolchain.pythons import FoundPython, find_python, how_to_get
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.manifest.build import BuildConfig, KernelSpec
from pinwheel.manifest.targets import target_problems
from pinwheel.options import HostEnvironment
from pinwheel.wheels.substitute import Substitution, apply


@dataclass(frozen=True)
class ToolchainChoice:
    config: BuildConfig  # the effective [build] (substitutions applied)
    substitutions: tuple[Substitution, ...]
    host: HostCompiler | None  # None: [build] pins no gcc; the build's default compiler
    python: FoundPython | None = None  # the interpreter of [build] python

    def environment(self, host: HostEnvironment) -> HostEnvironment:
        """The build's environment with CC/CXX/CUDAHOSTCXX at the chosen compiler."""
        return host.with_child(**self.host.env()) if self.host else host


def choose(
    config: BuildConfig,
    machine: HostEnvironment,
    substitute: Mapping[str, str] | None = None,
    *,
    python_needed: bool = True,
) -> ToolchainChoice:
    """``python_needed`` False: nothing this build makes is for a particular Python (the
    in-tree CMake kernels' ``py3-none`` wheels), so a missing ``[build] python`` is no
    problem: the build needs the Python its wheels are for, and no other."""
    effective, subs = apply(config, substitute, provisionable=tuple(LOCKS))
    host, python, problems = check(effective, machine, python_needed=python_needed)
    if problems:
        raise one_report(problems)
    return ToolchainChoice(effective, subs, host, python)


def python_free(spec: KernelSpec) -> bool:
    """Whether ``spec``'s wheel is for no particular Python: an in-tree CMake kernel whose
    ``[tool.scikit-build] wheel.py-api`` is ``py3`` (``py3-none``: the selftest kernel).
    It builds with pinwheel's own interpreter; ``[build] python`` plays no part."""
    if spec.builder != "cmake" or spec.path is None:
        return False
    try:
        doc = tomllib.loads((spec.path / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False  # the build says what is wrong with it; here it needs the pin
    skb = doc.get("tool", {}).get("scikit-build", {})
    api = skb.get("wheel", {}).get("py-api") if isinstance(skb, dict) else None
    return isinstance(api, str) and api.startswith("py")


def python_needed(specs: Iterable[KernelSpec], engine: bool) -> bool:
    """Whether a build of ``specs`` (and the engine, when ``engine``) makes a wheel for
    ``[build] python``: the engine and torch extensions are ``cpXY``."""
    return engine or not all(python_free(s) for s in specs)


def check(
    effective: BuildConfig, machine: HostEnvironment, *, python_needed: bool = True
) -> tuple[HostCompiler | None, FoundPython | None, list[ToolchainError]]:
    """The gcc, the CUDA/arch table and the Python of ``effective``: what was found, and
    every problem (each with its own way on), none raised. A missing Python is a problem
    only when ``python_needed`` (a wheel of the build is for that Python)."""
    problems: list[ToolchainError] = []
    host = None
    try:
        host = find_host_compiler(effective.gcc, machine)
    except ToolchainError as exc:
        problems.append(exc)
    for p in target_problems(
        effective.cuda, effective.arches, effective.torch, effective.torch_index
    ):
        problems.append(
            ToolchainError(p.what, where=f"[build] {p.key}", next=target_fix(p, effective))
        )
    python = find_python(effective.python, machine)
    if python is None and python_needed:
        problems.append(
            ToolchainError(
                f"no Python {effective.python}, which [build] python pins (the wheels are "
                f"cp{effective.python.replace('.', '')}; looked on PATH, in uv's and pyenv's "
                "interpreters)",
                where="[build] python",
                next=how_to_get(effective.python),
            )
        )
    return host, python, problems


def one_report(problems: list[ToolchainError]) -> ToolchainError:
    """One problem as itself; several in one error, each with its where and next."""
    if len(problems) == 1:
        return problems[0]
    return ToolchainReport(problems)


class ToolchainReport(ToolchainError):
    """Several toolchain problems in one error, each with its where and next; ``parts``
    keeps them, so a caller can add one and report them all again."""

    def __init__(self, problems: list[ToolchainError]) -> None:
        super().__init__(
            f"{len(problems)} toolchain problems:\n"
            + "\n".join(f"  - {p.where}: {p.what}\n    next: {p.next}" for p in problems),
            where="[build]",
            next="fix each one above (or substitute where offered), then run the build again",
        )
        self.parts = tuple(problems)

"""The toolchain a build uses: ``[build]`` after explicit substitutions, and its host compiler.

In: ``[build]``, the ``--substitute`` flags and the caller's environment. Out: a frozen
:class:`ToolchainChoice`. Checked before anything long runs (the replay, a toolkit
download), so a missing gcc 14 stops the build in a second with its way on. Every problem
is found at once: the gcc, the CUDA/arch table and the Python ``[build]`` pins are checked
together and reported in one error, each with its own way on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pinwheel.compile.toolchain.find import target_fix
from pinwheel.compile.toolchain.hostcc import HostCompiler, find_host_compiler
from pinwheel.compile.toolchain.pins import LOCKS
from pinwheel.compile.toolchain.pythons import FoundPython, find_python, how_to_get
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.manifest.build import BuildConfig
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
    config: BuildConfig, machine: HostEnvironment, substitute: Mapping[str, str] | None = None
) -> ToolchainChoice:
    effective, subs = apply(config, substitute, provisionable=tuple(LOCKS))
    host, python, problems = check(effective, machine)
    if problems:
        raise one_report(problems)
    return ToolchainChoice(effective, subs, host, python)


def check(
    effective: BuildConfig, machine: HostEnvironment
) -> tuple[HostCompiler | None, FoundPython | None, list[ToolchainError]]:
    """The gcc, the CUDA/arch table and the Python of ``effective``: what was found, and
    every problem (each with its own way on), none raised."""
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
    if python is None:
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

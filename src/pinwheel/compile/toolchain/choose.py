"""The toolchain a build uses: ``[build]`` after explicit substitutions, and its host compiler.

In: ``[build]``, the ``--substitute`` flags and the caller's environment. Out: a frozen
:class:`ToolchainChoice`. Checked before anything long runs (the replay, a toolkit
download), so a missing gcc 14 stops the build in a second with its way on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pinwheel.compile.toolchain.hostcc import HostCompiler, find_host_compiler
from pinwheel.manifest.build import BuildConfig
from pinwheel.wheels.substitute import Substitution, apply


@dataclass(frozen=True)
class ToolchainChoice:
    config: BuildConfig  # the effective [build] (substitutions applied)
    substitutions: tuple[Substitution, ...]
    host: HostCompiler | None  # None: [build] pins no gcc; the build's default compiler

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """The build's environment with CC/CXX/CUDAHOSTCXX at the chosen compiler."""
        return dict(base) | (self.host.env() if self.host else {})


def choose(
    config: BuildConfig, environ: Mapping[str, str], substitute: Mapping[str, str] | None = None
) -> ToolchainChoice:
    effective, subs = apply(config, substitute)
    return ToolchainChoice(effective, subs, find_host_compiler(effective.gcc, environ))

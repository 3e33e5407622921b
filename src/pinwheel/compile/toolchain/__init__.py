"""The CUDA toolchain a build needs, one module per job.

- :mod:`.toolkit`: a found toolkit, its version, and the per-arch probe.
- :mod:`.find`: :func:`resolve_toolkit` looks for a toolkit whose version matches
  ``[build].cuda`` (``CUDA_HOME``/``CUDA_PATH``, ``nvcc`` on PATH, ``/usr/local/cuda``,
  then the one pinwheel provisioned into its cache) and provisions one when none fits.
- :mod:`.provision`: assembles a pinned toolkit tree; :mod:`.apt`, :mod:`.download`
  and :mod:`.unpack` fetch and copy its files.
- :mod:`.pins`: the pinned files (data only).
- :mod:`.substitute`: an explicit substitution of the pinned CUDA or gcc (``--substitute``,
  ``[build.substitute]``), recorded, never silent; :mod:`.hostcc`: the pinned gcc/g++;
  :mod:`.choose`: both, checked before anything long runs.

Nothing here reads ``os.environ``: the caller's environment comes in through
:class:`ToolkitRequest` (and the ``env``/``environ`` arguments below it).
"""

from pinwheel.compile.toolchain.choose import ToolchainChoice, choose
from pinwheel.compile.toolchain.find import ToolkitRequest, resolve_toolkit
from pinwheel.compile.toolchain.hostcc import HostCompiler, find_host_compiler
from pinwheel.compile.toolchain.pins import LOCKS, MARKER, NOT_PROVISIONABLE, ToolkitLock
from pinwheel.compile.toolchain.provision import provision_toolkit
from pinwheel.compile.toolchain.toolkit import ToolchainError, Toolkit, nvcc_version, probe_arches
from pinwheel.wheels.substitute import Substitution, parse_flags

__all__ = [
    "HostCompiler",
    "LOCKS",
    "Substitution",
    "ToolchainChoice",
    "choose",
    "find_host_compiler",
    "parse_flags",
    "MARKER",
    "NOT_PROVISIONABLE",
    "ToolchainError",
    "Toolkit",
    "ToolkitLock",
    "ToolkitRequest",
    "nvcc_version",
    "probe_arches",
    "provision_toolkit",
    "resolve_toolkit",
]

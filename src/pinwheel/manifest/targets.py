"""Which CUDA can build for which arch, and which torch builds carry which arch.

A manifest names a toolkit (``[build] cuda``), arches (``[build] arches``) and,
for torch-extension builds, a torch (``[build] torch`` + ``torch_index``). Some
combinations cannot work; :func:`target_problems` names each with its reason
and its fix, so the manifest is refused at load, not an hour into a build.

Facts (NVIDIA's CUDA release notes; PyTorch's wheel indexes):

- nvcc gained sm_90 in 11.8, sm_100 and sm_120 in 12.8, sm_103 and sm_121 in
  12.9, sm_110 in 13.0; CUDA 13.0 dropped every arch below sm_75 (Maxwell,
  Pascal, Volta: ``Unsupported gpu architecture 'compute_70'``) and sm_101
  (renamed sm_110).
- PyTorch's cu128 wheels dropped sm_70 from torch 2.11 on; the cu126 wheels
  keep it. Wheels built with CUDA 13 (cu130, cu132) cannot carry sm_70 at all.
- A torch CUDA extension is compiled by an nvcc of the same CUDA major as the
  torch build (torch's cpp_extension refuses a major mismatch).
- A torch wheel names the CUDA it is built with through the CUDA runtime it requires:
  ``nvidia-cuda-runtime-cu12==12.8.90`` (PyPI's torch 2.10.0), ``nvidia-cuda-runtime==13.0.96``
  through ``cuda-toolkit[cudart]==13.0.2`` (PyPI's torch 2.11.0); a hashed torch lock
  (``[build.torch_lock]``) pins that runtime beside torch, so :func:`lock_cuda` reads it there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from pinwheel.cudaarch import parse_arch

# First CUDA release whose nvcc targets the arch (SASS).
MIN_CUDA: dict[int, tuple[int, int]] = {
    50: (6, 0),
    52: (7, 0),
    53: (7, 0),
    60: (8, 0),
    61: (8, 0),
    62: (8, 0),
    70: (9, 0),
    72: (10, 0),
    75: (10, 0),
    80: (11, 0),
    86: (11, 1),
    87: (11, 4),
    89: (11, 8),
    90: (11, 8),
    100: (12, 8),
    101: (12, 8),
    103: (12, 9),
    110: (13, 0),
    120: (12, 8),
    121: (12, 9),
}
# Last CUDA major whose nvcc still targets the arch.
MAX_CUDA_MAJOR: dict[int, int] = {50: 12, 52: 12, 53: 12, 60: 12, 61: 12, 62: 12, 70: 12, 72: 12,
                                  101: 12}  # fmt: skip

# PyTorch wheel indexes that no longer carry an arch, from a torch version on:
# (index CUDA, arch) -> first torch (major, minor) without it.
TORCH_DROPPED: dict[tuple[str, int], tuple[int, int]] = {
    ("12.8", 70): (2, 11),
}

_INDEX = re.compile(r"/cu(\d{2,3})/?$")
# The CUDA runtime a torch wheel requires: nvidia-cuda-runtime-cu12 (CUDA 12), nvidia-cuda-runtime
# (CUDA 13's wheels drop the suffix).
_RUNTIME = re.compile(r"nvidia-cuda-runtime(-cu\d+)?")


@dataclass(frozen=True)
class TargetProblem:
    """One impossible combination: what, why, and what to change."""

    key: str  # the [build] key to change
    what: str
    fix: str


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def _torch_from(torch: str, cut: tuple[int, int]) -> bool:
    """Whether torch ``torch`` is release ``cut`` or later, by PEP 440 (packaging.version):
    its nightlies and release candidates (``2.11.0.dev20260101``, ``2.11.0rc1``) count as
    ``cut``, a local label (``+cu128``) is ignored. A version PEP 440 cannot read is not
    assumed to be later (the manifest's own check names it)."""
    try:
        return Version(torch) >= Version(f"{cut[0]}.{cut[1]}.dev0")
    except InvalidVersion:
        return False


def _sm(arch: str) -> int:
    return parse_arch(arch).sm


def index_cuda(url: str) -> str | None:
    """``.../whl/cu130`` -> ``"13.0"``; ``cu128`` -> ``"12.8"``; None for other indexes."""
    m = _INDEX.search(url)
    if not m:
        return None
    digits = m.group(1)
    return f"{digits[:-1]}.{digits[-1]}"


def lock_cuda(pins: Mapping[str, str]) -> str | None:
    """The CUDA (major.minor) a torch lock's torch is built with, from the CUDA runtime the
    lock pins (``{"nvidia-cuda-runtime-cu12": "12.8.90"}`` -> ``"12.8"``); None when it pins
    none (a CPU torch, or a torch whose runtime is not a wheel)."""
    for name, version in pins.items():
        if _RUNTIME.fullmatch(name):
            got = _version(version)[:2]
            if len(got) == 2:
                return f"{got[0]}.{got[1]}"
    return None


def compiled_by(cuda: str) -> tuple[int, ...]:
    """Every arch (as ``sm``) NVIDIA's table says CUDA ``cuda``'s nvcc targets, ascending."""
    have = _version(cuda)[:2]
    return tuple(
        sm
        for sm, first in sorted(MIN_CUDA.items())
        if have >= first and have[0] <= MAX_CUDA_MAJOR.get(sm, have[0])
    )


def cuda_fits(cuda: str, arches: tuple[str, ...], torch_index: str | None = None) -> bool:
    """Whether CUDA ``cuda`` compiles every arch (and, with a torch index, is of its CUDA
    major): the test a suggested ``--substitute cuda=V`` must pass before it is offered."""
    if _arch_problems(cuda, arches):
        return False
    built = index_cuda(torch_index) if torch_index else None
    return built is None or _version(built)[0] == _version(cuda)[0]


def fitting_cudas(
    candidates: tuple[str, ...], arches: tuple[str, ...], torch_index: str | None = None
) -> list[str]:
    """The ``candidates`` (e.g. the provisionable CUDA versions) that fit, oldest first."""
    return sorted((c for c in candidates if cuda_fits(c, arches, torch_index)), key=_version)


def target_problems(
    cuda: str, arches: tuple[str, ...], torch: str | None, torch_index: str | None
) -> list[TargetProblem]:
    """Every reason this toolkit / arch / torch combination cannot build or run."""
    return _arch_problems(cuda, arches) + _torch_problems(cuda, arches, torch, torch_index)


def _arch_problems(cuda: str, arches: tuple[str, ...]) -> list[TargetProblem]:
    """The arches CUDA ``cuda`` cannot compile, each with its reason."""
    problems: list[TargetProblem] = []
    have = _version(cuda)[:2]
    for arch in arches:
        sm = _sm(arch)
        first = MIN_CUDA.get(sm)
        if first and have < first:
            problems.append(
                TargetProblem(
                    "cuda",
                    f"CUDA {cuda} cannot compile for arch {arch}: nvcc first targets "
                    f"sm_{sm} in CUDA {first[0]}.{first[1]}",
                    f'set [build] cuda = "{first[0]}.{first[1]}" or newer, '
                    f"or drop {arch} from [build] arches",
                )
            )
        last = MAX_CUDA_MAJOR.get(sm)
        if last is not None and have[0] > last:
            problems.append(
                TargetProblem(
                    "cuda",
                    f"CUDA {cuda} cannot compile for arch {arch}: CUDA {last + 1} dropped "
                    f"sm_{sm} (the last toolkit for it is CUDA {last}.x)",
                    f'set [build] cuda = "{last}.4" (provisioned by `pinwheel toolchain`) '
                    f"or drop {arch} from [build] arches",
                )
            )
    return problems


def _torch_problems(
    cuda: str, arches: tuple[str, ...], torch: str | None, torch_index: str | None
) -> list[TargetProblem]:
    """Why the pinned torch cannot go with CUDA ``cuda`` and these arches."""
    problems: list[TargetProblem] = []
    have = _version(cuda)[:2]
    if torch_index:
        built = index_cuda(torch_index)
        if built and _version(built)[0] != have[0]:
            problems.append(
                TargetProblem(
                    "torch_index",
                    f"torch from {torch_index} is built with CUDA {built}; [build] cuda is "
                    f"{cuda}: torch extensions need an nvcc of the same CUDA major",
                    f"use a cu{have[0]}x torch index, or set [build] cuda to a CUDA "
                    f"{built.split('.')[0]}.x toolkit",
                )
            )
        if built and torch:
            for sm, cut, last in _torch_gaps(torch, built, arches):
                if cut is not None:
                    problems.append(
                        TargetProblem(
                            "torch",
                            f"torch {torch} from the cu{built.replace('.', '')} index carries "
                            f"no sm_{sm} kernels (dropped from {cut[0]}.{cut[1]} on)",
                            f"pin a torch < {cut[0]}.{cut[1]}, or take torch from the cu126 index "
                            "(it keeps sm_70)",
                        )
                    )
                else:
                    problems.append(
                        TargetProblem(
                            "torch_index",
                            f"torch built with CUDA {built} carries no sm_{sm} kernels "
                            f"(CUDA {last + 1} dropped it)",
                            f"take torch from a cu12x index that carries sm_{sm} (cu126)",
                        )
                    )
    return problems


def _torch_gaps(
    torch: str, built: str, arches: tuple[str, ...]
) -> list[tuple[int, tuple[int, int] | None, int]]:
    """The arches a torch (``torch``, built with CUDA ``built``) has no kernels for: each as
    (sm, the torch release that dropped it from that CUDA's wheels, None when it is the CUDA
    itself, and the last CUDA major that compiles it)."""
    gaps: list[tuple[int, tuple[int, int] | None, int]] = []
    for arch in arches:
        sm = _sm(arch)
        cut = TORCH_DROPPED.get((built, sm))
        last = MAX_CUDA_MAJOR.get(sm)
        if cut and _torch_from(torch, cut):
            gaps.append((sm, cut, last if last is not None else _version(built)[0]))
        elif last is not None and _version(built)[0] > last:
            gaps.append((sm, None, last))
    return gaps


def locked_torch_problems(
    cuda: str, arches: tuple[str, ...], torch: str, built: str, lock: str
) -> list[TargetProblem]:
    """Why the torch a lock pins (``torch``, built with CUDA ``built``) cannot build these
    arches' extensions with CUDA ``cuda``: another CUDA major, or an arch its wheels lack."""
    problems: list[TargetProblem] = []
    have = _version(cuda)[:2]
    major = _version(built)[0]
    if major != have[0]:
        problems.append(
            TargetProblem(
                "torch_lock",
                f"{lock} pins torch {torch} built with CUDA {built}; [build] cuda is {cuda}: "
                "torch extensions need an nvcc of the same CUDA major",
                f"lock a torch built with CUDA {have[0]}.x, or set [build] cuda to a CUDA "
                f"{major}.x toolkit",
            )
        )
    for sm, cut, last in _torch_gaps(torch, built, arches):
        if cut is not None:
            problems.append(
                TargetProblem(
                    "torch_lock",
                    f"{lock} pins torch {torch} built with CUDA {built}, whose wheels carry no "
                    f"sm_{sm} kernels (dropped from {cut[0]}.{cut[1]} on)",
                    f"lock a torch < {cut[0]}.{cut[1]}, or a cu126 build (it keeps sm_70)",
                )
            )
        else:
            problems.append(
                TargetProblem(
                    "torch_lock",
                    f"{lock} pins torch {torch} built with CUDA {built}, which carries no "
                    f"sm_{sm} kernels (CUDA {last + 1} dropped it)",
                    f"lock a torch built with CUDA {last}.x that carries sm_{sm} (cu126)",
                )
            )
    return problems

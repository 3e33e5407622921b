"""CUDA arch names, one spelling inside pinwheel: ``CudaArch(sm=70, ptx=True)``.

The manifest and users write arches the way their tools do (``7.0``,
``7.0+PTX``, ``sm_70``, ``compute_70``, ``70``); each tool wants its own
spelling back (TORCH_CUDA_ARCH_LIST, CMAKE_CUDA_ARCHITECTURES, nvcc -gencode).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from pinwheel.errors import UsageError

_FORMS = (
    re.compile(r"^(?P<major>\d{1,2})\.(?P<minor>\d)[af]?(?P<ptx>\+PTX)?$", re.I),  # 7.0, 9.0a
    re.compile(r"^(?:sm_|compute_)?(?P<sm>\d{2,3})[af]?(?P<ptx>\+PTX)?$", re.I),  # sm_70, 70
)


@dataclass(frozen=True, order=True)
class CudaArch:
    sm: int  # 70 for Volta
    ptx: bool = False  # also require compute_XX PTX (JIT on newer GPUs)

    @property
    def name(self) -> str:
        return f"sm_{self.sm}"

    @property
    def torch(self) -> str:
        return f"{self.sm // 10}.{self.sm % 10}" + ("+PTX" if self.ptx else "")

    @property
    def cmake(self) -> str:
        return f"{self.sm}" if self.ptx else f"{self.sm}-real"

    def __str__(self) -> str:
        return self.name + ("+PTX" if self.ptx else "")


def parse_arch(text: str) -> CudaArch:
    raw = text.strip()
    for form in _FORMS:
        m = form.match(raw)
        if not m:
            continue
        groups = m.groupdict()
        sm = (
            int(groups["sm"])
            if groups.get("sm")
            else int(groups["major"]) * 10 + int(groups["minor"])
        )
        return CudaArch(sm=sm, ptx=bool(groups.get("ptx")) or raw.lower().startswith("compute_"))
    raise UsageError(
        f"cannot read CUDA arch {text!r}",
        next="write arches like 7.0, 7.0+PTX, sm_70 or 70",
    )


def parse_arches(items: Iterable[str]) -> tuple[CudaArch, ...]:
    """Parse and merge (``7.0`` and ``7.0+PTX`` -> one arch needing PTX); sorted."""
    merged: dict[int, bool] = {}
    for item in items:
        for part in re.split(r"[;,\s]+", item):
            if part:
                arch = parse_arch(part)
                merged[arch.sm] = merged.get(arch.sm, False) or arch.ptx
    return tuple(CudaArch(sm, ptx) for sm, ptx in sorted(merged.items()))


def torch_arch_list(arches: Iterable[CudaArch]) -> str:
    """TORCH_CUDA_ARCH_LIST value, e.g. ``7.0+PTX``."""
    return ";".join(a.torch for a in arches)


def names(sms: Iterable[int]) -> str:
    listed = sorted(set(sms))
    return ", ".join(f"sm_{s}" for s in listed) if listed else "none"

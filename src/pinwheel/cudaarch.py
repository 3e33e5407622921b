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
    re.compile(r"^(?P<major>\d{1,2})\.(?P<minor>\d)(?P<suffix>[af]?)(?P<ptx>\+PTX)?$", re.I),
    re.compile(r"^(?:sm_|compute_)?(?P<sm>\d{2,3})(?P<suffix>[af]?)(?P<ptx>\+PTX)?$", re.I),
)


@dataclass(frozen=True, order=True)
class CudaArch:
    sm: int  # 70 for Volta
    ptx: bool = False  # also require compute_XX PTX (JIT on newer GPUs)
    suffix: str = ""  # "a" (arch-specific, sm_90a) or "f" (family); "" for plain

    @property
    def name(self) -> str:
        return f"sm_{self.sm}{self.suffix}"

    @property
    def dotted(self) -> str:
        """``7.0``, ``9.0a``: how the manifest writes it."""
        return f"{self.sm // 10}.{self.sm % 10}{self.suffix}"

    @property
    def torch(self) -> str:
        return self.dotted + ("+PTX" if self.ptx else "")

    @property
    def gencode(self) -> str:
        """nvcc's ``-gencode`` value: SASS, and PTX beside it when ``ptx``."""
        sm = f"{self.sm}{self.suffix}"
        code = f"[sm_{sm},compute_{sm}]" if self.ptx else f"sm_{sm}"
        return f"arch=compute_{sm},code={code}"

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
        return CudaArch(
            sm=sm,
            ptx=bool(groups.get("ptx")) or raw.lower().startswith("compute_"),
            suffix=(groups.get("suffix") or "").lower(),
        )
    raise UsageError(
        f"cannot read CUDA arch {text!r}",
        next="write arches like 7.0, 7.0+PTX, sm_70 or 70",
    )


_DOTTED = re.compile(r"(?P<major>[0-9]{1,2})\.(?P<minor>[0-9])(?P<suffix>[af]?)")


def parse_dotted(text: str, *, suffix: bool = True) -> CudaArch:
    """The dotted spelling alone (``7.0``, ``12.1``; ``9.0a`` / ``10.0f`` with ``suffix``):
    a manifest's ``[build] arches``, a profile's or nvidia-smi's compute capability.

    Strict (``fullmatch``; no ``sm_``, no ``+PTX``): the value is written back as is.
    """
    m = _DOTTED.fullmatch(text) if isinstance(text, str) else None
    if m is None or (m.group("suffix") and not suffix):
        raise UsageError(
            f"cannot read CUDA arch {str(text)[:40]!r}",
            next='write it like "7.0"' + (' or "9.0a"' if suffix else ""),
        )
    sm = int(m.group("major")) * 10 + int(m.group("minor"))
    return CudaArch(sm=sm, suffix=m.group("suffix"))


def parse_arches(items: Iterable[str]) -> tuple[CudaArch, ...]:
    """Parse and merge (``7.0`` and ``7.0+PTX`` -> one arch needing PTX); sorted."""
    merged: dict[tuple[int, str], bool] = {}
    for item in items:
        for part in re.split(r"[;,\s]+", item):
            if part:
                arch = parse_arch(part)
                key = (arch.sm, arch.suffix)
                merged[key] = merged.get(key, False) or arch.ptx
    return tuple(CudaArch(sm, ptx, suffix) for (sm, suffix), ptx in sorted(merged.items()))


def targets(arches: Iterable[str], ptx: bool) -> tuple[CudaArch, ...]:
    """``[build] arches`` + ``ptx``: SASS for each arch, PTX for the lowest when ``ptx``."""
    parsed = parse_arches(arches)
    if ptx and parsed:
        first = parsed[0]
        parsed = (CudaArch(first.sm, True, first.suffix), *parsed[1:])
    return parsed


def cmake_architectures(arches: Iterable[CudaArch]) -> str:
    """CMAKE_CUDA_ARCHITECTURES: ``70-real;80-real;70-virtual`` (SASS each, PTX where asked)."""
    listed = list(arches)
    parts = [f"{a.sm}{a.suffix}-real" for a in listed]
    parts += [f"{a.sm}{a.suffix}-virtual" for a in listed if a.ptx]
    return ";".join(parts)


def torch_arch_list(arches: Iterable[CudaArch]) -> str:
    """TORCH_CUDA_ARCH_LIST value, e.g. ``7.0+PTX``."""
    return ";".join(a.torch for a in arches)


def names(sms: Iterable[int]) -> str:
    listed = sorted(set(sms))
    return ", ".join(f"sm_{s}" for s in listed) if listed else "none"

"""What the GPU box says about itself, parsed: ``nvidia-smi --query-gpu`` CSV into
:class:`Gpu` rows, the ``nvidia-smi topo -m`` matrix into a :class:`Topology` of
NVLink/PCIe pairs, and nvcc's release line. Pure parsing (preflight runs the programs)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pinwheel.cudaarch import CudaArch, parse_dotted
from pinwheel.errors import PinwheelError, UsageError

GPU_QUERY = "index,name,compute_cap,memory.total,pci.bus_id"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: CudaArch | None  # None where the driver cannot say
    memory_mib: int | None  # None on unified-memory parts (GB10 reports [N/A])
    bus_id: str


def _capability(text: str) -> CudaArch | None:
    """nvidia-smi's ``compute_cap`` (``7.0``); None for ``[N/A]`` or anything else."""
    try:
        return parse_dotted(text, suffix=False)
    except UsageError:
        return None


def _cc(arch: CudaArch | None) -> str:
    return arch.dotted if arch is not None else "unknown"


def parse_gpu_csv(text: str) -> tuple[Gpu, ...]:
    """Rows of ``nvidia-smi --query-gpu=index,name,compute_cap,memory.total,pci.bus_id
    --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        # ASCII digits only: str.isdigit() takes '²' and '٣', which int() then refuses
        if len(cells) != 5 or not re.fullmatch(r"[0-9]{1,4}", cells[0], re.ASCII):
            raise PinwheelError(
                f"unexpected nvidia-smi line {line[:120]!r}",
                where="nvidia-smi --query-gpu",
                next="update the NVIDIA driver (compute_cap needs driver >= 510)",
            )
        idx, name, cc, mem, bus = cells
        gpus.append(
            Gpu(
                index=int(idx),
                name=name,
                compute_capability=_capability(cc),
                memory_mib=int(float(mem))
                if re.fullmatch(r"[0-9]{1,12}(\.[0-9]{1,6})?", mem)
                else None,
                bus_id=bus,
            )
        )
    return tuple(gpus)


@dataclass(frozen=True)
class Topology:
    gpus: tuple[int, ...]
    links: dict[tuple[int, int], str]  # (i, j) with i < j -> "NV2", "SYS", "PHB", ...

    def link(self, a: int, b: int) -> str | None:
        return self.links.get((min(a, b), max(a, b)))

    def nvlinked(self, a: int, b: int) -> bool:
        return (self.link(a, b) or "").startswith("NV")

    @property
    def nvlink_pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple(p for p, kind in sorted(self.links.items()) if kind.startswith("NV"))

    @property
    def pcie_pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple(p for p, kind in sorted(self.links.items()) if not kind.startswith("NV"))


_GPU_LABEL = re.compile(r"^GPU([0-9]{1,4})$", re.ASCII)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # some drivers underline the header even when piped


def parse_topo(text: str) -> Topology:
    """The GPU x GPU block of ``nvidia-smi topo -m`` (tabs or spaces, any driver's extra
    columns: NICs, CPU/NUMA affinity, GPU NUMA ID)."""
    header: list[int] | None = None
    links: dict[tuple[int, int], str] = {}
    for line in _ANSI.sub("", text).splitlines():
        tokens = line.split()
        if not tokens:
            continue
        if header is None:
            if _GPU_LABEL.match(tokens[0]):
                header = [int(m.group(1)) for t in tokens if (m := _GPU_LABEL.match(t))]
            continue
        row = _GPU_LABEL.match(tokens[0])
        if not row:
            if tokens[0].rstrip(":") in ("Legend", "NIC"):
                break
            continue
        a = int(row.group(1))
        for b, cell in zip(header, tokens[1 : 1 + len(header)], strict=False):
            if a != b:
                links[(min(a, b), max(a, b))] = cell
    if header is None:
        raise PinwheelError(
            "no GPU matrix in `nvidia-smi topo -m` output",
            where="nvidia-smi topo -m",
            next="run `nvidia-smi topo -m` by hand and check the driver is loaded",
        )
    return Topology(gpus=tuple(header), links=links)


def parse_nvcc_release(text: str) -> str | None:
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


__all__ = ["GPU_QUERY", "Gpu", "Topology", "parse_gpu_csv", "parse_nvcc_release", "parse_topo"]

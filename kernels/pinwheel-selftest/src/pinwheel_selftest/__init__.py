"""GPU self-tests through a tiny C API (ctypes): no torch, only the NVIDIA driver.

``gemm_selftest`` runs an fp16 tensor-core GEMM (SM70 ``mma.sync.m8n8k4``) and
compares it with an exact host reference; ``p2p_check`` copies a buffer between
two GPUs and returns checksums from the host, the source and the destination.
"""

from __future__ import annotations

import ctypes
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = [
    "SelftestError",
    "DeviceInfo",
    "GemmResult",
    "P2PResult",
    "devices",
    "gemm_selftest",
    "p2p_check",
]

_LIB_NAME = "libpinwheel_selftest.so"
_ERRLEN = 512


class SelftestError(RuntimeError):
    """The CUDA driver or runtime refused a step; the message names the call."""


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    capability: str  # "7.0"
    driver: int  # e.g. 12040

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GemmResult:
    device: int
    shape: tuple  # (M, N, K)
    max_abs_err: float
    wrong_rows: int
    first_wrong_row: Optional[int]
    binary_version: int  # 70 = the wheel's SASS ran; higher = the driver JIT-compiled the PTX
    ptx_version: int

    @property
    def ok(self) -> bool:
        return self.wrong_rows == 0 and self.max_abs_err == 0.0

    @property
    def jit(self) -> bool:
        return self.binary_version != self.ptx_version

    def as_dict(self) -> Dict[str, Any]:
        return dict(asdict(self), ok=self.ok, jit=self.jit)


@dataclass(frozen=True)
class P2PResult:
    src: int
    dst: int
    nbytes: int
    expected: int  # checksum computed on the host
    src_sum: int  # on the source GPU after filling
    dst_memcpy_sum: int  # on the destination after cudaMemcpyPeer
    dst_kernel_sum: Optional[int]  # after a kernel on dst read src's memory (P2P only)
    peer_access: bool

    @property
    def ok(self) -> bool:
        sums = [self.src_sum, self.dst_memcpy_sum]
        if self.dst_kernel_sum is not None:
            sums.append(self.dst_kernel_sum)
        return all(s == self.expected for s in sums)

    def as_dict(self) -> Dict[str, Any]:
        return dict(asdict(self), ok=self.ok)


_lib: Optional[ctypes.CDLL] = None


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        path = Path(__file__).with_name(_LIB_NAME)
        lib = ctypes.CDLL(str(path))
        c_int_p = ctypes.POINTER(ctypes.c_int)
        lib.pwst_device_count.argtypes = [c_int_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.pwst_device_info.argtypes = [
            ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, c_int_p, c_int_p, c_int_p,
            ctypes.c_char_p, ctypes.c_size_t,
        ]  # fmt: skip
        lib.pwst_gemm.argtypes = [
            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.POINTER(ctypes.c_double), c_int_p, c_int_p, c_int_p, c_int_p,
            ctypes.c_char_p, ctypes.c_size_t,
        ]  # fmt: skip
        lib.pwst_p2p.argtypes = [
            ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
            ctypes.POINTER(ctypes.c_uint64 * 4), c_int_p, ctypes.c_char_p, ctypes.c_size_t,
        ]  # fmt: skip
        for fn in (lib.pwst_device_count, lib.pwst_device_info, lib.pwst_gemm, lib.pwst_p2p):
            fn.restype = ctypes.c_int
        _lib = lib
    return _lib


def _call(name: str, *args: Any) -> None:
    err = ctypes.create_string_buffer(_ERRLEN)
    rc = getattr(_load(), name)(*args, err, _ERRLEN)
    if rc != 0:
        raise SelftestError(f"{name}: {err.value.decode(errors='replace') or f'error {rc}'}")


def devices() -> List[DeviceInfo]:
    count = ctypes.c_int(0)
    _call("pwst_device_count", ctypes.byref(count))
    found = []
    for i in range(count.value):
        name = ctypes.create_string_buffer(256)
        major, minor, driver = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        _call(
            "pwst_device_info", i, name, 256,
            ctypes.byref(major), ctypes.byref(minor), ctypes.byref(driver),
        )  # fmt: skip
        found.append(
            DeviceInfo(i, name.value.decode(), f"{major.value}.{minor.value}", driver.value)
        )
    return found


def gemm_selftest(device: int = 0, m: int = 128, n: int = 128, k: int = 256) -> GemmResult:
    """C = A·B (fp16 in, fp32 accumulate) on the tensor cores, checked against the host."""
    err = ctypes.c_double()
    wrong, first, binary, ptx = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _call(
        "pwst_gemm", device, m, n, k, ctypes.byref(err), ctypes.byref(wrong),
        ctypes.byref(first), ctypes.byref(binary), ctypes.byref(ptx),
    )  # fmt: skip
    return GemmResult(
        device=device,
        shape=(m, n, k),
        max_abs_err=err.value,
        wrong_rows=wrong.value,
        first_wrong_row=first.value if first.value >= 0 else None,
        binary_version=binary.value,
        ptx_version=ptx.value,
    )


def p2p_check(src_dev: int, dst_dev: int, nbytes: int = 64 << 20, seed: int = 0x5EED) -> P2PResult:
    """Copy ``nbytes`` from ``src_dev`` to ``dst_dev``; checksums from host, source, destination."""
    sums = (ctypes.c_uint64 * 4)()
    peer = ctypes.c_int()
    _call("pwst_p2p", src_dev, dst_dev, nbytes, seed, ctypes.byref(sums), ctypes.byref(peer))
    return P2PResult(
        src=src_dev,
        dst=dst_dev,
        nbytes=nbytes,
        expected=sums[0],
        src_sum=sums[1],
        dst_memcpy_sum=sums[2],
        dst_kernel_sum=sums[3] if peer.value else None,
        peer_access=bool(peer.value),
    )

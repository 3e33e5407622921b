"""The pinned files of each provisionable CUDA toolkit (data only).

Each lock names the Debian packages and PyPI wheels a toolkit tree is
assembled from, every one by sha256, and which of their files go where.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class DebPin:
    package: str
    version: str
    sha256: str
    # (path inside the package, path inside the toolkit tree); a dir copies recursively.
    files: tuple[tuple[str, str], ...]
    size: int = 0  # bytes of the .deb as downloaded (measured); 0: not measured

    @property
    def filename(self) -> str:
        # apt-get download escapes ':' in epochs as %3a; these versions have none.
        return f"{self.package}_{self.version}_amd64.deb"


@dataclass(frozen=True)
class WheelPin:
    project: str
    version: str
    filename: str
    sha256: str
    files: tuple[tuple[str, str], ...]
    size: int = 0  # bytes of the wheel as downloaded (measured); 0: not measured


@dataclass(frozen=True)
class ToolkitLock:
    version: str  # full nvcc version the tree reports
    suite: str  # Debian suite holding the package
    component: str
    debs: tuple[DebPin, ...]
    wheels: tuple[WheelPin, ...]
    # What an engine build needs beyond a kernel's: (package, files) added to that
    # package's pin by with_dev(): math-library, nvrtc and nvtx3 headers, driver stubs.
    dev: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    variant: str = ""

    @property
    def dirname(self) -> str:
        return f"cuda-{self.version}" + (f"-{self.variant}" if self.variant else "")

    def files_to_fetch(self) -> tuple[tuple[str, int], ...]:
        """(file name, bytes; 0 when not measured) of every file the lock downloads."""
        return tuple((d.filename, d.size) for d in self.debs) + tuple(
            (w.filename, w.size) for w in self.wheels
        )

    def with_dev(self) -> ToolkitLock:
        """This toolkit plus the dev files: a separate tree (``cuda-X.Y.Z-dev``)."""
        extra = dict(self.dev)
        debs = tuple(
            dataclasses.replace(p, files=p.files + extra[p.package]) if p.package in extra else p
            for p in self.debs
        )
        return dataclasses.replace(self, debs=debs, dev=(), variant="dev")


# Headers and link stubs CMake's FindCUDAToolkit wants for an engine build
# (CUDA::nvrtc, CUDA::cuda_driver, cublas/cusparse/cusolver/curand, nvtx3).
_DEV_HEADERS = (
    "cublas.h", "cublasLt.h", "cublasXt.h", "cublas_api.h", "cublas_v2.h", "cusparse.h",
    "cusparse_v2.h", "cusolverDn.h", "cusolverMg.h", "cusolverRf.h", "cusolverSp.h",
    "cusolverSp_LOWLEVEL_PREVIEW.h", "cusolver_common.h", "nvrtc.h", "nvToolsExt.h",
    "nvToolsExtCuda.h", "nvToolsExtCudaRt.h", "nvToolsExtOpenCL.h", "nvToolsExtSync.h",
    "nvtx3", "cuda_profiler_api.h", "cudaProfiler.h", "cudalibxt.h", "nvJitLink.h",
    "nvfunctional", "crt/nvfunctional", "curand.h", "curand_discrete.h", "curand_discrete2.h",
    "curand_globals.h", "curand_kernel.h", "curand_lognormal.h", "curand_mrg32k3a.h",
    "curand_mtgp32.h", "curand_mtgp32_host.h", "curand_mtgp32_kernel.h",
    "curand_mtgp32dc_p_11213.h", "curand_normal.h", "curand_normal_static.h",
    "curand_philox4x32_x.h", "curand_poisson.h", "curand_precalc.h", "curand_uniform.h",
)  # fmt: skip
DEV_FILES = (
    *((f"usr/include/{h}", f"include/{h}") for h in _DEV_HEADERS),
    ("usr/lib/x86_64-linux-gnu/stubs", "lib64/stubs"),
)
# What an installed toolkit must hold to count for an engine build.
DEV_PROBES = ("include/cublas_v2.h", "include/nvrtc.h", "include/nvtx3")


_TK = "usr/lib/nvidia-cuda-toolkit"
_BINS = ("ptxas", "fatbinary", "nvlink", "cudafe++", "bin2c", "cuobjdump", "nvdisasm", "nvprune")

# Observed sha256s of the exact files: Debian's Packages index agrees for the
# .deb; PyPI's for the wheels. A different file under the same name is refused.
LOCKS: dict[str, ToolkitLock] = {
    "12.4": ToolkitLock(
        version="12.4.131",
        suite="trixie",
        component="non-free",
        debs=(
            DebPin(
                package="nvidia-cuda-toolkit",
                version="12.4.131~12.4.1-2",
                sha256="cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319",
                size=87_240_108,  # measured: the downloaded file
                files=(
                    (f"{_TK}/bin/nvcc", "bin/nvcc"),
                    (f"{_TK}/bin/crt", "bin/crt"),
                    (f"{_TK}/bin/cicc", "nvvm/bin/cicc"),
                    (f"{_TK}/libdevice/libdevice.10.bc", "nvvm/libdevice/libdevice.10.bc"),
                    *((f"usr/bin/{b}", f"bin/{b}") for b in _BINS),
                ),
            ),
            # Only for the static runtime and device runtime: nvcc names
            # -lcudadevrt on every link and CMake's CUDA compiler check links
            # cudart_static. The .deb is 900 MB; the two files are read by
            # streaming its data.tar and stopping once both are out.
            DebPin(
                package="nvidia-cuda-dev",
                version="12.4.127~12.4.1-2",
                sha256="d846838f914a0176948d48a8bcade5d6dbcccb5c9374343f6475f5503f173ee0",
                size=933_853_452,  # measured: the downloaded file
                files=(
                    ("usr/lib/x86_64-linux-gnu/libcudadevrt.a", "lib64/libcudadevrt.a"),
                    ("usr/lib/x86_64-linux-gnu/libcudart_static.a", "lib64/libcudart_static.a"),
                ),
            ),
        ),
        dev=(("nvidia-cuda-dev", DEV_FILES),),
        wheels=(
            WheelPin(
                project="nvidia-cuda-nvcc-cu12",
                version="12.4.131",
                filename="nvidia_cuda_nvcc_cu12-12.4.131-py3-none-manylinux2014_x86_64.whl",
                sha256="e4c9a35435c3b0e36c6397c5696334c9ea6650e524736cbd1c5d345ea099bb04",
                size=22_265_199,  # measured: the downloaded file
                files=(
                    ("nvidia/cuda_nvcc/include", "include"),
                    ("nvidia/cuda_nvcc/nvvm/lib64", "nvvm/lib64"),
                    ("nvidia/cuda_nvcc/nvvm/include", "nvvm/include"),
                ),
            ),
            WheelPin(
                project="nvidia-cuda-runtime-cu12",
                version="12.4.127",
                filename="nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl",
                sha256="64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5",
                size=883_737,  # measured: the downloaded file
                files=(
                    ("nvidia/cuda_runtime/include", "include"),
                    ("nvidia/cuda_runtime/lib", "lib64"),
                ),
            ),
            WheelPin(
                project="nvidia-cuda-cccl-cu12",
                version="12.4.127.post1",
                filename="nvidia_cuda_cccl_cu12-12.4.127.post1-py3-none-manylinux2014_x86_64.whl",
                sha256="2027fa5fc75fbee703bf24e8275a40a605cf94a3e8fef8a7187897d49b34facb",
                size=3_111_329,  # measured: the downloaded file
                files=(("nvidia/cuda_cccl/include", "include"),),
            ),
        ),
    ),
}

# CUDA 13.0 from PyPI alone (no .deb): the versions of NVIDIA's own 13.0 toolkit
# (13.0.2). The five wheels share one tree (nvidia/cu13/); it is mapped onto the
# layout NVCC_PROFILE expects (lib64/, include/ with CCCL flattened into it).
# CUDA 13 targets sm_75 and newer only; sm_120 and sm_121 compile and link.
_CU13 = "nvidia/cu13"
LOCKS["13.0"] = ToolkitLock(
    version="13.0.88",
    suite="",
    component="",
    debs=(),
    wheels=(
        WheelPin(
            project="nvidia-cuda-nvcc",
            version="13.0.88",
            filename="nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            sha256="56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
            files=(
                (f"{_CU13}/bin", "bin"),
                (f"{_CU13}/include/fatbinary_section.h", "include/fatbinary_section.h"),
            ),
        ),
        WheelPin(
            project="nvidia-nvvm",
            version="13.0.88",
            filename="nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
            sha256="c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0",
            files=(
                (f"{_CU13}/nvvm", "nvvm"),
                (f"{_CU13}/lib/libnvvm.so.4", "lib64/libnvvm.so.4"),
                (f"{_CU13}/include/nvvm.h", "include/nvvm.h"),
            ),
        ),
        WheelPin(
            project="nvidia-cuda-crt",
            version="13.0.88",
            filename="nvidia_cuda_crt-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            sha256="2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4",
            files=((f"{_CU13}/include/crt", "include/crt"),),
        ),
        WheelPin(
            project="nvidia-cuda-runtime",
            version="13.0.96",
            filename="nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            sha256="7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
            files=((f"{_CU13}/include", "include"), (f"{_CU13}/lib", "lib64")),
        ),
        WheelPin(
            project="nvidia-cuda-cccl",
            version="13.0.85",
            filename="nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            sha256="e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649",
            files=((f"{_CU13}/include/cccl", "include"), (f"{_CU13}/include/nv", "include/nv")),
        ),
    ),
)

# Versions a manifest may pin that cannot be provisioned, and why: they must be
# installed (CUDA_HOME, PATH or /usr/local/cuda).
NOT_PROVISIONABLE: dict[str, str] = {
    "12.8": "PyPI's nvidia-cuda-nvcc-cu12 12.8 holds only ptxas and libnvvm (no nvcc, cicc, "
    "fatbinary, nvlink)",
    "12.9": "PyPI's nvidia-cuda-nvcc-cu12 12.9 holds only ptxas and libnvvm (no nvcc, cicc, "
    "fatbinary, nvlink)",
}


MARKER = ".pinwheel-toolkit.json"

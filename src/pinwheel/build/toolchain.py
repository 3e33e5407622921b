"""The CUDA toolchain: the manifest's ``[build]`` table, and a CUDA 12.x toolkit that can build it.

``resolve_toolkit`` looks for a toolkit whose version matches ``[build].cuda``
(``CUDA_HOME``/``CUDA_PATH``, ``nvcc`` on PATH, ``/usr/local/cuda``, then the
one pinwheel provisioned into its cache). When none fits it provisions one:
NVIDIA's compiler binaries from the Debian ``nvidia-cuda-toolkit`` package
(fetched from the machine's own Debian mirror, suite trixie, component
non-free, with a private APT state) plus the headers, libnvvm and libcudart from
PyPI's ``nvidia-cuda-*-cu12`` wheels, every file pinned by sha256 in
:data:`LOCKS`, assembled into one relocatable tree with an ``nvcc.profile``.

Every toolkit is probed by compiling a tiny kernel for each requested arch
before it is used: CUDA 13 dropped sm_70, and an nvcc that cannot emit the
manifest's arches must stop the build here, not an hour into it.
"""

from __future__ import annotations

import dataclasses
import getpass
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from pinwheel.checksums import sha256_file
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_dir, atomic_write_text
from pinwheel.manifest.build import BuildConfig, parse_build_table  # noqa: F401
from pinwheel.manifest.targets import target_problems


class ToolchainError(PinwheelError):
    """No usable CUDA toolkit, or provisioning one failed."""


# --------------------------------------------------------------------------- [build]

# --------------------------------------------------------------------------- the toolkit


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit that compiled a probe kernel for every requested arch."""

    root: Path
    nvcc: Path
    version: str  # "12.4.131"
    arches: tuple[str, ...]  # the arches it was probed for
    source: str  # where it came from: "CUDA_HOME", "PATH", "provisioned", ...

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for build subprocesses: this toolkit first on PATH, CUDA_HOME set."""
        env = dict(os.environ if base is None else base)
        env.update(
            CUDA_HOME=str(self.root),
            CUDA_PATH=str(self.root),
            CUDAToolkit_ROOT=str(self.root),
            CUDACXX=str(self.nvcc),
            PATH=os.pathsep.join([str(self.root / "bin"), env.get("PATH", os.defpath)]),
        )
        return env

    def facts(self) -> dict[str, str]:
        """For provenance receipts."""
        return {"cuda": self.version, "nvcc": str(self.nvcc), "source": self.source}


_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


def nvcc_version(nvcc: Path) -> str:
    """``12.4.131`` from ``nvcc --version``."""
    try:
        out = subprocess.run(
            [str(nvcc), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as exc:
        raise ToolchainError(f"cannot run {nvcc}: {exc}", where=str(nvcc)) from None
    m = _RELEASE.search(out.stdout)
    if out.returncode != 0 or not m:
        raise ToolchainError(
            f"`{nvcc} --version` gave no CUDA release line (exit {out.returncode})",
            where=str(nvcc),
            next="check that this is NVIDIA's nvcc",
        )
    return m.group(2)


_PROBE = r"""
#include <cuda_fp16.h>
// Touches fp16 and the tensor-core MMA that the self-tests rely on for sm_70+.
__global__ void pinwheel_probe(const __half* a, float* out) {
  out[threadIdx.x] = __half2float(a[threadIdx.x]) * 2.0f;
}
"""

# nvcc messages that deserve a tailored "why" and "what to do".
_DIAGNOSES = (
    (
        re.compile(r"Unsupported gpu architecture 'compute_(\d+)'"),
        "this nvcc cannot target sm_{0} (CUDA 13 dropped Volta sm_70 and older)",
        'use a CUDA 12.x toolkit: set [build] cuda = "12.4" and run `pinwheel toolchain`, '
        "which provisions one into the cache",
    ),
    (
        re.compile(r"unsupported GNU version|unsupported clang version"),
        "the host compiler is newer than this nvcc supports",
        "point CUDAHOSTCXX at a supported g++ (CUDA 12.4: gcc <= 13), or install g++-13",
    ),
)


def probe_arches(nvcc: Path, arches: tuple[str, ...], env: Mapping[str, str] | None = None) -> None:
    """Compile a tiny kernel for each arch; raise saying why and what to do if one fails."""
    with tempfile.TemporaryDirectory(prefix="pinwheel-probe-") as tmp:
        src = Path(tmp) / "probe.cu"
        src.write_text(_PROBE)
        for arch in arches:
            sm = arch.replace(".", "")
            cmd = [
                str(nvcc),
                "-c",
                str(src),
                "-o",
                str(Path(tmp) / f"probe_{sm}.o"),
                f"-gencode=arch=compute_{sm},code=[sm_{sm},compute_{sm}]",
            ]
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=300, check=False, env=env
            )
            if out.returncode == 0:
                continue
            message = (out.stderr or out.stdout).strip().splitlines()
            detail = message[-1] if message else f"exit {out.returncode}"
            why, todo = f"nvcc failed: {detail}", "run the command by hand to see the full error"
            for pattern, reason, advice in _DIAGNOSES:
                m = pattern.search(out.stderr + out.stdout)
                if m:
                    why, todo = reason.format(*m.groups()) + f" ({detail})", advice
                    break
            raise ToolchainError(
                f"toolkit cannot compile for arch {arch}: {why}",
                where=f"{nvcc} ({' '.join(cmd[1:2] + cmd[5:])})",
                next=todo,
            )


def _candidates(environ: Mapping[str, str]) -> list[tuple[str, Path]]:
    """(source, root) for toolkits installed on this machine, most explicit first."""
    found: list[tuple[str, Path]] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(var):
            found.append((var, Path(environ[var])))
    on_path = shutil.which("nvcc", path=environ.get("PATH"))
    if on_path:
        found.append(("PATH", Path(on_path).resolve().parent.parent))
    found.append(("/usr/local/cuda", Path("/usr/local/cuda")))
    unique: dict[Path, tuple[str, Path]] = {}
    for source, root in found:
        key = root.resolve() if root.exists() else root
        unique.setdefault(key, (source, root))
    return list(unique.values())


def resolve_toolkit(
    config: BuildConfig,
    cache: Path,
    *,
    provision: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Toolkit:
    """The first toolkit matching ``config.cuda`` that compiles every arch; provision if none."""
    environ = dict(os.environ if environ is None else environ)
    _refuse_impossible(config)
    rejected: list[str] = []
    for source, root in _candidates(environ):
        nvcc = root / "bin" / "nvcc"
        if not nvcc.is_file():
            continue
        try:
            version = nvcc_version(nvcc)
        except ToolchainError as exc:
            rejected.append(f"{source} {root}: {exc.what}")
            continue
        if not _same_minor(version, config.cuda):
            rejected.append(f"{source} {root}: CUDA {version}, [build] cuda pins {config.cuda}")
            continue
        if config.cuda_dev and (lacks := [p for p in DEV_PROBES if not (root / p).exists()]):
            rejected.append(f"{source} {root}: no {', '.join(lacks)} ([build] cuda_dev)")
            continue
        probe_arches(nvcc, config.arches, env=environ)
        return Toolkit(root, nvcc, version, config.arches, source)

    lock = LOCKS.get(config.cuda)
    if lock is not None and config.cuda_dev:
        lock = lock.with_dev()
    cached = cache / "toolchains" / lock.dirname if lock else None
    if lock and cached and (cached / MARKER).is_file():
        return _checked(cached, config, "provisioned", environ)
    if not provision or lock is None:
        tried = "; ".join(rejected) or "no nvcc found (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)"
        can = ", ".join(sorted(LOCKS))
        raise ToolchainError(
            f"no usable CUDA {config.cuda} toolkit: {tried}",
            where="[build] cuda",
            next=(
                "run `pinwheel toolchain`: it provisions a pinned CUDA "
                f"{lock.version} into the cache"
                if lock
                else f"set CUDA_HOME to a CUDA {config.cuda} install, or pin a provisionable "
                f"version in [build] cuda ({can})"
                + (
                    f"; CUDA {config.cuda} is not provisioned: {NOT_PROVISIONABLE[config.cuda]}"
                    if config.cuda in NOT_PROVISIONABLE
                    else ""
                )
            ),
        )
    root = provision_toolkit(lock, cache)
    return _checked(root, config, "provisioned", environ)


def _refuse_impossible(config: BuildConfig) -> None:
    """The arch / CUDA / torch table (:mod:`pinwheel.manifest.targets`) before any probe."""
    problems = target_problems(config.cuda, config.arches, config.torch, config.torch_index)
    if problems:
        raise ToolchainError(
            problems[0].what, where=f"[build] {problems[0].key}", next=problems[0].fix
        )


def _checked(root: Path, config: BuildConfig, source: str, environ: Mapping[str, str]) -> Toolkit:
    nvcc = root / "bin" / "nvcc"
    version = nvcc_version(nvcc)
    probe_arches(nvcc, config.arches, env=environ)
    return Toolkit(root, nvcc, version, config.arches, source)


def _same_minor(version: str, wanted: str) -> bool:
    return version.split(".")[:2] == wanted.split(".")[:2]


# --------------------------------------------------------------------------- provisioning


@dataclass(frozen=True)
class DebPin:
    package: str
    version: str
    sha256: str
    # (path inside the package, path inside the toolkit tree); a dir copies recursively.
    files: tuple[tuple[str, str], ...]

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

# nvcc reads this beside itself; $(_HERE_) makes the tree relocatable.
NVCC_PROFILE = """\
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""


def provision_toolkit(lock: ToolkitLock, cache: Path) -> Path:
    """Download, verify and assemble ``lock`` into ``<cache>/toolchains/cuda-X.Y.Z``; idempotent."""
    base = cache / "toolchains"
    final = base / lock.dirname
    base.mkdir(parents=True, exist_ok=True)
    with FileLock(str(base / f".{lock.dirname}.lock")):
        if (final / MARKER).is_file():
            return final
        downloads = base / "downloads"
        debs = _fetch_debs(lock, downloads, base / "apt")
        wheels = [_fetch_wheel(pin, downloads) for pin in lock.wheels]
        with atomic_dir(final) as tmp:
            for pin, path in zip(lock.debs, debs, strict=True):
                _unpack_deb(path, pin, tmp)
            for wpin, path in zip(lock.wheels, wheels, strict=True):
                _unpack_wheel(path, wpin, tmp)
            for junk in tmp.rglob("__init__.py"):  # the wheels' namespace stubs
                junk.unlink()
            for so in sorted((tmp / "lib64").glob("libcudart.so.1[0-9]")):
                # torch's CUDAExtension links -lcudart: it needs the unversioned name.
                if not (tmp / "lib64" / "libcudart.so").exists():
                    (tmp / "lib64" / "libcudart.so").symlink_to(so.name)
            atomic_write_text(tmp / "bin" / "nvcc.profile", NVCC_PROFILE)
            found = nvcc_version(tmp / "bin" / "nvcc")
            if found != lock.version:
                raise ToolchainError(
                    f"assembled nvcc reports {found}, the lock says {lock.version}",
                    where=f"toolchain lock for CUDA {lock.version}",
                    next="fix LOCKS in pinwheel/toolchain.py",
                )
            record = {
                "version": lock.version,
                "debs": {p.filename: p.sha256 for p in lock.debs},
                "wheels": {p.filename: p.sha256 for p in lock.wheels},
            }
            tmp.chmod(0o755)  # mkdtemp made it private; the toolkit is for every user
            atomic_write_text(tmp / MARKER, json.dumps(record, indent=2, sort_keys=True) + "\n")
        return final


def _verified(path: Path, sha256: str) -> bool:
    return path.is_file() and sha256_file(path) == sha256


def _check_download(path: Path, sha256: str, origin: str) -> Path:
    actual = sha256_file(path)
    if actual != sha256:
        path.unlink()
        raise ToolchainError(
            f"{path.name} from {origin} has sha256 {actual}, the lock pins {sha256}",
            where=f"toolchain lock ({path.name})",
            next="the mirror serves a different file: check the mirror, or re-pin LOCKS "
            "in pinwheel/toolchain.py after reviewing the new file",
        )
    return path


# -- Debian -------------------------------------------------------------------

DEBIAN_SUITES = {"buster", "bullseye", "bookworm", "trixie", "forky", "sid"}
DEBIAN_SUITES |= {"stable", "testing", "unstable", "oldstable"}


@dataclass(frozen=True)
class AptSource:
    uri: str
    signed_by: str | None


def debian_sources(etc: Path = Path("/etc/apt")) -> list[AptSource]:
    """Debian archive sources configured on this machine (one-line and deb822 formats).

    Only plain Debian archives count (a suite named after a Debian release, not
    -security/-updates); third-party repositories are skipped.
    """
    found: list[AptSource] = []
    files = [etc / "sources.list"] if (etc / "sources.list").is_file() else []
    parts = etc / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    for path in files:
        text = path.read_text(errors="replace")
        entries = _deb822(text) if path.suffix == ".sources" else _one_line(text)
        for types, uris, suites, signed in entries:
            if "deb" not in types or not any(s in DEBIAN_SUITES for s in suites):
                continue
            for uri in uris:
                src = AptSource(uri.rstrip("/"), signed)
                if src not in found:
                    found.append(src)
    return found


def _one_line(text: str) -> list[tuple[list[str], list[str], list[str], str | None]]:
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        signed = None
        m = re.search(r"\[([^\]]*)\]", line)
        if m:
            for opt in m.group(1).split():
                if opt.startswith("signed-by="):
                    signed = opt.split("=", 1)[1]
            line = line[: m.start()] + line[m.end() :]
        words = line.split()
        if len(words) >= 3:
            out.append(([words[0]], [words[1]], [words[2]], signed))
    return out


def _deb822(text: str) -> list[tuple[list[str], list[str], list[str], str | None]]:
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no" or "uris" not in fields:
            continue
        out.append(
            (
                fields.get("types", "").split(),
                fields["uris"].split(),
                fields.get("suites", "").split(),
                fields.get("signed-by") or None,
            )
        )
    return out


def _apt_config(state: Path, source: AptSource, lock: ToolkitLock) -> Path:
    """A private apt configuration: our own sources, lists and cache; nothing of the system's."""
    for sub in ("lists/partial", "cache/archives/partial", "sources", "preferences"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "status").touch()
    signed = f"Signed-By: {source.signed_by}\n" if source.signed_by else ""
    atomic_write_text(
        state / "sources" / "pinwheel.sources",
        f"Types: deb\nURIs: {source.uri}\nSuites: {lock.suite}\n"
        f"Components: {lock.component}\n{signed}",
    )
    conf = state / "apt.conf"
    atomic_write_text(
        conf,
        "\n".join(
            [
                f'Dir::State "{state}";',
                f'Dir::State::Lists "{state}/lists";',
                f'Dir::State::status "{state}/status";',
                f'Dir::Cache "{state}/cache";',
                'Dir::Etc::sourcelist "/dev/null";',
                f'Dir::Etc::sourceparts "{state}/sources";',
                f'Dir::Etc::preferencesparts "{state}/preferences";',
                'APT::Architecture "amd64";',
                # Downloads land in a directory the _apt sandbox user cannot write.
                f'APT::Sandbox::User "{getpass.getuser()}";',
                'Acquire::Languages "none";',
                "",
            ]
        ),
    )
    return conf


def _fetch_debs(lock: ToolkitLock, downloads: Path, state: Path) -> list[Path]:
    """The lock's .debs, verified; downloads what the cache lacks with one private apt update."""
    targets = [downloads / pin.filename for pin in lock.debs]
    missing = [p for p, t in zip(lock.debs, targets, strict=True) if not _verified(t, p.sha256)]
    if not missing:
        return targets
    names = " ".join(f"{p.package}={p.version}" for p in missing)
    sources = debian_sources()
    if not sources:
        raise ToolchainError(
            f"this machine's apt sources name no Debian archive to fetch {names} from "
            f"(suite {lock.suite}, component {lock.component})",
            where="/etc/apt/sources.list, /etc/apt/sources.list.d/",
            next="add a Debian mirror to the apt sources, or set CUDA_HOME to a CUDA 12.x toolkit",
        )
    downloads.mkdir(parents=True, exist_ok=True)
    errors = []
    for source in sources:
        env = dict(os.environ, APT_CONFIG=str(_apt_config(state, source, lock)), LC_ALL="C")
        steps = (
            ["apt-get", "-q", "update"],
            ["apt-get", "-q", "download", *names.split()],
        )
        for cmd in steps:
            out = subprocess.run(
                cmd, cwd=downloads, env=env, capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                errors.append(f"{source.uri}: `{' '.join(cmd)}`: {out.stderr.strip()[-300:]}")
                break
        else:
            for pin in missing:
                _check_download(downloads / pin.filename, pin.sha256, source.uri)
            return targets
    raise ToolchainError(
        f"could not download {names}: " + " | ".join(errors),
        where=f"Debian {lock.suite}/{lock.component}",
        next="check the network and the apt sources, or set CUDA_HOME to a CUDA 12.x toolkit",
    )


def _ar_member(path: Path, prefix: str) -> tuple[int, int]:
    """(offset, size) of the first member named ``prefix*`` in an ``ar`` archive (a .deb)."""
    with open(path, "rb") as fh:
        if fh.read(8) != b"!<arch>\n":
            raise ToolchainError(f"{path.name} is not a Debian package (no ar header)")
        while header := fh.read(60):
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            if name.startswith(prefix):
                return fh.tell(), size
            fh.seek(size + (size % 2), io.SEEK_CUR)
    raise ToolchainError(f"{path.name} has no {prefix}* member", where=str(path))


class _Window(io.RawIOBase):
    """A read-only view of ``size`` bytes of a file from ``offset``: one ar member."""

    def __init__(self, fh: io.BufferedReader, offset: int, size: int):
        fh.seek(offset)
        self._fh, self._left = fh, size

    def readable(self) -> bool:
        return True

    def readinto(self, buf: bytearray | memoryview) -> int:  # type: ignore[override]
        n = self._fh.readinto(memoryview(buf)[: min(len(buf), self._left)])
        self._left -= n
        return n


def _unpack_deb(path: Path, pin: DebPin, dest: Path) -> None:
    """Copy the pinned files out of the data.tar, streaming: nvidia-cuda-dev is 900 MB."""
    offset, size = _ar_member(path, "data.tar")
    wanted = dict(pin.files)
    seen: set[str] = set()  # pinned files (not dirs) copied so far
    with open(path, "rb") as fh:
        stream = io.BufferedReader(_Window(fh, offset, size), 1 << 20)
        with tarfile.open(fileobj=stream, mode="r|*") as tar:
            for member in tar:
                rel = member.name.removeprefix("./")
                target = _map(rel, wanted)
                if target is None or not (member.isfile() or member.isdir()):
                    continue
                if member.isfile() and rel in wanted:
                    seen.add(rel)
                out = dest / target
                if member.isdir():
                    out.mkdir(parents=True, exist_ok=True)
                else:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    src = tar.extractfile(member)
                    assert src is not None
                    with open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                    out.chmod(0o755 if member.mode & 0o111 else 0o644)
                if len(seen) == len(wanted):
                    break  # every pinned file is out: skip decompressing the rest
    _require(dest, pin.files, path.name)


def _map(rel: str, wanted: Mapping[str, str]) -> str | None:
    """Where ``rel`` goes in the tree, if a pinned file or directory covers it."""
    if rel in wanted:
        return wanted[rel]
    for src, dst in wanted.items():
        if rel.startswith(src + "/"):
            return dst + rel[len(src) :]
    return None


def _require(dest: Path, files: tuple[tuple[str, str], ...], origin: str) -> None:
    missing = [dst for _, dst in files if not (dest / dst).exists()]
    if missing:
        raise ToolchainError(
            f"{origin} lacks {', '.join(missing)}",
            where=origin,
            next="the package layout changed: update LOCKS in pinwheel/toolchain.py",
        )


# -- PyPI ---------------------------------------------------------------------


def _fetch_wheel(pin: WheelPin, downloads: Path) -> Path:
    target = downloads / pin.filename
    if _verified(target, pin.sha256):
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--platform", "manylinux2014_x86_64", "--implementation", "py",
            "--dest", tmp, f"{pin.project}=={pin.version}",
        ]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        got = Path(tmp) / pin.filename
        if out.returncode != 0 or not got.is_file():
            names = ", ".join(p.name for p in Path(tmp).iterdir()) or "nothing"
            raise ToolchainError(
                f"pip could not download {pin.filename} (got {names}): {out.stderr.strip()[-300:]}",
                where=f"{pin.project}=={pin.version}",
                next="check the network and pip's index configuration",
            )
        _check_download(got, pin.sha256, "the package index")
        os.replace(got, target)
    return target


def _unpack_wheel(path: Path, pin: WheelPin, dest: Path) -> None:
    wanted = dict(pin.files)
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            target = _map(info.filename.rstrip("/"), wanted)
            if target is None or info.is_dir():
                continue
            out = dest / target
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(zf.read(info))
            mode = (info.external_attr >> 16) & 0o777
            out.chmod(0o755 if mode & 0o111 else 0o644)
    _require(dest, pin.files, path.name)

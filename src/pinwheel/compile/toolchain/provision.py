"""Assemble a pinned toolkit into ``<cache>/toolchains/cuda-X.Y.Z``.

NVIDIA's compiler binaries come from the Debian ``nvidia-cuda-toolkit`` package
(fetched from the machine's own Debian mirror, suite trixie, component
non-free, with a private APT state), the headers, libnvvm and libcudart from
PyPI's ``nvidia-cuda-*`` wheels, every file pinned by sha256 in
:data:`~pinwheel.compile.toolchain.pins.LOCKS`, assembled into one relocatable
tree with an ``nvcc.profile``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from filelock import FileLock

from pinwheel.compile.toolchain.apt import fetch_debs
from pinwheel.compile.toolchain.download import fetch_wheel
from pinwheel.compile.toolchain.pins import MARKER, ToolkitLock
from pinwheel.compile.toolchain.toolkit import ToolchainError, nvcc_version
from pinwheel.compile.toolchain.unpack import unpack_deb, unpack_wheel
from pinwheel.fsutil import atomic_dir, atomic_write_text
from pinwheel.heartbeat import watch_bytes
from pinwheel.progress import SILENT, Reporter, human_bytes

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


def download_plan(lock: ToolkitLock, downloads: Path) -> str:
    """What provisioning will download, said before it starts: files, sizes, destination."""
    todo = [
        (name, size)
        for name, size in lock.files_to_fetch()
        if not (
            (downloads / name).is_file() and (not size or (downloads / name).stat().st_size == size)
        )
    ]
    if not todo:
        return f"CUDA {lock.version}: every pinned file is already in {downloads}"
    known = sum(size for _, size in todo)
    unknown = sum(1 for _, size in todo if not size)
    total = human_bytes(known) + (f" + {unknown} file(s) of unknown size" if unknown else "")
    listing = ", ".join(f"{name} ({human_bytes(size) if size else '?'})" for name, size in todo)
    return (
        f"CUDA {lock.version}: downloading {len(todo)} file(s), {total}, into {downloads} "
        f"(once; --cache or PINWHEEL_CACHE puts it elsewhere): {listing}"
    )


def provision_toolkit(
    lock: ToolkitLock,
    cache: Path,
    environ: Mapping[str, str],
    reporter: Reporter = SILENT,
) -> Path:
    """Download, verify and assemble ``lock`` into ``<cache>/toolchains/cuda-X.Y.Z``; idempotent.

    ``environ`` is the caller's environment: apt-get, pip and nvcc run in it. ``reporter``
    gets the plan (files, sizes, destination) before any download, the bytes as they
    arrive, and each phase.
    """
    base = cache / "toolchains"
    final = base / lock.dirname
    base.mkdir(parents=True, exist_ok=True)
    with FileLock(str(base / f".{lock.dirname}.lock")):
        if (final / MARKER).is_file():
            return final
        downloads = base / "downloads"
        reporter.info(download_plan(lock, downloads))
        expected = sum(size for _, size in lock.files_to_fetch()) or None
        what = f"downloading CUDA {lock.version}"
        with watch_bytes(reporter, what, downloads, expected=expected):
            debs = fetch_debs(lock, downloads, base / "apt", environ)
            wheels = [fetch_wheel(pin, downloads, environ) for pin in lock.wheels]
        reporter.info(f"CUDA {lock.version}: sha256 verified; unpacking into {final}")
        with atomic_dir(final) as tmp:
            for pin, path in zip(lock.debs, debs, strict=True):
                unpack_deb(path, pin, tmp)
            for wpin, path in zip(lock.wheels, wheels, strict=True):
                unpack_wheel(path, wpin, tmp)
            for junk in tmp.rglob("__init__.py"):  # the wheels' namespace stubs
                junk.unlink()
            for so in sorted((tmp / "lib64").glob("libcudart.so.1[0-9]")):
                # torch's CUDAExtension links -lcudart: it needs the unversioned name.
                if not (tmp / "lib64" / "libcudart.so").exists():
                    (tmp / "lib64" / "libcudart.so").symlink_to(so.name)
            atomic_write_text(tmp / "bin" / "nvcc.profile", NVCC_PROFILE)
            reporter.info(f"CUDA {lock.version}: checking the assembled nvcc")
            found = nvcc_version(tmp / "bin" / "nvcc", env=environ)
            if found != lock.version:
                raise ToolchainError(
                    f"assembled nvcc reports {found}, the lock says {lock.version}",
                    where=f"toolchain lock for CUDA {lock.version}",
                    next="fix LOCKS in pinwheel/compile/toolchain/pins.py",
                )
            record = {
                "version": lock.version,
                "debs": {p.filename: p.sha256 for p in lock.debs},
                "wheels": {p.filename: p.sha256 for p in lock.wheels},
            }
            tmp.chmod(0o755)  # mkdtemp made it private; the toolkit is for every user
            atomic_write_text(tmp / MARKER, json.dumps(record, indent=2, sort_keys=True) + "\n")
        reporter.info(f"CUDA {lock.version}: ready at {final}")
        return final

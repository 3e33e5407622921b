"""The environment of every wheel build (engine and kernels): one place, recorded as set.

In: ``[build]``, the toolkit, the source's date, the caller's base environment.
Out: the full environment for the build process, and the part pinwheel set
(what provenance records).

:func:`declared_base` is the base of a kernel build: made only of declared values (a
fixed PATH of the toolkit, the locked build venv, the chosen host compiler and the
system directories; a HOME of pinwheel's; the host compiler the toolchain chose), so
nothing of the caller's PATH, PYTHONPATH, CFLAGS or tool folders reaches the build
unless ``[build] env`` declares it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pinwheel.compile.listing import python_path
from pinwheel.manifest.build import BuildConfig

# The system's own program directories: the only part of PATH that is not a declared tool.
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# Taken from the caller because the toolchain choice put them there (declared: [build] gcc,
# --substitute gcc=N, or CXX the user gave and provenance records as the host compiler).
FROM_CHOICE = ("CC", "CXX", "CUDAHOSTCXX")
# The compiler cache's own settings: where its server and storage are, never what compiles.
PASSED_PREFIXES = ("SCCACHE_",)


def declared_base(
    environ: Mapping[str, str], *, tool_dirs: tuple[str, ...], home: str
) -> dict[str, str]:
    """A build's base environment made only of declared values.

    PATH: ``tool_dirs`` (the locked venv's bin; the toolkit puts its own in front), the
    directories of the chosen host compilers, then :data:`SYSTEM_PATH`; HOME: ``home``
    (pinwheel's, under the cache); the host compiler the toolchain chose. Everything
    else of ``environ`` stays out; ``[build] env`` adds what a build really needs.
    """
    import shutil

    path = list(tool_dirs)
    base = {k: environ[k] for k in FROM_CHOICE if environ.get(k)}
    for key in FROM_CHOICE:
        value = base.get(key, "").split(" ")[0]
        if "/" in value:  # an absolute compiler: its folder is declared with it
            folder = os.path.dirname(value)
        else:
            found = shutil.which(value, path=environ.get("PATH")) if value else None
            folder = os.path.dirname(found) if found else ""
        if folder and folder not in path and folder not in SYSTEM_PATH:
            path.append(folder)
    base.update({k: v for k, v in environ.items() if k.startswith(PASSED_PREFIXES)})
    base["PATH"] = os.pathsep.join([*path, *SYSTEM_PATH])
    base["HOME"] = home
    return base


def build_env(
    config: BuildConfig,
    *,
    toolkit: Any,
    source_date_epoch: int,
    base: Mapping[str, str],
    version: str | None = None,
    cpu_count: int | None = None,
    listing_hook: str | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """(full environment, the part pinwheel set). ``[build] env`` wins over pinwheel's defaults.

    ``listing_hook``: :func:`pinwheel.compile.listing.install`'s directory, put first on
    ``PYTHONPATH`` (the build's Python processes list directories in name order); the
    ``PYTHONPATH`` of ``[build] env`` follows it (recorded), else the caller's (unrecorded).
    """
    set_env = {
        "TORCH_CUDA_ARCH_LIST": config.torch_arch_list,
        "CUDAARCHS": config.cmake_architectures,  # CMake's default CMAKE_CUDA_ARCHITECTURES
        "CMAKE_CUDA_ARCHITECTURES": config.cmake_architectures,
        "SOURCE_DATE_EPOCH": str(source_date_epoch),
        "MAX_JOBS": str(cpu_count or os.cpu_count() or 1),
        "NVCC_THREADS": "1",
        "PYTHONHASHSEED": "0",
        "TZ": "UTC",
        "LC_ALL": "C",
        # nvcc names host-stub temp files after its pid; the symbols that carry
        # them make setuptools-built .so files differ run to run. Strip them.
        "LDFLAGS": (base.get("LDFLAGS", "") + " -Wl,--strip-all").strip(),
    }
    if version is not None:
        set_env["SETUPTOOLS_SCM_PRETEND_VERSION"] = version
        set_env["VLLM_VERSION_OVERRIDE"] = version
    set_env.update(config.env)
    full = dict(base)
    if toolkit is not None:
        full = toolkit.env(full)
        set_env.update({k: full[k] for k in ("CUDA_HOME", "CUDACXX") if k in full})
    full.update(set_env)
    if listing_hook is not None:
        declared = {"PYTHONPATH": set_env["PYTHONPATH"]} if "PYTHONPATH" in set_env else {}
        set_env["PYTHONPATH"] = python_path(listing_hook, declared)
        full["PYTHONPATH"] = python_path(listing_hook, declared or base)
    return full, set_env

"""The environment of every wheel build (engine and kernels): one place, recorded as set.

In: ``[build]``, the toolkit, the source's date, the caller's base environment.
Out: the full environment for the build process, and the part pinwheel set
(what provenance records).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pinwheel.compile.listing import python_path
from pinwheel.manifest.build import BuildConfig


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

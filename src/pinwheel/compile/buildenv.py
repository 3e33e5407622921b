"""The environment of every wheel build (engine and kernels): one place, recorded as set.

In: ``[build]``, the toolkit, the source's date, the caller's base environment.
Out: the full environment for the build process, and the part pinwheel set
(what provenance records).

:func:`declared_base` is the base of a kernel build: made only of declared values (a
fixed PATH of the toolkit, the locked build venv, the chosen host compiler and the
system directories; a HOME of pinwheel's; the host compiler the toolchain chose), so
nothing of the caller's PATH, PYTHONPATH, CFLAGS or tool folders reaches the build
unless ``[build] env`` declares it. :func:`engine_base` is the same for the engine build
(the build Python's folder as its tool folder) plus :data:`ENGINE_PASS_THROUGH`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pinwheel import options
from pinwheel.compile.listing import python_path
from pinwheel.manifest.build import BuildConfig
from pinwheel.options import HostEnvironment

# The system's own program directories: the only part of PATH that is not a declared tool.
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# Taken from the caller because the toolchain choice put them there (declared: [build] gcc,
# --substitute gcc=N, or CXX the user gave and provenance records as the host compiler).
FROM_CHOICE = ("CC", "CXX", "CUDAHOSTCXX")
# The compiler cache's own settings: where its server and storage are, never what compiles.
PASSED_PREFIXES = ("SCCACHE_",)
# What the engine build takes from the caller besides declared_base's, and why: a build
# that [build] network lets reach the network goes through the caller's proxy and trusts
# the caller's certificates. None of them changes what compiles. Everything else of the
# caller's (CFLAGS, LDFLAGS, LD_LIBRARY_PATH, PYTHONPATH, VIRTUAL_ENV, TMPDIR, its PATH
# and HOME, any other name) stays out; ``[build] env`` declares what a build really needs.
ENGINE_PASS_THROUGH = (
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
)  # fmt: skip


def declared_base(
    host: HostEnvironment, *, tool_dirs: tuple[str, ...], home: str
) -> dict[str, str]:
    """A build's base environment made only of declared values.

    PATH: ``tool_dirs`` (the locked venv's bin; the toolkit puts its own in front), the
    directories of the chosen host compilers, then :data:`SYSTEM_PATH`; HOME: ``home``
    (pinwheel's, under the cache); the host compiler the toolchain chose. Everything
    else of ``host.child`` stays out; ``[build] env`` adds what a build really needs.
    """
    import shutil

    path = [d for d in dict.fromkeys(tool_dirs) if d and d not in SYSTEM_PATH]
    environ = host.child
    base = options.select(environ, FROM_CHOICE, keep_empty=False)
    for given in base.values():
        value = given.split(" ")[0]
        if "/" in value:  # an absolute compiler: its folder is declared with it
            folder = os.path.dirname(value)
        else:
            found = shutil.which(value, path=host.path) if value else None
            folder = os.path.dirname(found) if found else ""
        if folder and folder not in path and folder not in SYSTEM_PATH:
            path.append(folder)
    base.update({k: v for k, v in environ.items() if k.startswith(PASSED_PREFIXES)})
    base["PATH"] = os.pathsep.join([*path, *SYSTEM_PATH])
    base["HOME"] = home
    return base


def engine_base(host: HostEnvironment, *, python: str, home: str) -> dict[str, str]:
    """The engine build's base environment: :func:`declared_base` with the build Python's
    folder (its venv's ``bin``: cmake, ninja and the backend the build requirements
    installed) as the tool folder, plus :data:`ENGINE_PASS_THROUGH`. Nothing else of
    ``host.child`` reaches the build."""
    import shutil

    found = python if "/" in python else shutil.which(python, path=host.path) or ""
    # Not resolved: a venv's python is a link to its base interpreter, its tools are beside it.
    folder = os.path.dirname(os.path.abspath(found)) if found else ""
    base = declared_base(host, tool_dirs=(folder,), home=home)
    base.update(options.select(host.child, ENGINE_PASS_THROUGH, keep_empty=False))
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
        "LDFLAGS": (options.value(base, "LDFLAGS") + " -Wl,--strip-all").strip(),
    }
    if version is not None:
        set_env["SETUPTOOLS_SCM_PRETEND_VERSION"] = version
        set_env["VLLM_VERSION_OVERRIDE"] = version
    set_env.update(config.env)
    full = dict(base)
    if toolkit is not None:
        full = toolkit.env(full)
        set_env.update(options.select(full, ("CUDA_HOME", "CUDACXX")))
    full.update(set_env)
    if listing_hook is not None:
        declared = options.select(set_env, ("PYTHONPATH",))
        set_env["PYTHONPATH"] = python_path(listing_hook, declared)
        full["PYTHONPATH"] = python_path(listing_hook, declared or base)
    return full, set_env

"""One build path on every machine: compilers see the cache at :data:`CANONICAL_CACHE`.

Compilers write the paths they are given into what they produce (``__FILE__``
in asserts and error messages, nvcc's registration code, CMake's generated
files), so a wheel built from ``/home/a/.cache/pinwheel`` differed from one
built from ``/data/ci/cache``. Every compiling subprocess therefore sees the
cache at one fixed path, whatever the cache location, user, host or checkout:

- ``mount-namespace`` (preferred): the command runs in a private user + mount
  namespace (``unshare -rm``) where a tmpfs covers :data:`CANONICAL_ROOT` and the
  real cache is bind-mounted at :data:`CANONICAL_CACHE`. Nothing outside sees
  the mount; every path that reaches the bytes is the canonical one because no
  other path exists for the build.
- ``prefix-map`` (fallback, where user namespaces are refused): the build runs
  at the real path with ``-ffile-prefix-map`` for the host compilers (CFLAGS,
  CXXFLAGS) and for nvcc's host and device preprocessing (``-Xcompiler`` through
  CUDAFLAGS and ``NVCC_APPEND_FLAGS``): ``__FILE__`` and debug paths are
  rewritten, but paths a tool embeds by itself are not; provenance says which
  method built a wheel. ``PINWHEEL_CANONICAL=prefix-map`` in the environment
  chooses it even where the namespace works (to compare the two).

In: the cache and the caller's environment. Out: a :class:`Canonical` that
translates paths, wraps commands and records ``{"path", "method"}``.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pinwheel import runner

CANONICAL_ROOT = Path("/tmp/pinwheel-canonical")
CANONICAL_CACHE = CANONICAL_ROOT / "cache"

NAMESPACE = "mount-namespace"
PREFIX_MAP = "prefix-map"

# Runs inside the new namespace (as its root): cover the root with a tmpfs, bind the
# cache under it, enter the working directory, exec the build. Self-contained: it runs
# with -I (no PYTHONPATH, no site), so nothing of the caller's Python leaks in.
_ENTER = """
import os, subprocess, sys
root, cache, real, cwd = sys.argv[1:5]
cmd = sys.argv[6:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "--", "pinwheel", root], check=True)
os.makedirs(cache)
subprocess.run(["mount", "--bind", "--", real, cache], check=True)
os.chdir(cwd)
os.execvp(cmd[0], cmd)
"""


@dataclass(frozen=True)
class Canonical:
    """How builds of ``real`` (the cache) see it at :data:`CANONICAL_CACHE`."""

    real: Path  # the cache, absolute and resolved
    method: str  # NAMESPACE | PREFIX_MAP
    unshare: str | None = None  # the unshare binary (NAMESPACE)
    why: str | None = None  # why the fallback was taken

    @property
    def path(self) -> Path:
        return CANONICAL_CACHE

    def record(self) -> dict[str, str]:
        """For provenance: the canonical path and the method, no machine path."""
        return {"path": str(CANONICAL_CACHE), "method": self.method}

    def to_build(self, value: str | os.PathLike[str]) -> str:
        """``value`` as the build must spell it: the canonical path under the namespace,
        the real one under prefix maps (the maps rewrite it in the outputs)."""
        text = os.fspath(value)
        return self.recorded(text) if self.method == NAMESPACE else text

    def recorded(self, value: str) -> str:
        """``value`` as provenance records it: the canonical spelling whatever the method
        (what the outputs carry), never this machine's cache path."""
        real = str(self.real)
        if value == real or value.startswith(real + "/"):
            return str(CANONICAL_CACHE) + value[len(real) :]
        return value.replace(real + "/", str(CANONICAL_CACHE) + "/")

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` for the build: paths translated; prefix maps added for the fallback."""
        out = {k: self.to_build(v) for k, v in env.items()}
        if self.method == PREFIX_MAP:
            out.update(prefix_map_env(out, self.real, CANONICAL_CACHE))
        return out

    def wrap(
        self, cmd: Sequence[str], cwd: str | os.PathLike[str], *, network: bool = True
    ) -> tuple[list[str], Path]:
        """(command, directory to start it in). ``network=False`` adds a network namespace
        (the build's fence against undeclared downloads) to the same ``unshare``."""
        if self.method != NAMESPACE:
            if network:
                return list(cmd), Path(cwd)
            raise ValueError("no network namespace without the mount namespace: use wrapper()")
        flags = "-rm" if network else "-rmn"
        assert self.unshare is not None
        enter = [self.unshare, flags, "--", sys.executable, "-I", "-c", _ENTER]
        args = [str(CANONICAL_ROOT), str(CANONICAL_CACHE), str(self.real), self.to_build(cwd)]
        return [*enter, *args, "--", *(self.to_build(c) for c in cmd)], self.real


def prefix_map_env(env: Mapping[str, str], real: Path, canonical: Path) -> dict[str, str]:
    """CFLAGS, CXXFLAGS, CUDAFLAGS and NVCC_APPEND_FLAGS with ``real`` mapped to ``canonical``."""
    mapping = f"-ffile-prefix-map={real}={canonical}"

    def add(key: str, flag: str) -> str:
        return (env.get(key, "") + " " + flag).strip()

    return {
        "CFLAGS": add("CFLAGS", mapping),
        "CXXFLAGS": add("CXXFLAGS", mapping),
        "CUDAFLAGS": add("CUDAFLAGS", f"-Xcompiler={mapping}"),
        "NVCC_APPEND_FLAGS": add("NVCC_APPEND_FLAGS", f"-Xcompiler={mapping}"),
    }


def choose(cache: Path, environ: Mapping[str, str], *, allow_namespace: bool = True) -> Canonical:
    """The namespace where this machine allows one, else prefix maps (saying why)."""
    real = Path(cache).absolute().resolve()
    if not allow_namespace or environ.get("PINWHEEL_CANONICAL") == PREFIX_MAP:
        return Canonical(real, PREFIX_MAP, why="mount namespace turned off")
    if real == CANONICAL_ROOT or CANONICAL_ROOT in real.parents:
        return Canonical(real, PREFIX_MAP, why=f"the cache is under {CANONICAL_ROOT}")
    why = _namespace_refused(environ.get("PATH", os.defpath))
    if why:
        return Canonical(real, PREFIX_MAP, why=why)
    return Canonical(real, NAMESPACE, unshare=shutil.which("unshare", path=environ.get("PATH")))


@functools.lru_cache(maxsize=4)
def _namespace_refused(path: str) -> str | None:
    """Why ``unshare -rm`` + a tmpfs at :data:`CANONICAL_ROOT` cannot work here, or None."""
    unshare = shutil.which("unshare", path=path)
    if not unshare or not shutil.which("mount", path=path):
        return "no unshare/mount (util-linux) on PATH"
    try:
        CANONICAL_ROOT.mkdir(mode=0o755, exist_ok=True)
    except OSError as exc:
        return f"cannot create {CANONICAL_ROOT}: {exc.strerror}"
    if not CANONICAL_ROOT.is_dir():
        return f"{CANONICAL_ROOT} is not a directory"
    with tempfile.TemporaryDirectory(prefix="pinwheel-canonical-probe-") as tmp:
        probe = Canonical(Path(tmp).resolve(), NAMESPACE, unshare=unshare)
        cmd, cwd = probe.wrap(["true"], tmp)
        out = runner.run(
            runner.Command(
                tuple(cmd),
                what="unshare -rm probe",
                cwd=cwd,
                env={"PATH": path},
                timeout=60,
                check=False,
            )  # fmt: skip
        )
    if out.returncode != 0:
        err = out.stderr.decode(errors="replace").strip().splitlines()
        tail = (err or [f"exit {out.returncode}"])[-1]
        return f"unshare -rm refused here ({tail[:200]})"
    return None


__all__ = [
    "CANONICAL_CACHE",
    "CANONICAL_ROOT",
    "NAMESPACE",
    "PREFIX_MAP",
    "Canonical",
    "choose",
    "prefix_map_env",
]

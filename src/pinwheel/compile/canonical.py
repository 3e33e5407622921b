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

Process ids, the same way: nvcc before 12.9 names a unit's internal-linkage entities
after its front end's process id (cudafe++ appends its ``getpid()`` to
``_INTERNAL_<hash>_<len>_<file>_cu_<hash>``; the names reach the host side's
registration strings, the dynamic string table and the cubin). Under the namespace,
:meth:`Canonical.with_toolkit` names the toolkit's front end and the namespace covers it
with a launcher that runs it as process 1 of a PID namespace of its own
(``unshare --pid --fork``): every run of it, by nvcc or by the compiler cache's server,
concurrent or not, on any machine, has the same pid. Under prefix maps (no user
namespace) the machine's pids stay and :meth:`Canonical.record` says so.

In: the cache and the caller's environment. Out: a :class:`Canonical` that
translates paths, wraps commands and records ``{"path", "method"}``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pinwheel import runner
from pinwheel.compile import workers
from pinwheel.errors import UsageError
from pinwheel.options import HostEnvironment

CANONICAL_ROOT = Path("/tmp/pinwheel-canonical")
CANONICAL_CACHE = CANONICAL_ROOT / "cache"
CANONICAL_TOOLKIT = CANONICAL_ROOT / "toolkit"  # a CUDA toolkit installed outside the cache

NAMESPACE = "mount-namespace"
PREFIX_MAP = "prefix-map"
# The toolkit programs whose process id reaches the bytes (relative to the toolkit root):
# cudafe++ writes its getpid() into internal-linkage names (nvcc 12.0-12.8; 12.9 and later
# use a fixed seed, and the launcher changes nothing there).
FRONT_ENDS = ("bin/cudafe++",)
FIXED_PID = "1 (each front end in a PID namespace of its own)"


@dataclass(frozen=True)
class Canonical:
    """How builds of ``real`` (the cache) see it at :data:`CANONICAL_CACHE`, and a toolkit
    installed elsewhere at :data:`CANONICAL_TOOLKIT`."""

    real: Path  # the cache, absolute and resolved
    method: str  # NAMESPACE | PREFIX_MAP
    unshare: str | None = None  # the unshare binary (NAMESPACE)
    why: str | None = None  # why the fallback was taken
    toolkit: Path | None = None  # a toolkit outside the cache, resolved
    toolkit_spellings: tuple[str, ...] = ()  # how the build may name it (as given, resolved)
    # header views (pinwheel.compile.headerview): (fixed-time copy, the directory it covers as
    # the build names it), bound inside the namespace; and how many directories outside
    # pinwheel's making the build reads (their times are the machine's without a namespace)
    views: tuple[tuple[str, str], ...] = ()
    foreign_headers: int = 0
    # (directory, canonical name) the compilers write instead, whatever the method: the build
    # Python's include directory, a machine torch's headers (headerview.prefix_maps)
    outside: tuple[tuple[str, str], ...] = ()
    # the toolkit's front ends (FRONT_ENDS) as the build names them: run at a fixed pid (NAMESPACE)
    front_ends: tuple[str, ...] = ()
    cuda: bool = False  # a toolkit was given: the record says how its front ends' pid is set
    pid_refused: str | None = None  # why the namespace cannot make a PID namespace, or None

    @property
    def path(self) -> Path:
        return CANONICAL_CACHE

    def with_toolkit(self, root: Path | None) -> Canonical:
        """Also move the toolkit when it lives outside the cache (CUDA_HOME, /usr/local/cuda):
        its headers' paths reach the bytes like the sources' do."""
        if root is None:
            return self
        given = Path(root).absolute()
        resolved = given.resolve()
        moved = self
        if not any(resolved == d or d in resolved.parents for d in (self.real, CANONICAL_ROOT)):
            moved = dataclasses.replace(
                self, toolkit=resolved, toolkit_spellings=tuple(sorted({str(given), str(resolved)}))
            )
        return moved._with_front_ends(resolved)

    def _with_front_ends(self, toolkit: Path) -> Canonical:
        """Name the toolkit's front ends (:data:`FRONT_ENDS`) for :meth:`wrap` to run at a
        fixed pid: resolved (a toolkit's ``bin`` may hold links), as the build reaches them."""
        fronts: list[str] = []
        if self.method == NAMESPACE and self.pid_refused is None:
            for rel in FRONT_ENDS:
                found = (toolkit / rel).resolve()
                if found.is_file() and os.access(found, os.X_OK):
                    # the build reaches it at its canonical path; covered at the real one too
                    spellings = (self.to_build(self.to_build_path(found)), str(found))
                    fronts.extend(dict.fromkeys(spellings))
        return dataclasses.replace(self, front_ends=tuple(fronts), cuda=True)

    def with_views(self, cache: Path, dirs: Sequence[Path]) -> Canonical:
        """Also give the header directories ``dirs`` (outside pinwheel's making: a system
        toolkit's, a given Python's torch) one fixed mtime, through views in the namespace;
        under prefix maps they keep the machine's times and :meth:`record` says so."""
        from pinwheel.compile import headerview  # workspace imports stay out of plain path use

        foreign = headerview.outside(dirs, self.real)
        if not foreign:
            return self
        if self.method != NAMESPACE:
            return dataclasses.replace(self, foreign_headers=len(foreign))
        views = []
        for d in foreign:
            view = headerview.make(d, self.real)
            views.append((str(view.copy), self.to_build_path(d)))
        return dataclasses.replace(self, views=tuple(views), foreign_headers=len(foreign))

    def with_outside(self, pairs: Sequence[tuple[str, str]]) -> Canonical:
        """Also give ``pairs`` (directory outside the cache, its canonical name) to the
        compilers as prefix maps, under either method: the namespace does not move them."""
        merged = dict(self.outside)
        merged.update((real, canon) for real, canon in pairs)
        return dataclasses.replace(
            self, outside=tuple(sorted(merged.items(), key=lambda p: (len(p[0]), p[0])))
        )

    def to_build_path(self, path: Path) -> str:
        """A resolved directory as the build reaches it: under the toolkit's canonical
        place when it is the toolkit's, else where it is."""
        if self.toolkit is not None and (path == self.toolkit or self.toolkit in path.parents):
            return str(CANONICAL_TOOLKIT / path.relative_to(self.toolkit))
        return str(path)

    def maps(self) -> list[tuple[str, str]]:
        """(real spelling, canonical path), longest real first."""
        pairs = [(str(self.real), str(CANONICAL_CACHE))]
        pairs += [(s, str(CANONICAL_TOOLKIT)) for s in self.toolkit_spellings]
        return sorted(pairs, key=lambda p: -len(p[0]))

    def record(self) -> dict[str, str]:
        """For provenance: the canonical paths and the method, no machine path."""
        out = {"path": str(CANONICAL_CACHE), "method": self.method}
        if self.toolkit is not None:
            out["toolkit"] = str(CANONICAL_TOOLKIT)
        if self.cuda:  # nvcc writes the front end's pid into some units' internal names
            out["front_end_pid"] = (
                FIXED_PID if self.front_ends else "the machine's (no PID namespace)"
            )
        if self.foreign_headers:  # header directories pinwheel did not install
            fixed = len(self.views) == self.foreign_headers
            out["header_times"] = (
                f"fixed: {len(self.views)} directories outside the cache seen through views"
                if fixed
                else f"the machine's: {self.foreign_headers} directories outside the cache "
                "(no mount namespace for views)"
            )
        return out

    def to_build(self, value: str | os.PathLike[str]) -> str:
        """``value`` as the build must spell it: the canonical path under the namespace,
        the real one under prefix maps (the maps rewrite it in the outputs)."""
        text = os.fspath(value)
        return self.recorded(text) if self.method == NAMESPACE else text

    def recorded(self, value: str) -> str:
        """``value`` as provenance records it: the canonical spelling whatever the method
        (what the outputs carry), never this machine's cache or toolkit path."""
        for real, canon in self.maps():
            if value == real:
                return canon
            value = value.replace(real + "/", canon + "/")
        return value

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` for the build: paths translated; prefix maps added for the fallback."""
        out = {k: self.to_build(v) for k, v in env.items()}
        maps = [*self.maps(), *self.outside] if self.method == PREFIX_MAP else list(self.outside)
        if maps:  # gcc tries the last map first: the outside ones (more specific) go last
            out.update(prefix_map_env(out, maps))
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
        binds = [(str(self.real), str(CANONICAL_CACHE))]
        if self.toolkit is not None:
            binds.append((str(self.toolkit), str(CANONICAL_TOOLKIT)))
        # workers/enter_namespace.py, self-contained: it runs with -I (no PYTHONPATH, no
        # site), so nothing of the caller's Python leaks in
        script = workers.source("enter_namespace")
        enter = [self.unshare, flags, "--", sys.executable, "-I", "-c", script]
        args = [str(CANONICAL_ROOT), self.to_build(cwd), str(len(binds))]
        args += [part for pair in binds for part in pair]
        args += [str(len(self.views)), *(part for view in self.views for part in view)]
        args += [str(len(self.front_ends)), *self.front_ends]
        return [*enter, *args, "--", *(self.to_build(c) for c in cmd)], self.real


def prefix_map_env(env: Mapping[str, str], maps: Sequence[tuple[str, str]]) -> dict[str, str]:
    """CFLAGS, CXXFLAGS, CUDAFLAGS and NVCC_APPEND_FLAGS with each real prefix mapped to its
    canonical one (``-ffile-prefix-map``: ``__FILE__`` and debug paths; ``-Xcompiler`` for
    nvcc's host and device preprocessing).

    CFLAGS, CXXFLAGS and CUDAFLAGS are split into arguments the way a shell splits them
    (CMake puts them into command lines a shell runs; setuptools splits them with quotes
    honoured), so a path with a space or a quote is shell-quoted: it stays one argument.
    nvcc splits NVCC_APPEND_FLAGS at every blank, and an ``-Xcompiler`` value at every
    blank too, honouring only double quotes around the value
    (``-Xcompiler="-ffile-prefix-map=/my cache=..."``): a shell-quoted flag reached gcc
    cut at the space (``'-ffile-prefix-map=/tmp/my``) and every build from such a cache
    failed. A plain path is left as it was (the same flags, the same build identity)."""
    raw = [f"-ffile-prefix-map={real}={canon}" for real, canon in maps]
    flags = [shlex.quote(f) for f in raw]
    nvcc = [_nvcc_value("-Xcompiler", f) for f in raw]
    cuda = [shlex.quote(f) for f in nvcc]  # nvcc's own quotes inside, the shell's around

    def add(key: str, items: list[str]) -> str:
        return " ".join([env.get(key, ""), *items]).strip()

    return {
        "CFLAGS": add("CFLAGS", flags),
        "CXXFLAGS": add("CXXFLAGS", flags),
        "CUDAFLAGS": add("CUDAFLAGS", cuda),
        "NVCC_APPEND_FLAGS": add("NVCC_APPEND_FLAGS", nvcc),
    }


def _nvcc_value(option: str, value: str) -> str:
    """``option=value`` as one word of NVCC_APPEND_FLAGS: double-quoted when it holds a
    blank (nvcc's only quoting there; a value with a double quote in it cannot be said)."""
    if not any(c.isspace() for c in value) and '"' not in value:
        return f"{option}={value}"
    if '"' in value:
        raise UsageError(
            "a build path with a double quote in it cannot reach nvcc's host compiler "
            "(NVCC_APPEND_FLAGS has no way to say it)",
            where=value,
            next="build from a cache path without '\"' (--cache DIR)",
        )
    return f'{option}="{value}"'


def choose(cache: Path, host: HostEnvironment, *, allow_namespace: bool = True) -> Canonical:
    """The namespace where this machine allows one, else prefix maps (saying why)."""
    real = Path(cache).absolute().resolve()
    if not allow_namespace or host.canonical == PREFIX_MAP:
        return Canonical(real, PREFIX_MAP, why="mount namespace turned off")
    if real == CANONICAL_ROOT or CANONICAL_ROOT in real.parents:
        return Canonical(real, PREFIX_MAP, why=f"the cache is under {CANONICAL_ROOT}")
    path = host.path if host.path is not None else os.defpath
    why = _namespace_refused(path)
    if why:
        return Canonical(real, PREFIX_MAP, why=why)
    unshare = shutil.which("unshare", path=host.path)
    return Canonical(real, NAMESPACE, unshare=unshare, pid_refused=_pid_refused(path))


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


@functools.lru_cache(maxsize=4)
def _pid_refused(path: str) -> str | None:
    """Why a front end cannot run at pid 1 inside the namespace (a nested PID namespace
    refused, an ``unshare`` without ``--kill-child``), or None: probed with a stand-in."""
    unshare = shutil.which("unshare", path=path)
    with tempfile.TemporaryDirectory(prefix="pinwheel-canonical-probe-") as tmp:
        real = Path(tmp).resolve()
        front = real / "cudafe++"
        front.write_text('#!/bin/sh\ntest "$$" = 1\n')
        front.chmod(0o755)
        probe = Canonical(real, NAMESPACE, unshare=unshare)
        probe = dataclasses.replace(probe, front_ends=(probe.to_build(front), str(front)))
        cmd, cwd = probe.wrap(["sh", "-c", f'"{front}" && "$0"', probe.to_build(front)], tmp)
        out = runner.run(
            runner.Command(tuple(cmd), what="unshare --pid probe", cwd=cwd,
                           env={"PATH": path}, timeout=60, check=False)  # fmt: skip
        )
    if out.returncode != 0:
        err = out.stderr.decode(errors="replace").strip().splitlines()
        tail = (err or [f"exit {out.returncode}"])[-1]
        return f"no PID namespace inside the build's ({tail[:200]})"
    return None


__all__ = [
    "CANONICAL_CACHE",
    "CANONICAL_ROOT",
    "CANONICAL_TOOLKIT",
    "NAMESPACE",
    "PREFIX_MAP",
    "Canonical",
    "choose",
    "prefix_map_env",
]

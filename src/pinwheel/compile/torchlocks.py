"""The torch locks the repository's manifests pin (``[build.torch_lock]``), refreshed with uv.

``pinwheel lock --tools`` refreshes them beside the tool locks of
:mod:`pinwheel.compile.toollocks`. The manifests are the repository's own:
``manifest.toml`` at its root and ``recipes/*/manifest.toml`` (:data:`MANIFESTS`; the
examples under ``recipes/examples/`` are not among them), each one that has a
``[build.torch_lock]``.

A lock is resolved again from its manifest's values only: ``torch==[build] torch`` on uv's
standard input, ``--python-version [build] python``, the ``--python-platform`` the lock's
header names (else ``<machine>-manylinux_2_28`` from its file name,
``torch-<version>-cp<XY>-<machine>.txt``) and ``--index-url [build] torch_index`` when the
manifest sets one; each value is checked by :mod:`pinwheel.validate` before it is put in
uv's argv. uv runs in an empty staged folder with the caller's UV_/PIP_ settings left out, so
neither a path nor an index of this machine lands in the file; its header names
``pinwheel lock --tools`` and the uv command a person would type. The new lock must still pin
``[build] torch`` with hashes and fit ``[build] cuda`` and the arches (:func:`misfit`, what
:func:`pinwheel.compile.kernels.torch_lock` asks of it), else nothing is written. Then each
changed lock is written atomically and its manifest's ``[build.torch_lock] sha256``, and only
that value, rewritten (tomlkit: comments, layout, newlines and mode kept; atomic), so the
manifest still loads. ``check``: nothing is written.

In: :class:`TorchLockRequest`. Out: a :class:`TorchRefreshed` per lock.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from pinwheel import validate
from pinwheel.compile.buildvenv import BuildVenvError, parse_requirements
from pinwheel.compile.toollocks import COMMAND, LockError, pins_diff, run_uv, uv_environment
from pinwheel.fsutil import atomic_write_bytes
from pinwheel.manifest import load
from pinwheel.manifest.build import BuildConfig
from pinwheel.manifest.targets import lock_cuda, locked_torch_problems

# The repository's manifests, root first (globs relative to the repository root).
MANIFESTS = ("manifest.toml", "recipes/*/manifest.toml")
# default: the glibc floor every committed torch lock was resolved for (their headers say
# x86_64-manylinux_2_28), used only when a lock's header names no platform.
PLATFORM_TAIL = "manylinux_2_28"
_HEADER_PLATFORM = re.compile(r"--python-platform[ =](\S+)")
_FILE_MACHINE = re.compile(r"torch-[^/]+-cp[0-9]+-([a-z0-9_]+)\.txt")
LOCK_FILE = "torch-lock.txt"  # uv's output in the staged folder


@dataclass(frozen=True)
class TorchLockRequest:
    root: Path  # the repository (the checkout pinwheel runs from)
    uv: str  # the uv binary
    environ: Mapping[str, str]  # the caller's environment (its UV_/PIP_ settings are dropped)
    check: bool = False  # write nothing, only report
    exclude_newer: str | None = None  # a cooldown: no file uploaded after this (RFC 3339)


@dataclass(frozen=True)
class Misfit:
    """Why a torch lock cannot be the build's torch; ``fix`` None: write the lock again."""

    what: str
    fix: str | None


@dataclass(frozen=True)
class Resolution:
    """What one lock is resolved from: the manifest's values, each checked for uv's argv."""

    torch: str
    python: str
    platform: str
    index_url: str | None
    output: str  # the lock's path relative to the repository root (the header's -o)

    def argv(self, uv: str) -> tuple[str, ...]:
        index = ("--index-url", self.index_url) if self.index_url else ()
        # --no-python-downloads: without a local Python of [build] python uv would fetch one
        return (uv, "pip", "compile", "--quiet", "--no-python-downloads", "--generate-hashes",
                "--python-version", self.python, "--python-platform", self.platform, *index,
                "--no-emit-index-url", "--no-emit-find-links", "--output-file", LOCK_FILE,
                "-")  # fmt: skip

    @property
    def by_hand(self) -> str:
        """The uv command a person would type for this lock."""
        return by_hand(self.torch, self.python, self.platform, self.index_url, self.output)

    @property
    def header(self) -> str:
        """What the lock's header says made it (UV_CUSTOM_COMPILE_COMMAND)."""
        return f"{COMMAND}, or by hand: {self.by_hand}"


def by_hand(torch: str, python: str, platform: str, index_url: str | None, out: str) -> str:
    """``printf 'torch==V\\n' | uv pip compile ...``: the command that writes a torch lock."""
    index = f" --index-url {index_url}" if index_url else ""
    return (
        f"printf 'torch=={torch}\\n' | uv pip compile --generate-hashes "
        f"--python-version {python} --python-platform {platform}{index} "
        f"--no-emit-index-url --no-emit-find-links - -o {shlex.quote(out)}"
    )


@dataclass(frozen=True)
class TorchRefreshed:
    manifest: str  # relative to the repository root
    path: str  # the lock, relative to the repository root
    torch: str
    platform: str
    old_sha256: str
    new_sha256: str  # also the manifest's [build.torch_lock] sha256 after a write
    diff: str  # unified diff of the pins (empty: the same versions)

    @property
    def changed(self) -> bool:
        return self.old_sha256 != self.new_sha256


@dataclass(frozen=True)
class _Planned:
    manifest: Path
    manifest_rel: str
    lock: Path
    config: BuildConfig
    resolution: Resolution


def misfit(config: BuildConfig, text: str, name: str) -> Misfit | None:
    """Why the lock ``text`` (a file called ``name``) is not ``[build] torch`` for this build:
    no torch pinned by hash, another torch, or a torch whose CUDA (the runtime the lock pins)
    is of another major than ``[build] cuda`` or whose wheels lack an arch. None: it fits."""
    pins = parse_requirements(text, name)
    version, hashes = pins.get("torch", (None, ()))
    if version is None or version.split("+")[0] != str(config.torch).split("+")[0] or not hashes:
        return Misfit(
            f"[build] torch = {config.torch}, but {name} pins torch {version or 'not at all'}: "
            "torch is installed only by the lock's hash",
            None,
        )
    built = lock_cuda({n: pin[0] for n, pin in pins.items()})
    if built is None:
        return None
    problems = locked_torch_problems(config.cuda, config.arches, version, built, name)
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return Misfit(problems[0].what + more, problems[0].fix)


def manifests(root: Path) -> list[Path]:
    """The repository's manifests (:data:`MANIFESTS`), root first, then by path."""
    found: list[Path] = []
    for pattern in MANIFESTS:
        found += sorted(p for p in root.glob(pattern) if p.is_file())
    return found


def platform_of(text: str, name: str) -> str | None:
    """The platform a lock was resolved for: ``--python-platform`` in its header (the
    comment lines before the first requirement), else its file name's machine on
    :data:`PLATFORM_TAIL`; None when neither says."""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if m := _HEADER_PLATFORM.search(line):
            return m.group(1)
    if m := _FILE_MACHINE.fullmatch(name):
        return f"{m.group(1)}-{PLATFORM_TAIL}"
    return None


def _checked(value: object, problem: str | None, key: str, where: str) -> str:
    if problem is not None:
        raise LockError(
            f"{key} = {value!r} cannot be given to uv: {problem}",
            where=where,
            next=f"fix {key} in {where.split(' ')[0]}, then run `pinwheel lock --tools` again",
        )
    assert isinstance(value, str)
    return value


def _plan(root: Path, path: Path) -> _Planned | None:
    real_root = root.resolve()
    rel = path.relative_to(root).as_posix()
    if not path.resolve().is_relative_to(real_root):
        raise LockError(
            f"{rel} resolves outside the repository: `lock --tools` rewrites the repository's "
            "own manifests only",
            where=rel,
            next=f"replace the link {rel} by the manifest itself",
        )
    build = load(path).build
    if build is None or build.torch_lock is None:
        return None
    lock = build.torch_lock.path  # resolved inside the manifest's folder when it loaded
    if not lock.is_relative_to(real_root):
        raise LockError(
            f"[build.torch_lock] of {rel} resolves outside the repository",
            where=f"{rel} [build.torch_lock] path",
            next="keep the lock in the manifest's folder of the repository",
        )
    out = lock.relative_to(real_root).as_posix()
    where = f"{rel} [build]"
    if build.torch is None:
        raise LockError(
            f"{rel} pins a torch lock but no [build] torch to resolve it for",
            where=where,
            next=f"set [build] torch in {rel}, then run `pinwheel lock --tools` again",
        )
    text = lock.read_text(encoding="utf-8")
    platform = platform_of(text, lock.name)
    if platform is None:
        raise LockError(
            f"{out} names no platform to resolve for: no --python-platform in its header and "
            "no machine in its name",
            where=out,
            next="name it torch-<version>-cp<XY>-<machine>.txt (x86_64), then run "
            "`pinwheel lock --tools` again",
        )
    index = build.torch_index
    if index is not None:
        try:
            validate.https_url(index)
        except ValueError as exc:
            _checked(index, str(exc), "[build] torch_index", where)
    resolution = Resolution(
        torch=_checked(build.torch, validate.version_problem(build.torch), "[build] torch", where),
        python=_checked(
            build.python, validate.python_minor_problem(build.python), "[build] python", where
        ),
        platform=_checked(
            platform, validate.python_platform_problem(platform), "--python-platform",
            f"{out} (header)",
        ),
        index_url=index,
        output=_checked(out, validate.rel_path_problem(out), "[build.torch_lock] path", where),
    )  # fmt: skip
    return _Planned(path, rel, lock, build, resolution)


def _resolve(
    plan: _Planned, stage: Path, uv: str, environ: Mapping[str, str], exclude_newer: str | None
) -> bytes:
    r = plan.resolution
    env = uv_environment(environ, r.header, exclude_newer)
    run_uv(r.argv(uv), stage, env, stdin=f"torch=={r.torch}\n".encode())
    new = (stage / LOCK_FILE).read_bytes()
    where = f"{r.output} ({plan.manifest_rel} [build.torch_lock])"
    try:
        bad = misfit(plan.config, new.decode("utf-8"), plan.lock.name)
    except (BuildVenvError, UnicodeDecodeError) as exc:
        raise LockError(
            f"uv wrote a torch lock pinwheel cannot read: {exc}", where=where,
            next="run `pinwheel lock --tools` again; nothing was written",
        ) from None  # fmt: skip
    if bad is not None:
        raise LockError(
            f"refreshed, {bad.what}; nothing was written",
            where=where,
            next=bad.fix or f"fix [build] torch/cuda/torch_index in {plan.manifest_rel}",
        )
    return new


def with_sha256(text: str, sha256: str, where: str) -> str:
    """The manifest ``text`` with ``[build.torch_lock] sha256`` set to ``sha256``: that value
    alone changes (tomlkit keeps comments and layout; checked by reading both back)."""
    doc = tomlkit.parse(text)
    doc["build"]["torch_lock"]["sha256"] = sha256
    new = tomlkit.dumps(doc)
    before: Any = tomllib.loads(text)
    after: Any = tomllib.loads(new)
    before["build"]["torch_lock"]["sha256"] = sha256
    if before != after:  # never expected: tomlkit changed something else
        raise LockError(
            "rewriting [build.torch_lock] sha256 would change more than that value",
            where=where,
            next="set [build.torch_lock] sha256 by hand to the lock's `sha256sum`",
        )
    return new


def refresh(request: TorchLockRequest) -> tuple[TorchRefreshed, ...]:
    """Resolve every manifest's torch lock again; write the changed ones and their manifests'
    sha256 (unless ``check``) only when every lock resolved and fits."""
    root = request.root
    plans = [p for m in manifests(root) if (p := _plan(root, m)) is not None]
    resolved: list[tuple[_Planned, bytes]] = []
    with tempfile.TemporaryDirectory(prefix="pinwheel-torch-lock-") as tmp:
        for n, plan in enumerate(plans):
            stage = Path(tmp) / str(n)  # empty: uv sees no file of the repository
            stage.mkdir()
            resolved.append((plan, _resolve(plan, stage, request.uv, request.environ,
                                            request.exclude_newer)))  # fmt: skip
    from pinwheel.source.lock import ManifestFile  # here: it brings libgit2 in

    done: list[TorchRefreshed] = []
    writes: list[tuple[_Planned, bytes, bytes, ManifestFile, str]] = []
    for plan, new in resolved:
        old = plan.lock.read_bytes()
        r = plan.resolution
        item = TorchRefreshed(
            plan.manifest_rel, r.output, r.torch, r.platform,
            hashlib.sha256(old).hexdigest(), hashlib.sha256(new).hexdigest(),
            pins_diff(old.decode("utf-8"), new.decode("utf-8"), r.output),
        )  # fmt: skip
        done.append(item)
        if item.changed:
            stored = ManifestFile.read(plan.manifest)
            text = with_sha256(stored.text, item.new_sha256, plan.manifest_rel)
            writes.append((plan, old, new, stored, text))
    if not request.check:
        for plan, old, new, stored, text in writes:
            mode = plan.lock.stat().st_mode & 0o7777
            atomic_write_bytes(plan.lock, new, mode=mode)
            try:
                stored.write(text)
            except BaseException:
                atomic_write_bytes(plan.lock, old, mode=mode)  # the manifest still loads
                raise
            load(plan.manifest)  # loads again: its sha256 is the new lock's
    return tuple(done)

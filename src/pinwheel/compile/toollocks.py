"""The hashed locks under ``locks/``: every Python environment pinwheel and its builds use.

Each lock is a ``pip --require-hashes`` requirements file written by
``uv pip compile --generate-hashes --universal`` (markers for every supported
Python, no index URL, no machine path), committed to the repository:

- pinwheel's own environments (its dependencies, the extras a tool uses and the
  developers' dependency groups, PEP 735):
  ``replay`` (tools/replay), ``tests``, ``kernels``, ``lint``, ``qualify``,
  ``release``; each also holds pinwheel's build backend (``[build-system]``),
  so ``pip install --no-deps --no-build-isolation -e .`` needs nothing else;
- ``nox`` (.ci/run and the README's test command);
- the builds' own tools: ``torch-build`` (what a torch CUDAExtension's setup.py
  imports beside torch) and ``cmake-build`` (the in-tree CMake kernels'
  scikit-build-core, cmake, ninja).

``pinwheel lock --tools`` (and ``nox -s lock``) regenerates them all with
:func:`refresh` and shows the diff (and, with :mod:`pinwheel.compile.torchlocks`, the
torch locks the repository's manifests pin). In: the repository root and a uv binary.
Out: :class:`Refreshed` per lock (old and new digest, the unified diff).
"""

from __future__ import annotations

import datetime
import difflib
import hashlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pinwheel import runner
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_write_text

LOCK_DIR = "locks"
# The oldest Python pinwheel supports (pyproject's requires-python); --universal adds
# markers for every newer one.
PYTHON_FLOOR = "3.11"
# What the header of every lock says made it (never a path of the machine that ran uv).
COMMAND = "pinwheel lock --tools"


class LockError(PinwheelError):
    """A lock could not be read or regenerated."""


@dataclass(frozen=True)
class LockSpec:
    """One lock: pinwheel with ``extras`` and dependency ``groups`` (PEP 735: the
    developers' tools, not published) (``project``), or the ``.in`` file beside it."""

    name: str
    extras: tuple[str, ...] = ()
    project: bool = False  # pinwheel's own dependencies (pyproject.toml) plus its backend
    uses: str = ""  # who installs it
    groups: tuple[str, ...] = ()  # [dependency-groups] of pyproject.toml

    @property
    def filename(self) -> str:
        return f"{self.name}.txt"


LOCKS: tuple[LockSpec, ...] = (
    LockSpec("replay", ("kernels", "build", "install", "sigstore"), True, "tools/replay (.venv)"),
    LockSpec("tests", ("build", "sigstore"), True, "nox: tests, bootstrap, upstream, lock",
             ("test",)),
    LockSpec("kernels", ("kernels", "build"), True, "nox: kernels, flash-attn", ("test",)),
    LockSpec("lint", (), True, "nox: lint", ("lint",)),
    LockSpec("qualify", ("qualify",), True, "nox: qualify-cpu", ("test",)),
    LockSpec("release", ("release",), True, "pinwheel release (publishing)"),
    LockSpec("nox", (), False, ".ci/run and the README's test command"),
    LockSpec("torch-build", (), False, "torch-extension kernel builds (compile.kernels)"),
    LockSpec("cmake-build", (), False, "in-tree CMake kernel builds (compile.kernels)"),
)
# pinwheel with every extra, resolved jointly: the constraint every pinwheel lock is
# resolved against, so they all hold the same version of a shared package.
JOINT = LockSpec("all", ("install", "kernels", "build", "qualify", "release", "sigstore"),
                 True, "the constraint of the other pinwheel locks", ("test", "lint"))  # fmt: skip
BUILD_SYSTEM_IN = "build-system.in"  # pinwheel's own [build-system] requires, locked


def by_name(name: str) -> LockSpec:
    for spec in (*LOCKS, JOINT):
        if spec.name == name:
            return spec
    raise LockError(
        f"no lock called {name!r}",
        where=LOCK_DIR,
        next="one of: " + ", ".join(s.name for s in LOCKS),
    )


def repo_root() -> Path | None:
    """The checkout pinwheel runs from (``src/pinwheel`` two levels down), or None for an
    installed copy without ``locks/``."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / LOCK_DIR).is_dir() and (root / "pyproject.toml").is_file() else None


def lock_path(name: str, root: Path | None = None) -> Path:
    """The committed lock file called ``name``; an error naming the fix when it is missing."""
    spec = by_name(name)
    base = root or repo_root()
    path = (base / LOCK_DIR / spec.filename) if base is not None else None
    if path is None or not path.is_file():
        raise LockError(
            f"the lock {spec.filename} is not here (used by {spec.uses})",
            where=str(path) if path else f"{LOCK_DIR}/{spec.filename}",
            next="run pinwheel from its checkout (tools/replay), or `pinwheel lock --tools`",
        )
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class Refreshed:
    name: str
    path: str  # relative to the repository root
    old_sha256: str | None
    new_sha256: str
    diff: str  # unified diff of the pins (empty: unchanged)

    @property
    def changed(self) -> bool:
        return self.old_sha256 != self.new_sha256


def _compile_cmd(uv: str, spec: LockSpec, out: Path, constraints: Path | None) -> list[str]:
    # --no-python-downloads: uv never fetches an interpreter (the lock needs none of its own)
    cmd = [uv, "pip", "compile", "--quiet", "--no-python-downloads", "--generate-hashes",
           "--universal", "--python-version", PYTHON_FLOOR, "--no-emit-index-url",
           "--no-emit-find-links", "--output-file", str(out)]  # fmt: skip
    if spec.project:
        cmd += ["pyproject.toml", f"{LOCK_DIR}/{BUILD_SYSTEM_IN}"]
        for extra in spec.extras:
            cmd += ["--extra", extra]
        for group in spec.groups:
            cmd += ["--group", f"pyproject.toml:{group}"]
    else:
        cmd += [f"{LOCK_DIR}/{spec.name}.in"]
    if constraints is not None:
        cmd += ["--constraint", str(constraints)]
    return cmd


def uv_environment(
    environ: Mapping[str, str], command: str = COMMAND, exclude_newer: str | None = None
) -> dict[str, str]:
    """uv's environment: the caller's minus every UV_/PIP_ setting (an extra index or a
    find-links folder of this machine must not decide the pins), plus the header command
    (what the lock's header says made it) and, for a cooldown, the upload time after which
    uv takes no file (``UV_EXCLUDE_NEWER``, from :func:`cooldown_cutoff`: not in the
    header, so a cooldown alone changes no lock)."""
    env = {k: v for k, v in environ.items() if not k.startswith(("UV_", "PIP_"))}
    env["UV_CUSTOM_COMPILE_COMMAND"] = command
    env["UV_NO_CONFIG"] = "1"
    if exclude_newer is not None:
        env["UV_EXCLUDE_NEWER"] = exclude_newer
    return env


# The longest cooldown `lock --tools --cooldown` takes (a year: a typo, not a policy).
MAX_COOLDOWN_DAYS = 366


def cooldown_cutoff(days: int, now: datetime.datetime | None = None) -> str | None:
    """The RFC 3339 UTC time ``days`` days before ``now``: files uploaded later are not
    taken (a release is locked only once it is that old). None for 0 days (no cooldown)."""
    if not 0 <= days <= MAX_COOLDOWN_DAYS:
        raise LockError(
            f"a cooldown of {days} days: expected 0 to {MAX_COOLDOWN_DAYS}",
            where="lock --tools --cooldown",
            next="pass a number of days, e.g. `pinwheel lock --tools --cooldown 7`",
        )
    if days == 0:
        return None
    now = now or datetime.datetime.now(datetime.UTC)
    return (now - datetime.timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def refresh(
    root: Path,
    uv: str,
    environ: Mapping[str, str],
    *,
    names: Sequence[str] = (),
    check: bool = False,
    exclude_newer: str | None = None,
) -> list[Refreshed]:
    """Regenerate the locks (all, or ``names``) from pyproject.toml and the ``.in`` files.

    pinwheel's own locks are resolved against ``locks/all.txt`` (pinwheel with every extra,
    regenerated first), so every environment holds the same version of a shared package.
    ``check``: write nothing, only report what would change. ``exclude_newer``: no file
    uploaded after it is taken (:func:`cooldown_cutoff`).
    """
    specs = [by_name(n) for n in names] if names else list(LOCKS)
    env = uv_environment(environ, exclude_newer=exclude_newer)
    done: list[Refreshed] = []
    with tempfile.TemporaryDirectory(prefix="pinwheel-lock-") as tmp:
        # uv runs in a copy of the inputs and names them relatively: the locks' comments
        # ("# via -c locks/all.txt") then hold no path of this machine.
        stage = Path(tmp)
        (stage / LOCK_DIR).mkdir()
        for name in ("pyproject.toml", "README.md"):
            if (root / name).is_file():
                (stage / name).write_bytes((root / name).read_bytes())
        for src in (root / LOCK_DIR).glob("*.in"):
            (stage / LOCK_DIR / src.name).write_bytes(src.read_bytes())
        joint = Path(LOCK_DIR) / JOINT.filename
        run_uv(_compile_cmd(uv, JOINT, joint, None), stage, env)
        for spec in (JOINT, *specs):
            out = Path(LOCK_DIR) / spec.filename
            if spec is not JOINT:
                run_uv(_compile_cmd(uv, spec, out, joint if spec.project else None), stage, env)
            new = (stage / out).read_text()
            target = root / out
            old = target.read_text() if target.is_file() else None
            diff = pins_diff(old, new, str(out))
            if not check and new != old:
                atomic_write_text(target, new)
            done.append(
                Refreshed(
                    spec.name, str(out),
                    hashlib.sha256(old.encode()).hexdigest() if old is not None else None,
                    hashlib.sha256(new.encode()).hexdigest(), diff,
                )
            )  # fmt: skip
    return done


def pins_diff(old: str | None, new: str, path: str) -> str:
    """The unified diff of two locks' pins (``path`` relative to the repository root)."""
    return "".join(
        difflib.unified_diff(_pins(old or ""), _pins(new), f"a/{path}", f"b/{path}", n=0)
    )


def _pins(text: str) -> list[str]:
    """The ``name==version`` lines of a lock (hash lines and comments left out of the diff)."""
    lines = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].split("--hash", 1)[0].strip()
        if line:
            lines.append(line + "\n")
    return lines


def run_uv(
    cmd: Sequence[str], root: Path, env: Mapping[str, str], *, stdin: bytes | None = None
) -> None:
    """``uv pip compile`` in ``root`` (the staged folder), its failure a :class:`LockError`."""
    runner.run(
        runner.Command(
            tuple(cmd), what="uv pip compile", cwd=root, env=env, error=LockError, input=stdin,
            where=" ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd[:4])),
            next="check the network (uv asks the package index), then run it again",
        )
    )  # fmt: skip

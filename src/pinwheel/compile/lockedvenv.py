"""A kernel build's Python environment, made from a hashed lock and listed package by package.

The builds' own tools (a torch extension's setuptools, wheel, ninja, numpy...;
the CMake kernels' scikit-build-core, cmake, ninja) are written into the
wheels (``Generator: setuptools (84.2.1)``, ninja's and CMake's choices), so
they are inputs like the sources. They come from a committed lock
(:mod:`pinwheel.compile.toollocks`), installed ``--require-hashes --no-deps
--only-binary=:all:`` into a venv of their own that has no pip, no setuptools
of ``ensurepip`` and nothing else:

- keyed by the base interpreter (resolved path and full version), the lock's
  sha256 and the machine directories it overlays, under ``<cache>/venvs/``;
- ``overlay``: where the build must use a machine's preinstalled torch (a GPU
  box's Python, ``PINWHEEL_TORCH_PYTHON``), that Python's package directories are
  appended to the venv's ``sys.path`` by a ``.pth`` file, *after* the venv's own
  site-packages: torch and its dependencies come from the machine, every locked
  package from the lock, and the machine's setuptools/wheel/ninja never reach
  the build (unlike ``--system-site-packages``, this also works when the given
  Python is itself a venv or a conda environment);
- :func:`listing` asks the venv's Python (``-I -S``: no ``.pth`` or ``sitecustomize``
  runs) what it imports, in the order its path would have:
  each distribution's name, version, where it is (``lock`` or ``machine``) and
  the sha256 of its RECORD (the installed files and their hashes, less the
  lines an installer writes for its own machine: scripts outside site-packages,
  INSTALLER, REQUESTED, direct_url.json, RECORD itself); :func:`differences`
  compares it with the lock, before anything compiles, and :func:`inventory` holds
  the venv's own files to their RECORDs (each file's sha256) and refuses a ``.pth``
  or ``sitecustomize``/``usercustomize`` no locked package installed; a venv whose
  every entry's ``lstat`` is what a signed memo of the last passing check recorded is
  not hashed again (:mod:`pinwheel.compile.venvmemo`).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from pinwheel import cachelayout, confine, locking, runner, validate
from pinwheel.compile import derivation, pipwatch, venvmemo, workers, workspace
from pinwheel.compile.buildvenv import parse_requirements
from pinwheel.compile.phases import Note
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_write_text, remove_tree
from pinwheel.progress import SILENT, Reporter

READY = ".pinwheel-locked-venv.json"
OVERLAY_PTH = "zz-pinwheel-machine.pth"  # last of the .pth files: the machine's dirs go last


class LockedVenvError(PinwheelError):
    """A locked build environment could not be made, or differs from its lock."""


@dataclass(frozen=True)
class LockedVenvRequest:
    lock: Path  # a --require-hashes requirements file (locks/*.txt)
    lock_name: str  # "locks/torch-build.txt": how provenance names it
    interpreter: str  # the Python the venv is made from (a venv's python: its base is used)
    cache: Path
    environ: Mapping[str, str]
    kind: str  # folder prefix: "cmake-build", "torch-build"
    overlay_from: str | None = None  # a machine Python whose packages follow the venv's own
    wheelhouse: Path | None = None  # offline: the locked wheels from this folder, no index
    # overlay_from is a torch venv pinwheel made from this hashed lock: (its name, sha256);
    # its packages are listed as "torch-lock", not "machine"
    overlay_lock: tuple[str, str] | None = None


@dataclass(frozen=True)
class Interpreter:
    base: str  # the base interpreter's resolved executable
    version: str  # "3.11.7"
    site: tuple[str, ...] = ()  # its package directories (sys.path from the first site dir)
    markers: tuple[tuple[str, str], ...] = ()  # PEP 508 marker environment of it


@dataclass(frozen=True)
class LockedVenv:
    python: Path
    lock_name: str
    lock_sha256: str
    pins: Mapping[str, tuple[str, tuple[str, ...]]]  # name -> (version, sha256s)
    key: str
    overlay: tuple[str, ...] = field(default=())
    overlay_lock: tuple[str, str] | None = None  # the overlay's own lock, when pinwheel made it
    cache: Path | None = None  # where its check's memo is kept (None: hashed every time)

    def record(self, packages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """For provenance: the lock and every package the build's Python imports."""
        out: dict[str, Any] = {
            "lock": self.lock_name,
            "lock_sha256": self.lock_sha256,
            # packages of a Python pinwheel did not make from a lock (PINWHEEL_TORCH_PYTHON)
            "machine_packages": bool(self.overlay) and self.overlay_lock is None,
        }
        if self.overlay_lock is not None:
            out["torch_lock"] = {"lock": self.overlay_lock[0], "sha256": self.overlay_lock[1]}
        out["packages"] = [dict(p) for p in packages]
        return out


def interpreter(python: str) -> Interpreter:
    out = runner.run(
        runner.Command(
            (python, "-I", "-c", workers.source("interpreter_probe")),
            what="the build interpreter", timeout=120,
            error=LockedVenvError, where=python,
            next="point it at a working Python (PINWHEEL_TORCH_PYTHON, [build] python)",
        )
    )  # fmt: skip
    try:
        data = json.loads(out.text.splitlines()[-1])
        found = Interpreter(str(data["base"]), str(data["version"]),
                            tuple(str(d) for d in data["site"]),
                            tuple(sorted((str(k), str(v)) for k, v in
                                         (data.get("markers") or {}).items())))  # fmt: skip
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise LockedVenvError(
            f"the machine Python {python} answered no interpreter description ({exc})",
            where=python, next="point it at a working CPython",
        ) from exc
    for value in (found.base, *found.site):
        # The site directories are written into a .pth file, where a line that starts with
        # "import" runs: only plain absolute paths get there.
        if not value.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise LockedVenvError(
                f"the machine Python {python} reports the directory {value[:120]!r}: not a "
                "plain absolute path",
                where=python, next="point it at a Python whose sys.path holds plain paths",
            )
    return found


def ensure(req: LockedVenvRequest, reporter: Reporter = SILENT) -> LockedVenv:
    """The venv for ``req``, made once (in place, under a file lock, marker last); the
    install's size and progress go to ``reporter``."""
    text = Path(req.lock).read_text()
    parse_requirements(text, req.lock_name)  # every line pinned and hashed, or an error
    lock_sha = hashlib.sha256(text.encode()).hexdigest()
    base = interpreter(req.interpreter)
    pins = pins_for(text, dict(base.markers))
    overlay = interpreter(req.overlay_from).site if req.overlay_from else ()
    key = hashlib.sha256(
        json.dumps([base.base, base.version, lock_sha, list(overlay)]).encode()
    ).hexdigest()[:16]
    root = cachelayout.bucket(Path(req.cache), "venvs")
    final = root / f"{req.kind}-{key}"
    confine.folder_in_cache(Path(req.cache), "venvs", what="venvs folder")  # no link
    with locking.held(root / f".{final.name}.lock"):
        marker = final / READY
        ok = False
        if marker.is_file():
            try:
                ok = json.loads(marker.read_text()).get("lock_sha256") == lock_sha
            except ValueError:
                ok = False
        if not ok:
            _make(final, req, base, overlay, lock_sha, pins, reporter)
    return LockedVenv(
        final / "bin" / "python", req.lock_name, lock_sha, pins, key, overlay, req.overlay_lock,
        Path(req.cache),
    )


_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*(.*?))?\s*(?:--hash|$)")


def pins_for(
    text: str, markers: Mapping[str, str]
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The lock's pins that apply to an interpreter (a universal lock holds one line per
    Python where versions differ: ``numpy==2.4.6 ; python_full_version < '3.12'``).
    ``markers`` empty: every line (the last one of a name wins)."""
    from packaging.markers import Marker

    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        m = _LINE.match(line)
        if not m:
            continue
        if m.group(3) and markers and not Marker(m.group(3)).evaluate(dict(markers)):
            continue
        hashes = tuple(re.findall(f"--hash=sha256:({validate.SHA256_HEX})", line))
        out[canonicalize_name(m.group(1))] = (m.group(2), hashes)
    return out


def _make(
    final: Path,
    req: LockedVenvRequest,
    base: Interpreter,
    overlay: Sequence[str],
    sha: str,
    pins: Mapping[str, tuple[str, tuple[str, ...]]],
    reporter: Reporter,
) -> None:
    remove_tree(final, ignore_errors=True)
    try:
        runner.run(
            runner.Command(
                (base.base, "-I", "-m", "venv", "--without-pip", str(final)),
                what="python -m venv", error=LockedVenvError, where=str(final),
            )
        )  # fmt: skip
        # pip's own config (extra indexes, find-links) must not add anything: hashes decide.
        # Nor may the caller's PYTHONPATH (or user site): pip, run in the new venv, would
        # find a locked name there ("already satisfied") and leave it out of the venv,
        # which the machine's copy then fills (seen on a GPU box: packaging 26.3).
        env = {k: v for k, v in req.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
        env["PIP_CONFIG_FILE"] = "/dev/null"
        env["PYTHONNOUSERSITE"] = "1"
        target = final / "bin" / "python"
        cmd = (
            sys.executable, "-m", "pip", "--python", str(target), "install",
            "--disable-pip-version-check", "--require-hashes", "--no-deps",
            "--only-binary=:all:",
            *(("--no-index", "--find-links", str(req.wheelhouse)) if req.wheelhouse else ()),
            "-r", str(req.lock),
        )  # fmt: skip
        log = final.parent / f"{final.name}.pip.log"
        code, tail = pipwatch.run(
            pipwatch.PipInstall(cmd, env, final, log, pins, f"{req.lock_name} into {final.name}",
                                req.wheelhouse),
            reporter,
        )  # fmt: skip
        if code != 0:
            raise LockedVenvError(
                f"installing {req.lock_name} failed:\n    " + "\n    ".join(tail[-6:]),
                where=f"{req.lock_name} (pip's log: {log})",
                next="check the network (or the wheelhouse: PINWHEEL_WHEELHOUSE); a hash "
                "mismatch means the index serves another file than the one locked "
                "(`pinwheel lock --tools` regenerates the lock)",
            )
        if overlay:
            site = _own_site(target)
            (site / OVERLAY_PTH).write_text("".join(f"{d}\n" for d in overlay))
        workspace.fix_header_times(final)  # headers of locked packages reach line tables
        atomic_write_text(final / READY, json.dumps({"lock_sha256": sha}) + "\n")
    except BaseException:
        remove_tree(final, ignore_errors=True)
        raise


def _own_site(python: Path) -> Path:
    venv = python.parent.parent
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise LockedVenvError(f"no single site-packages in {venv}", where=str(venv))
    return found[0]


def listing(venv: LockedVenv) -> list[dict[str, Any]]:
    """Every distribution the venv's Python imports from its site-packages and the
    machine's (``-I``: no PYTHONPATH, no user site), in ``sys.path`` order; the overlay's
    packages are ``torch-lock`` when pinwheel made that Python from a hashed lock."""
    return inventory(venv)[0]


def inventory(
    venv: LockedVenv, note: Note | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`listing`, and how the venv's own files differ from what its packages
    installed (:func:`python_inventory`)."""
    labels = {d: "torch-lock" for d in venv.overlay} if venv.overlay_lock is not None else {}
    memo = venvmemo.Scope(venv.cache, venv.lock_sha256) if venv.cache is not None else None
    return python_inventory(venv.python, labels, memo=memo, note=note)


def python_listing(python: Path, labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """:func:`listing` of any venv's ``python`` (its own site-packages are ``lock``)."""
    return python_inventory(python, labels)[0]


def python_inventory(
    python: Path,
    labels: Mapping[str, str] | None = None,
    *,
    memo: venvmemo.Scope | None = None,
    note: Note | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The listing of ``python``'s venv and its problems, found by the files, not their
    RECORD's text: a file of its site-packages whose bytes are not the sha256 its RECORD
    names (edited, or gone), and a ``.pth`` file or ``sitecustomize`` / ``usercustomize``
    no installed package owns (each runs at every start of that Python). Listed with
    ``-I -S``: the site module never runs, so none of them executes while it is checked.

    ``memo``: the files are not hashed when the venv is, entry for entry, what the signed
    memo of its last passing check recorded (:mod:`pinwheel.compile.venvmemo`); after a
    check that hashed and found nothing, the memo is written. ``note`` says which it was."""
    site = _own_site(python)
    venv = python.parent.parent
    begun = time.time_ns()

    def listed(hash_files: bool) -> runner.Completed:
        return runner.run(
            runner.Command(
                (str(python), "-I", "-S", "-c", workers.source("dist_listing"), str(site),
                 json.dumps(dict(labels or {})), json.dumps([OVERLAY_PTH]),
                 "1" if hash_files else "0"),
                what="listing the build env",
                timeout=300, error=LockedVenvError, where=str(python),
            )
        )  # fmt: skip

    if memo is None:
        trusted, why = False, "no memo is kept for this venv"
        out = listed(True)
    else:
        # The venv's walk (lstat of every entry) runs while its Python lists it, unhashed;
        # when the memo does not hold, the listing runs again, hashing every file.
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(venvmemo.unchanged, memo, venv, site)
            out = listed(False)
            trusted, why = held.result()
        if not trusted:
            out = listed(True)
    lines = out.text.splitlines()
    found = json.loads(lines[-2]) if len(lines) > 1 else {}
    problems = [f"{n} in {site} is not in the lock (it would run at every start)"
                for n in found.get("unowned", [])]  # fmt: skip
    problems += [f"{m} differs from its RECORD (edited after install)"
                 for m in found.get("modified", [])]  # fmt: skip
    note = note if note is not None else Note()
    if trusted:
        note.skip("hashing the venv's files: every entry's stat is what the signed memo "
                  "of its last passing check recorded")  # fmt: skip
    else:
        note.did(f"hashed {found.get('hashed', '?')} file(s) against their RECORDs ({why})")
        if memo is not None and not problems:
            if venvmemo.save(memo, venv, site, begun):
                note.did("recorded the venv's stat in a signed memo")
    return list(json.loads(lines[-1])), problems


def outside_lock(record: Mapping[str, Any]) -> str:
    """One sha256 over the packages a recorded environment takes from outside its tool lock
    (a torch lock's venv or the machine): name, version and RECORD digest of each one the
    build imports (shadowed copies left out). Where each comes from is not part of it: the
    same files are the same input."""
    rows = sorted(
        (str(p.get("name")), str(p.get("version")), str(p.get("record_sha256")))
        for p in record.get("packages") or []
        if isinstance(p, Mapping) and p.get("from") != "lock" and not p.get("shadowed")
    )
    return derivation.digest(rows)


def differences(venv: LockedVenv, packages: Sequence[Mapping[str, Any]]) -> list[str]:
    """How the listed environment differs from the lock (empty: it is the lock)."""
    return pin_differences(venv.pins, packages)


def pin_differences(
    pins: Mapping[str, tuple[str, tuple[str, ...]]], packages: Sequence[Mapping[str, Any]]
) -> list[str]:
    """How ``packages`` (a listing, live or from provenance) differ from ``pins``."""
    found: dict[str, Mapping[str, Any]] = {}
    problems: list[str] = []
    for p in packages:
        if p.get("shadowed"):
            continue
        found[canonicalize_name(str(p["name"]))] = p
        if p["from"] == "lock" and canonicalize_name(str(p["name"])) not in pins:
            problems.append(f"{p['name']} {p['version']} is in the venv but not in the lock")
    for name, (version, _hashes) in sorted(pins.items()):
        got = found.get(name)
        if got is None:
            problems.append(f"{name}=={version} is locked but not installed")
        elif got["from"] != "lock":
            where = "the torch lock" if got["from"] == "torch-lock" else "the machine"
            problems.append(f"{name} comes from {where} ({got['version']}), not the lock")
        elif got["version"] != version:
            problems.append(f"{name} is {got['version']}, the lock says {version}")
    return problems


def checked(venv: LockedVenv, where: str, note: Note | None = None) -> dict[str, Any]:
    """List the venv, raise when it is not the lock, else its provenance record."""
    packages, changed = inventory(venv, note)
    problems = changed + differences(venv, packages)
    if problems:
        raise LockedVenvError(
            f"the build environment differs from {venv.lock_name}: " + "; ".join(problems),
            where=f"{where} ({venv.python.parent.parent})",
            next="delete that venv (pinwheel makes it again from the lock), or "
            "`pinwheel lock --tools` if the lock itself is stale",
        )
    return venv.record(packages)


def engine_environment(python: Path, lock_name: str, lock_sha256: str,
                       pins: Mapping[str, tuple[str, tuple[str, ...]]], *,
                       cache: Path | None = None, note: Note | None = None) -> dict[str, Any]:
    """The engine's ``[build.requirements]`` venv listed package by package and held to its
    lock before anything compiles (a package installed into it by hand, one missing or of
    another version stops the build); its provenance record (``environment``), which names
    the manifest's lock and carries its pins, so ``check`` can compare without the manifest.
    ``cache``: where the signed memo of its files' stat is kept (:func:`python_inventory`)."""
    memo = venvmemo.Scope(Path(cache), lock_sha256) if cache is not None else None
    packages, changed = python_inventory(python, memo=memo, note=note)
    # The venv's own installer (the interpreter's ensurepip copy of pip) is listed with the
    # rest but not held to the lock: `python -m build --no-isolation` does not import it.
    held = [p for p in packages if p.get("name") != INSTALLER or "pip" in pins]
    problems = changed + pin_differences(pins, held)
    if problems:
        raise LockedVenvError(
            f"the engine's build environment differs from {lock_name}: " + "; ".join(problems),
            where=f"[build.requirements] ({python.parent.parent})",
            next="delete that venv (pinwheel makes it again from the lock)",
        )
    return {
        "lock": f"{MANIFEST_LOCK}{lock_name}",
        "lock_sha256": lock_sha256,
        "machine_packages": False,
        "pins": {name: version for name, (version, _h) in sorted(pins.items())},
        "packages": packages,
    }


# How an environment record names a lock that lives beside a manifest, not in locks/.
MANIFEST_LOCK = "[build.requirements] "
INSTALLER = "pip"  # the engine venv's own installer (python -m venv puts it there)


def recorded_against_lock(record: Mapping[str, Any], root: Path) -> tuple[list[str], list[str]]:
    """A build's recorded environment (a provenance component's ``environment``) against the lock
    it names in the checkout ``root``: (problems, notes). Same lock digest: every locked
    package must have been there, from the lock, at the lock's version (problems). Another
    digest (the lock moved since): a note, the packages are compared by version only."""
    name = str(record.get("lock") or "")
    if name.startswith(MANIFEST_LOCK):
        # the engine's lock lives beside its manifest: held to the pins the record carries
        recorded = record.get("pins")
        if not isinstance(recorded, Mapping):
            return [f"{name[:80]!r} records no pins"], []
        packages = [p for p in record.get("packages") or [] if isinstance(p, Mapping)]
        wanted: dict[str, tuple[str, tuple[str, ...]]] = {
            str(canonicalize_name(str(k))): (str(v), ()) for k, v in recorded.items()
        }
        held = [p for p in packages if p.get("name") != INSTALLER or INSTALLER in wanted]
        return pin_differences(wanted, held), []
    path = root / name
    if not name.startswith("locks/") or "/" in name[len("locks/"):] or not path.is_file():
        return [f"the recorded lock {name[:80]!r} is not in this checkout"], []
    text = path.read_text()
    parse_requirements(text, name)
    packages = [p for p in record.get("packages") or [] if isinstance(p, Mapping)]
    # A universal lock may pin a name once per Python: the recorded build used one of them.
    versions: dict[str, set[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        m = _LINE.match(line.split("#", 1)[0].strip())
        if m:
            versions.setdefault(canonicalize_name(m.group(1)), set()).add(m.group(2))
    used: dict[str, str] = {
        canonicalize_name(str(p.get("name"))): str(p.get("version")) for p in packages
        if p.get("from") == "lock" and not p.get("shadowed")
    }  # fmt: skip
    pins: dict[str, tuple[str, tuple[str, ...]]] = {
        n: (used[n] if used.get(n) in vs else sorted(vs)[-1], ()) for n, vs in versions.items()
    }
    found = pin_differences(pins, packages)
    digest = hashlib.sha256(text.encode()).hexdigest()
    if record.get("lock_sha256") == digest:
        return found, []
    note = (f"built from {name} sha256 {str(record.get('lock_sha256'))[:16]}, the checkout's "
            f"is {digest[:16]}")  # fmt: skip
    return [], [note, *(f"{name}: {d}" for d in found)]

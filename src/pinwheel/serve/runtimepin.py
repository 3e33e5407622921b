"""The serving venv against the manifest's ``[serve.runtime]`` pin (``pinwheel preflight``).

Each ``[[serve.runtime.wheel]]`` names a distribution the engine's venv must hold, with
the version and the sha256 of the wheel that was installed. The venv says what it holds
in its ``*.dist-info`` folders: ``METADATA`` (name, version), ``direct_url.json`` (the
archive's sha256, recorded by pip for an install from a file or URL) and, where
``pinwheel install`` made the venv, the lock it installed from
(``pylock.pinwheel-resolved.toml``). Those folders are a tree someone else filled: they
are read by :mod:`pinwheel.release.envlock`, through :func:`pinwheel.untrusted.read_beneath`
(bounded, no link followed, names and versions matched whole), never here.

Nothing is guessed: a value the manifest leaves as ``FILL IN`` (a key left out), and a
hash the venv does not record, are reported *unverified*, by name; a value that is
pinned and differs is a mismatch naming the distribution, the manifest key and the next
command.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, canonicalize_version

from pinwheel.errors import PinwheelError
from pinwheel.manifest.runtime import RuntimePin, RuntimeWheel
from pinwheel.printable import shown
from pinwheel.release import envlock, pylock


@dataclass(frozen=True)
class Problem:
    what: str  # the distribution and what differs
    where: str  # the manifest key
    next: str


@dataclass(frozen=True)
class Outcome:
    venv: Path | None
    verified: tuple[str, ...]  # "vllm 0.11.0 (version, sha256)"
    unverified: tuple[str, ...]  # "vllm: sha256 is FILL IN (manifest.toml:96 ...)"
    mismatches: tuple[Problem, ...]


def venv_of(python: str) -> Path | None:
    """The venv whose ``bin/python`` is ``python`` (``pyvenv.cfg`` beside ``bin``), if any."""
    exe = shutil.which(python) or python
    venv = Path(exe).absolute().parent.parent
    return venv if (venv / "pyvenv.cfg").is_file() else None


def _folder_name(folder: str) -> str:
    """The distribution a ``NAME-VERSION.dist-info`` folder claims, canonical."""
    return canonicalize_name(folder.removesuffix(".dist-info").rpartition("-")[0] or folder)


def _fix(pin: RuntimePin, wheel: RuntimeWheel, python: str) -> str:
    want = f"{wheel.name}=={wheel.version}" if wheel.version else wheel.name
    return (
        f"install the pinned wheel ({want}, from {pin.repo}) into the venv: "
        f"`{shown(python)} -m pip install --no-deps --force-reinstall {wheel.name}-*.whl` with "
        "the wheel file downloaded from that repository (the card's recipe: "
        "`bash scripts/install_prebuilt.sh`), then run `pinwheel preflight`"
    )


def check(pin: RuntimePin, python: str) -> Outcome:
    """Compare ``pin`` with the venv of ``python``; never raises for what the venv holds."""
    venv = venv_of(python)
    unverified: list[str] = []
    if pin.revision is None:
        unverified.append(f"{pin.repo}: revision is FILL IN ({pin.revision_where})")
    if venv is None:
        problem = Problem(
            f"the engine Python {shown(python)} is not in a venv (no pyvenv.cfg beside its "
            "bin/): the pinned runtime wheels cannot be checked",
            pin.where,
            "pass --python VENV/bin/python, the venv the engine serves from (`pinwheel install` "
            "makes one), then run `pinwheel preflight`",
        )
        return Outcome(None, (), tuple(unverified), (problem,))
    try:
        dists, bad, _python = envlock.installed(venv)
        resolved = envlock.resolved_lock(venv)
        locks = [pylock.check(resolved)] if resolved is not None else []
    except PinwheelError as exc:
        problem = Problem(f"the venv {venv} cannot be read: {exc.what}", exc.where or str(venv),
                          exc.next or "recreate the venv with `pinwheel install`")  # fmt: skip
        return Outcome(venv, (), tuple(unverified), (problem,))
    by_name: dict[str, list[envlock.Installed]] = {}
    for d in dists:
        by_name.setdefault(canonicalize_name(d.name), []).append(d)
    refused = {_folder_name(u.name): u for u in bad}
    verified: list[str] = []
    mismatches: list[Problem] = []
    for wheel in pin.wheels:
        key = canonicalize_name(wheel.name)
        found = by_name.get(key, [])
        fix = _fix(pin, wheel, python)
        if key in refused and not found:
            u = refused[key]
            mismatches.append(Problem(f"{wheel.name}: its dist-info {u.name!r:.120} in {venv} "
                                      f"is refused ({u.why})", wheel.where, fix))  # fmt: skip
            continue
        if not found:
            mismatches.append(Problem(f"{wheel.name} is not installed in {venv}", wheel.where, fix))
            continue
        if len(found) > 1:
            folders = ", ".join(d.folder for d in found)
            mismatches.append(Problem(f"{wheel.name} is installed twice in {venv} ({folders})",
                                      wheel.where, fix))  # fmt: skip
            continue
        dist = found[0]
        checked: list[str] = []
        if wheel.version is None:
            unverified.append(f"{wheel.name} {dist.version}: version is FILL IN "
                              f"({wheel.version_where})")  # fmt: skip
        elif canonicalize_version(dist.version) != canonicalize_version(wheel.version):
            mismatches.append(Problem(
                f"{wheel.name}: the venv has {dist.version}, the manifest pins {wheel.version}",
                wheel.version_where, fix + f"; or, if {dist.version} is the runtime you mean, "
                f"set version (and sha256) at {wheel.version_where}",
            ))  # fmt: skip
            continue
        else:
            checked.append("version")
        hashes = _installed_hashes(dist, locks)
        if wheel.sha256 is None:
            unverified.append(f"{wheel.name} {dist.version}: sha256 is FILL IN "
                              f"({wheel.sha256_where})")  # fmt: skip
        elif not hashes:
            unverified.append(
                f"{wheel.name} {dist.version}: the venv records no sha256 for it (no "
                f"direct_url.json hash, no {envlock.RESOLVED} entry: an index install records "
                "none)"
            )
        elif wheel.sha256 not in hashes:
            got = ", ".join(sorted(hashes))
            mismatches.append(Problem(
                f"{wheel.name} {dist.version}: installed from a wheel of sha256 {got}, the "
                f"manifest pins {wheel.sha256}", wheel.sha256_where, fix,
            ))  # fmt: skip
            continue
        else:
            checked.append("sha256")
        if checked:
            verified.append(f"{wheel.name} {dist.version} ({', '.join(checked)})")
    return Outcome(venv, tuple(verified), tuple(unverified), tuple(mismatches))


def _installed_hashes(dist: envlock.Installed, locks: list[pylock.Lock]) -> set[str]:
    """The sha256 of the wheel ``dist`` was installed from, where the venv records it:
    direct_url.json's archive hash, else the install lock's wheels for its name, version
    and tags."""
    if dist.direct_sha256 is not None:
        return {dist.direct_sha256}
    got = envlock.pin(dist, {}, locks)
    if isinstance(got, envlock.Pinned):
        return {w.sha256 for w in got.wheels}
    return set()

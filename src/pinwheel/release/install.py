"""``pinwheel install``: verified wheels into a venv (uv when present, else pip with hashes).

The wheel directory is checked against SHA256SUMS (and its signature when
allowed_signers is configured) right before installing, and every wheel then
goes through the same archive check as ``pinwheel check`` (zip structure,
duplicate members, zip-slip, RECORD, zip-bomb limits; arches are not required
here): nothing is installed unless all of them pass. A set missing a wheel that
SHA256SUMS lists is refused unless ``allow_partial``.

Whichever installer, the venv is a lock: the release's ``pylock.toml`` when it
ships one, else the release wheels' dependencies resolved first into a PEP 751
lock (``uv pip compile`` or ``pip lock``: every file by URL and sha256) kept in
the venv; the lock is installed (the installer checks every hash), then the
release wheels by hash with ``--no-deps``. With pip, pinwheel's own pip does
every step (``--python VENV``; the venv is made without pip, so it holds the lock
and the release wheels and nothing else).

torch is pinned to what the build used, read from the release's
``provenance.json`` (``torch.version`` and ``torch.index``): ``torch==VERSION`` is
part of what is resolved, with the recorded index searched before any other, and
the lock must pin that version from that index's host, so "cu128" cannot mean a
different torch tomorrow.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import parse as parse_version

from pinwheel import runner, validate
from pinwheel.errors import PinwheelError, UsageError, VerifyError
from pinwheel.fsutil import atomic_write_text
from pinwheel.net.httpget import origin
from pinwheel.options import HostEnvironment
from pinwheel.release import attest, envlock, interpreter, pylock, signing, sigstorebundle
from pinwheel.release.assemble import Verified, verify_release
from pinwheel.urls import redact
from pinwheel.wheels.abifloor import Version, host_glibc, show
from pinwheel.wheels.check import CheckSpec, check_wheels
from pinwheel.wheels.metadata import direct_references, read_path
from pinwheel.wheels.provenance import FILENAME

INSTALLERS = ("auto", "uv", "pip")
# A wheel file name (PEP 427): no spaces, no path, never an option to pip or uv.
_WHEEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+!-]*\.whl")


@dataclass(frozen=True)
class InstallResult:
    venv: Path
    installer: str
    wheels: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...]
    signed_by: str | None
    torch: str | None = None  # the torch pinned from provenance.json, if any
    fell_back: str | None = None  # why pip, not uv, and what that lost (auto without uv)
    allow_unsigned: bool = False  # installed without a verified signature (--allow-unsigned)
    python: str | None = None  # the venv's Python version ("3.12"), when known
    python_how: str = ""  # how that interpreter was found
    lock: str | None = None  # the pylock.toml installed from, if the release ships one
    check: attest.ReleaseCheck | None = None  # the attestation and bundles (None: unsigned)


@dataclass(frozen=True)
class TorchPin:
    version: str  # "2.11.0+cu130": torch.__version__ as the build saw it
    index: str | None  # the package index the build's torch came from


def torch_pin(wheel_dir: Path, sums: Mapping[str, str]) -> TorchPin | None:
    """The torch the release was built against, from its provenance.json (None if unknown).

    Trust follows verification: the provenance is read only when the verified
    SHA256SUMS (``sums``) lists it and its bytes hash to that entry; it is read
    through the checked receipt reader, and every value passed on to pip or uv is
    validated (a PEP 440 version, an https index).
    """
    from pinwheel.documents import read_provenance
    from pinwheel.wheels.provenance import SCHEMA

    path = wheel_dir / FILENAME
    listed = sums.get(FILENAME)
    if listed is None or not path.exists():
        return None  # not covered by the verified sums: never read
    if hashlib.sha256(path.read_bytes()).hexdigest() != listed:
        raise VerifyError(
            f"{FILENAME} differs from the verified SHA256SUMS; nothing was installed",
            where=str(path),
            next="do not install this release; fetch it from the publisher again",
        )
    doc, _raw = read_provenance(path, SCHEMA)  # a damaged receipt is an error, never "no pin"
    if doc.torch is None or doc.torch.version is None:
        return None
    version, index = doc.torch.version, doc.torch.index
    if validate.version_problem(version):
        raise VerifyError(
            f"{FILENAME}'s torch version is not a version: {str(version)[:80]!r}",
            where=str(path),
            next="do not install this release; report it to the publisher",
        )
    if index is not None and validate.index_url_problem(index):
        raise VerifyError(
            f"{FILENAME}'s torch index is not an https package index URL: "
            f"{redact(str(index))[:120]!r} ({validate.index_url_problem(index)})",
            where=str(path),
            next="do not install this release; report it to the publisher",
        )
    return TorchPin(version, index)


def find_uv() -> str | None:
    exe = shutil.which("uv")
    if exe:
        return exe
    try:  # the PyPI `uv` package ships the binary inside the wheel
        import uv

        found: str = uv.find_uv_bin()
        return found
    except (ImportError, FileNotFoundError):
        return None


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def _run(cmd: list[str], what: str, venv: Path) -> tuple[str, ...]:
    runner.run(
        runner.Command(
            tuple(cmd),
            what=what,
            where=str(venv),
            next="fix the cause above and rerun `pinwheel install`",
            redact=True,
        )
    )
    return tuple(cmd)


def check_before_install(paths: list[Path], target_glibc: Version | None = None) -> None:
    """The safety half of ``pinwheel check`` (no arch rules) and the glibc floor against the
    target machine's glibc; raise before anything installs."""
    spec = CheckSpec(
        arches=(),
        require_cuda=False,
        max_glibc=target_glibc,
        glibc_limit="the glibc of the machine installing it",
    )
    report = check_wheels(paths, spec)
    if report.ok:
        return
    if all(f.rule == "glibc" for f in report.errors) and target_glibc is not None:
        raise VerifyError(
            "the wheels need a newer C library than this machine has; nothing was installed:"
            + "".join(f"\n    {f.line()}" for f in report.errors),
            where=", ".join(sorted({f.wheel for f in report.errors})),
            next=f"install on a machine with glibc >= the wheel's floor (this one has "
            f"{show(target_glibc)}), or rebuild with [build] max_glibc = "
            f'"{show(target_glibc)}" on an old enough build host (docs/build.md)',
        )
    shown = "\n    ".join(f.line() for f in report.errors[:20])
    more = f"\n    … and {len(report.errors) - 20} more" if len(report.errors) > 20 else ""
    raise VerifyError(
        f"wheel check failed ({len(report.errors)} error(s)); nothing was installed:"
        f"\n    {shown}{more}",
        where=", ".join(sorted({f.wheel for f in report.errors})),
        next="do not install these wheels; fetch the release from the publisher again "
        "(`pinwheel check WHEEL` shows the same findings)",
    )


def _ensure_venv(
    venv: Path, uv: str | None, installer: str, found: interpreter.Interpreter, offline: bool
) -> list[tuple[str, ...]]:
    """The target venv, made by the interpreter the wheels need (an existing one must be it)."""
    if venv_python(venv).exists():
        have = interpreter.venv_version(venv_python(venv))
        if found.version is not None and have != found.version:
            raise PinwheelError(
                f"{venv} is a Python {have} venv; the wheels need Python {found.version}",
                where=str(venv),
                next=f"pass another --venv (it is created with Python {found.version}), or "
                "remove this one",
            )
        return []
    if found.python is None:  # uv provisions the interpreter (online only)
        assert uv is not None and found.version is not None
        cmd = [uv, "venv", "--quiet", "--python", found.version, "--seed", str(venv.absolute())]
        return [_run(cmd, f"uv venv --python {found.version}", venv)]
    if installer == "uv" and uv:
        cmd = [uv, "venv", "--quiet", "--python", found.python, str(venv.absolute())]
        return [_run(cmd + (["--offline"] if offline else []), "uv venv", venv)]
    # without pip: pinwheel's own pip installs into it (--python), so the venv holds the lock
    # and the release wheels, nothing else
    cmd = [found.python, "-m", "venv", "--without-pip", str(venv.absolute())]
    return [_run(cmd, "python -m venv", venv)]


def refuse_direct_references(wheel_dir: Path, wheels: list[str]) -> None:
    """No wheel may require a URL (``pkg @ file:///...``, ``git+...``): an installer would
    fetch it from there, outside every hash. Raises before anything is installed."""
    found = []
    for w in wheels:
        meta = read_path(wheel_dir / w)
        found += [f"{w}: Requires-Dist: {r[:200]}" for r in direct_references(meta.requires_dist)]
    if found:
        raise VerifyError(
            "a wheel requires a direct URL or VCS reference; nothing was installed:\n    "
            + "\n    ".join(found[:20]),
            where=", ".join(sorted({f.split(":", 1)[0] for f in found})),
            next="do not install this release; its dependencies must come from an index by "
            "version (report it to the publisher)",
        )


def _shipped_lock(wheel_dir: Path, sums: Mapping[str, str]) -> pylock.Lock | None:
    """The release's pylock.toml when the verified SHA256SUMS lists it (its hash was checked)."""
    path = wheel_dir / pylock.FILENAME
    if pylock.FILENAME not in sums or not path.is_file():
        return None
    return pylock.check(path)


RESOLVED = envlock.RESOLVED  # in the venv: what install resolved, by hash


def pip_command(python: str) -> list[str]:
    """pinwheel's own pip acting on the venv of ``python`` (pip reads ``-r pylock.toml`` from
    26.1 on, experimental; the venv's own pip, if any, may be older)."""
    return [sys.executable, "-m", "pip", "--python", python]


@dataclass(frozen=True)
class Resolve:
    """What :func:`_resolve_first` resolves, and with which installer."""

    installer: str  # "uv" or "pip"
    uv: str | None
    python: str  # the venv's interpreter
    wheel_dir: Path
    wheels: tuple[str, ...]
    venv: Path
    pin: TorchPin | None
    torch_backend: str | None
    offline: tuple[str, ...]


def _check_torch(lock: pylock.Lock, pin: TorchPin) -> None:
    """The lock pins exactly the build's torch, and (with a recorded index) every torch file
    from that index's host; else nothing is installed."""
    found = [(n, v) for n, v in lock.packages if canonicalize_name(n) == "torch"]
    versions = sorted({v for _n, v in found})
    if {parse_version(v) for v in versions} != {parse_version(pin.version)}:
        raise VerifyError(
            f"the resolved lock pins torch {', '.join(versions) or '(none)'}, the build used "
            f"torch {pin.version}; nothing was installed",
            where=str(lock.path),
            next="make the build's torch reachable (its index in provenance.json) and rerun "
            "`pinwheel install`",
        )
    if pin.index is None:
        return
    files = [w for n, _v in found for w in lock.wheels.get(n, ())]
    away = [w.url for w in files if origin(w.url) != origin(pin.index)]
    if away or not files:
        raise VerifyError(
            f"the resolved lock takes torch {pin.version} from somewhere other than the build's "
            f"torch index {redact(pin.index)}: {redact(away[0]) if away else 'no wheel'}; "
            "nothing was installed",
            where=str(lock.path),
            next="check the package index configuration (PIP_*/UV_* variables, pip.conf, "
            "uv.toml) and rerun `pinwheel install`",
        )


def _resolve_first(job: Resolve) -> tuple[pylock.Lock | None, list[tuple[str, ...]]]:
    """The release wheels' dependencies resolved into a PEP 751 lock before anything is
    installed (``uv pip compile`` or ``pip lock``: every file by URL and sha256), kept in the
    venv as :data:`RESOLVED`: the venv is then exactly a lock, and ``runtime-lock`` pins every
    package from it. The build's torch (provenance.json) is resolved with them, its recorded
    index searched first (uv: ``--extra-index-url`` comes before the default index and uv
    takes a package from the first index that has it; pip: the version's local label,
    ``+cu130``, is on that index alone), and checked in the lock. None when the wheels need
    nothing."""
    wheel_dir, venv, pin = job.wheel_dir, job.venv, job.pin
    ours = {canonicalize_name(parse_wheel_filename(w)[0]) for w in job.wheels}
    wanted = sorted({r for w in job.wheels for r in read_path(wheel_dir / w).requires_dist
                     if canonicalize_name(Requirement(r).name) not in ours})  # fmt: skip
    if pin is not None:
        wanted.append(f"torch=={pin.version}")
    if not wanted:
        return None, []
    venv.mkdir(parents=True, exist_ok=True)
    reqs, out = venv / "pinwheel-requires.in", venv / RESOLVED
    atomic_write_text(reqs, "".join(f"{r}\n" for r in wanted))
    index = ["--extra-index-url", pin.index] if pin is not None and pin.index else []
    if job.installer == "uv":
        assert job.uv is not None
        cmd = [job.uv, "pip", "compile", "--quiet", "--python", job.python, *job.offline, *index]
        cmd += [f"--torch-backend={job.torch_backend}"] if job.torch_backend and not index else []
        cmd += ["-o", str(out), str(reqs)]
        what = "uv pip compile (the dependencies, by hash)"
    else:
        cmd = [*pip_command(job.python), "lock", "--quiet", "--disable-pip-version-check",
               *job.offline, *index, "-o", str(out), "-r", str(reqs)]  # fmt: skip
        what = "pip lock (the dependencies, by hash)"
    ran = _run(cmd, what, venv)
    lock = pylock.check(out)
    if pin is not None:
        _check_torch(lock, pin)
    return lock, [ran]


@dataclass(frozen=True)
class InstallRequest:
    """One `pinwheel install`, resolved once by the CLI (flags, [release], environment)."""

    wheel_dir: Path  # a fetched release (SHA256SUMS, wheels, provenance)
    venv: Path
    torch_backend: str | None  # uv's --torch-backend when provenance pins no torch index
    installer: str = "auto"  # auto | uv | pip
    no_deps: bool = False
    allowed_signers: Path | None = None
    principal: str | None = None
    allow_partial: bool = False
    target_glibc: Version | None = None  # None: this machine's
    allow_unsigned: bool = False  # install without allowed_signers (every output says so)
    python: str | None = None  # --python: the interpreter for the venv (else found by tag)
    offline: bool = False  # --offline: nothing from the network (uv --offline / pip --no-index)
    # PATH, HOME, UV_PYTHON_INSTALL_DIR, PYENV_ROOT: where the wheels' Python is looked for
    host: HostEnvironment = field(default_factory=HostEnvironment)  # PATH, HOME, uv, pyenv
    # who must have signed a Sigstore bundle beside the release (None: reported, not checked)
    sigstore_policy: sigstorebundle.IdentityPolicy | None = None


def _checked_wheels(
    request: InstallRequest,
) -> tuple[Verified, attest.ReleaseCheck | None, list[str]]:
    """The release verified (SHA256SUMS, signature, the attestation and any Sigstore bundle
    over the same files), then the listed wheels present: well named, all there unless
    ``allow_partial``, above the glibc floor, with no direct references."""
    wheel_dir = request.wheel_dir
    signing.require_signers(request.allowed_signers, request.allow_unsigned, "pinwheel install")
    verified = verify_release(
        wheel_dir, allowed_signers=request.allowed_signers, principal=request.principal,
        require_all=False,
    )  # fmt: skip
    # the attestation (and any Sigstore bundle) over the same files, before anything else
    check = attest.check_carried(
        wheel_dir, verified, allowed_signers=request.allowed_signers,
        principal=request.principal, sigstore_policy=request.sigstore_policy, partial=True,
    )  # fmt: skip
    listed = sorted(n for n in verified.sums if n.endswith(".whl"))
    odd = [n for n in listed if not _WHEEL_NAME.fullmatch(n)]
    if odd:
        raise VerifyError(
            f"not a wheel file name: {', '.join(repr(n) for n in odd)}",
            where=str(wheel_dir / "SHA256SUMS"),
            next="do not install this release; fetch it from the publisher again",
        )
    wheels = [n for n in listed if (wheel_dir / n).is_file()]
    if not wheels:
        raise PinwheelError(
            f"no listed wheels in {wheel_dir}",
            where=str(wheel_dir),
            next="run `pinwheel fetch SOURCE --dest DIR` first",
        )
    missing = [n for n in listed if n not in wheels]
    if missing and not request.allow_partial:
        raise VerifyError(
            f"partial release: {len(missing)} of {len(listed)} wheels listed in SHA256SUMS "
            f"are missing: {', '.join(missing)}; nothing was installed",
            where=str(wheel_dir),
            next="fetch the rest (`pinwheel fetch SOURCE --dest DIR`), or pass --allow-partial "
            "to install only the wheels present",
        )
    target_glibc = request.target_glibc if request.target_glibc is not None else host_glibc()
    check_before_install([wheel_dir / w for w in wheels], target_glibc)
    refuse_direct_references(wheel_dir, wheels)
    return verified, check, wheels


def _choose_installer(request: InstallRequest) -> tuple[str | None, str, str | None]:
    """(uv's path or None, the installer used, why it is not the one asked for or None)."""
    uv = find_uv()
    installer = request.installer
    chosen = ("uv" if uv else "pip") if installer == "auto" else installer
    if chosen == "uv" and not uv:
        raise PinwheelError(
            "uv not found",
            next="install uv into the Python that runs pinwheel (python -m pip install uv), "
            "or pass --installer pip",
        )
    fell_back = None
    if installer == "auto" and not uv:
        fell_back = "uv not found: installed with pip" + (
            f"; --torch-backend {request.torch_backend} was not applied (pip has no torch "
            "backend: torch comes from pip's index, a CUDA build only if the build's "
            "provenance.json pins its index); install uv (python -m pip install uv) to apply it"
            if request.torch_backend
            else ""
        )
    return uv, chosen, fell_back


def install(request: InstallRequest) -> InstallResult:
    """Verify, check (glibc floor against ``target_glibc``, default this machine's), install."""
    if request.installer not in INSTALLERS:
        raise UsageError(f"unknown installer {request.installer!r}", next="use auto, uv or pip")
    verified, check, wheels = _checked_wheels(request)
    wheel_dir, venv, torch_backend = request.wheel_dir, request.venv, request.torch_backend
    no_deps = request.no_deps
    lock = _shipped_lock(wheel_dir, verified.sums) if not no_deps else None
    uv, chosen, fell_back = _choose_installer(request)
    need = interpreter.wanted(wheels)
    found = interpreter.find(need, given=request.python, uv=uv, offline=request.offline,
                             fallback=sys.executable, host=request.host)  # fmt: skip
    commands = _ensure_venv(venv, uv, chosen, found, request.offline)
    python = str(venv_python(venv))
    paths = [str((wheel_dir / w).resolve()) for w in wheels]
    offline = (["--offline"] if chosen == "uv" else ["--no-index", "--find-links",
               str(wheel_dir.resolve())]) if request.offline else []  # fmt: skip
    pin = None if no_deps or lock is not None else torch_pin(wheel_dir, verified.sums)
    if lock is None and not no_deps:
        lock, resolved = _resolve_first(Resolve(
            installer=chosen, uv=uv, python=python, wheel_dir=wheel_dir, wheels=tuple(wheels),
            venv=venv, pin=pin, torch_backend=torch_backend, offline=tuple(offline)))  # fmt: skip
        commands += resolved
        no_deps = True  # the lock holds every dependency (or none was wanted)
    if lock is not None:
        # The environment qualification ran in, every file hash-checked by the installer;
        # then the release's wheels, by hash, with nothing left to resolve.
        # pip reads pylock.toml from 26.1 on (`-r pylock.toml`, experimental: pip's
        # changelog for 26.1): pinwheel's own pip installs into the venv (--python).
        cmd = [uv, "pip", "install", "--python", python] if chosen == "uv" and uv else [
            *pip_command(python), "install", "--disable-pip-version-check"]  # fmt: skip
        commands.append(_run([*cmd, *offline, "-r", str(lock.path.resolve())],
                             f"install {lock.path.name}", venv))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pinwheel-install.") as tmp:
        commands += _install(
            WheelInstall(
                installer=chosen, uv=uv, python=python, paths=tuple(paths), wheels=tuple(wheels),
                sums=verified.sums, constraint=tuple(offline), venv=venv, scratch=Path(tmp),
                torch_backend=None if pin is not None and pin.index else torch_backend,
            )
        )  # fmt: skip
    result = InstallResult(
        venv=venv,
        installer=chosen,
        wheels=tuple(wheels),
        commands=tuple(commands),
        signed_by=verified.signed_by,
        torch=pin.version if pin else None,
        fell_back=fell_back,
        allow_unsigned=verified.signed_by is None,
        python=found.version,
        python_how=found.how,
        lock=lock.path.name if lock is not None else None,
        check=check,
    )
    if venv.is_dir():
        write_receipt(result, {w: verified.sums[w] for w in wheels})
    return result


RECEIPT = "pinwheel-install.json"


def write_receipt(result: InstallResult, hashes: Mapping[str, str]) -> Path:
    """``VENV/pinwheel-install.json``: what was installed, by hash, and how it was trusted."""
    path = result.venv / RECEIPT
    doc = {
        "schema": "pinwheel.install/1",
        "wheels": dict(sorted(hashes.items())),
        "signature": f"verified: signed by {result.signed_by}"
        if result.signed_by
        else signing.UNSIGNED_NOTE,
        "allow_unsigned": result.allow_unsigned,
        "installer": result.installer,
        "python": result.python,
        "python_found_by": result.python_how,
        "lock": result.lock,
        "torch": result.torch,
        "commands": [list(c) for c in result.commands],
    }
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    return path


@dataclass(frozen=True)
class WheelInstall:
    """The release wheels' own install into a made venv, after the lock (no dependency is
    resolved here): which installer, the venv's python, the wheels (paths and the names
    SHA256SUMS lists them by, in the same order) with their hashes, and a scratch folder."""

    installer: str  # "uv" or "pip"
    uv: str | None
    python: str
    paths: tuple[str, ...]
    wheels: tuple[str, ...]
    sums: Mapping[str, str]
    constraint: tuple[str, ...]  # the offline flags
    venv: Path
    torch_backend: str | None  # uv's, unless the build's torch index decides
    scratch: Path  # for pip's requirements file


def _install(job: WheelInstall) -> list[tuple[str, ...]]:
    """The commands run, in order (each run through :func:`_run`)."""
    uv, python, paths, wheels, sums = job.uv, job.python, job.paths, job.wheels, job.sums
    if job.installer == "uv":
        assert uv is not None
        cmd = [uv, "pip", "install", "--python", python, "--no-deps", *job.constraint]
        cmd += [f"--torch-backend={job.torch_backend}"] if job.torch_backend else []
        cmd += ["--"]
        return [_run([*cmd, *paths], "uv pip install", job.venv)]
    req = job.scratch / "requirements.txt"
    req.write_text(
        "".join(f"{p} --hash=sha256:{sums[w]}\n" for p, w in zip(paths, wheels, strict=True))
    )
    # --no-deps: the dependencies came from the lock; --require-hashes would demand a hash
    # for every dependency too.
    offline = [a for a in job.constraint if a == "--no-index"]
    cmd = [*pip_command(python), "install", "--disable-pip-version-check", "--require-hashes",
           "--no-deps", *offline, "-r", str(req)]  # fmt: skip
    return [_run(cmd, "pip install --require-hashes", job.venv)]

"""Which Python a release's wheels need, and where to find it on this machine.

A ``cp312-cp312`` wheel installs only into CPython 3.12; the venv ``install``
creates must be made by that interpreter, never simply by the one running
pinwheel. :func:`wanted` reads the wheels' tags (``py3``/``abi3``/``none``
tags accept any); :func:`find` tries, in order, ``--python PATH``,
``python3.12`` on ``PATH``, the interpreters uv manages and pyenv's versions
(:mod:`pinwheel.compile.toolchain.pythons`, the finder ``[build] python`` uses),
and ``uv python find`` (interpreters uv manages or sees; never a download), and
checks each candidate by running it: a shim that does not answer with the right
version does not count. Offline, a missing interpreter is an error that says how
to get one; online, uv may provision it (``uv venv --python 3.12``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from pinwheel import runner
from pinwheel.compile.toolchain import pythons
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.options import HostEnvironment

_CP = re.compile(r"cp(\d)(\d+)")
_PROBE = "import sys; print('%d.%d' % sys.version_info[:2])"


@dataclass(frozen=True)
class Interpreter:
    python: str | None  # a path that answered with ``version``; None: uv provisions it
    version: str | None  # "3.12"; None: any Python 3 (pure or abi3 wheels)
    how: str  # how it was found, for the output


def wanted(wheels: Sequence[str]) -> str | None:
    """The one CPython minor version the wheels' tags demand (None: any)."""
    need: set[str] = set()
    for name in wheels:
        tags = parse_wheel_filename(name)[3]
        versions: set[str] = set()
        for t in tags:
            m = _CP.fullmatch(t.interpreter)
            if m is None or t.abi in ("abi3", "none"):
                versions = set()  # some tag takes any Python: this wheel demands none
                break
            versions.add(f"{m.group(1)}.{m.group(2)}")
        if len(versions) == 1:
            need |= versions
    if len(need) > 1:
        raise PinwheelError(
            f"the wheels need different Pythons: {', '.join(sorted(need))}",
            where=", ".join(wheels),
            next="install the wheels of one Python version (a release is built for one)",
        )
    return next(iter(need), None)


def version_of(python: str) -> str | None:
    """What ``python`` says its version is (None: it does not run)."""
    done = runner.run(
        runner.Command(
            (python, "-c", _PROBE), what="python --version probe", check=False, timeout=60
        )  # fmt: skip
    )
    text = done.text.strip()
    return text if done.returncode == 0 and re.fullmatch(r"\d+\.\d+", text) else None


_SOURCES = {"PATH": "python{version} on PATH", "uv": "uv-managed", "pyenv": "pyenv's versions"}


def find(
    version: str | None,
    *,
    given: str | None,
    uv: str | None,
    offline: bool,
    fallback: str,
    host: HostEnvironment | None = None,
) -> Interpreter:
    """The interpreter for ``version`` (see the module doc for the order)."""
    if given is not None:
        got = version_of(given)
        if got is None:
            raise UsageError(f"--python {given} does not run", next="pass a Python interpreter")
        if version is not None and got != version:
            raise UsageError(
                f"--python {given} is Python {got}; the wheels need {version}",
                next=f"pass a Python {version} interpreter",
            )
        return Interpreter(given, got, "--python")
    if version is None:
        return Interpreter(fallback, version_of(fallback), "pinwheel's own Python (any fits)")
    # Where people keep interpreters (compile.toolchain.pythons: PATH, uv-managed, pyenv's
    # versions), then uv's own search; every one is run below, a name alone is a claim.
    candidates: list[tuple[str | None, str]] = [
        (path, _SOURCES.get(source, source).format(version=version))
        for source, path in pythons.candidates(version, host or HostEnvironment())
    ]
    if uv is not None:
        found = runner.run(
            runner.Command(
                (uv, "python", "find", "--no-python-downloads", "--", version),
                what="uv python find",
                check=False,
                timeout=60,
            )  # fmt: skip
        )
        if found.returncode == 0 and found.text.strip():
            candidates.append((found.text.strip().splitlines()[-1], "uv python find"))
    if version_of(fallback) == version:
        candidates.insert(0, (fallback, "pinwheel's own Python"))
    passed: list[str] = []
    for path, how in candidates:
        if not path:
            continue
        got = version_of(path)
        if got == version:
            return Interpreter(path, version, how)
        passed.append(f"{path} ({how}): " + (f"is Python {got}" if got else "does not run"))
    if uv is not None and not offline:
        return Interpreter(None, version, f"uv venv --python {version} (uv provisions it)")
    tried = "".join(f"\n    {p}" for p in passed[:10])
    raise PinwheelError(
        f"no Python {version} here: the wheels are built for CPython {version} "
        f"(found no python{version} that runs on PATH, among uv's or pyenv's versions"
        + (", or by uv python find)" if uv else "; no uv)")
        + (f"; tried:{tried}" if passed else ""),
        where="pinwheel install",
        next=pythons.how_to_get(version) + "; or pass --python PATH"
        + (" (without --offline uv provisions it)" if offline and uv else ""),
    )


def venv_version(venv_python: Path) -> str | None:
    return version_of(str(venv_python)) if venv_python.exists() else None

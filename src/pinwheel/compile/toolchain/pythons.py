"""The Python ``[build] python`` pins, found where people keep interpreters.

In: the wanted ``X.Y`` and the caller's environment (``PATH``, ``HOME``,
``UV_PYTHON_INSTALL_DIR``, ``PYENV_ROOT``). Out: the interpreter's path, or ``None`` with
the places looked at. Searched in order: ``pythonX.Y`` on PATH, uv-managed interpreters,
pyenv's versions. Each candidate is run once to confirm its version (a name is a claim).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pinwheel import runner
from pinwheel.errors import PinwheelError
from pinwheel.options import HostEnvironment


@dataclass(frozen=True)
class FoundPython:
    path: str
    version: str  # "3.12"
    source: str  # "PATH", "uv", "pyenv", "this interpreter"


def python_version(python: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``X.Y`` that ``python`` reports, or None when it does not run."""
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    try:
        out = runner.run(runner.Command((python, "-c", probe), check=False, timeout=60))
    except PinwheelError:
        return None
    text = out.text.strip()
    return text if out.returncode == 0 and text.replace(".", "").isdigit() else None


def _managed(root: Path, pattern: str, version: str) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(
        (d / "bin" / f"python{version}" for d in root.glob(pattern)),
        key=lambda p: p.parent.parent.name,
        reverse=True,  # the newest patch release first
    )


def candidates(version: str, host: HostEnvironment) -> list[tuple[str, str]]:
    """(source, path) to try, in order."""
    found: list[tuple[str, str]] = []
    path = host.path if host.path is not None else os.defpath
    on_path = shutil.which(f"python{version}", path=path)
    if on_path:
        found.append(("PATH", on_path))
    home = host.home
    uv_root = host.uv_python_install_dir or (
        str(home / ".local" / "share" / "uv" / "python") if home else None
    )
    if uv_root:
        found += [("uv", str(p)) for p in _managed(Path(uv_root), f"cpython-{version}.*", version)]
    pyenv_root = host.pyenv_root or (str(home / ".pyenv") if home else None)
    if pyenv_root:
        found += [
            ("pyenv", str(p))
            for p in _managed(Path(pyenv_root) / "versions", f"{version}.*", version)
        ]
    return found


def find_python(version: str, host: HostEnvironment) -> FoundPython | None:
    for source, path in candidates(version, host):
        if Path(path).is_file() and python_version(path) == version:
            return FoundPython(path, version, source)
    return None


def how_to_get(version: str) -> str:
    """The next step for a missing Python ``version``: the ways that work on the stock
    distributions a GPU box runs, from their own package indexes first."""
    tag = version.replace(".", "")
    return (
        f"install Python {version} and run again (pinwheel looks for python{version} on PATH, "
        f"then uv's and pyenv's interpreters): where the distribution packages it, from its "
        f"index (Ubuntu 24.04: `apt-get install python{version} python{version}-venv`; RHEL 9 "
        f"family: `dnf install python{version}`); where it does not (Debian 12 ships only "
        f"3.11), from the conda-forge index (`conda create -p ~/py{tag} -c conda-forge "
        f"python={version}`, micromamba alike, then put ~/py{tag}/bin on PATH), "
        f"`uv python install {version}` (downloads from GitHub; UV_PYTHON_INSTALL_MIRROR "
        f"names a mirror, a local one offline) or `pyenv install {version}` (builds "
        "python.org's source)"
    )

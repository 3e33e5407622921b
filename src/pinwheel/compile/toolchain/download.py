"""Downloads checked against their pins; wheels through ``pip download``."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pinwheel import runner
from pinwheel.checksums import sha256_file
from pinwheel.compile.toolchain.pins import WheelPin
from pinwheel.compile.toolchain.toolkit import ToolchainError


def verified(path: Path, sha256: str) -> bool:
    """``path`` exists and has the pinned sha256."""
    return path.is_file() and sha256_file(path) == sha256


def check_download(path: Path, sha256: str, origin: str) -> Path:
    """``path`` if it has the pinned sha256; else it is deleted and the error names both."""
    actual = sha256_file(path)
    if actual != sha256:
        path.unlink()
        raise ToolchainError(
            f"{path.name} from {origin} has sha256 {actual}, the lock pins {sha256}",
            where=f"toolchain lock ({path.name})",
            next="the mirror serves a different file: check the mirror, or re-pin LOCKS "
            "in pinwheel/compile/toolchain/pins.py after reviewing the new file",
        )
    return path


def fetch_wheel(pin: WheelPin, downloads: Path, environ: Mapping[str, str]) -> Path:
    """``pin``'s wheel in ``downloads``, verified; ``pip download`` runs in ``environ``."""
    target = downloads / pin.filename
    if verified(target, pin.sha256):
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--platform", "manylinux2014_x86_64", "--implementation", "py",
            "--dest", tmp, f"{pin.project}=={pin.version}",
        ]  # fmt: skip
        out = runner.run(
            runner.Command(tuple(cmd), env=environ, check=False, error=ToolchainError)
        )
        got = Path(tmp) / pin.filename
        if out.returncode != 0 or not got.is_file():
            names = ", ".join(p.name for p in Path(tmp).iterdir()) or "nothing"
            raise ToolchainError(
                f"pip could not download {pin.filename} (got {names}): {out.err_text[-300:]}",
                where=f"{pin.project}=={pin.version}",
                next="check the network and pip's index configuration",
            )
        check_download(got, pin.sha256, "the package index")
        os.replace(got, target)
    return target

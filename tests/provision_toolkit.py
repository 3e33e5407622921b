"""Provision CUDA 12.4 into argv[1] (a cache dir) and print the toolkit's root.

Run by noxfile.py's ``kernels`` session (in the session's venv, where pinwheel is
installed); not a test module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit
from pinwheel.manifest.build import BuildConfig


def main(cache: str) -> int:
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    config = BuildConfig(
        python=python, cuda="12.4", arches=("8.0", "9.0"), ptx=True, torch=None, label=None,
        version=None,
    )  # fmt: skip
    toolkit = resolve_toolkit(
        ToolkitRequest(config, Path(cache), {"PATH": os.defpath}, provision=True)
    )
    print(toolkit.root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

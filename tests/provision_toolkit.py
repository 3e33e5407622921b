"""Find or provision CUDA 12.4 in argv[1] (a cache dir), reporting on stderr, and write
the toolkit's root to argv[2].

Run by noxfile.py's ``kernels`` session (in the session's venv, where pinwheel is
installed); not a test module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit
from pinwheel.manifest.build import BuildConfig
from pinwheel.options import host as host_of
from pinwheel.progress import LineReporter


def main(cache: str, out: str) -> int:
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    config = BuildConfig(
        python=python, cuda="12.4", arches=("8.0", "9.0"), ptx=True, torch=None, label=None,
        version=None,
    )  # fmt: skip
    toolkit = resolve_toolkit(
        ToolkitRequest(config, Path(cache), host_of({"PATH": os.defpath}), provision=True,
                       reporter=LineReporter(sys.stderr))
    )  # fmt: skip
    Path(out).write_text(str(toolkit.root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

"""The environment every test runs in, for pytest (conftest.py) and nox (noxfile.py) alike.

Kept here once: the tests' caches under $PINWHEEL_TEST_CACHE and the terminal variables
the tests never inherit.
"""

from __future__ import annotations

import os
from pathlib import Path

# What a terminal hands its children and CI does not. argparse and rich wrap to $COLUMNS
# and, without it, ask the terminal on stdout: the width is fixed at CI's 80 columns (a
# pipe's fallback). Colour switches are dropped. Every test then behaves as in the piped
# run CI makes, in a 120- or 200-column terminal too (tests/test_terminal.py drives pytest
# in a pseudo-terminal to keep it so).
TERMINAL_FIXED = {"COLUMNS": "80", "LINES": "24"}
TERMINAL_DROPPED = ("FORCE_COLOR", "NO_COLOR", "CLICOLOR", "CLICOLOR_FORCE", "PY_COLORS",
                    "TTY_COMPATIBLE", "TTY_INTERACTIVE")  # fmt: skip


def cache_environment(root: str) -> dict[str, str]:
    """The variables that keep every file the tests write under ``root``
    ($PINWHEEL_TEST_CACHE): pinwheel's cache and the caches of the tools the tests start
    (vLLM, matplotlib, uv, pip, Hugging Face, XDG)."""
    base = Path(root)
    return {
        "PINWHEEL_TEST_CACHE": root,
        "PINWHEEL_CACHE": str(base / "pinwheel"),
        "VLLM_CACHE_ROOT": str(base / "tools" / "vllm"),
        "VLLM_CONFIG_ROOT": str(base / "tools" / "vllm-config"),
        "MPLCONFIGDIR": str(base / "tools" / "matplotlib"),
        "UV_CACHE_DIR": str(base / "tools" / "uv"),
        "HF_HOME": str(base / "tools" / "huggingface"),
        "XDG_CACHE_HOME": str(base / "tools" / "xdg-cache"),
        "XDG_CONFIG_HOME": str(base / "tools" / "xdg-config"),
    }


def apply(environ: dict[str, str] | os._Environ[str], root: str) -> None:
    """Set the tests' environment in ``environ`` (os.environ for pytest and nox)."""
    environ.update(cache_environment(root))
    environ.update(TERMINAL_FIXED)
    for name in TERMINAL_DROPPED:
        environ.pop(name, None)


def default_root() -> str:
    return os.environ.get("PINWHEEL_TEST_CACHE") or str(Path.home() / ".cache" / "pinwheel-test")

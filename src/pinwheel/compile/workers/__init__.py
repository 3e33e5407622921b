"""Programs the compile stage runs in another interpreter: the build's Python (its header
and interpreter probes; a kernel tree's ``build_wheel`` goes through ``pyproject_hooks``,
compile/frontend.py), the sorted-listing ``sitecustomize`` every build process loads, and
the entry into the build's mount namespace.

They import nothing from pinwheel (the build's Python need not have it). Each is a real
file, linted and tested like any module; :func:`source` is the text a caller runs with
``python -c`` (so the child's ``sys.path`` is what it always was: the working directory
first, not this folder).
"""

from __future__ import annotations

import functools
from pathlib import Path

HERE = Path(__file__).resolve().parent


@functools.cache
def source(name: str) -> str:
    """The program ``name`` (``find_headers``, ``enter_namespace`` ...), as text."""
    return (HERE / f"{name}.py").read_text(encoding="utf-8")

"""Worker scripts run by the engine's Python, one process per rank (see serve/ranks.py).

They import nothing from pinwheel (the engine's venv need not have it): torch,
torch.distributed and, for ``pg_primitives``, a built extension. Each prints one
JSON object as its last stdout line. Preflight's engine probe and self-test and the
fidelity teacher are run whole with ``python -c`` (:func:`source`): the child's
``sys.path`` starts with the working directory, not this folder.
"""

from __future__ import annotations

import functools
from pathlib import Path

HERE = Path(__file__).resolve().parent


@functools.cache
def source(name: str) -> str:
    """The program ``name`` (``engine_probe``, ``selftest``, ``teacher``), as text."""
    return (HERE / f"{name}.py").read_text(encoding="utf-8")

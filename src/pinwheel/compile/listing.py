"""Directory listings in name order inside every Python process of a build.

Build scripts gather their sources with ``os.walk``, ``os.listdir`` or ``glob``,
which return names in the filesystem's order, not in name order: ext4 orders
them by a hash salted per filesystem, tmpfs newest first, others by creation.
exllamav3's setup.py hands ``os.walk``'s order to the link, so one source tree
linked its objects in one order on one machine and in another order on the
next, and the shared object differed although no path reached it.

Every build pinwheel runs (kernels and the engine) gets a ``sitecustomize``
through ``PYTHONPATH`` that makes ``os.listdir`` and ``os.scandir`` -- and with
them ``os.walk``, ``os.fwalk``, ``glob``, ``pathlib`` and ``shutil`` -- return
entries sorted by name. Then it runs the ``sitecustomize`` it shadows, if any.
Programs that read directories themselves are not changed: CMake sorts
``file(GLOB)`` results, shell globs are sorted, GNU make >= 4.3 sorts
``$(wildcard)``.

In: the cache. Out: the hook's directory (a fixed path under the cache, so the
canonical build path covers it) for the build's ``PYTHONPATH``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pinwheel import options
from pinwheel.compile import workers
from pinwheel.fsutil import atomic_write_text

HOOK_DIR = Path("hooks") / "sorted-listing"
MARKER = "pinwheel-sorted-listing"

SITECUSTOMIZE = workers.source("sorted_listing").replace("@MARKER@", MARKER)


def install(cache: Path) -> Path:
    """The hook's directory under ``cache``, written (atomically) when missing or changed."""
    directory = Path(cache) / HOOK_DIR
    target = directory / "sitecustomize.py"
    try:
        current = target.read_text()
    except OSError:
        current = None
    if current != SITECUSTOMIZE:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, SITECUSTOMIZE)
    return directory


def python_path(hook: Path | str, base: Mapping[str, str]) -> str:
    """``PYTHONPATH`` for the build: the hook first, then what the caller had."""
    existing = options.value(base, "PYTHONPATH")
    return os.pathsep.join([str(hook), *([existing] if existing else [])])


__all__ = ["HOOK_DIR", "MARKER", "SITECUSTOMIZE", "install", "python_path"]

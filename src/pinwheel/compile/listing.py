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

from pinwheel.fsutil import atomic_write_text

HOOK_DIR = Path("hooks") / "sorted-listing"
MARKER = "pinwheel-sorted-listing"

SITECUSTOMIZE = '''"""pinwheel: directory listings in name order for this build (same bytes).

Installed by pinwheel.compile.listing; os.listdir and os.scandir (and so os.walk,
glob, pathlib, shutil) return entries sorted by name, whatever the filesystem's order.
Then the sitecustomize this file shadows on sys.path, if any, runs.
"""

import os as _os
import sys as _sys

MARKER = "@MARKER@"


class _Listing:
    """What os.scandir returns (an iterator and a context manager), entries sorted."""

    def __init__(self, entries):
        self._entries = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._entries)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._entries = iter(())


def _install():
    if getattr(_os.listdir, "__pinwheel__", None) == MARKER:
        return
    listdir, scandir = _os.listdir, _os.scandir

    def sorted_listdir(path=None):
        return sorted(listdir() if path is None else listdir(path))

    def sorted_scandir(path=None):
        with scandir() if path is None else scandir(path) as found:
            entries = sorted(found, key=lambda entry: entry.name)
        return _Listing(entries)

    for new, old in ((sorted_listdir, listdir), (sorted_scandir, scandir)):
        new.__name__, new.__doc__, new.__pinwheel__ = old.__name__, old.__doc__, MARKER
    _os.listdir, _os.scandir = sorted_listdir, sorted_scandir


def _chain():
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    rest = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_install()
_chain()
'''.replace("@MARKER@", MARKER)


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
    existing = base.get("PYTHONPATH")
    return os.pathsep.join([str(hook), *([existing] if existing else [])])


__all__ = ["HOOK_DIR", "MARKER", "SITECUSTOMIZE", "install", "python_path"]

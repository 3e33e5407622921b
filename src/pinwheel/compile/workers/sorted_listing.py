"""pinwheel: directory listings in name order for this build (same bytes).

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
        new.__name__, new.__doc__ = old.__name__, old.__doc__
        new.__dict__["__pinwheel__"] = MARKER
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

"""The PEP 517 ``build_wheel`` hook of a source tree, called once, with nothing around it.

``pip wheel --no-build-isolation`` ran each kernel's backend twice before it
compiled anything: ``prepare_metadata_for_build_wheel`` (for a torch extension,
setup.py and its ``import torch`` once more) and then ``build_wheel``, behind
pip's own start-up. The backend's ``build_wheel`` writes the metadata it ships
either way (setuptools and scikit-build-core ignore a ``metadata_directory``), so
calling it alone gives the same wheel and saves seconds on every rebuild.

In: the tree, its ``[build-system]`` (read here, on pinwheel's side) and the
config settings pinwheel chose. Out: the command that runs the hook in the build's
Python; the wheel's file name is the last line it prints.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pinwheel.compile import workers
from pinwheel.errors import ManifestError

# PEP 517: a tree without [build-system] build-backend builds with setuptools' legacy backend.
LEGACY_BACKEND = "setuptools.build_meta:__legacy__"

# Runs in the build's Python, in the source tree (its setup.py may read relative paths).
# argv: OUT BACKEND BACKEND_PATH_JSON CONFIG_SETTINGS_JSON. The hook's wheel name is
# printed last, marked, so the caller need not guess it from the directory.
MARK = "pinwheel-frontend-wheel: "


@dataclass(frozen=True)
class Backend:
    """A tree's ``[build-system]``: the hook object and the in-tree paths it is imported from."""

    name: str  # "module:object" (PEP 517)
    path: tuple[str, ...] = ()  # backend-path, relative to the tree


def backend_of(tree: Path) -> Backend:
    """What ``tree``'s pyproject.toml names, or setuptools' legacy backend when it names none."""
    pyproject = tree / "pyproject.toml"
    if not pyproject.is_file():
        return Backend(LEGACY_BACKEND)
    where = f"{pyproject.name} of {tree.name}"
    try:
        doc = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(
            f"the source's pyproject.toml is not valid TOML: {exc}",
            where=where,
            next="fix the file with a patch step, or build the source as its upstream does",
        ) from exc
    system = doc.get("build-system") or {}
    name = system.get("build-backend") or LEGACY_BACKEND
    paths = system.get("backend-path") or []
    if not isinstance(name, str) or not isinstance(paths, list):
        raise ManifestError(
            "[build-system] build-backend must be a string and backend-path a list",
            where=where,
            next="fix the file with a patch step",
        )
    for entry in paths:  # PEP 517: relative, inside the tree
        if not isinstance(entry, str) or Path(entry).is_absolute() or ".." in Path(entry).parts:
            raise ManifestError(
                f"[build-system] backend-path entry {entry!r} is not a path inside the tree",
                where=where,
                next="fix the file with a patch step",
            )
    return Backend(name, tuple(paths))


def command(
    python: str, tree: Path, out: Path, settings: Mapping[str, str | Sequence[str]]
) -> list[str]:
    """The build's Python calling ``tree``'s ``build_wheel`` into ``out`` (run it in ``tree``)."""
    backend = backend_of(tree)
    return [
        python, "-c", workers.source("build_wheel"), str(out), backend.name,
        json.dumps(list(backend.path)), json.dumps(dict(settings), sort_keys=True),
    ]  # fmt: skip


def config_settings(flags: Sequence[str]) -> dict[str, str | list[str]]:
    """``--config-settings=KEY=VALUE`` flags as the dict a backend receives (pip's rule: a
    repeated key becomes a list, in order)."""
    out: dict[str, str | list[str]] = {}
    prefix = "--config-settings="
    for flag in flags:
        if not flag.startswith(prefix) or "=" not in flag[len(prefix) :]:
            raise ValueError(f"not a --config-settings=KEY=VALUE flag: {flag!r}")
        key, _, value = flag[len(prefix) :].partition("=")
        if key in out:
            kept = out[key]
            out[key] = [*(kept if isinstance(kept, list) else [kept]), value]
        else:
            out[key] = value
    return out

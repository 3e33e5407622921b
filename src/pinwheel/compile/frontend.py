"""The PEP 517 ``build_wheel`` hook of a source tree, called once, with nothing around it.

``pip wheel --no-build-isolation`` ran each kernel's backend twice before it
compiled anything: ``prepare_metadata_for_build_wheel`` (for a torch extension,
setup.py and its ``import torch`` once more) and then ``build_wheel``, behind
pip's own start-up. The backend's ``build_wheel`` writes the metadata it ships
either way (setuptools and scikit-build-core ignore a ``metadata_directory``), so
calling it alone gives the same wheel and saves seconds on every rebuild.

The hook is called through ``pyproject_hooks`` (the PyPA hook caller pip and build
use): its in-process script runs in the build's Python (standard library only), its
answers come back as its error types (:class:`BackendUnavailable`, :class:`HookMissing`),
and pinwheel supplies the runner (the build's environment, log and mount namespace).

In: the tree, its ``[build-system]`` (read here, on pinwheel's side) and the
config settings pinwheel chose. Out: the wheel's file name.
"""

from __future__ import annotations

import tomllib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyproject_hooks import (
    BackendUnavailable,
    BuildBackendHookCaller,
    BuildBackendWarning,
    HookMissing,
    UnsupportedOperation,
)

from pinwheel.errors import ManifestError, PinwheelError

# PEP 517: a tree without [build-system] build-backend builds with setuptools' legacy backend.
LEGACY_BACKEND = "setuptools.build_meta:__legacy__"

#: Runs a hook's command: (argv, the directory to run it in, variables to add to the
#: build's environment). It raises when the command fails.
Run = Callable[[Sequence[str], str, Mapping[str, str]], None]


class BackendError(PinwheelError):
    """The tree's build backend could not be called (not importable, no such hook)."""


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


def build_wheel(
    python: str,
    tree: Path,
    out: str,
    settings: Mapping[str, str | Sequence[str]],
    run: Run,
    warn: Callable[[str], None] = lambda line: None,
) -> str:
    """Call ``tree``'s ``build_wheel`` in ``python`` (run by ``run``, in ``tree``), the wheel
    written to ``out`` as the build spells it; the wheel's file name. The backend's own
    warnings (``BuildBackendWarning``) go to ``warn``."""
    backend = backend_of(tree)
    caller = BuildBackendHookCaller(
        str(tree), backend.name, list(backend.path) or None,
        runner=lambda cmd, cwd=None, extra_environ=None: run(
            cmd, cwd or str(tree), dict(extra_environ or {})),
        python_executable=python,
    )  # fmt: skip
    where = f"[build-system] of {tree.name}"
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", BuildBackendWarning)
            name = caller.build_wheel(out, dict(settings) or None)
    except BackendUnavailable as exc:
        raise BackendError(
            f"the build backend {backend.name!r} cannot be imported by {python}: "
            f"{(exc.traceback or str(exc)).strip().splitlines()[-1][-300:]}",
            where=where,
            next="the build's Python must hold the backend: check the kernel's build lock "
            "(locks/cmake-build.txt or locks/torch-build.txt) or fix build-backend with a patch",
        ) from None
    except (HookMissing, UnsupportedOperation) as exc:
        raise BackendError(
            f"the build backend {backend.name!r} has no usable build_wheel hook "
            f"({type(exc).__name__}: {str(exc)[-200:]})",
            where=where,
            next="fix build-backend with a patch step, or build the source as its upstream does",
        ) from None
    for w in seen:
        warn(f"{tree.name}: the build backend warns: {w.message}")
    if not isinstance(name, str) or "/" in name or not name.endswith(".whl"):
        raise BackendError(
            f"the build backend {backend.name!r} returned {name!r}, not a wheel's file name",
            where=where,
            next="fix build-backend with a patch step, or build the source as its upstream does",
        )
    return name


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

"""A shipped manifest copied for a bench, with the files it names beside it (they resolve
relative to the manifest): shared by the kernel benches."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def named_files(doc: Any) -> list[str]:
    """The relative paths a manifest names (they resolve beside it): [build.torch_lock]
    and [build.requirements] paths, each [[kernel]] path and its [[kernel.patch]] paths."""
    found: list[str] = []
    for table in ("torch_lock", "requirements"):
        lock = doc.get("build", {}).get(table, {})
        if isinstance(lock, dict) and isinstance(lock.get("path"), str):
            found.append(lock["path"])
    for kernel in doc.get("kernel", []):
        if isinstance(kernel.get("path"), str):
            found.append(kernel["path"])
        found += [p["path"] for p in kernel.get("patch", []) if isinstance(p.get("path"), str)]
    return found


def copy_beside(source: Path, doc: Any, dest: Path) -> None:
    """Into ``dest`` (a fresh folder): ``source``'s patches/ and every file ``doc`` (its
    parsed text) names, at the same relative paths, so the copy written there loads."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    if (source.parent / "patches").is_dir():
        shutil.copytree(source.parent / "patches", dest / "patches")
    for rel in named_files(doc):
        src, to = source.parent / rel, dest / rel
        if src.is_dir() and not to.exists():
            shutil.copytree(src, to)
        elif src.is_file() and not to.exists():
            to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, to)

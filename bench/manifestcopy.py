"""A shipped manifest copied for a bench, with the files it names beside it (they resolve
relative to the manifest): shared by the kernel benches."""

from __future__ import annotations

from typing import Any


def named_files(doc: Any) -> list[str]:
    """The relative paths a manifest names (they resolve beside it): [build.torch_lock]
    path, each [[kernel]] path and its [[kernel.patch]] paths."""
    found: list[str] = []
    lock = doc.get("build", {}).get("torch_lock", {})
    if isinstance(lock, dict) and isinstance(lock.get("path"), str):
        found.append(lock["path"])
    for kernel in doc.get("kernel", []):
        if isinstance(kernel.get("path"), str):
            found.append(kernel["path"])
        found += [p["path"] for p in kernel.get("patch", []) if isinstance(p.get("path"), str)]
    return found

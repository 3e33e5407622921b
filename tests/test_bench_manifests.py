"""The kernel benches run on every shipped manifest: bench/pr_ab.variant (which
bench/kernel_fresh_store.py and bench/pr_ab.py build from) and bench/build_cache's
one_file_manifest copy a manifest with every file it names beside it
(bench/manifestcopy.py), so the copy loads (issue 52: recipes/sm120-tp2's copy lacked its
[build.torch_lock] file)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from pinwheel.manifest import load

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = [ROOT / "manifest.toml", *sorted(ROOT.glob("recipes/*/manifest.toml"))]


def _kernels(path: Path) -> list[str]:
    return [k.name for k in load(path).kernels]


EACH_KERNEL = pytest.mark.parametrize(
    ("manifest", "kernel"),
    [(m, k) for m in SHIPPED for k in _kernels(m)],
    ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, Path) else v,
)  # every [[kernel]] of every shipped manifest


@EACH_KERNEL
def test_the_bench_copy_of_every_shipped_manifest_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manifest: Path, kernel: str
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    sys.modules.pop("pr_ab", None)
    from pr_ab import variant

    args = argparse.Namespace(arch=["9.0"], jobs=4)
    copy = variant(manifest, tmp_path / "m", kernel, None, args)
    loaded = load(copy)
    assert kernel in [k.name for k in loaded.kernels]
    assert loaded.build is not None and loaded.build.arches == ("9.0",)


@EACH_KERNEL
def test_the_one_file_copy_of_every_shipped_manifest_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, manifest: Path, kernel: str
) -> None:
    """bench/build_cache.py --kernel-manifest: the copy with one more patch step loads, with
    the files the manifest names (its torch lock) beside it and the new step's patch."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    for name in ("build_cache", "manifestcopy"):
        sys.modules.pop(name, None)
    from build_cache import one_file_manifest

    patch = "--- a/x.cu\n+++ b/x.cu\n@@ -1 +1,2 @@\n x\n+y\n"
    (spec,) = [k for k in load(manifest).kernels if k.name == kernel]
    if spec.url is None:  # in-tree: no stack to add a patch to
        with pytest.raises(SystemExit, match="in-tree"):
            one_file_manifest(manifest, kernel, patch, tmp_path / "one-file")
        return
    copy = one_file_manifest(manifest, kernel, patch, tmp_path / "one-file")
    (spec,) = [k for k in load(copy).kernels if k.name == kernel]
    assert spec.tree is None  # the stack ends elsewhere now
    assert (tmp_path / "one-file" / "patches" / "bench-one-file.patch").read_text() == patch


def test_the_copy_takes_the_requirements_lock_too(tmp_path: Path) -> None:
    """A manifest's [build.requirements] file (an engine build's hashed lock) resolves
    beside it like its torch lock: the copy carries both."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from manifestcopy import named_files
    finally:
        sys.path.remove(str(ROOT / "bench"))
    import tomlkit

    example = ROOT / "recipes/examples/1cat-build.toml"
    doc = tomlkit.parse(example.read_text())
    rel = doc["build"]["requirements"]["path"]  # type: ignore[index]
    assert (example.parent / rel).is_file() and rel in named_files(doc)
    sm120 = ROOT / "recipes/sm120-tp2/manifest.toml"
    doc = tomlkit.parse(sm120.read_text())
    rel = doc["build"]["torch_lock"]["path"]  # type: ignore[index]
    assert (sm120.parent / rel).is_file() and rel in named_files(doc)

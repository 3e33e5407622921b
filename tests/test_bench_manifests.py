"""The kernel benches run on every shipped manifest: bench/pr_ab.variant (which
bench/kernel_fresh_store.py and bench/pr_ab.py build from) copies a manifest with every file
it names beside it, so the copy loads (issue 52: recipes/sm120-tp2's copy lacked its
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


@pytest.mark.parametrize(
    ("manifest", "kernel"),
    [(m, k) for m in SHIPPED for k in _kernels(m)],
    ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, Path) else v,
)
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

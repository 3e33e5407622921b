"""Slow: a toolkit pinwheel did not install gives the same bytes whatever its files' times.

ptxas with ``-lineinfo`` writes the mtime of each file holding device code into the
cubin's line table, cuda_fp16.hpp's among them. Two copies of the pinned CUDA 12.4
toolkit, outside the cache and without pinwheel's marker (as a system toolkit is),
differ only in their headers' mtimes (as two machine images made at other times do).
Through the mount namespace the build sees header views with one fixed time: one
sha256. Under prefix maps (no views) the same two builds differ, which shows the
times do reach the bytes, and provenance says the headers kept the machine's times.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pinwheel.compile import canonical
from pinwheel.compile.toolchain import MARKER
from pinwheel.options import host as host_of
from test_canonical_build import checkout, kernels, toolkit_root  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.kernels]

# Device code from cuda_fp16.hpp (__hadd, __float2half): that header enters the line table.
HALF = """
#include <cuda_fp16.h>
__global__ void pinwheel_half_touch(__half* x) { x[0] = __hadd(x[0], __float2half(1.0f)); }
"""


def foreign_toolkit(root: Path, dest: Path, mtime: int) -> Path:
    """A copy of the toolkit at ``dest``: binaries hard-linked, headers copied with ``mtime``,
    no pinwheel marker (a toolkit the machine brought)."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(root, dest, symlinks=True, copy_function=link,
                    ignore=shutil.ignore_patterns("include", MARKER))  # fmt: skip
    shutil.copytree(root / "include", dest / "include", symlinks=True)
    for dirpath, _, files in os.walk(dest / "include"):
        for name in files:
            os.utime(Path(dirpath) / name, (mtime, mtime), follow_symlinks=False)
    return dest


def test_a_foreign_toolkits_header_times_do_not_reach_the_bytes(
    toolkit_root: Path,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    probe = canonical.choose(tmp_path, host_of({"PATH": os.environ.get("PATH", os.defpath)}))
    if probe.method != canonical.NAMESPACE:
        pytest.skip(f"views need the mount namespace: {probe.why}")
    tree = checkout(tmp_path / "checkout")
    # -lineinfo declared in the manifest: a build's environment holds only declared values
    # (the caller's CUDAFLAGS never reaches it)
    manifest = tree / "manifest.toml"
    text = manifest.read_text()
    assert "\n[build]\n" in text
    manifest.write_text(text.replace("\n[build]\n", '\n[build]\nenv = { CUDAFLAGS = "-lineinfo" }\n', 1))
    cu = tree / "kernels" / "pinwheel-selftest" / "csrc" / "selftest.cu"
    cu.write_text(cu.read_text() + HALF)
    one = foreign_toolkit(toolkit_root, tmp_path / "image-2025" / "cuda", 1_740_000_000)
    two = foreign_toolkit(toolkit_root, tmp_path / "image-2026" / "cuda", 1_780_000_000)

    def build(toolkit: Path, name: str, **env: str) -> dict:
        return kernels(tree, tmp_path / f"cache-{name}", tmp_path / "home",
                       tmp_path / f"out-{name}", "--no-cache", CUDA_HOME=str(toolkit),
                       **env)  # fmt: skip

    a, b = build(one, "a"), build(two, "b")
    record = a["provenance"]["canonical"]
    assert record["method"] == canonical.NAMESPACE
    assert record["header_times"].startswith("fixed:"), record
    assert a["sha256"] == b["sha256"]

    c = build(one, "c", PINWHEEL_CANONICAL="prefix-map")
    d = build(two, "d", PINWHEEL_CANONICAL="prefix-map")
    assert "the machine's" in c["provenance"]["canonical"]["header_times"]
    assert c["sha256"] != d["sha256"]  # without views the headers' times are in the cubins

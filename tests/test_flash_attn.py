"""The out-of-tree flash-attention-v100 kernel, replayed from its pinned commit plus our patch
and built with torch 2.9.1's CUDAExtension: heavy (tens of minutes on 2 cores), so only in
the `flash-attn` nox session. Needs a mirror of the upstream (PINWHEEL_MIRRORS) or network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from pinwheel.cli import default_cache
from test_kernels_build import substitutions

pytestmark = [pytest.mark.slow, pytest.mark.flash_attn]

REPO = Path(__file__).resolve().parent.parent
URL = "https://github.com/ai-bond/flash-attention-v100.git"


def test_flash_attention_v100_wheel_has_sm70(tmp_path: Path) -> None:
    mirrors = os.environ.get("PINWHEEL_MIRRORS", "")
    if URL not in mirrors and os.environ.get("PINWHEEL_OFFLINE"):
        pytest.skip("no mirror for flash-attention-v100 and offline")
    cache = Path(os.environ.get("PINWHEEL_CACHE") or default_cache())
    cmd = [sys.executable, "-m", "pinwheel", "--manifest", str(REPO / "manifest.toml"),
           "--cache", str(cache), "--json", "kernels", "--name", "flash-attention-v100",
           "--out", str(tmp_path), *substitutions()]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    (w,) = json.loads(proc.stdout)["components"]
    print(f"\nflash-attention-v100: {took:.0f} s end to end, build {w['seconds']} s, "
          f"sha256 {w['sha256']}, tree {w['tree']}")  # fmt: skip
    with zipfile.ZipFile(tmp_path / w["wheel"]) as zf:
        sos = [n for n in zf.namelist() if n.endswith(".so")]
    assert any("flash_attn_v100_cuda" in n for n in sos), sos
    check = subprocess.run(
        [sys.executable, "-m", "pinwheel", "--manifest", str(REPO / "manifest.toml"), "check",
         str(tmp_path / w["wheel"]), "--arch", "7.0", "--no-tools", "--require", "*.so"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr

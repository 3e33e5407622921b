"""Slow: the build driver with a real CUDA 12.4 toolkit (resolved or provisioned by
pinwheel.compile.toolchain). A tiny setuptools project compiles a real .cu with nvcc through
`pinwheel build` (replay + build), then `pinwheel check` and `pinwheel verify-build`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gitfixture import UPSTREAM_URL
from pinwheel.cli import default_cache
from pinwheel.options import host as host_of
from test_build import PY, make_tiny
from tinyproject import NVCC_SETUP

pytestmark = [pytest.mark.slow, pytest.mark.kernels]
CP = f"cp{PY.replace('.', '')}"
# nvcc links the CUDA runtime statically: its libc calls (dlclose...) carry this host's glibc
# versions, so publish() tags the wheel with the policy auditwheel finds, not a fixed one.
TINY = re.compile(rf"tiny-0\.4\.1\.dev3\+pw\.tinycard\.cu124-{CP}-{CP}-manylinux_2_(\d+)_x86_64\.whl")


def tiny_wheel(wheels: Path) -> str:
    """The tiny engine wheel's name, checked to carry a manylinux tag."""
    (name,) = [p.name for p in wheels.glob("tiny-*.whl")]
    assert TINY.fullmatch(name), name
    return name


@pytest.fixture(scope="module")
def cuda12():
    from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit
    from pinwheel.manifest.build import BuildConfig

    config = BuildConfig(
        python=PY, cuda="12.4", arches=("7.0",), ptx=True, torch=None, label=None, version=None
    )
    # The toolkit cache is shared with the kernels tests: provisioned once per machine.
    return resolve_toolkit(ToolkitRequest(config, default_cache(), host_of(os.environ)))


def cli(tmp: Path, manifest: Path, toolkit, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_HOME": str(toolkit.root)}
    cmd = [
        sys.executable,
        "-m",
        "pinwheel",
        "--manifest",
        str(manifest),
        "--cache",
        str(tmp / "cache"),
        "--mirror",
        f"{UPSTREAM_URL}={tmp / 'gh' / 'upstream.git'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env)


def test_real_nvcc_build_check_and_verify(tmp_path: Path, cuda12) -> None:
    tiny = make_tiny(tmp_path, NVCC_SETUP)
    manifest = tiny.manifest(ptx="true")
    started = time.monotonic()
    proc = cli(tmp_path, manifest, cuda12, "--json", "build", "--out", "wheels")
    first = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = json.loads(proc.stdout)
    (so,) = [s for s in out["check"]["wheels"][0]["shared_objects"] if s["fatbins"]]
    assert so["member"] == "tiny/_C.so"
    assert so["sass"] == ["sm_70"] and so["ptx"] == ["compute_70"]
    assert so["cuobjdump_sass"] == ["sm_70"]  # cuobjdump 12.4 agrees with the reader
    assert so["rpath"] == [] and so["runpath"] == []
    wheels = tmp_path / "wheels"
    receipt = json.loads((wheels / "provenance.json").read_text())
    assert receipt["toolchain"]["cuda"] == cuda12.version
    assert "release 12.4" in receipt["toolchain"]["nvcc"]
    assert receipt["arches"] == ["sm_70+PTX"]
    (engine,) = [c for c in receipt["components"] if c["kind"] == "engine"]
    assert engine["env"]["TORCH_CUDA_ARCH_LIST"] == "7.0+PTX"
    WHEEL = tiny_wheel(wheels)
    tagged = int(TINY.fullmatch(WHEEL).group(1))  # type: ignore[union-attr]
    floor = out["check"]["wheels"][0]["floor"]["GLIBC"]["version"].split(".")
    assert (2, tagged) >= (int(floor[0]), int(floor[1]))  # the tag is never below the floor
    digest = receipt["wheels"][WHEEL]
    subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=wheels, check=True)

    started = time.monotonic()
    again = cli(tmp_path, manifest, cuda12, "verify-build", "--wheels", "wheels")
    second = time.monotonic() - started
    assert again.returncode == 0, again.stderr + again.stdout
    assert f"same     {digest}  {WHEEL}" in again.stdout
    assert again.stdout.strip().endswith("reproducible: 1/1 wheel(s) identical")
    print(f"\nreal nvcc build: {first:.1f} s, verify-build: {second:.1f} s, sha256 {digest}")


def test_real_sm75_only_wheel_fails_the_sm70_check(tmp_path: Path, cuda12) -> None:
    tiny = make_tiny(tmp_path, NVCC_SETUP)
    manifest = tiny.manifest(ptx="false")
    manifest.write_text(manifest.read_text().replace('arches = ["7.0"]', 'arches = ["7.5"]'))
    assert cli(tmp_path, manifest, cuda12, "build", "--out", "wheels").returncode == 0
    WHEEL = tiny_wheel(tmp_path / "wheels")
    wheel = tmp_path / "wheels" / WHEEL
    proc = cli(
        tmp_path,
        manifest,
        cuda12,
        "check",
        "--arch",
        "7.0",
        "--cuobjdump",
        str(cuda12.root / "bin" / "cuobjdump"),
        str(wheel),
    )
    assert proc.returncode == 6
    assert f"error: {WHEEL}: tiny/_C.so: no SASS for sm_70: found sm_75, need sm_70" in proc.stdout


def test_build_makes_kernel_and_engine_wheels_under_one_sha256sums(tmp_path: Path, cuda12) -> None:
    """`tools/replay build`: the in-tree kernel wheel and the engine wheel, one SHA256SUMS."""
    import shutil

    tiny = make_tiny(tmp_path, NVCC_SETUP)
    manifest = tiny.manifest(ptx="true")
    shutil.copytree(
        Path(__file__).resolve().parent.parent / "kernels" / "pinwheel-selftest",
        manifest.parent / "kernels" / "pinwheel-selftest",
    )
    manifest.write_text(
        manifest.read_text()
        + '\n[[kernel]]\nname = "pinwheel-selftest"\nbuilder = "cmake"\n'
        + 'path = "kernels/pinwheel-selftest"\n'
    )
    proc = cli(tmp_path, manifest, cuda12, "--json", "build", "--out", "wheels")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    wheels = tmp_path / "wheels"
    names = sorted(p.name for p in wheels.glob("*.whl"))
    assert tiny_wheel(wheels) in names and any(n.startswith("pinwheel_selftest-") for n in names)
    listed = {line.split()[1] for line in (wheels / "SHA256SUMS").read_text().splitlines()}
    assert set(names) <= listed
    receipt = json.loads((wheels / "provenance.json").read_text())
    assert set(names) <= set(receipt["wheels"])
    assert {c["name"] for c in receipt["components"]} == {"engine", "pinwheel-selftest"}
    subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=wheels, check=True)
    # verify-build rebuilds every component the receipt lists, kernels included.
    again = cli(tmp_path, manifest, cuda12, "verify-build", "--wheels", "wheels")
    assert again.returncode == 0, again.stderr + again.stdout
    assert again.stdout.strip().endswith("reproducible: 2/2 wheel(s) identical")

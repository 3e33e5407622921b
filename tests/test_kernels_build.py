"""The real thing, slow: provision CUDA 12.4 from the package registries into a fresh cache,
build the in-tree self-test kernel wheel twice (same sha256), check its machine code, and
validate the cibuildwheel table. Needs network access to the Debian mirror and PyPI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from pinwheel.compile.toolchain import MARKER, ToolkitRequest, resolve_toolkit
from pinwheel.manifest.build import BuildConfig
from pinwheel.options import host as host_of

pytestmark = [pytest.mark.slow, pytest.mark.kernels]

REPO = Path(__file__).resolve().parent.parent
SELFTEST = REPO / "kernels" / "pinwheel-selftest"
CONFIG = BuildConfig(python="3.11", cuda="12.4", arches=("7.0",), ptx=True, torch=None,
                     label=None, version=None)  # fmt: skip
TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def toolkit(cache: Path):
    # No CUDA_HOME and no PATH nvcc: the machine's nvcc 13 must not be picked.
    env = {"PATH": os.defpath}
    started = time.monotonic()
    tk = resolve_toolkit(ToolkitRequest(CONFIG, cache, host_of(env), provision=True))
    TIMES["provision_cold"] = time.monotonic() - started
    return tk


def test_provisioned_toolkit_is_pinned_and_relocatable(toolkit, cache: Path) -> None:
    assert toolkit.source == "provisioned" and toolkit.version == "12.4.131"
    assert toolkit.root == cache / "toolchains" / "cuda-12.4.131"
    record = json.loads((toolkit.root / MARKER).read_text())
    assert record["debs"]["nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb"].startswith("cd5fe8")
    for rel in ("bin/nvcc", "bin/ptxas", "bin/cudafe++", "bin/fatbinary", "bin/cuobjdump",
                "nvvm/bin/cicc", "nvvm/lib64/libnvvm.so", "include/cuda_runtime.h",
                "include/cuda/std/type_traits", "lib64/libcudart_static.a"):  # fmt: skip
        assert (toolkit.root / rel).exists(), rel
    assert "$(_HERE_)" in (toolkit.root / "bin" / "nvcc.profile").read_text()
    # Warm: found in the cache, probed again, nothing downloaded.
    started = time.monotonic()
    request = ToolkitRequest(CONFIG, cache, host_of({"PATH": os.defpath}), provision=False)
    again = resolve_toolkit(request)
    TIMES["provision_warm"] = time.monotonic() - started
    assert again.root == toolkit.root
    print(f"\ntoolchain provision cold {TIMES['provision_cold']:.1f} s, "
          f"warm {TIMES['provision_warm']:.1f} s")  # fmt: skip


def substitutions() -> list[str]:
    """The V100 card's toolchain (CUDA 12.8, gcc 14) where these machines cannot have it:
    the provisionable CUDA 12.4 and this machine's g++, substituted explicitly."""
    gxx = subprocess.run(["g++", "-dumpfullversion"], capture_output=True, text=True, check=True)
    return ["--substitute", "cuda=12.4", "--substitute", f"gcc={gxx.stdout.split('.')[0]}"]


def pinwheel(cache: Path, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    cmd = [sys.executable, "-m", "pinwheel", "--manifest", str(REPO / "manifest.toml"),
           "--cache", str(cache), *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def selftest_wheel(toolkit, cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("wheels")
    proc = pinwheel(cache, "--json", "kernels", "--name", "pinwheel-selftest", "--twice",
                    "--out", str(out), *substitutions())  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = json.loads(proc.stdout)
    recorded = json.loads((out / "provenance.json").read_text())["substitutions"]
    assert outcome["substitutions"] == recorded
    assert {"key": "cuda", "pinned": "12.8", "used": "12.4"}.items() <= recorded[0].items()
    (built,) = outcome["components"]
    built["path"] = out / built["wheel"]
    built["sums"] = (out / "SHA256SUMS").read_text()
    return built


def test_selftest_wheel_builds_twice_to_the_same_bytes(selftest_wheel: dict) -> None:
    w = selftest_wheel
    assert w["reproduced"] is True
    # publish() tags it with the manylinux policy auditwheel finds; the tag is never below
    # the glibc floor the check measured (the policy is at least the floor).
    # the variant label: the card's system and the CUDA that compiled it; no torch part,
    # though the manifest pins one: this CMake kernel links no torch
    m = re.fullmatch(r"pinwheel_selftest-0\.1\.0\+pw\.glm53card\.cu124-py3-none-"
                     r"manylinux_2_(\d+)_x86_64\.whl", w["wheel"])  # fmt: skip
    assert m, w["wheel"]
    floor = w["floor"]["GLIBC"]["version"].split(".")
    assert (2, int(m.group(1))) >= (int(floor[0]), int(floor[1]))
    print(f"\nkernel wheel {w['wheel']}: floor {w['floor']}")
    assert f"{w['sha256']}  {w['wheel']}\n" == w["sums"]
    print(f"\nkernel wheel cold {w['first_build_seconds']} s, warm {w['seconds']} s, "
          f"sha256 {w['sha256']} (both builds)")  # fmt: skip


def test_selftest_wheel_carries_sm70_sass_and_ptx(selftest_wheel: dict, toolkit, cache) -> None:
    wheel = selftest_wheel["path"]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        so = zf.read("pinwheel_selftest/libpinwheel_selftest.so")
    assert "pinwheel_selftest/__main__.py" in names
    extracted = wheel.parent / "libpinwheel_selftest.so"
    extracted.write_bytes(so)
    listing = subprocess.run([str(toolkit.root / "bin" / "cuobjdump"), "--list-elf",
                              "--list-ptx", str(extracted)], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    assert "sm_70.cubin" in listing and "sm_70.ptx" in listing
    sass = subprocess.run([str(toolkit.root / "bin" / "cuobjdump"), "-sass", str(extracted)],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "HMMA.884" in sass  # the m8n8k4 tensor-core instruction made it to SASS
    dyn = subprocess.run(["readelf", "-d", str(extracted)], capture_output=True, text=True).stdout
    assert "libcudart" not in dyn and "RPATH" not in dyn and "RUNPATH" not in dyn
    # The check stage agrees (its own .nv_fatbin reader).
    proc = pinwheel(cache, "--json", "check", str(wheel), "--arch", "7.0+PTX", "--no-tools")
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_selftest_runs_without_torch_and_reports_a_missing_gpu(
    selftest_wheel: dict, tmp_path: Path
) -> None:
    with zipfile.ZipFile(selftest_wheel["path"]) as zf:
        zf.extractall(tmp_path / "site")
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": os.defpath}
    proc = subprocess.run([sys.executable, "-m", "pinwheel_selftest"], capture_output=True,
                          text=True, env=env, cwd=tmp_path)  # fmt: skip
    if proc.returncode == 0:  # a machine with a GPU: the tests must have passed
        assert "all self-tests passed" in proc.stdout
        return
    # No GPU here: the library loaded (static cudart) and the driver's refusal is named.
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pwst_device_count" in proc.stderr and "cudaGetDeviceCount" in proc.stderr


def test_cibuildwheel_table_is_valid() -> None:
    tool = shutil.which("cibuildwheel") or str(Path(sys.executable).parent / "cibuildwheel")
    if not Path(tool).exists():
        pytest.skip("cibuildwheel is not installed (tools/replay installs the kernels extra)")
    proc = subprocess.run([tool, "--print-build-identifiers", "--platform", "linux",
                           str(SELFTEST)], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cp311-manylinux_x86_64"]

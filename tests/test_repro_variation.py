"""Slow: what reprotest varies, varied for real: two cold builds of the in-tree selftest
kernel (whose csrc/launches.cu holds anonymous-namespace device code in a unit with no
plain external definition: nvcc names its internal entities after the front end's pid)
at different process ids, times, umasks, locales, time zones, host names (a UTS
namespace), build paths, HOMEs and CPU sets give one wheel sha256.

Needs the pinned CUDA 12.4 toolkit (provisioned once, as test_canonical_build does) and
the canonical mount namespace (the fixed front-end pid lives in it): where user
namespaces are refused it skips, saying so. On demand for any kernel or toolkit:
``pinwheel kernels --name NAME --twice --no-cache`` (two cold builds; the members named
when they differ), and `pinwheel wheeldiff A.whl B.whl` for two wheels built anywhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from pinwheel.cli import default_cache
from pinwheel.compile import canonical
from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit
from pinwheel.options import host as host_of
from pinwheel.wheels.wheeldiff import diff_members
from test_canonical_build import CONFIG, REPO, SO, checkout, make_cache

pytestmark = [pytest.mark.slow, pytest.mark.kernels, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def toolkit_root() -> Path:
    env = {"PATH": os.defpath}  # not this machine's nvcc 13
    return resolve_toolkit(ToolkitRequest(CONFIG, default_cache(), host_of(env))).root


def _uts_prefix(hostname: str) -> list[str]:
    """A command prefix that runs the rest under another host name (a user + UTS
    namespace), or [] where this machine refuses one."""
    unshare = shutil.which("unshare")
    if not unshare:
        return []
    probe = [unshare, "--user", "--map-root-user", "--uts", "--", "hostname", hostname]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        return []
    script = 'hostname "$0" && exec "$@"'
    return [unshare, "--user", "--map-root-user", "--uts", "--", "sh", "-c", script, hostname]


def _move_pids(n: int = 300) -> None:
    """Spend process ids, so the second build's processes get other ones."""
    for _ in range(n):
        subprocess.run(["true"], check=True)


def build(tree: Path, cache: Path, home: Path, out: Path, *, prefix: list[str],
          umask: int, cpus: set[int] | None, **env: str) -> dict:  # fmt: skip
    home.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_HOME", "CUDA_PATH", "LANG", "LANGUAGE", "TZ")
            and not k.startswith("LC_")}  # fmt: skip
    base.update(HOME=str(home), PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                     os.defpath]), **env)  # fmt: skip
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"),
                                                     base.get("PYTHONPATH")) if p)  # fmt: skip
    cmd = [*prefix, sys.executable, "-m", "pinwheel", "--manifest", str(tree / "manifest.toml"),
           "--cache", str(cache), "--json", "kernels", "--name", "pinwheel-selftest",
           "--out", str(out), "--no-cache"]  # fmt: skip

    def child() -> None:
        os.umask(umask)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=base,
                          preexec_fn=child)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = json.loads(proc.stdout)["components"]
    built["path"] = out / built["wheel"]
    built["provenance"] = json.loads((out / "provenance.json").read_text())["components"][0]
    return built


def test_cold_builds_varied_like_reprotest_give_one_sha256(
    toolkit_root: Path, tmp_path: Path
) -> None:
    probe = canonical.choose(tmp_path / "probe", host_of({"PATH": os.defpath}))
    if probe.method != canonical.NAMESPACE:
        pytest.skip(f"no mount namespace here, so no fixed front-end pid: {probe.why}")
    a_cache = make_cache(tmp_path / "alice" / ".cache" / "pinwheel", toolkit_root)
    b_cache = make_cache(tmp_path / "ci runner" / "work" / "pw-b", toolkit_root)
    a_tree = checkout(tmp_path / "alice" / "src")
    b_tree = checkout(tmp_path / "ci runner" / "checkout" / "deeper")
    first = build(a_tree, a_cache, tmp_path / "alice", tmp_path / "out-a", prefix=[],
                  umask=0o022, cpus=None, LANG="C.UTF-8", TZ="UTC")  # fmt: skip
    _move_pids()
    time.sleep(2)  # another second of the clock (SOURCE_DATE_EPOCH comes from the source)
    cpus = sorted(os.sched_getaffinity(0))
    second = build(
        b_tree, b_cache, tmp_path / "ci runner", tmp_path / "out-b",
        prefix=_uts_prefix("pinwheel-variation-b"), umask=0o077, cpus={cpus[-1]},
        LANG="fr_FR.UTF-8", LC_ALL="fr_FR.UTF-8", LANGUAGE="fr", TZ="Pacific/Chatham",
    )  # fmt: skip
    diffs = [d.line() for d in diff_members(first["path"], second["path"])]
    print(f"sha256 {first['sha256']} / {second['sha256']}; differing: {diffs}")
    assert first["sha256"] == second["sha256"], diffs
    with zipfile.ZipFile(first["path"]) as zf:
        lib = zf.read(SO)
    # the unit is there: its kernel's name is registered (no pid ends it: the bytes agree)
    assert b"_GLOBAL__N__" in lib and b"launches_cu" in lib
    assert first["provenance"]["canonical"]["front_end_pid"] == canonical.FIXED_PID

"""Slow: the same wheel whatever build tools the launching Python carries.

Two launcher Pythons ("machines") carry different preinstalled build tools:
setuptools 70.3.0 / wheel 0.43.0 / ninja 1.11.1.1 / scikit-build-core 0.10.7 /
cmake 3.30.5 against setuptools 80.9.0 / wheel 0.45.1 / ninja 1.13.0 /
scikit-build-core 0.11.5 / cmake 3.31.6. Each is a venv of this machine's Python
with those packages in its own site-packages and pinwheel's dependencies (this
test's environment) after them. From each, with its own cache, HOME and checkout:

- the in-tree selftest kernel (CMake, CUDA 12.4) through ``pinwheel kernels``;
- a torch-extension kernel (an out-of-tree setup.py that imports torch 2.13.0 CPU,
  the launcher being PINWHEEL_TORCH_PYTHON; its extension is C, so no GPU torch is
  needed), built by ``build_kernel``.

Each pair gives one sha256; the provenance lists the locked build environment, the
same on both; no member of any wheel holds a path of the build machine (its caches,
the launcher venvs, the torch directory, the temp dirs, HOME). Before the locks,
the wheels followed the launcher's tools (``Generator: setuptools (70.3.0)``).

Needs: PyPI (the launcher packages, torch's dependencies), the CUDA 12.4 toolkit
(provisioned into ``$PINWHEEL_CACHE`` as test_canonical_build does) and a local
torch 2.13.0 CPU wheel in ``$PIP_FIND_LINKS`` (this machine image has one; without
it the torch half skips: a CUDA torch is several GB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pinwheel.cli import default_cache
from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit
from pinwheel.manifest.build import BuildConfig
from pinwheel.options import host as host_of

pytestmark = [pytest.mark.slow, pytest.mark.kernels, pytest.mark.timeout(3000)]

REPO = Path(__file__).resolve().parent.parent
TOOLS = {
    "a": ("setuptools==70.3.0", "wheel==0.43.0", "ninja==1.11.1.1", "scikit-build-core==0.10.7",
          "cmake==3.30.5"),
    "b": ("setuptools==80.9.0", "wheel==0.45.1", "ninja==1.13.0", "scikit-build-core==0.11.5",
          "cmake==3.31.6"),
}  # fmt: skip
TORCH = "2.13.0"
CONFIG = BuildConfig(python="3.11", cuda="12.4", arches=("7.0",), ptx=True, torch=None,
                     label=None, version=None)  # fmt: skip


def _site_dirs() -> list[str]:
    """This test's package directories (pinwheel's dependencies), in sys.path order."""
    return [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args],
                   check=True, env=env)  # fmt: skip


def _launcher(root: Path, name: str, extra_site: list[str]) -> Path:
    """A venv with launcher ``name``'s build tools first, then ``extra_site`` and this test's
    packages (pinwheel's dependencies): a machine Python with its own preinstalled tools."""
    venv = root / f"launcher-{name}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    _pip("--python", str(python), "install", "--only-binary=:all:", *TOOLS[name])
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "zz-test-machine.pth").write_text("".join(f"{d}\n" for d in (*extra_site,
                                                                          *_site_dirs())))
    probe = "import setuptools, sys; print(setuptools.__version__)"
    got = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    assert got.stdout.strip() == TOOLS[name][0].split("==")[1]
    return python


def _torch_wheel() -> Path | None:
    for d in os.environ.get("PIP_FIND_LINKS", "").split():
        for w in sorted(Path(d).glob(f"torch-{TORCH}+cpu-cp311-*.whl")) if Path(d).is_dir() else []:
            return w
    return None


@pytest.fixture(scope="module")
def toolkit_root() -> Path:
    request = ToolkitRequest(CONFIG, default_cache(), host_of({"PATH": os.defpath}))
    return resolve_toolkit(request).root


@pytest.fixture(scope="module")
def torch_site(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    wheel = _torch_wheel()
    if wheel is None or sys.version_info[:2] != (3, 11):
        return None
    target = tmp_path_factory.mktemp("machine-torch") / "site-packages"
    _pip("install", "--target", str(target), "--only-binary=:all:", str(wheel))
    return target


@pytest.fixture(scope="module")
def launchers(tmp_path_factory: pytest.TempPathFactory, torch_site: Path | None) -> dict:
    root = tmp_path_factory.mktemp("launchers")
    extra = [str(torch_site)] if torch_site else []
    return {name: _launcher(root, name, extra) for name in TOOLS}


def _env(home: Path, python: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "PINWHEEL_TORCH_PYTHON")}  # fmt: skip
    env.update(HOME=str(home), PATH=os.pathsep.join([str(python.parent), os.defpath]),
               PYTHONPATH=str(REPO / "src"), **more)  # fmt: skip
    return env


def _machine_paths(tmp: Path, *more: Path) -> list[bytes]:
    """What must not be in a wheel: this test's temp dirs (caches, launchers, torch, HOMEs),
    the real HOME, and the running venv's prefix."""
    paths = {str(tmp), str(Path.home()), sys.prefix, *(str(m) for m in more)}
    paths.add(str(Path(os.environ.get("PINWHEEL_CACHE", default_cache()))))
    return sorted(p.encode() for p in paths if len(p) > 4)


def _scan(wheel: Path, needles: list[bytes]) -> list[str]:
    found = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            data = zf.read(info)
            found += [f"{info.filename}: {n.decode()}" for n in needles if n in data]
    return found


def _generator(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/WHEEL")]
        return [ln for ln in zf.read(name).decode().splitlines() if ln.startswith("Generator")][0]


def _selftest(tmp: Path, name: str, python: Path, toolkit_root: Path) -> dict:
    from test_canonical_build import checkout, make_cache

    cache = make_cache(tmp / name / "cache", toolkit_root)
    tree = checkout(tmp / name / "checkout")
    out = tmp / name / "out"
    cmd = [str(python), "-m", "pinwheel", "--manifest", str(tree / "manifest.toml"),
           "--cache", str(cache), "--json", "kernels", "--name", "pinwheel-selftest",
           "--out", str(out), "--no-cache"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree,
                          env=_env(tmp / name / "home", python))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = json.loads(proc.stdout)["components"]
    built["path"] = out / built["wheel"]
    built["provenance"] = json.loads((out / "provenance.json").read_text())["components"][0]
    built["cache"] = cache
    return built


def test_selftest_wheel_is_one_sha256_from_launchers_with_other_build_tools(
    launchers: dict, toolkit_root: Path, tmp_path: Path
) -> None:
    (tmp_path / "a" / "home").mkdir(parents=True)
    (tmp_path / "b" / "home").mkdir(parents=True)
    a = _selftest(tmp_path, "a", launchers["a"], toolkit_root)
    b = _selftest(tmp_path, "b", launchers["b"], toolkit_root)
    gen_a, gen_b = _generator(a["path"]), _generator(b["path"])
    assert gen_a == gen_b, (gen_a, gen_b)  # the lock's scikit-build-core, not the launcher's
    assert a["sha256"] == b["sha256"], (a["sha256"], b["sha256"])
    env_a = a["provenance"]["environment"]
    assert env_a == b["provenance"]["environment"]
    assert env_a["lock"] == "locks/cmake-build.txt" and len(env_a["lock_sha256"]) == 64
    names = {p["name"]: p for p in env_a["packages"]}
    assert {"scikit-build-core", "cmake", "ninja"} <= set(names)
    assert all(p["from"] == "lock" and len(p["record_sha256"]) == 64 for p in names.values())
    assert names["scikit-build-core"]["version"] not in ("0.10.7", "0.11.5")
    members = a["provenance"]["members"]
    assert members == b["provenance"]["members"] and SO_MEMBER in members
    leaks = _scan(a["path"], _machine_paths(tmp_path, *launchers.values()))
    assert not leaks, leaks


SO_MEMBER = "pinwheel_selftest/libpinwheel_selftest.so"

SETUP = """\
import torch  # the machine's torch (the launcher's), as a real extension's setup.py does
from setuptools import Extension, setup

assert torch.__version__.startswith("2.13.0"), torch.__version__
setup(name="pw-ext", version="0.1.0", packages=["pw_ext"],
      ext_modules=[Extension("pw_ext._c", ["csrc/ext.c"])])
"""
EXT = """\
#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *arg) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(2 * v);
}
static PyMethodDef methods[] = {{"twice", twice, METH_O, "2 * x"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_c", NULL, -1, methods};
PyMODINIT_FUNC PyInit__c(void) { return PyModule_Create(&mod); }
"""

DRIVER = """
import json, os, sys
from pathlib import Path
from pinwheel.compile.kernels import BuildOptions, build_kernel
from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit
from pinwheel.manifest.model import load
from pinwheel.options import host as host_of
manifest_path, cache, url, mirror = sys.argv[1:5]
m = load(manifest_path)
env = dict(os.environ)
request = ToolkitRequest(m.build, Path(cache), host_of({"PATH": os.defpath}), provision=False)
tk = resolve_toolkit(request)
opts = BuildOptions(cache=Path(cache), mirrors={url: mirror}, host=host_of(env), cold=True)
built = build_kernel(m.kernels[0], m.build, tk, opts)
print(json.dumps({"wheel": str(built.wheel), "build": built.build.to_json()}))
"""


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid",
           "GIT_AUTHOR_DATE": "1760054400 +0000", "GIT_COMMITTER_DATE": "1760054400 +0000"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def _extension_repo(root: Path) -> tuple[Path, str]:
    up = root / "pw-ext"
    (up / "csrc").mkdir(parents=True)
    (up / "pw_ext").mkdir()
    (up / "setup.py").write_text(SETUP)
    (up / "csrc" / "ext.c").write_text(EXT)
    (up / "pw_ext" / "__init__.py").write_text("from pw_ext._c import twice\n")
    _git(up, "init", "-q", "-b", "main")
    _git(up, "add", ".")
    _git(up, "commit", "-q", "-m", "pw-ext")
    return up, _git(up, "rev-parse", "HEAD")


def _torch_ext(tmp: Path, name: str, python: Path, toolkit_root: Path, repo: Path,
               commit: str) -> dict:  # fmt: skip
    from test_canonical_build import make_cache

    cache = make_cache(tmp / name / "cache", toolkit_root)
    url = "https://example.invalid/pw-ext.git"
    manifest = tmp / name / "manifest.toml"
    manifest.write_text(
        '[upstream]\nurl = "https://example.invalid/engine.git"\n'
        'commit = "0123456789abcdef0123456789abcdef01234567"\n'
        f'[build]\npython = "3.11"\ncuda = "12.4"\narches = ["7.0"]\ntorch = "{TORCH}"\n'
        f'[[kernel]]\nname = "pw-ext"\nbuilder = "torch-extension"\nurl = "{url}"\n'
        f'commit = "{commit}"\n'
    )
    (tmp / name / "home").mkdir(parents=True, exist_ok=True)
    env = _env(tmp / name / "home", python, PINWHEEL_TORCH_PYTHON=str(python))
    proc = subprocess.run([str(python), "-c", DRIVER, str(manifest), str(cache), url, str(repo)],
                          capture_output=True, text=True, env=env, cwd=tmp / name)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    kept = tmp / name / Path(out["wheel"]).name
    kept.write_bytes(Path(out["wheel"]).read_bytes())
    return {"path": kept, "build": out["build"], "cache": cache}


def test_torch_extension_is_one_sha256_from_torch_pythons_with_other_build_tools(
    launchers: dict, toolkit_root: Path, torch_site: Path | None, tmp_path: Path
) -> None:
    if torch_site is None:
        pytest.skip(f"no local torch {TORCH} CPU wheel for Python 3.11 in $PIP_FIND_LINKS "
                    "(a CUDA torch from the index is several GB)")  # fmt: skip
    import hashlib

    repo, commit = _extension_repo(tmp_path / "upstream")
    a = _torch_ext(tmp_path, "a", launchers["a"], toolkit_root, repo, commit)
    b = _torch_ext(tmp_path, "b", launchers["b"], toolkit_root, repo, commit)
    assert _generator(a["path"]) == _generator(b["path"]), (_generator(a["path"]),
                                                             _generator(b["path"]))  # fmt: skip
    sha_a = hashlib.sha256(a["path"].read_bytes()).hexdigest()
    sha_b = hashlib.sha256(b["path"].read_bytes()).hexdigest()
    assert sha_a == sha_b, (sha_a, sha_b)
    env_a, env_b = a["build"]["environment"], b["build"]["environment"]
    assert env_a["lock"] == "locks/torch-build.txt" and env_a["machine_packages"] is True
    locked = {p["name"]: p for p in env_a["packages"] if p["from"] == "lock"}
    assert {"setuptools", "wheel", "ninja", "numpy"} <= set(locked)
    assert locked == {p["name"]: p for p in env_b["packages"] if p["from"] == "lock"}
    # The launcher's setuptools is there, on the machine's side, and shadowed by the lock's.
    machine = [p for p in env_a["packages"] if p["from"] == "machine" and p["name"] == "setuptools"]
    assert machine and all(p["shadowed"] for p in machine), machine
    assert any(p["name"] == "torch" and p["from"] == "machine" for p in env_a["packages"])
    leaks = _scan(a["path"], _machine_paths(tmp_path, torch_site, *launchers.values()))
    assert not leaks, leaks
    with zipfile.ZipFile(a["path"]) as zf:  # no RUNPATH at all (was the Python's prefix/lib)
        (so,) = [n for n in zf.namelist() if n.endswith(".so")]
        extracted = tmp_path / "ext.so"
        extracted.write_bytes(zf.read(so))
    dyn = subprocess.run(["readelf", "-d", str(extracted)], capture_output=True, text=True).stdout
    assert "RPATH" not in dyn and "RUNPATH" not in dyn, dyn

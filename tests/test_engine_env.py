"""The engine build's child environment is made of declared values only, and the objects it
compiles name the build Python's include directory and a machine torch's headers only under
canonical names.

A real replayed tiny setuptools project, built by the real pipeline (``python -m build
--no-isolation`` in a real subprocess, in the mount namespace or with prefix maps): its
setup.py writes the environment it was given into the wheel and compiles a C file that
includes ``Python.h`` and a header of a torch stand-in installed outside the cache, with
``-g`` and the build's CFLAGS, so every header's directory is in the object's debug paths.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from gitfixture import UPSTREAM_URL, Upstream, manifest_text
from pinwheel.compile import canonical, headerview
from pinwheel.compile.buildenv import ENGINE_PASS_THROUGH, SYSTEM_PATH, engine_base
from pinwheel.compile.pipeline import BuildRequest
from pinwheel.compile.pipeline import build as run_build
from pinwheel.compile.produce import machine_placeholders
from pinwheel.compile.reuse import portable
from pinwheel.errors import PinwheelError
from pinwheel.manifest import load
from pinwheel.options import host as host_of
from pinwheel.source.replay import replay_manifest
from pinwheel.wheels.provenance import component
from tinyproject import BUILD_TABLE, STANDIN_SETUP, project_files

PY = f"{sys.version_info.major}.{sys.version_info.minor}"

pytestmark = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("objcopy")), reason="needs gcc and objcopy"
)

# The stand-in, but the shared object is compiled from a C file that includes Python.h and
# the torch stand-in's header (both found the way a torch extension finds them), with -g
# and the CFLAGS the build was given; and the whole environment is written into the wheel.
ENV_SETUP = STANDIN_SETUP.replace(
    '''subprocess.check_call(["gcc", "-shared", "-fPIC", "-O2", "-o", so, "csrc/probe.c"])''',
    '''import json, shlex, sysconfig, importlib.util
        torch_inc = os.path.join(importlib.util.find_spec("torch").submodule_search_locations[0],
                                 "include")
        flags = shlex.split(os.environ.get("CFLAGS", ""))
        subprocess.check_call(["gcc", "-shared", "-fPIC", "-O0", "-g", *flags,
                               "-I" + sysconfig.get_paths()["include"], "-I" + torch_inc,
                               "-o", so, "csrc/probe.c"])
        with open(os.path.join(pkg, "child_env.json"), "w") as fh:
            json.dump(dict(os.environ), fh, sort_keys=True)''',
)
assert ENV_SETUP != STANDIN_SETUP

PROBE_C = r"""#include <Python.h>
#include "tinytorch.h"
int tiny_probe(PyObject *o) { Py_INCREF(o); return tiny_torch_twice((int)Py_REFCNT(o)); }
"""
TORCH_H = "static inline int tiny_torch_twice(int x) { return 2 * x; }\n"

STRAY = {
    "FOO": "stray-foo",
    "CFLAGS": "-DSTRAY_CFLAGS",
    "CXXFLAGS": "-DSTRAY_CXXFLAGS",
    "LDFLAGS": "-Lstray-ldflags",
    "LD_LIBRARY_PATH": "/stray/ld-library-path",
    "VIRTUAL_ENV": "/stray/virtual-env",
    "TMPDIR": "/stray/tmp",
}


def _torch_python(tmp: Path) -> tuple[Path, Path]:
    """A build Python (a wrapper of this one) whose packages hold a torch stand-in, outside
    the cache; (the wrapper, the stand-in's include directory)."""
    site = tmp / "machine-site"
    inc = site / "torch" / "include"
    inc.mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (inc / "tinytorch.h").write_text(TORCH_H)
    wrapper = tmp / "machine-bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, inc


@pytest.mark.parametrize("method", [canonical.NAMESPACE, canonical.PREFIX_MAP])
def test_a_stray_variable_never_reaches_the_engine_build(tmp_path: Path, method: str) -> None:
    if method == canonical.NAMESPACE:
        probe = canonical.choose(tmp_path, host_of({"PATH": os.environ.get("PATH", os.defpath)}))
        if probe.method != canonical.NAMESPACE:
            pytest.skip(f"no mount namespace here: {probe.why}")
    up = Upstream(tmp_path / "gh")
    files = project_files(ENV_SETUP, {"csrc/probe.c": PROBE_C})
    base = up.commit(files, "tiny: initial")
    up.publish({})
    manifest = tmp_path / "m.toml"
    table = BUILD_TABLE.format(python=PY, ptx="false", extra_env="", threads=2)
    manifest.write_text(manifest_text(base, [], extra=table))
    cache = tmp_path / "cache"
    result = replay_manifest(load(manifest), cache=cache, mirrors={UPSTREAM_URL: str(up.bare)})
    python, torch_inc = _torch_python(tmp_path)
    stray_bin = tmp_path / "stray-bin"
    stray_bin.mkdir()
    environ = {
        **os.environ,
        **STRAY,
        "PATH": f"{stray_bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "HOME": str(tmp_path / "caller-home"),
    }
    if method == canonical.PREFIX_MAP:
        environ["PINWHEEL_CANONICAL"] = canonical.PREFIX_MAP
    outcome = run_build(
        BuildRequest(
            manifest=load(manifest), cache=cache, out_dir=tmp_path / "wheels", host=host_of(environ),
            replayed=result, kernels=(), cuda=False,  # the workspace: under the cache
            build_python=str(python),  # PINWHEEL_BUILD_PYTHON, as the CLI resolves it
        )  # fmt: skip
    )
    (wheel,) = outcome.wheels.built
    with zipfile.ZipFile(wheel) as zf:
        child = json.loads(zf.read("tiny/child_env.json"))
        so = zf.read("tiny/_C.so")
    # Nothing of the caller's that is not declared: no stray name, flag or directory.
    assert "FOO" not in child
    for key in ("LD_LIBRARY_PATH", "VIRTUAL_ENV", "TMPDIR"):
        assert key not in child, key
    for key in ("CFLAGS", "CXXFLAGS"):  # pinwheel's prefix maps only
        assert "STRAY" not in child.get(key, "")
        assert all(f.startswith("-ffile-prefix-map=") for f in child.get(key, "").split())
    assert "stray" not in child.get("LDFLAGS", "")
    for value in STRAY.values():
        assert not any(value in v for v in child.values()), value
    # PATH: the build Python's folder and the system's (a toolkit's and the compiler cache's
    # when there are), never the caller's; HOME under the cache, not the caller's.
    path = child["PATH"].split(os.pathsep)
    assert str(stray_bin) not in path
    assert str(python.parent) in path
    assert set(SYSTEM_PATH) <= set(path)
    home_real = cache / "build" / ".home"
    assert child["HOME"] in (str(home_real), str(canonical.CANONICAL_CACHE / "build" / ".home"))
    # The objects hold no machine path for the Python's headers or the torch stand-in's:
    # they are named under the canonical root.
    include = sysconfig.get_paths()["include"]
    for spelling in {include, os.path.realpath(include)}:
        assert spelling.encode() not in so, spelling
    assert str(torch_inc).encode() not in so
    assert str(tmp_path).encode() not in so
    assert str(canonical.CANONICAL_ROOT / "python" / "include").encode() in so
    assert str(canonical.CANONICAL_ROOT / "site-packages" / "torch" / "include").encode() in so
    # Provenance records the declared PATH and HOME (the cache as $CACHE) and the command
    # (the build Python by its folder's placeholder): no path of this machine anywhere in it.
    text = (tmp_path / "wheels" / "provenance.json").read_text()
    engine = component(json.loads(text), "engine")
    env = engine["env"]
    assert env.get("HOME") == "$CACHE/build/.home"
    assert "FOO" not in env and str(stray_bin) not in env.get("PATH", "")
    assert f"$BUILD_PYTHON_DIR/{python.name}" in engine["command"]  # after a wrapper, if any
    assert "$BUILD_PYTHON_DIR" in env["PATH"].split(os.pathsep)
    for spelling in {str(tmp_path), os.path.realpath(tmp_path), str(python.parent)}:
        assert spelling not in text, spelling


def test_engine_base_is_declared_values_and_the_pass_through_list() -> None:
    caller = {
        "PATH": "/stray/bin:/usr/bin", "HOME": "/home/caller", "FOO": "x", "CFLAGS": "-O0",
        "PYTHONPATH": "/stray", "CC": "gcc", "SCCACHE_DIR": "/s", "https_proxy": "http://p:3",
        "SSL_CERT_FILE": "/etc/ssl/c.pem", "PINWHEEL_CACHE": "/c",
    }  # fmt: skip
    base = engine_base(host_of(caller), python="/opt/venv/bin/python", home="/cache/build/.home")
    assert base["PATH"].split(os.pathsep)[0] == "/opt/venv/bin"
    assert "/stray/bin" not in base["PATH"]
    assert base["HOME"] == "/cache/build/.home"
    allowed = {"PATH", "HOME", "CC", "SCCACHE_DIR", *ENGINE_PASS_THROUGH}
    assert set(base) <= allowed
    assert base["https_proxy"] == "http://p:3" and base["CC"] == "gcc"


def test_hostile_header_directories_are_refused_by_name(tmp_path: Path) -> None:
    """A build Python whose include directory the option cannot carry ('=' splits
    -ffile-prefix-map's OLD from NEW; a newline splits the flags) stops the build."""
    for bad in ("/opt/py=evil/include", "/opt/py\n-fplugin=x/include", "relative/include"):
        fake = tmp_path / f"py{abs(hash(bad))}"
        fake.write_text(
            f"#!/bin/sh\nprintf '%s\\n' {json.dumps(json.dumps([bad, bad]))}\n"
        )
        fake.chmod(0o755)
        with pytest.raises(PinwheelError) as info:
            headerview.prefix_maps([fake], canonical.CANONICAL_ROOT, tmp_path / "cache")
        assert str(fake) in str(info.value.where)
        assert info.value.next


def test_machine_placeholders_name_the_cache_and_an_outside_build_python(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (tmp_path / "link").symlink_to(cache)
    outside = tmp_path / "py" / "bin" / "python"
    got = machine_placeholders(tmp_path / "link", str(outside))
    assert got == {
        str(tmp_path / "link"): "$CACHE", str(cache): "$CACHE",
        str(outside.parent): "$BUILD_PYTHON_DIR",
    }  # fmt: skip
    # A Python inside the cache is named by the cache; a system directory is no machine path.
    assert machine_placeholders(cache, str(cache / "venvs" / "v" / "bin" / "python")) == {
        str(cache): "$CACHE"
    }
    assert machine_placeholders(cache, "/usr/bin/python3") == {str(cache): "$CACHE"}
    path = os.pathsep.join([f"{outside.parent}", f"{outside.parent}2", "/usr/bin"])
    # Only where the path ends or a "/" follows: its namesake folder keeps its name.
    assert portable(path, got) == os.pathsep.join(["$BUILD_PYTHON_DIR", f"{outside.parent}2", "/usr/bin"])
    assert portable(f"-I{cache}/include", got) == "-I$CACHE/include"
    assert portable(str(cache) + "-old/x", got) == str(cache) + "-old/x"
    assert portable("a\\b", {"a": "$X\\1"}) == "$X\\1\\b"  # a name is taken as written

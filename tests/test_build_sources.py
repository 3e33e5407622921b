"""Build-time sources on a real fixture upstream: plan flags them, lock pins them, build
supplies them offline, an unpinned one stops the build before it compiles, a download the
tree hides from pinwheel fails the build by name, and provenance lists what went in.

Real git repositories (an engine upstream and a dependency with a moving tag), the real
CLI, real CMake (FetchContent with a PATCH_COMMAND), a real setuptools build; the device
code is tinyproject's stand-in (no CUDA toolkit here), so the build runs with cuda=False.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gitfixture import UPSTREAM_URL, Upstream, manifest_text
from pinwheel.compile.pipeline import BuildRequest
from pinwheel.compile.pipeline import build as run_build
from pinwheel.errors import ManifestError, PinwheelError
from pinwheel.manifest import load
from pinwheel.options import host as host_of
from pinwheel.release.assemble import release_config, render_notes
from pinwheel.source.replay import replay_manifest
from pinwheel.wheels.provenance import component, read_receipt
from tinyproject import BUILD_TABLE, STANDIN_SETUP, project_files

DEP_URL = "https://example.invalid/demodep.git"
PY = f"{sys.version_info.major}.{sys.version_info.minor}"

pytestmark = pytest.mark.skipif(
    not (shutil.which("cmake") and shutil.which("patch") and shutil.which("gcc")),
    reason="needs cmake, GNU patch and gcc",
)

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.16)
project(demo NONE)
include(FetchContent)
set(DEMODEP_TAG v1.0)
if (DEFINED ENV{DEMO_DEP_SRC_DIR})
  set(DEMO_DEP_SRC_DIR $ENV{DEMO_DEP_SRC_DIR})
endif()
if(DEMO_DEP_SRC_DIR)
  FetchContent_Declare(demodep SOURCE_DIR ${DEMO_DEP_SRC_DIR})
else()
  FetchContent_Declare(
    demodep
    GIT_REPOSITORY https://example.invalid/demodep.git
    GIT_TAG ${DEMODEP_TAG}
    PATCH_COMMAND patch --batch --forward -p1 -l -i ${CMAKE_CURRENT_LIST_DIR}/patches/dep.patch
  )
endif()
FetchContent_MakeAvailable(demodep)
file(READ ${demodep_SOURCE_DIR}/VALUE.txt value)
file(WRITE ${CMAKE_BINARY_DIR}/dep_value.txt "${value}")
if(DEFINED ENV{DEMO_HIDDEN})
  # Declared where pinwheel's reading of the CMake cannot judge it (a macro body):
  # only the network fence catches this one.
  macro(hidden_fetch)
    FetchContent_Declare(hiddendep GIT_REPOSITORY https://example.invalid/hidden.git GIT_TAG main)
    FetchContent_MakeAvailable(hiddendep)
  endmacro()
  hidden_fetch()
endif()
"""

# tinyproject's stand-in build, plus the CMake configure the real engine's setup.py runs.
SETUP = STANDIN_SETUP.replace(
    "        os.unlink(fb)\n",
    "        os.unlink(fb)\n"
    "        import shlex, shutil\n"
    "        cm = os.path.join(self.build_lib, '..', 'cmake-build')\n"
    "        subprocess.check_call(['cmake', '-S', '.', '-B', cm,\n"
    "                               *shlex.split(os.environ.get('CMAKE_ARGS', ''))])\n"
    "        shutil.copy(os.path.join(cm, 'dep_value.txt'), os.path.join(pkg, 'dep_value.txt'))\n",
)
PATCH = """\
--- a/VALUE.txt
+++ b/VALUE.txt
@@ -1 +1 @@
-one
+one, patched
"""


def make(tmp: Path) -> tuple[Upstream, Upstream, str, str]:
    dep = Upstream(tmp / "dep")
    v1 = dep.commit({"VALUE.txt": "one\n"}, "dep: one")
    subprocess.run(["git", "tag", "v1.0"], cwd=dep.work, check=True)
    dep.commit({"VALUE.txt": "two\n"}, "dep: two (main moved on)")
    dep.publish()
    subprocess.run(["git", "push", "-q", str(dep.bare), "v1.0"], cwd=dep.work, check=True)
    up = Upstream(tmp / "gh")
    files = project_files(SETUP) | {"CMakeLists.txt": CMAKELISTS, "patches/dep.patch": PATCH}
    files["docs/big.bin"] = "not needed by the build\n"
    base = up.commit(files, "demo: initial")
    up.publish()
    return up, dep, base, v1


def manifest(tmp: Path, base: str, extra: str = "") -> Path:
    table = BUILD_TABLE.format(python=PY, ptx="false", extra_env=extra, threads=1)
    table = table.replace('"tiny/__init__.py"]', '"tiny/__init__.py", "tiny/dep_value.txt"]')
    table += 'exclude = ["docs/**"]\nnetwork = "none"\n'
    path = tmp / "m.toml"
    path.write_text(manifest_text(base, [], extra=table))
    return path


def cli(tmp: Path, up: Upstream, dep: Upstream, m: Path, *args: str):
    env = dict(os.environ, PINWHEEL_MIRRORS=f"{UPSTREAM_URL}={up.bare} {DEP_URL}={dep.bare}")
    cmd = [sys.executable, "-m", "pinwheel", "--manifest", str(m), "--cache", str(tmp / "c")]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, cwd=tmp)


def build(tmp: Path, up: Upstream, dep: Upstream, m: Path, environ: dict[str, str] | None = None):
    mirrors = {UPSTREAM_URL: str(up.bare), DEP_URL: str(dep.bare)}
    manifest = load(m)
    replayed = replay_manifest(manifest, cache=tmp / "c", mirrors=mirrors)
    request = BuildRequest(
        manifest=manifest,
        cache=tmp / "c",
        out_dir=tmp / "wheels",
        host=host_of({**os.environ, **(environ or {})}),
        mirrors=mirrors,
        replayed=replayed,
        kernels=(),
        cuda=False,  # the stand-in compiler needs no toolkit (tinyproject.py)
    )
    return run_build(request)


def test_plan_flags_lock_pins_and_build_supplies_offline(tmp_path: Path) -> None:
    up, dep, base, v1 = make(tmp_path)
    m = manifest(tmp_path, base)
    plan = cli(tmp_path, up, dep, m, "--json", "plan")
    assert plan.returncode == 0, plan.stderr
    (src,) = json.loads(plan.stdout)["build_sources"]["sources"]
    assert (src["name"], src["url"], src["ref"]) == ("demodep", DEP_URL, "v1.0")
    assert (src["used"], src["pinned"], src["status"]) == ("yes", False, "UNPINNED")
    assert src["variables"] == ["DEMO_DEP_SRC_DIR"] and src["patches"] == ["patches/dep.patch"]

    # A declared source without a pin stops the build before anything compiles.
    with pytest.raises(ManifestError) as err:
        build(tmp_path, up, dep, m)
    assert "demodep" in err.value.what and "pinwheel lock" in (err.value.next or "")
    assert not (tmp_path / "wheels").exists()

    locked = cli(tmp_path, up, dep, m, "lock")
    assert locked.returncode == 0, locked.stderr
    pinned = load(m).build.sources  # type: ignore[union-attr]
    assert [(s.name, s.commit, s.ref) for s in pinned] == [("demodep", v1, "v1.0")]

    outcome = build(tmp_path, up, dep, m)
    (wheel,) = outcome.wheels.built
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("tiny/dep_value.txt") == b"one, patched\n"  # the tag's commit + patch
        assert not [n for n in zf.namelist() if n.startswith("docs/")]
    engine = component(read_receipt(tmp_path / "wheels" / "provenance.json"), "engine")
    assert engine is not None
    (rec,) = engine["sources"]
    assert (rec["name"], rec["url"], rec["commit"], rec["ref"]) == ("demodep", DEP_URL, v1, "v1.0")
    assert rec["patches"][0]["path"] == "patches/dep.patch" and len(rec["sha256"]) == 64
    assert engine["excluded"] == ["docs/**"]
    assert engine["network"] in ("none", "host (no network namespace available)")
    notes = render_notes(load(m), read_receipt(tmp_path / "wheels" / "provenance.json"), {},
                         None, release_config(load(m)))  # fmt: skip
    assert f"- `demodep`: `{DEP_URL}` @ `{v1}` (declared `v1.0`)" in notes

    # drift: the pin still matches the tag; after the tag moves, drift says so.
    ok = cli(tmp_path, up, dep, m, "drift")
    assert ok.returncode == 0 and "demodep: ok" in ok.stdout, ok.stderr
    subprocess.run(["git", "tag", "-f", "v1.0", "main"], cwd=dep.work, check=True)
    subprocess.run(["git", "push", "-q", "-f", str(dep.bare), "v1.0"], cwd=dep.work, check=True)
    moved = cli(tmp_path, up, dep, m, "drift")
    assert f"demodep: ref moved to {dep.rev('main')[:12]}" in moved.stdout


def test_a_download_pinwheel_cannot_see_fails_the_build_by_name(tmp_path: Path) -> None:
    if subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode != 0:
        pytest.skip("no network namespace here (unshare -rn): the fence this test checks")
    up, dep, base, _ = make(tmp_path)
    # Declared in [build] env: the caller's environment never reaches the engine build.
    m = manifest(tmp_path, base, extra=', DEMO_HIDDEN = "1"')
    assert cli(tmp_path, up, dep, m, "lock").returncode == 0
    with pytest.raises(PinwheelError) as err:
        build(tmp_path, up, dep, m)
    assert "https://example.invalid/hidden.git" in err.value.what
    assert "tried to download" in err.value.what
    assert not (tmp_path / "wheels").exists()  # nothing published


OMIT_CMAKELISTS = """\
cmake_minimum_required(VERSION 3.16)
project(omitdemo NONE)
include(FetchContent)
FetchContent_Declare(bigdep SOURCE_DIR $ENV{BIGDEP_SRC_DIR})
FetchContent_MakeAvailable(bigdep)
install(DIRECTORY ${bigdep_SOURCE_DIR}/ DESTINATION pkg FILES_MATCHING PATTERN "*.py")
"""


def test_an_omitted_source_is_a_stand_in_real_cmake_accepts(tmp_path: Path) -> None:
    """CMake refuses an empty SOURCE_DIR ("not an existing non-empty directory", as the
    real 1Cat-vLLM triton_kernels declaration does): the stand-in holds only a marker, which
    no build step installs, and the record says what is missing and why."""
    from pinwheel.compile.sources import OMITTED_MARKER, source_env, supply
    from pinwheel.manifest.build import BuildSource
    from pinwheel.source.cache import Cache

    src = BuildSource(
        name="bigdep", url="https://example.invalid/big.git", commit=None, ref="v3.5.1",
        variables=("BIGDEP_SRC_DIR",), patches=(), submodules=(), exclude=(), omit=True,
        reason="over the mirror size limit", used="yes",
    )  # fmt: skip
    (supplied,) = supply([src], project=tmp_path, dest=tmp_path / "deps",
                         cache=Cache(tmp_path / "c", {}))  # fmt: skip
    assert supplied.omitted and supplied.record()["reason"] == "over the mirror size limit"
    assert [p.name for p in supplied.path.iterdir()] == [OMITTED_MARKER]
    assert "over the mirror size limit" in (supplied.path / OMITTED_MARKER).read_text()

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "CMakeLists.txt").write_text(OMIT_CMAKELISTS)
    env = {**os.environ, **source_env([supplied])}
    for args in (["-S", str(proj), "-B", str(proj / "b")],
                 ["--install", str(proj / "b"), "--prefix", str(tmp_path / "inst")]):  # fmt: skip
        done = subprocess.run(["cmake", *args], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
    assert not list((tmp_path / "inst").rglob("*.txt"))  # the marker is not installed


def test_a_new_build_source_pin_is_no_reuse_of_compiled_members(tmp_path: Path) -> None:
    """Same tree, new dependency commit: what the compilers read from outside the tree
    changed, so --reuse-from must rebuild (and the wheel must carry the new source)."""
    up, dep, base, _ = make(tmp_path)
    m = manifest(tmp_path, base)
    assert cli(tmp_path, up, dep, m, "lock").returncode == 0
    build(tmp_path, up, dep, m)
    first = tmp_path / "first"
    (tmp_path / "wheels").rename(first)

    three = dep.commit({"VALUE.txt": "one\nthree\n"}, "dep: three")
    dep.publish()
    text = m.read_text()
    (pinned,) = load(m).build.sources  # type: ignore[union-attr]
    m.write_text(text.replace(str(pinned.commit), three))

    mirrors = {UPSTREAM_URL: str(up.bare), DEP_URL: str(dep.bare)}
    manifest_ = load(m)
    request = BuildRequest(
        manifest=manifest_, cache=tmp_path / "c", out_dir=tmp_path / "wheels",
        host=host_of(os.environ), mirrors=mirrors,
        replayed=replay_manifest(manifest_, cache=tmp_path / "c", mirrors=mirrors),
        kernels=(), cuda=False, reuse_from=str(first),
    )  # fmt: skip
    outcome = run_build(request)
    (wheel,) = outcome.wheels.built
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("tiny/dep_value.txt") == b"one, patched\nthree\n"
    engine = component(read_receipt(tmp_path / "wheels" / "provenance.json"), "engine")
    assert engine is not None and "reused" not in engine
    identity = engine["compiled_inputs"]["identity"]
    (src,) = identity["inputs"]["sources"]
    assert (src["name"], src["commit"]) == ("demodep", three)
    # No machine path in the identity: a release built elsewhere can be reused here.
    assert str(tmp_path) not in json.dumps(identity)
    assert identity["env"]["DEMO_DEP_SRC_DIR"] == "$WORK/deps/demodep"


def test_a_relative_cache_is_made_absolute_before_any_path_under_it_is_handed_on(
    tmp_path: Path, monkeypatch
) -> None:
    """`--cache c`: build sources' variables, provenance and the reuse identity name paths
    under the cache; a relative one would point elsewhere once the build changes directory,
    and would turn every "c" in a recorded value into "$CACHE"."""
    import argparse

    from pinwheel.cli import ctx_cache, default_cache

    monkeypatch.chdir(tmp_path)
    assert ctx_cache(argparse.Namespace(cache="c")) == tmp_path / "c"
    monkeypatch.setenv("PINWHEEL_CACHE", "rel")
    assert default_cache() == tmp_path / "rel"


def test_a_kept_workspace_keeps_an_unchanged_build_source_and_restores_a_touched_one(
    tmp_path: Path,
) -> None:
    """The second build reuses deps/<name> without exporting it again (its files are not
    even touched); a file changed since is noticed by its time and the source exported
    again, so the wheel still holds the pinned, patched bytes."""
    up, dep, base, _ = make(tmp_path)
    m = manifest(tmp_path, base)
    assert cli(tmp_path, up, dep, m, "lock").returncode == 0
    first = build(tmp_path, up, dep, m)  # a fresh workspace: the export is moved into place
    (first_wheel,) = first.wheels.built
    first_bytes = first_wheel.read_bytes()
    (value,) = (tmp_path / "c" / "build").glob("*/deps/demodep/VALUE.txt")
    assert value.read_text() == "one, patched\n"
    touched = value.stat().st_ctime_ns
    (record,) = (tmp_path / "c" / "build").glob("*/deps-demodep.kept.json")

    # Same pins, same files: kept as it is, without its repository (both copies moved away:
    # an export would fail).
    repos = [p for p in (tmp_path / "c" / "repos").iterdir() if "demodep" in p.name]
    assert repos
    for p in [dep.bare, *repos]:
        p.rename(p.with_name(p.name + ".away"))
    build(tmp_path, up, dep, m)
    assert value.stat().st_ctime_ns == touched
    for p in [dep.bare, *repos]:
        p.with_name(p.name + ".away").rename(p)

    value.write_text("tampered\n")  # written after the export: another mtime
    outcome = build(tmp_path, up, dep, m)
    assert value.read_text() == "one, patched\n"
    (wheel,) = outcome.wheels.built
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("tiny/dep_value.txt") == b"one, patched\n"
    # restored file by file into the kept workspace: the bytes of the fresh, moved export
    assert wheel.read_bytes() == first_bytes
    assert json.loads(record.read_text())["files"]["VALUE.txt"][0] == len("one, patched\n")

    record.write_text("{not json")  # a damaged record is no reason to fail: export again
    build(tmp_path, up, dep, m)
    assert value.read_text() == "one, patched\n"
    assert json.loads(record.read_text())["key"]


def test_a_download_is_named_with_its_url_in_cmake_4s_wrapped_message() -> None:
    """CMake 4 puts the URL of a failed clone on a line of its own; the build python's venv
    (whose cmake the engine build uses) writes it that way."""
    from pinwheel.compile.sources import undeclared_downloads

    log = ("CMake Error at x-gitclone.cmake:55 (message):\n  Failed to clone repository:\n\n"
           "    'https://example.invalid/hidden.git'\n\n")  # fmt: skip
    assert undeclared_downloads(log, ()) == [
        "Failed to clone repository: 'https://example.invalid/hidden.git'"
    ]

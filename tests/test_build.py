"""The engine build driver on a real replayed tree: a tiny setuptools project in a real git
upstream, replayed by the real engine, built with `python -m build --no-isolation`, checked,
checksummed and recorded. Device code comes from a stand-in (see tinyproject.py); the slow
tests build a real .cu with nvcc 12.4."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from gitfixture import UPSTREAM_URL, Upstream, git, manifest_text
from pinwheel.compile.engine import BuildError
from pinwheel.compile.pipeline import BuildRequest
from pinwheel.compile.pipeline import build as run_build
from pinwheel.compile.verify import compare_builds
from pinwheel.errors import VerifyError
from pinwheel.manifest import load
from pinwheel.options import host as host_of
from pinwheel.source.export import export_tree
from pinwheel.source.replay import replay_manifest
from pinwheel.wheels.provenance import component, read_receipt
from tinyproject import BUILD_TABLE, STANDIN_SETUP, project_files

PY = f"{sys.version_info.major}.{sys.version_info.minor}"
# The tiny engine's _C.so needs only GLIBC_2.2.5 symbols and libc: auditwheel's lowest policy
# holds, so publish() retags the wheel the build made as linux_x86_64.
WHEEL = f"tiny-0.4.1.dev3+pw.tinycard.cpu-cp{PY.replace('.', '')}-cp{PY.replace('.', '')}-manylinux_2_5_x86_64.whl"

pytestmark = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("objcopy")), reason="needs gcc and objcopy"
)


@dataclass
class Tiny:
    up: Upstream
    tmp: Path
    base: str
    pr_head: str

    def manifest(
        self, *, ptx: str = "false", extra_env: str = "", name: str = "m.toml", threads: int = 2
    ) -> Path:
        table = BUILD_TABLE.format(python=PY, ptx=ptx, extra_env=extra_env, threads=threads)
        path = self.tmp / name
        path.write_text(
            manifest_text(
                self.base, [{"action": "pick", "pr": 7, "head": self.pr_head}], extra=table
            )
        )
        return path

    def replay(self, manifest: Path):
        return replay_manifest(
            load(manifest), cache=self.tmp / "cache", mirrors={UPSTREAM_URL: str(self.up.bare)}
        )


def make_tiny(
    tmp: Path, setup_py: str = STANDIN_SETUP, extra: dict[str, str] | None = None
) -> Tiny:
    up = Upstream(tmp / "gh")
    base = up.commit(project_files(setup_py, extra), "tiny: initial")
    up.checkout("main", "pr7")
    head = up.commit(
        {"tiny/__init__.py": '"""tiny, patched by PR 7."""\nPATCHED = True\n'},
        "tiny: mark patched",
        author="Pat Ch <pat@example.org>",
    )
    up.checkout("main")
    up.publish({7: "pr7"})
    return Tiny(up, tmp, base, head)


@pytest.fixture
def tiny(tmp_path: Path) -> Tiny:
    return make_tiny(tmp_path)


def request(tiny: Tiny, manifest: Path, out: Path, result, work: str = "work", **kw):
    return BuildRequest(
        manifest=load(manifest),
        cache=tiny.tmp / "cache",
        out_dir=out,
        host=host_of(os.environ),
        replayed=result,
        kernels=(),
        cuda=False,  # the stand-in compiler needs no toolkit (tinyproject.py)
        engine_workdir=tiny.tmp / work,
        **kw,
    )


def build(tiny: Tiny, manifest: Path, out: Path, work: str = "work"):
    result = tiny.replay(manifest)
    return result, run_build(request(tiny, manifest, out, result, work))


def test_build_checks_sums_and_records_provenance(tiny: Tiny) -> None:
    manifest = tiny.manifest()
    out = tiny.tmp / "wheels"
    result, outcome = build(tiny, manifest, out)
    assert [p.name for p in outcome.wheels.built] == [WHEEL]
    assert outcome.wheels.report.ok
    # SHA256SUMS in sha256sum -c format, checked by the real tool.
    assert (out / "SHA256SUMS").read_text().endswith(f"  {WHEEL}\n")
    subprocess.run(
        ["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=out, check=True, capture_output=True
    )
    # The replayed tree (PR 7 applied) is what was built, with the environment we set.
    with zipfile.ZipFile(out / WHEEL) as zf:
        assert b"PATCHED = True" in zf.read("tiny/__init__.py")
        env = dict(line.split("=", 1) for line in zf.read("tiny/build_env.txt").decode().split())
    base_time = int(git(tiny.up.work, "show", "-s", "--format=%ct", tiny.base))
    assert env == {
        "TORCH_CUDA_ARCH_LIST": "7.0",
        "CUDAARCHS": "70-real",
        "MAX_JOBS": "2",
        "NVCC_THREADS": "2",
        "SOURCE_DATE_EPOCH": str(base_time),
        "VLLM_VERSION_OVERRIDE": "0.4.1.dev3+pw.tinycard.cpu",
    }
    receipt = read_receipt(out / "provenance.json")
    assert receipt["manifest"]["sha256"] == load(manifest).sha256
    assert receipt["upstream"] == {"url": UPSTREAM_URL, "branch": "main", "base": tiny.base}
    (step,) = receipt["steps"]
    assert (step["pr"], step["head"], step["result_head"]) == (7, tiny.pr_head, result.head)
    assert step["commits"][0]["original"] == tiny.pr_head
    assert step["commits"][0]["replayed"] == result.steps[0].commits[0].replayed
    assert step["commits"][0]["author"] == "Pat Ch <pat@example.org>"
    assert (receipt["head"], receipt["tree"]) == (result.head, result.tree)
    assert receipt["arches"] == ["sm_70"]
    assert receipt["version"] == "0.4.1.dev3+pw.tinycard.cpu"
    assert receipt["wheels"] == {WHEEL: outcome.to_json()["wheels"][WHEEL]}
    assert receipt["built"] == [WHEEL]
    assert receipt["source_date_epoch"] == base_time
    assert receipt["toolchain"]["python"].startswith(PY)
    engine = component(receipt, "engine")
    assert engine is not None and engine["wheel"] == WHEEL and engine["kind"] == "engine"
    assert engine["source"]["tree"] == result.tree
    assert engine["platform_tag"]["platform"] == "manylinux_2_5_x86_64"
    assert engine["floor"] == {}  # probe.c calls nothing from libc: no versioned symbol
    assert engine["env"]["TORCH_CUDA_ARCH_LIST"] == "7.0"
    assert engine["command"][-6:] == [
        "build",
        "--wheel",
        "--no-isolation",
        "--outdir",
        "$WORK/dist",
        ".",
    ]


def test_rebuild_is_identical_and_a_changed_build_names_the_members(tiny: Tiny) -> None:
    manifest = tiny.manifest()
    first, second = tiny.tmp / "wheels", tiny.tmp / "again"
    build(tiny, manifest, first)
    build(tiny, manifest, second)  # a fresh export into the same scratch path
    same = compare_builds(first, second)
    assert same.same and same.wheels[0].rebuilt == same.wheels[0].recorded
    # Another NVCC_THREADS changes build_env.txt, hence RECORD: the diff must name both.
    changed = tiny.manifest(threads=1, name="changed.toml")
    other = tiny.tmp / "other"
    build(tiny, changed, other)
    diff = compare_builds(first, other)
    assert not diff.same
    (wheel,) = diff.wheels
    assert {(m.member, m.change) for m in wheel.members} == {
        ("tiny/build_env.txt", "differs"),
        ("tiny-0.4.1.dev3+pw.tinycard.cpu.dist-info/RECORD", "differs"),
    }
    lines = diff.human_lines()
    assert lines[-1] == "NOT reproducible: 0/1 wheel(s) identical"
    assert any("differs: tiny/build_env.txt" in ln for ln in lines)


def test_wheel_without_sm70_never_reaches_wheels_dir(tiny: Tiny) -> None:
    manifest = tiny.manifest(extra_env=', TINY_FORCE_SM = "75"')
    out = tiny.tmp / "wheels"
    with pytest.raises(VerifyError) as err:
        build(tiny, manifest, out)
    text = str(err.value)
    assert f"{WHEEL}: tiny/_C.so: no SASS for sm_70: found sm_75, need sm_70" in text
    assert not list(out.glob("*.whl")) and not (out / "SHA256SUMS").exists()


def test_failing_build_names_the_log_and_shows_its_tail(tiny: Tiny) -> None:
    manifest = tiny.manifest()
    result = tiny.replay(manifest)
    source = export_tree(result, tiny.tmp / "work" / "src")
    (source / "csrc" / "probe.c").write_text("int broken( {\n")
    with pytest.raises(BuildError) as err:
        run_build(request(tiny, manifest, tiny.tmp / "wheels", result, engine_source=source))
    assert "wheel build failed" in err.value.what
    assert "probe.c" in err.value.what  # gcc's message is in the tail
    assert "build.log" in (err.value.where or "")


def _cli(tiny: Tiny, manifest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "pinwheel",
        "--manifest",
        str(manifest),
        "--cache",
        str(tiny.tmp / "cache"),
        "--offline",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tiny.tmp)


def test_cli_verify_build_refuses_a_changed_manifest_or_missing_receipt(tiny: Tiny) -> None:
    manifest = tiny.manifest()
    out = tiny.tmp / "wheels"
    build(tiny, manifest, out)
    edited = tiny.manifest(threads=3)  # same path, different bytes
    proc = _cli(tiny, edited, "verify-build", "--wheels", str(out))
    assert proc.returncode == 5, proc.stderr
    assert "m.toml changed since this build" in proc.stderr
    empty = tiny.tmp / "empty"
    empty.mkdir()
    proc = _cli(tiny, edited, "verify-build", "--wheels", str(empty))
    assert proc.returncode == 6 and "no provenance.json in" in proc.stderr


def test_engine_workspace_is_kept_updated_in_place_and_wiped_when_cold(tiny: Tiny) -> None:
    """The default engine workspace (one per manifest, under the cache, seen at the canonical
    path) survives a rebuild: unchanged files keep their mtime, the builder's products stay;
    a cold build (--no-cache, verify-build) starts from nothing."""
    import dataclasses

    from pinwheel.compile import canonical, workspace

    manifest = tiny.manifest()
    result = tiny.replay(manifest)

    def once(out: str, environ=None, **kw):
        req = dataclasses.replace(request(tiny, manifest, tiny.tmp / out, result, **kw),
                                  engine_workdir=None)  # fmt: skip
        if environ is not None:
            req = dataclasses.replace(req, host=host_of(environ))
        return run_build(req)

    first = once("w1")
    work = tiny.tmp / "cache" / "build" / load(manifest).name
    setup = work / "src" / "setup.py"
    exported = setup.stat()
    assert exported.st_mtime == workspace.SOURCE_MTIME  # one time for every exported file
    old = 1_000_000_000
    os.utime(work / "build.log", ns=(old, old))
    (work / "src" / "build").mkdir(exist_ok=True)
    (work / "src" / "build" / "product.o").write_text("left by the builder")
    second = once("w2")
    assert second.wheels.wheels == first.wheels.wheels  # same bytes
    assert setup.stat().st_ino == exported.st_ino  # not rewritten: nothing to recompile
    assert (work / "src" / "build" / "product.o").is_file()
    # Nothing changed at all: the builder did not even run (its log is the first build's).
    assert (work / "build.log").stat().st_mtime_ns == old
    # A compiler flag of the caller's environment never reaches the build (buildenv's
    # declared environment): nothing to do.
    once("w2a", environ={**os.environ, "CFLAGS": "-O1"})
    assert (work / "build.log").stat().st_mtime_ns == old
    # A declared value the build is given changed (CMAKE_ARGS, recorded): the builder runs
    # (incrementally).
    third = once("w2b", environ={**os.environ, "CMAKE_ARGS": "-DTINY_OPTION=1"})
    assert (work / "build.log").stat().st_mtime_ns != old
    assert third.wheels.wheels == first.wheels.wheels  # the stand-in ignores CFLAGS
    assert setup.stat().st_ino == exported.st_ino
    assert (work / "src" / "build" / "product.o").is_file()  # no source changed
    engine = read_receipt(tiny.tmp / "w2" / "provenance.json")["components"][0]
    assert engine["canonical"]["path"] == str(canonical.CANONICAL_CACHE)
    assert str(tiny.tmp) not in json_text(engine["env"])
    cold = once("w3", compiler_cache=False)
    assert cold.wheels.wheels == first.wheels.wheels
    assert not (work / "src" / "build" / "product.o").exists()


def json_text(value: object) -> str:
    import json

    return json.dumps(value)


def _repack(dist_name: str, directory: Path) -> Path:
    """A wheel of an installed distribution (its RECORD files zipped with a fresh RECORD):
    the build venv installs it offline with --require-hashes, as it would from an index."""
    import base64
    import hashlib
    import importlib.metadata

    dist = importlib.metadata.distribution(dist_name)
    name, version = dist.metadata["Name"].replace("-", "_"), dist.version
    target = directory / f"{name}-{version}-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    rows, record = [], None
    with zipfile.ZipFile(target, "w") as zf:
        for f in dist.files or ():
            rel = str(f)
            if rel.endswith(".dist-info/RECORD") and rel.count("/") == 1:  # not a vendored one
                record = rel
                continue
            src = Path(str(f.locate()))
            if rel.startswith("..") or "__pycache__" in rel or not src.is_file():
                continue
            data = src.read_bytes()
            zf.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append(f"{rel},sha256={digest.decode()},{len(data)}")
        assert record is not None
        zf.writestr(record, "\n".join([*rows, f"{record},,"]) + "\n")
    return target


def test_provenance_records_the_build_venv_not_pinwheels_interpreter(tiny: Tiny) -> None:
    """With [build.requirements], the engine builds in that venv: provenance's python/torch
    and the torch pin install reads come from it. The caller's PINWHEEL_BUILD_PYTHON here
    sees a stand-in torch 9.9.9 (a module on its path, said so); the venv has no torch."""
    import hashlib

    wheelhouse = tiny.tmp / "wheelhouse"
    lines = []
    # `python -m build --wheel --no-isolation` needs them in the venv (build, its
    # pyproject_hooks, setuptools): the venv holds nothing the lock does not (no ensurepip
    # setuptools)
    for dist in ("setuptools", "wheel", "packaging", "build", "pyproject_hooks"):
        made = _repack(dist, wheelhouse)
        digest = hashlib.sha256(made.read_bytes()).hexdigest()
        lines.append(f"{dist}=={made.name.split('-')[1]} --hash=sha256:{digest}\n")
    reqs = tiny.tmp / "build-requirements.txt"
    reqs.write_text("".join(lines))
    fake = tiny.tmp / "fake-torch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text('__version__ = "9.9.9"\n')
    wrapper = tiny.tmp / "python-with-torch"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{fake}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    manifest = tiny.manifest()
    sha = hashlib.sha256(reqs.read_bytes()).hexdigest()
    manifest.write_text(
        manifest.read_text().replace(
            "[build]\n", f'[build]\nrequirements = {{ path = "{reqs.name}", sha256 = "{sha}" }}\n'
        )
    )
    result = tiny.replay(manifest)
    out = tiny.tmp / "wheels"
    req = request(tiny, manifest, out, result, wheelhouse=wheelhouse, offline=True)
    req = dataclasses.replace(req, build_python=str(wrapper))  # $PINWHEEL_BUILD_PYTHON
    outcome = run_build(req)
    receipt = read_receipt(out / "provenance.json")
    assert receipt["toolchain"]["torch"] is None, receipt["toolchain"]
    assert receipt["torch"]["version"] is None
    # The venv, listed package by package before the builder ran, is the lock's.
    (engine,) = [c for c in receipt["components"] if c["kind"] == "engine"]
    env = engine["environment"]
    assert env["lock"] == f"[build.requirements] {reqs.name}" and env["lock_sha256"] == sha
    listed = {p["name"]: p for p in env["packages"]}
    names = ("setuptools", "wheel", "packaging", "build", "pyproject-hooks")
    assert {n: listed[n]["version"] for n in names} == env["pins"]
    assert set(listed) == set(env["pins"])  # no pip, no setuptools of ensurepip's
    assert all(len(p["record_sha256"]) == 64 and p["from"] == "lock" for p in listed.values())
    assert any(p.name == "build venv check" and p.did for p in outcome.phases)
    from pinwheel.compile.lockedvenv import recorded_against_lock

    assert recorded_against_lock(env, tiny.tmp) == ([], [])
    moved = {**env, "pins": {**env["pins"], "wheel": "0.0.1"}}
    assert recorded_against_lock(moved, tiny.tmp)[0] == ["wheel is " + listed["wheel"]["version"]
                                                         + ", the lock says 0.0.1"]  # fmt: skip
    # A package installed into the venv by hand stops the next build before the builder.
    from pinwheel.compile.lockedvenv import LockedVenvError

    (venv,) = (tiny.tmp / "cache" / "venvs").glob("build-*[!g]")
    (site,) = venv.glob("lib/python3*/site-packages")
    info = site / "stowaway-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stowaway\nVersion: 0.1\n")
    (info / "RECORD").write_text("stowaway-0.1.dist-info/METADATA,,\n")
    with pytest.raises(LockedVenvError, match="stowaway 0.1 is in the venv but not in the lock"):
        run_build(dataclasses.replace(req, out_dir=tiny.tmp / "wheels-2"))


def test_an_update_stopped_before_invalidation_rebuilds_the_tree(tiny: Tiny) -> None:
    """File times are fixed, so an export rewritten by a run that stopped before it
    removed what the change reached would look up to date forever: the next build
    finds the mark that run left and starts the build tree from scratch."""
    from pinwheel.compile import workspace

    manifest = tiny.manifest()
    result = tiny.replay(manifest)

    def once(out: str):
        return run_build(dataclasses.replace(request(tiny, manifest, tiny.tmp / out, result),
                                             engine_workdir=None))  # fmt: skip

    first = once("w1")
    work = tiny.tmp / "cache" / "build" / load(manifest).name
    assert not (work / workspace.PENDING).exists()
    (work / "src" / "build").mkdir(exist_ok=True)
    (work / "src" / "build" / "product.o").write_text("built from the old export")
    assert workspace.begin_update(work) is False  # a run starts updating ... and dies
    again = once("w2")
    assert again.wheels.wheels == first.wheels.wheels
    assert not (work / "src" / "build" / "product.o").exists()  # the tree was not trusted
    assert not (work / workspace.PENDING).exists()


def test_the_engine_workspace_key_does_not_depend_on_the_checkouts_path(tmp_path: Path) -> None:
    """The same manifest from two checkouts keeps one engine workspace: its requirements
    file counts by its pinned sha256, not by where the checkout put it (a clone elsewhere
    wiped the kept 1Cat-vLLM build tree and exported its build sources again)."""
    from pinwheel.compile import canonical
    from pinwheel.compile.produce import engine_key
    from pinwheel.manifest.build import Requirements

    examples = Path(__file__).resolve().parent.parent / "recipes" / "examples"
    keys = []
    for where in ("alice/src", "ci/checkout/deeper"):
        dest = tmp_path / where
        dest.mkdir(parents=True)
        for name in ("1cat-build.toml", "1cat-build-requirements.txt"):
            shutil.copy(examples / name, dest / name)
        config = load(dest / "1cat-build.toml").require("build")
        canon = canonical.Canonical(tmp_path.resolve(), canonical.PREFIX_MAP)
        keys.append(engine_key(config, None, canon))
        other = dataclasses.replace(config, arches=("8.0",))
        assert engine_key(other, None, canon) != keys[-1]  # a real [build] value still counts
        # The kernels' torch lock never reaches the engine (nor does its path).
        kernels_torch = Requirements(dest / "torch-lock.txt", "a" * 64)
        assert engine_key(dataclasses.replace(config, torch_lock=kernels_torch), None, canon) == (
            keys[-1]
        )
    assert keys[0] == keys[1]


def test_an_engine_python_without_build_is_an_error_not_a_setup_py_fallback(
    tmp_path: Path,
) -> None:
    """Issue 52: no direct `setup.py bdist_wheel` (deprecated, another route to other
    bytes) where the build's Python lacks `build`: an error naming the requirements."""
    import venv

    from pinwheel.compile.engine import wheel_command
    from pinwheel.errors import PinwheelError

    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # no build module in it
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    with pytest.raises(PinwheelError) as err:
        wheel_command(str(bare / "bin" / "python"), tree, tmp_path / "out")
    assert "no `build` module" in err.value.what
    assert "[build.requirements]" in (err.value.next or "")
    assert wheel_command(sys.executable, tree, tmp_path / "out")[1:3] == ("-m", "build")

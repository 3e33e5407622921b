"""The hashed locks (locks/*.txt) and the locked build venvs, on real pip, uv and venvs.

Network: the package index (PyPI), as the rest of the default tests.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel.compile import lockedvenv, toollocks
from pinwheel.compile.buildvenv import parse_requirements
from pinwheel.options import host as host_of

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "locks"


# --------------------------------------------------------------------------- the committed locks


@pytest.mark.parametrize("spec", toollocks.LOCKS + (toollocks.JOINT,), ids=lambda s: s.name)
def test_every_lock_is_pinned_hashed_and_portable(spec: toollocks.LockSpec) -> None:
    path = LOCKS / spec.filename
    text = path.read_text()
    pins = parse_requirements(text, spec.filename)  # raises on a line without == and a hash
    assert pins
    assert "#    pinwheel lock --tools" in text  # the header names the command, not a path
    import tempfile

    machine = (str(ROOT), str(Path.home()), tempfile.gettempdir() + "/", sys.prefix, "/home/")
    for bad in ("--index-url", "--extra-index-url", "--find-links", "http://", "https://",
                "file:", *machine):  # fmt: skip
        assert bad not in text, (spec.filename, bad)
    if spec.project:  # pinwheel's backend is locked too: -e . --no-build-isolation
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name

        backend = _pyproject()["build-system"]["requires"]
        assert {canonicalize_name(Requirement(r).name) for r in backend} <= set(pins)


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.mark.parametrize("spec", [s for s in toollocks.LOCKS if s.project], ids=lambda s: s.name)
def test_each_pinwheel_lock_holds_its_extras(spec: toollocks.LockSpec) -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = _pyproject()["project"]
    wanted = list(project["dependencies"])
    for extra in spec.extras:
        wanted += project["optional-dependencies"][extra]
    for group in spec.groups:  # PEP 735 dependency groups (the developers' tools)
        wanted += _pyproject()["dependency-groups"][group]
    pins = parse_requirements((LOCKS / spec.filename).read_text(), spec.filename)
    for req in map(Requirement, wanted):
        assert canonicalize_name(req.name) in pins, (spec.filename, req.name)
        assert req.specifier.contains(pins[canonicalize_name(req.name)][0], prereleases=True)


def test_the_torch_and_cmake_build_locks_hold_what_the_builders_import() -> None:
    torch = parse_requirements((LOCKS / "torch-build.txt").read_text(), "torch-build.txt")
    assert {"setuptools", "wheel", "ninja", "packaging", "numpy", "psutil"} <= set(torch)
    cmake = parse_requirements((LOCKS / "cmake-build.txt").read_text(), "cmake-build.txt")
    assert {"scikit-build-core", "cmake", "ninja"} <= set(cmake)
    from pinwheel.compile import kernels

    assert not hasattr(kernels, "TORCH_BUILD_REQS")  # no unpinned list left beside the lock


def test_ci_and_every_nox_session_install_from_a_lock() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert "--require-hashes --no-deps -r locks/nox.txt" in run
    assert "pip install -q nox" not in run
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Call) and ast.unparse(d.func) == "nox.session"
            for d in node.decorator_list
        ):
            sessions += 1
            body = ast.unparse(node)
            assert "_install_locked(session" in body, node.name
            assert "session.install(" not in body, node.name  # nothing unlocked beside it
    assert sessions >= 7
    helper = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                  and n.name == "_install_locked")  # fmt: skip
    text = ast.unparse(helper)
    assert "'--require-hashes', '--no-deps'" in text and "'--no-build-isolation'" in text


def test_tools_replay_installs_from_the_lock_and_says_its_digest() -> None:
    script = (ROOT / "tools" / "replay").read_text()
    assert '--require-hashes --no-deps \\\n        -r "$lock"' in script
    assert "--no-deps --no-build-isolation" in script
    assert "sha256 $digest" in script
    assert "[${extras}]" not in script  # no unlocked extras install is left


# --------------------------------------------------------------------------- lock --tools


def test_refresh_writes_a_portable_lock_and_then_finds_nothing_to_change(tmp_path: Path) -> None:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(uv).exists():
        pytest.skip("uv is not installed here (the test extra installs it)")
    repo = tmp_path / "checkout"
    (repo / "locks").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, repo / name)
    for src in LOCKS.glob("*.in"):
        shutil.copy(src, repo / "locks" / src.name)
    environ = {**os.environ, "UV_INDEX_URL": "http://127.0.0.1:9/never-used"}  # dropped
    first = toollocks.refresh(repo, uv, environ, names=["cmake-build"])
    by = {r.name: r for r in first}
    assert set(by) == {"all", "cmake-build"}
    made = by["cmake-build"]
    assert made.old_sha256 is None and made.changed and "+scikit-build-core==" in made.diff
    text = (repo / "locks" / "cmake-build.txt").read_text()
    assert str(tmp_path) not in text and "127.0.0.1" not in text
    assert str(tmp_path) not in (repo / "locks" / "all.txt").read_text()
    parse_requirements(text, "cmake-build.txt")
    again = toollocks.refresh(repo, uv, os.environ, names=["cmake-build"], check=True)
    assert not any(r.changed for r in again), [r.diff for r in again]


# --------------------------------------------------------------------------- locked venvs


def _lock_of(names: set[str], tmp_path: Path) -> Path:
    """A lock holding ``names``' blocks, cut from the committed cmake-build lock (real hashes)."""
    blocks = re.split(r"\n(?=[a-z])", (LOCKS / "cmake-build.txt").read_text())
    keep = [b for b in blocks if b.split("==", 1)[0].strip() in names]
    assert len(keep) == len(names)
    out = tmp_path / "lock.txt"
    out.write_text("\n".join(keep) + "\n")
    return out


def _dist(site: Path, name: str, version: str) -> None:
    """A real (hand-written) installed distribution: METADATA and RECORD in a .dist-info."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


def _machine_python(tmp_path: Path) -> Path:
    """A machine Python with its own (older) packaging and a package of its own."""
    venv = tmp_path / "machine"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    _dist(site, "packaging", "1.0")
    _dist(site, "machinepkg", "2.0")
    return venv / "bin" / "python"


def test_locked_venv_is_the_lock_first_and_the_machine_after(tmp_path: Path) -> None:
    lock = _lock_of({"packaging", "pathspec"}, tmp_path)
    machine = _machine_python(tmp_path)

    def make(cache: Path) -> lockedvenv.LockedVenv:
        return lockedvenv.ensure(lockedvenv.LockedVenvRequest(
            lock=lock, lock_name="locks/test.txt", interpreter=str(machine), cache=cache,
            environ=dict(os.environ), kind="test-build", overlay_from=str(machine)))  # fmt: skip

    venv = make(tmp_path / "cache-a")
    packages = lockedvenv.listing(venv)
    first = {p["name"]: p for p in packages if not p["shadowed"]}
    assert first["packaging"]["from"] == "lock" and first["packaging"]["version"] == "26.4"
    assert first["machinepkg"] == {**first["machinepkg"], "from": "machine", "version": "2.0"}
    shadowed = [p for p in packages if p["shadowed"]]
    assert [(p["name"], p["version"], p["from"]) for p in shadowed] == [
        ("packaging", "1.0", "machine")]  # fmt: skip
    assert "pip" not in first and "setuptools" not in first  # nothing but the lock and machine
    record = lockedvenv.checked(venv, "test")
    assert record["lock_sha256"] == venv.lock_sha256 and record["machine_packages"] is True
    # The RECORD digest names the installed files, not where the venv is.
    other = lockedvenv.listing(make(tmp_path / "elsewhere" / "cache-b"))
    assert {p["name"]: p["record_sha256"] for p in other} == {
        p["name"]: p["record_sha256"] for p in packages}  # fmt: skip
    # Made once: the same request is the same venv, untouched.
    stamp = (venv.python.parent.parent / lockedvenv.READY).stat().st_mtime_ns
    assert make(tmp_path / "cache-a").python == venv.python
    assert (venv.python.parent.parent / lockedvenv.READY).stat().st_mtime_ns == stamp


def test_a_torch_venv_made_from_a_lock_is_listed_as_that_lock_not_the_machine(
    tmp_path: Path,
) -> None:
    """The overlay is a Python pinwheel made from a hashed torch lock: its packages are
    ``torch-lock``, provenance names that lock, and nothing says "machine packages"; the
    digest of what comes from outside the tool lock follows the overlay's files, not
    their label or where the venv lies."""
    lock = _lock_of({"packaging"}, tmp_path)
    machine = _machine_python(tmp_path)

    def make(cache: Path, overlay_lock: tuple[str, str] | None) -> lockedvenv.LockedVenv:
        return lockedvenv.ensure(lockedvenv.LockedVenvRequest(
            lock=lock, lock_name="locks/test.txt", interpreter=str(machine), cache=cache,
            environ=dict(os.environ), kind="test-build", overlay_from=str(machine),
            overlay_lock=overlay_lock))  # fmt: skip

    torch_lock = ("torch-9.9.9-cp311-x86_64.txt", "e" * 64)
    venv = make(tmp_path / "a", torch_lock)
    record = lockedvenv.checked(venv, "test")
    froms = {(p["name"], p["from"]) for p in record["packages"]}
    assert ("machinepkg", "torch-lock") in froms and ("packaging", "lock") in froms
    assert not any(f == "machine" for _, f in froms), froms
    assert record["machine_packages"] is False
    assert record["torch_lock"] == {"lock": torch_lock[0], "sha256": torch_lock[1]}
    plain = lockedvenv.checked(make(tmp_path / "elsewhere" / "b", None), "test")
    assert plain["machine_packages"] is True and "torch_lock" not in plain
    assert {(p["name"], p["from"]) for p in plain["packages"]} >= {("machinepkg", "machine")}
    digest = lockedvenv.outside_lock(record)
    assert digest == lockedvenv.outside_lock(plain)  # the same files, labelled otherwise
    (site,) = machine.parent.parent.glob("lib/python3*/site-packages")
    shutil.rmtree(site / "machinepkg-2.0.dist-info")
    _dist(site, "machinepkg", "2.0")  # same version, other files: another input
    (site / "machinepkg-2.0.dist-info" / "RECORD").write_text("machinepkg/rebuilt.py,,\n")
    assert lockedvenv.outside_lock(lockedvenv.checked(venv, "test")) != digest
    # the tool lock's own packages are not part of it
    assert lockedvenv.outside_lock({"packages": [
        p for p in record["packages"] if p["from"] != "lock"]}) == digest


def test_the_callers_pythonpath_cannot_stand_in_for_a_locked_package(tmp_path: Path) -> None:
    """A PYTHONPATH folder holding the locked version of a name (packaging 26.4): pip, run
    in the new venv with the caller's environment, took it as installed and left it out,
    and the build then imported the machine's older copy (a GPU box: "packaging comes from
    the machine (26.3), not the lock"). The venv holds every locked package itself."""
    lock = _lock_of({"packaging", "pathspec"}, tmp_path)
    machine = _machine_python(tmp_path)
    stray = tmp_path / "stray"
    _dist(stray, "packaging", "26.4")
    _dist(stray, "pathspec", "1.1.1")
    environ = dict(os.environ, PYTHONPATH=str(stray), PYTHONUSERBASE=str(stray))
    venv = lockedvenv.ensure(lockedvenv.LockedVenvRequest(
        lock=lock, lock_name="locks/test.txt", interpreter=str(machine),
        cache=tmp_path / "cache", environ=environ, kind="test-build",
        overlay_from=str(machine)))  # fmt: skip
    first = {p["name"]: p for p in lockedvenv.listing(venv) if not p["shadowed"]}
    assert first["packaging"]["from"] == "lock" and first["pathspec"]["from"] == "lock"
    lockedvenv.checked(venv, "test")  # no difference from the lock


def test_a_venv_that_drifted_from_its_lock_stops_before_the_build(tmp_path: Path) -> None:
    lock = _lock_of({"packaging"}, tmp_path)
    machine = _machine_python(tmp_path)
    venv = lockedvenv.ensure(lockedvenv.LockedVenvRequest(
        lock=lock, lock_name="locks/test.txt", interpreter=str(machine), cache=tmp_path / "c",
        environ=dict(os.environ), kind="test-build", overlay_from=str(machine)))  # fmt: skip
    (site,) = venv.python.parent.parent.glob("lib/python3*/site-packages")
    _dist(site, "stowaway", "0.1")  # installed by hand into the build env
    with pytest.raises(lockedvenv.LockedVenvError, match="stowaway 0.1 is in the venv but not"):
        lockedvenv.checked(venv, "test")
    shutil.rmtree(site / "stowaway-0.1.dist-info")
    for info in site.glob("packaging-*.dist-info"):
        shutil.rmtree(info)  # the lock's packaging gone: the machine's would be imported
    with pytest.raises(lockedvenv.LockedVenvError) as err:
        lockedvenv.checked(venv, "test")
    assert "packaging comes from the machine (1.0), not the lock" in err.value.what
    assert "delete that venv" in (err.value.next or "")


@pytest.mark.parametrize("site", ["/x\nimport os; os.system('true')", "relative/dir",
                                  "/x/\x1b[31mred"])  # fmt: skip
def test_a_machine_python_naming_hostile_directories_is_refused(tmp_path: Path, site: str) -> None:
    """The overlay's directories go into a .pth file, where a line starting with ``import``
    runs: a machine Python that reports one (a newline, a relative path, control
    characters) is refused before anything is written."""
    fake = tmp_path / "python"
    answer = json.dumps({"base": sys.executable, "version": "3.11.7", "site": [site]})
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer}\nEOF\n")
    fake.chmod(0o755)
    lock = _lock_of({"packaging"}, tmp_path)
    with pytest.raises(lockedvenv.LockedVenvError, match="machine Python"):
        lockedvenv.ensure(lockedvenv.LockedVenvRequest(
            lock=lock, lock_name="locks/test.txt", interpreter=sys.executable,
            cache=tmp_path / "c", environ={}, kind="test-build", overlay_from=str(fake)))  # fmt: skip
    assert not (tmp_path / "c" / "venvs").exists() or not any(
        p.name.startswith("test-build-") for p in (tmp_path / "c" / "venvs").iterdir())  # fmt: skip


def test_recorded_environment_against_the_checkout_lock(tmp_path: Path) -> None:
    text = (LOCKS / "cmake-build.txt").read_text()
    pins = parse_requirements(text, "cmake-build.txt")
    import hashlib

    digest = hashlib.sha256(text.encode()).hexdigest()
    packages = [{"name": n, "version": v, "from": "lock", "shadowed": False,
                 "record_sha256": "0" * 64} for n, (v, _h) in pins.items()]  # fmt: skip
    record = {"lock": "locks/cmake-build.txt", "lock_sha256": digest, "packages": packages}
    assert lockedvenv.recorded_against_lock(record, ROOT) == ([], [])
    packages[0] = {**packages[0], "version": "0.0.1"}
    problems, _ = lockedvenv.recorded_against_lock(record, ROOT)
    assert problems == [f"{packages[0]['name']} is 0.0.1, the lock says {pins[packages[0]['name']][0]}"]
    moved = {**record, "lock_sha256": "f" * 64}
    problems, notes = lockedvenv.recorded_against_lock(moved, ROOT)
    assert problems == [] and notes[0].startswith("built from locks/cmake-build.txt sha256 ffff")
    for name in ("../pyproject.toml", "locks/../../etc/passwd", "/etc/passwd"):
        problems, _ = lockedvenv.recorded_against_lock({**record, "lock": name}, ROOT)
        assert problems and "is not in this checkout" in problems[0]


# --------------------------------------------------------------------------- declared build env


def test_a_kernel_builds_base_environment_is_declared_values_only(tmp_path: Path) -> None:
    from pinwheel.compile.buildenv import SYSTEM_PATH, build_env, declared_base
    from pinwheel.manifest.build import BuildConfig

    gxx = tmp_path / "opt-gcc" / "bin" / "g++-13"
    gxx.parent.mkdir(parents=True)
    gxx.write_text("#!/bin/sh\n")
    gxx.chmod(0o755)
    caller = {
        "PATH": f"{tmp_path}/home/.local/bin:/usr/bin", "PYTHONPATH": f"{tmp_path}/site",
        "CFLAGS": "-O0", "LDFLAGS": "-L/somewhere", "CXX": str(gxx), "CC": "gcc",
        "SCCACHE_DIR": f"{tmp_path}/sccache", "VIRTUAL_ENV": f"{tmp_path}/venv",
        "HOME": f"{tmp_path}/home", "LD_LIBRARY_PATH": "/evil",
    }  # fmt: skip
    base = declared_base(host_of(caller), tool_dirs=("/cache/venvs/torch-build-x/bin",),
                         home="/cache/kernels/.home")  # fmt: skip
    assert base["PATH"].split(os.pathsep) == [
        "/cache/venvs/torch-build-x/bin", str(gxx.parent), *SYSTEM_PATH]
    assert base["HOME"] == "/cache/kernels/.home" and base["CXX"] == str(gxx)
    assert base["SCCACHE_DIR"] == caller["SCCACHE_DIR"]
    for gone in ("PYTHONPATH", "CFLAGS", "VIRTUAL_ENV", "LD_LIBRARY_PATH"):
        assert gone not in base, gone
    config = BuildConfig(python="3.11", cuda="12.4", arches=("7.0",), ptx=True, torch=None,
                         label=None, version=None)  # fmt: skip
    full, _set = build_env(config, toolkit=None, source_date_epoch=0, base=base,
                           listing_hook="/cache/listing")  # fmt: skip
    assert full["PYTHONPATH"] == "/cache/listing"  # the hook only: not the caller's
    assert full["LDFLAGS"] == "-Wl,--strip-all"  # the caller's -L did not get in
    assert str(tmp_path / "home") not in json.dumps(full)


# --------------------------------------------------------------------------- verify-build


def test_verify_build_names_the_environment_and_members_that_differ_without_the_wheel(
    tmp_path: Path,
) -> None:
    """Two builders exchange receipts only: the member digests say which member differs,
    the environments which package moved."""
    import zipfile

    from pinwheel.compile.verify import compare_builds
    from pinwheel.wheels.provenance import SCHEMA, member_digests, write_receipt

    name = "k-0.1.0-py3-none-linux_x86_64.whl"
    rebuilt = tmp_path / "rebuilt"
    rebuilt.mkdir()
    with zipfile.ZipFile(rebuilt / name, "w") as zf:
        zf.writestr("k/lib.so", b"\x7fELF rebuilt")
        zf.writestr("k-0.1.0.dist-info/WHEEL", "Generator: x\n")
    from pinwheel.checksums import sha256_file

    got = sha256_file(rebuilt / name)
    members = member_digests(rebuilt / name)
    assert set(members) == {"k/lib.so", "k-0.1.0.dist-info/WHEEL"}

    def env(version: str, digest: str) -> dict:
        return {"lock": "locks/cmake-build.txt", "lock_sha256": digest, "machine_packages": False,
                "packages": [{"name": "cmake", "version": version, "record_sha256": "c" * 64,
                              "from": "lock", "shadowed": False}]}  # fmt: skip

    def receipt(folder: Path, sha: str, mem: dict, environment: dict) -> None:
        folder.mkdir(exist_ok=True)
        write_receipt(folder, {"schema": SCHEMA, "wheels": {name: sha}, "built": [name],
                               "components": [{"name": "k", "kind": "kernel", "wheel": name,
                                               "sha256": sha, "members": mem,
                                               "environment": environment}]})  # fmt: skip

    recorded = tmp_path / "recorded"  # holds the receipt only, not the wheel
    receipt(recorded, "0" * 64, {**members, "k/lib.so": "1" * 64}, env("4.4.5", "a" * 64))
    receipt(rebuilt, got, members, env("4.4.6", "b" * 64))
    (w,) = compare_builds(recorded, rebuilt).wheels
    assert not w.same and w.rebuilt == got
    assert [(m.member, m.change) for m in w.members] == [("k/lib.so", "differs")]
    assert w.environment == (f"lock_sha256: {'a' * 64} -> {'b' * 64}", "cmake: 4.4.5 -> 4.4.6")


def test_check_fails_a_wheel_whose_recorded_environment_or_members_disagree(tmp_path: Path) -> None:
    import hashlib
    import zipfile

    from pinwheel.wheels.provenance import SCHEMA, member_digests, write_receipt

    name = "k-0.1.0-py3-none-any.whl"
    wheel = tmp_path / name
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("k/__init__.py", "")
        zf.writestr("k-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: x\n"
                    "Root-Is-Purelib: true\nTag: py3-none-any\n")  # fmt: skip
        zf.writestr("k-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: k\n"
                    "Version: 0.1.0\n")  # fmt: skip
        zf.writestr("k-0.1.0.dist-info/RECORD", "")
    text = (LOCKS / "cmake-build.txt").read_text()
    pins = parse_requirements(text, "cmake-build.txt")
    packages = [{"name": n, "version": v, "from": "lock", "record_sha256": "0" * 64,
                 "shadowed": False} for n, (v, _h) in sorted(pins.items())]  # fmt: skip
    packages[0]["from"] = "machine"  # the build imported the machine's copy
    members = {**member_digests(wheel), "k/__init__.py": "9" * 64}
    write_receipt(tmp_path, {"schema": SCHEMA, "wheels": {name: hashlib.sha256(
        wheel.read_bytes()).hexdigest()}, "built": [name], "components": [
        {"name": "k", "kind": "kernel", "wheel": name, "sha256": "0" * 64, "members": members,
         "environment": {"lock": "locks/cmake-build.txt",
                         "lock_sha256": hashlib.sha256(text.encode()).hexdigest(),
                         "packages": packages}}]})  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "pinwheel", "--json", "check", "--arch", "7.0", "--allow-no-cuda",
         "--no-tools", str(wheel)],
        capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    out = json.loads(proc.stdout)
    assert proc.returncode != 0
    assert f"{name}: {packages[0]['name']} comes from the machine" in " ".join(
        out["environment_problems"])
    assert f"{name}: member k/__init__.py differs (provenance vs wheel)" in out["environment_problems"]


def test_a_universal_lock_pins_per_python_and_the_venv_takes_its_own() -> None:
    text = (LOCKS / "torch-build.txt").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("numpy==")]
    assert len(lines) == 2 and all(";" in ln for ln in lines)  # one numpy per Python range
    py311 = lockedvenv.pins_for(text, {"python_full_version": "3.11.7", "python_version": "3.11"})
    py312 = lockedvenv.pins_for(text, {"python_full_version": "3.12.3", "python_version": "3.12"})
    assert py311["numpy"][0] != py312["numpy"][0]
    assert py311["numpy"][0] in lines[0] + lines[1] and py312["numpy"][0] in lines[0] + lines[1]
    assert py311["setuptools"] == py312["setuptools"] and len(py311["numpy"][1]) > 3


def test_setuptools_links_without_the_interpreter_prefix(tmp_path: Path) -> None:
    """pyenv's (and other) Pythons carry their configure prefix in LDSHARED
    (-Wl,-rpath,<prefix>/lib): setuptools wrote it into every extension's RUNPATH. The build
    gets LDSHARED without the words naming the prefix, the chosen CC in front."""
    from pinwheel.compile.kernels import python_link_env

    prefix = str(tmp_path / "home" / "u" / ".pyenv" / "versions" / "3.11.7")
    answer = json.dumps([f"gcc -pthread -shared -L{prefix}/lib -Wl,-rpath,{prefix}/lib "
                         "-Wl,-O1", "g++ -shared", "gcc", "g++", prefix, prefix])  # fmt: skip
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer}\nEOF\n")
    fake.chmod(0o755)
    env = python_link_env(fake, {"CC": "/usr/bin/gcc-12"})
    assert env["LDSHARED"] == "/usr/bin/gcc-12 -pthread -shared -Wl,-O1"
    assert env["LDCXXSHARED"] == "g++ -shared"
    # The real interpreter: its own prefix never survives.
    import sysconfig

    real = python_link_env(Path(sys.executable), {})
    assert sys.base_prefix not in real.get("LDSHARED", "")
    assert real.get("LDSHARED", "").split()[0] == str(sysconfig.get_config_var("LDSHARED")).split()[0]


def test_the_locked_backend_is_what_pyproject_builds_with() -> None:
    """locks/build-system.in is pyproject's [build-system] requires (setuptools >= 70.1 has
    its own bdist_wheel: no `wheel`)."""
    from packaging.requirements import Requirement

    backend = {str(Requirement(r)) for r in _pyproject()["build-system"]["requires"]}
    text = (LOCKS / "build-system.in").read_text()
    lines = {ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")}
    assert lines == backend
    assert "wheel" not in {Requirement(r).name for r in backend}


def test_runtime_dependencies_are_what_src_imports() -> None:
    """Each of pyproject's runtime dependencies is imported somewhere in src/ (issue 52:
    filelock was declared and never imported); the developers' tools are dependency groups,
    not published extras."""
    import re

    from packaging.requirements import Requirement

    project = _pyproject()["project"]
    source = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.py"))
    modules = {"pygit2": "pygit2", "tomlkit": "tomlkit", "rich": "rich",
               "packaging": "packaging", "pyproject-hooks": "pyproject_hooks"}  # fmt: skip
    for dep in project["dependencies"]:
        name = Requirement(dep).name.lower().replace("_", "-")
        module = modules.get(name, name.replace("-", "_"))
        assert re.search(rf"(?m)^\s*(?:from|import) {module}\b", source), (dep, module)
    assert not {"test", "lint"} & set(project["optional-dependencies"])
    assert {"test", "lint"} <= set(_pyproject()["dependency-groups"])


def test_every_pyproject_here_states_its_license_as_an_spdx_expression() -> None:
    """PEP 639: `license = "Apache-2.0"` (Metadata 2.4 License-Expression), not the
    deprecated `license = {text = ...}` table (the selftest kernel had it)."""
    import tomllib

    for path in [ROOT / "pyproject.toml", *sorted((ROOT / "kernels").glob("*/pyproject.toml"))]:
        license_ = tomllib.loads(path.read_text())["project"]["license"]
        assert isinstance(license_, str) and license_ == "Apache-2.0", path


# ---- docs/SECURITY.md "Installed environments": a locked venv is checked by its files


def _locked(tmp_path: Path) -> lockedvenv.LockedVenv:
    lock = _lock_of({"packaging"}, tmp_path)
    machine = _machine_python(tmp_path)
    return lockedvenv.ensure(lockedvenv.LockedVenvRequest(
        lock=lock, lock_name="locks/test.txt", interpreter=str(machine), cache=tmp_path / "c",
        environ=dict(os.environ), kind="test-build", overlay_from=str(machine)))  # fmt: skip


def test_a_hand_placed_pth_or_sitecustomize_is_refused_and_never_runs_while_listed(
    tmp_path: Path,
) -> None:
    """A ``.pth`` file (its ``import`` line runs at every start of the venv's Python), a
    ``sitecustomize.py`` or ``usercustomize.py`` no locked package installed: each
    refused by name, and none of them ran while the venv was checked."""
    venv = _locked(tmp_path)
    (site,) = venv.python.parent.parent.glob("lib/python3*/site-packages")
    ran = tmp_path / "ran"
    for name, text in (
        ("evil.pth", f"import pathlib; pathlib.Path({str(ran)!r}).mkdir(exist_ok=True)\n"),
        ("sitecustomize.py", f"import pathlib; pathlib.Path({str(ran)!r}).mkdir(exist_ok=True)\n"),
        ("usercustomize.py", "raise SystemExit(3)\n"),
    ):
        (site / name).write_text(text)
        with pytest.raises(lockedvenv.LockedVenvError) as err:
            lockedvenv.checked(venv, "test")
        assert f"{name} in {site} is not in the lock" in err.value.what
        assert not ran.exists()  # listed with -I -S: nothing of the venv's site ran
        (site / name).unlink()
    lockedvenv.checked(venv, "test")  # the venv as made is its lock


def test_an_edited_locked_file_is_refused_though_its_record_is_untouched(tmp_path: Path) -> None:
    venv = _locked(tmp_path)
    (site,) = venv.python.parent.parent.glob("lib/python3*/site-packages")
    target = site / "packaging" / "version.py"
    text = target.read_text()
    target.write_text(text + "\nBACKDOOR = 1\n")
    with pytest.raises(lockedvenv.LockedVenvError) as err:
        lockedvenv.checked(venv, "test")
    assert "packaging: packaging/version.py differs from its RECORD" in err.value.what
    target.write_text(text)
    lockedvenv.checked(venv, "test")
    target.unlink()  # a locked file gone: the same
    with pytest.raises(lockedvenv.LockedVenvError, match="version.py differs from its RECORD"):
        lockedvenv.checked(venv, "test")

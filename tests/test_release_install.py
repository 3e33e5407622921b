"""`pinwheel install`: the venv for the wheels' Python tag, the release's pylock.toml installed
with hashes, --offline, and no direct-URL requirements. Real pip, real uv, a real HTTP server.

The positive cp312 case needs a CPython 3.12 on this machine: found as ``python3.12`` on PATH
(checked by running it) or named by PINWHEEL_TEST_PYTHON312; without one it skips, and the
refusal for a Python that is nowhere (cp399) runs everywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel.checksums import sha256_file, write_sums
from pinwheel.cli import main
from pinwheel.compile.toolchain.pythons import find_python
from pinwheel.errors import EXIT_VERIFY
from pinwheel.options import host as host_of
from pinwheel.release.interpreter import version_of, wanted
from releasekit import ReleaseServer, make_wheel, write_manifest, write_provenance

pytestmark = pytest.mark.release


def _release(tmp: Path, *wheels: Path) -> Path:
    rel = tmp / "rel"
    rel.mkdir(exist_ok=True)
    for w in wheels:
        if w.parent != rel:
            shutil.copy(w, rel / w.name)
    write_sums(rel, sorted(w.name for w in wheels))
    return rel


def _install(rel: Path, venv: Path, *extra: str) -> int:
    return main(["--json", "install", str(rel), "--venv", str(venv), "--allow-unsigned", *extra])


def _python312() -> str | None:
    given = os.environ.get("PINWHEEL_TEST_PYTHON312")
    for candidate in (given, shutil.which("python3.12")):
        if candidate and version_of(candidate) == "3.12":
            return candidate
    found = find_python("3.12", host_of(os.environ))  # uv-managed or pyenv's versions, run to confirm
    return found.path if found else None


# --------------------------------------------------------------------------- direct references


@pytest.mark.parametrize(
    "requirement",
    [
        "evil @ file:///tmp/evil-1.0-py3-none-any.whl",
        "evil @ git+https://example.invalid/evil.git@main",
        "evil@https://example.invalid/e.whl ; python_version >= '3'",
    ],
)
def test_a_direct_url_requirement_is_refused_before_the_venv(tmp_path, capsys, requirement):
    """Issue 34 item 5: a Requires-Dist naming a URL would be fetched outside every hash."""
    made = make_wheel(tmp_path / "w", "pwa", "1.0", requires_dist=(requirement,))
    rel = _release(tmp_path, made)
    venv = tmp_path / "venv"
    assert _install(rel, venv, "--installer", "pip") == EXIT_VERIFY
    err = " ".join(capsys.readouterr().err.split())
    assert "requires a direct URL or VCS reference" in err and "nothing was installed" in err
    assert not venv.exists()


# --------------------------------------------------------------------------- the Python tag


def test_wanted_reads_the_python_tag() -> None:
    assert wanted(["a-1-cp312-cp312-linux_x86_64.whl", "b-1-py3-none-any.whl"]) == "3.12"
    assert wanted(["a-1-cp38-abi3-linux_x86_64.whl"]) is None  # abi3: any newer CPython
    assert wanted(["a-1-py3-none-any.whl"]) is None


def test_a_python_that_is_nowhere_is_refused_offline_with_how_to_get_it(tmp_path, capsys):
    made = make_wheel(tmp_path / "w", "pwa", "1.0", tag="cp399-cp399-linux_x86_64")
    rel = _release(tmp_path, made)
    venv = tmp_path / "venv"
    assert main(["--offline", "install", str(rel), "--venv", str(venv), "--allow-unsigned"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "no Python 3.99 here" in err and "uv python install 3.99" in err and "--python" in err
    # the way on a distribution without it (Debian 12: 3.11 only), from a package index
    assert "apt-get install python3.99" in err and "-c conda-forge python=3.99" in err
    assert not venv.exists()


def test_a_python_flag_of_the_wrong_version_is_refused(tmp_path, capsys):
    made = make_wheel(tmp_path / "w", "pwa", "1.0", tag="cp399-cp399-linux_x86_64")
    rel = _release(tmp_path, made)
    assert _install(rel, tmp_path / "venv", "--python", sys.executable) == 2
    assert "the wheels need 3.99" in capsys.readouterr().err


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_cp312_set_installs_into_a_312_venv_from_this_python(tmp_path, capsys, installer):
    py312 = _python312()
    if py312 is None:
        pytest.skip("no CPython 3.12 here (python3.12 on PATH or PINWHEEL_TEST_PYTHON312)")
    assert sys.version_info[:2] != (3, 12) or pytest.skip("pinwheel itself runs on 3.12")
    made = make_wheel(tmp_path / "w", "pwa", "1.0", tag="cp312-cp312-linux_x86_64")
    rel = _release(tmp_path, made)
    venv = tmp_path / "venv"
    given = [] if shutil.which("python3.12") == py312 else ["--python", py312]
    rc = _install(rel, venv, "--installer", installer, "--no-deps", "--offline", *given)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["python"] == "3.12"
    assert version_of(str(venv / "bin" / "python")) == "3.12"
    got = subprocess.run([str(venv / "bin/python"), "-c", "import pwa; print(pwa.VALUE)"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert got.strip() == "pwa 1.0"
    # a second run into the same venv is fine; a 3.11 venv for these wheels is refused
    other = tmp_path / "venv311"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    assert _install(rel, other, "--installer", installer, "--no-deps", *given) == 1
    assert "the wheels need Python 3.12" in capsys.readouterr().err


def _finder_env(tmp: Path, monkeypatch, versions: dict[str, str]) -> None:
    """PATH holds only a ``python3.12``/``python3.99`` shim that fails (pyenv's, when the
    version is not selected) and the system's tools; PYENV_ROOT holds ``versions``: name ->
    a real interpreter to link, or a shell line a fake one runs."""
    shims = tmp / "shims"
    shims.mkdir()
    for v in ("3.12", "3.99"):
        shim = shims / f"python{v}"
        shim.write_text("#!/bin/sh\necho 'pyenv: command not found' >&2\nexit 127\n")
        shim.chmod(0o755)
    for name, what in versions.items():
        minor = ".".join(name.split(".")[:2])
        exe = tmp / "pyenv" / "versions" / name / "bin" / f"python{minor}"
        exe.parent.mkdir(parents=True)
        if what.startswith("/"):
            exe.symlink_to(what)
        else:
            exe.write_text(f"#!/bin/sh\n{what}\n")
            exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:/usr/bin:/bin")
    monkeypatch.setenv("PYENV_ROOT", str(tmp / "pyenv"))
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(tmp / "uv-none"))


def test_install_finds_the_tags_python_among_pyenv_s_versions(tmp_path, capsys, monkeypatch):
    """Nothing on PATH runs as 3.12; pyenv's versions hold a decoy that answers 3.11 (tried
    first, newest name first, and passed over) and a real CPython 3.12, which makes the venv."""
    py312 = _python312()
    if py312 is None:
        pytest.skip("no CPython 3.12 here (PATH, uv-managed, pyenv or PINWHEEL_TEST_PYTHON312)")
    assert sys.version_info[:2] != (3, 12) or pytest.skip("pinwheel itself runs on 3.12")
    made = make_wheel(tmp_path / "w", "pwa", "1.0", tag="cp312-cp312-linux_x86_64")
    rel = _release(tmp_path, made)
    _finder_env(tmp_path, monkeypatch,
                {"3.12.999": "echo 3.11", "3.12.99": str(Path(py312).resolve())})  # fmt: skip
    venv = tmp_path / "venv"
    rc = _install(rel, venv, "--installer", "pip", "--no-deps", "--offline")
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["python"] == "3.12" and doc["python_found_by"] == "pyenv's versions"
    assert version_of(str(venv / "bin" / "python")) == "3.12"
    receipt = json.loads((venv / "pinwheel-install.json").read_text())
    assert receipt["python_found_by"] == "pyenv's versions"
    assert any("3.12.99" in " ".join(c) for c in receipt["commands"])


def test_candidates_that_do_not_answer_the_version_are_named_in_the_refusal(tmp_path, capsys,
                                                                           monkeypatch):  # fmt: skip
    made = make_wheel(tmp_path / "w", "pwa", "1.0", tag="cp399-cp399-linux_x86_64")
    rel = _release(tmp_path, made)
    _finder_env(tmp_path, monkeypatch, {"3.99.1": "echo 3.11", "3.99.0": "exit 3"})
    venv = tmp_path / "venv"
    assert main(["--offline", "install", str(rel), "--venv", str(venv), "--allow-unsigned"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "no Python 3.99 here" in err and "among uv's or pyenv's versions" in err
    assert "shims/python3.99 (python3.99 on PATH): does not run" in err
    assert "3.99.1/bin/python3.99 (pyenv's versions): is Python 3.11" in err
    assert "3.99.0/bin/python3.99 (pyenv's versions): does not run" in err
    assert not venv.exists()


# --------------------------------------------------------------------------- pylock.toml


def _lock_text(url: str, wheel: Path) -> str:
    return (
        'lock-version = "1.0"\ncreated-by = "pinwheel tests"\nrequires-python = ">=3.8"\n\n'
        f'[[packages]]\nname = "pwb"\nversion = "2.0"\n\n[[packages.wheels]]\n'
        f'name = "{wheel.name}"\nurl = "{url}{wheel.name}"\n'
        f'hashes = {{sha256 = "{sha256_file(wheel)}"}}\n'
    )


@pytest.fixture
def locked(tmp_path: Path):
    """A signed-off release of pwa (requires pwb) whose pylock.toml pins pwb on a live server."""
    served = tmp_path / "served"
    pwb = make_wheel(served, "pwb", "2.0", payload=3_000, seed=2)
    with ReleaseServer(served) as srv:
        lock = tmp_path / "pylock.toml"
        lock.write_text(_lock_text(srv.url, pwb))
        build = tmp_path / "wheels"
        made = make_wheel(build, "pwa", "1.0", seed=1, requires_dist=("pwb==2.0",))
        write_provenance(build, {made.name: sha256_file(made)})
        manifest = write_manifest(tmp_path)
        assert main(["--manifest", str(manifest), "release", "--no-sign", "--lock", str(lock)]) == 0
        yield tmp_path / "release", served, pwb, manifest


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_install_takes_the_dependencies_from_the_shipped_lock_with_hashes(locked, tmp_path,
                                                                          capsys, installer):  # fmt: skip
    release, _served, _pwb, manifest = locked
    assert "pylock.toml" in (release / "SHA256SUMS").read_text()
    venv = tmp_path / "venv"
    rc = main(["--manifest", str(manifest), "--json", "install", str(release), "--venv", str(venv),
               "--installer", installer, "--allow-unsigned"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["lock"] == "pylock.toml"
    assert any("pylock.toml" in " ".join(c) for c in doc["commands"])
    got = subprocess.run([str(venv / "bin/python"), "-c", "import pwa, pwb; print(pwb.VALUE)"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert got.strip() == "pwb 2.0"
    assert json.loads((venv / "pinwheel-install.json").read_text())["lock"] == "pylock.toml"


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_dependency_altered_on_its_server_fails_the_lock_hash(locked, tmp_path, installer):
    release, served, pwb, manifest = locked
    pwb.unlink()
    make_wheel(served, "pwb", "2.0", payload=3_000, seed=99)  # same name, other bytes
    venv = tmp_path / "venv"
    rc = main(["--manifest", str(manifest), "install", str(release), "--venv", str(venv),
               "--installer", installer, "--allow-unsigned"])  # fmt: skip
    assert rc != 0
    assert not (venv / "lib").exists() or not list(venv.glob("lib/python*/site-packages/pwa"))


@pytest.mark.parametrize(
    ("entry", "gist"),
    [
        # PEP 751 as packaging.pylock reads it (what pip reads), naming the field
        ('[[packages]]\nname = "x"\nversion = "1"\nvcs = {type = "git", url = "https://e.invalid/x"}\n',
         "packages[0].vcs.commit-id"),
        ('[[packages]]\nname = "x"\nversion = "1"\n[[packages.wheels]]\nurl = "https://e.invalid/x.whl"\n',
         "packages[0].wheels[0].hashes"),
        ('[[packages]]\nname = "x\\u001b[2J"\nversion = "1"\n', "packages[0].name"),
        ('[[packages]]\nname = "x"\nversion = "1' + "0" * 4000 + 'x"\n', "Invalid version"),
        # 5000 digits: packaging's int() raised ValueError (a traceback) before the bound
        ('[[packages]]\nname = "x"\nversion = "1' + "0" * 5000 + '"\n', "packages[0].version"),
        # then pinwheel's own rule: every file by sha256 from an http(s) URL, no VCS
        ('[[packages]]\nname = "x"\nversion = "1"\n[[packages.wheels]]\nurl = "file:///etc/x-1-py3-none-any.whl"\n'
         'hashes = {sha256 = "' + "a" * 64 + '"}\n', "no http(s) url"),
        ('[[packages]]\nname = "x"\nversion = "1"\nvcs = {type = "git", url = "https://e.invalid/x", '
         'commit-id = "' + "a" * 40 + '"}\n', "a vcs source is not hash-pinned"),
    ],
)  # fmt: skip
def test_release_refuses_a_lock_that_is_not_all_hash_pinned(tmp_path, capsys, entry, gist):
    build = tmp_path / "wheels"
    made = make_wheel(build, "pwa", "1.0", seed=1)
    write_provenance(build, {made.name: sha256_file(made)})
    manifest = write_manifest(tmp_path)
    lock = tmp_path / "pylock.toml"
    lock.write_text('lock-version = "1.0"\ncreated-by = "t"\n\n' + entry)
    rc = main(["--manifest", str(manifest), "release", "--no-sign", "--lock", str(lock)])
    assert rc == EXIT_VERIFY and gist in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "release").exists()


@pytest.mark.parametrize(("installer", "flag"), [("pip", "--no-index"), ("uv", "--offline")])
def test_offline_reaches_the_installer(tmp_path, capsys, installer, flag):
    """--offline: pip gets --no-index with the release directory as its only source, uv
    --offline; the dependency the release carries is found there."""
    pwa = make_wheel(tmp_path / "w", "pwa", "1.0", requires_dist=("pwb==2.0",))
    pwb = make_wheel(tmp_path / "w", "pwb", "2.0", seed=2)
    rel = _release(tmp_path, pwa, pwb)
    venv = tmp_path / "venv"
    rc = main(["--offline", "--json", "install", str(rel), "--venv", str(venv),
               "--installer", installer, "--allow-unsigned"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    installs = [c for c in doc["commands"] if "install" in c]
    assert installs and all(flag in c for c in installs), installs
    assert not any(flag in c for c in doc["commands"] if "venv" in c and "uv" not in c[0])


def test_offline_with_a_missing_dependency_fails_without_an_index(tmp_path, capsys):
    made = make_wheel(tmp_path / "w", "pwa", "1.0", requires_dist=("pwzz-not-here==1",))
    rel = _release(tmp_path, made)
    rc = main(["--offline", "install", str(rel), "--venv", str(tmp_path / "venv"),
               "--installer", "pip", "--allow-unsigned"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc != 0 and "No matching distribution found for pwzz-not-here" in err

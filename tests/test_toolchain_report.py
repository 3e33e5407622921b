"""Every toolchain problem in one report, and the pinned Python found where people keep it.

Real programs: the interpreters are real Pythons (this one, linked under the names and
folders PATH, uv and pyenv use); the compiler probe runs the machine's real gcc.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from pinwheel.compile.toolchain import choose
from pinwheel.compile.toolchain.pythons import candidates, find_python
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.manifest.build import BuildConfig
from pinwheel.options import host as host_of

HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _config(**kw) -> BuildConfig:
    base = dict(python=HERE, cuda="12.4", arches=("7.0",), ptx=True, torch=None, label=None,
                version=None)  # fmt: skip
    return BuildConfig(**(base | kw))  # type: ignore[arg-type]


def test_three_problems_come_in_one_report(tmp_path: Path) -> None:
    """gcc 99, a Python nobody has and sm_70 with CUDA 13 (which dropped it): one error
    names all three with their own ways on, not one per run."""
    env = {"PATH": os.defpath, "HOME": str(tmp_path)}
    with pytest.raises(ToolchainError) as err:
        choose(_config(gcc="99", python="3.99", cuda="13.0"), host_of(env))
    text = err.value.what
    assert text.startswith("3 toolchain problems")
    assert "[build] gcc" in text and "gcc/g++ 99" in text and "--substitute gcc=" in text
    assert "[build] python" in text and "Python 3.99" in text and "uv python install 3.99" in text
    assert "[build] cuda" in text or "[build] arches" in text


def test_one_problem_is_raised_as_itself(tmp_path: Path) -> None:
    env = {"PATH": os.defpath, "HOME": str(tmp_path)}
    with pytest.raises(ToolchainError) as err:
        choose(_config(python="3.99"), host_of(env))
    assert err.value.where == "[build] python" and "pyenv install 3.99" in err.value.next


def _linked(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True)
    (folder / name).symlink_to(sys.executable)
    return folder / name


def test_the_pinned_python_is_found_on_path_then_uv_then_pyenv(tmp_path: Path) -> None:
    home = tmp_path / "home"
    uv = _linked(home / ".local/share/uv/python" / f"cpython-{HERE}.9-linux-x86_64-gnu" / "bin",
                 f"python{HERE}")  # fmt: skip
    pyenv = _linked(home / ".pyenv/versions" / f"{HERE}.1" / "bin", f"python{HERE}")
    env = {"PATH": str(tmp_path / "empty"), "HOME": str(home)}
    assert [s for s, _ in candidates(HERE, host_of(env))] == ["uv", "pyenv"]
    found = find_python(HERE, host_of(env))
    assert found is not None and (found.source, found.path) == ("uv", str(uv))
    on_path = _linked(tmp_path / "bin", f"python{HERE}")
    found = find_python(HERE, host_of(env | {"PATH": str(tmp_path / "bin")}))
    assert found is not None and (found.source, found.path) == ("PATH", str(on_path))
    uv.unlink()
    found = find_python(HERE, host_of(env))
    assert found is not None and (found.source, found.path) == ("pyenv", str(pyenv))


def test_a_name_is_a_claim_the_version_is_checked(tmp_path: Path) -> None:
    """A python3.99 on PATH that is really this interpreter is not Python 3.99."""
    _linked(tmp_path / "bin", "python3.99")
    assert find_python("3.99", host_of({"PATH": str(tmp_path / "bin")})) is None


# ------------------------------------------------- `pinwheel toolchain`: everything in one report

MANIFEST_HEAD = """[upstream]
url = "https://example.invalid/up.git"
commit = "0123456789abcdef0123456789abcdef01234567"
"""


def _toolchain(tmp_path: Path, monkeypatch, capsys, build: str, *args: str,
               cache: Path | None = None, path: str = ""):  # fmt: skip
    """`pinwheel toolchain` in a bare environment: PATH holds only this Python (as
    python{HERE}) and ``path``; no CUDA_HOME, CUDA_PATH, CC or CXX. Returns rc, the JSON
    document, and the human run's stdout and stderr."""
    from pinwheel.cli import main

    manifest = tmp_path / "manifest.toml"
    manifest.write_text(MANIFEST_HEAD + "\n[build]\n" + build)
    if not (tmp_path / "bin").exists():
        _linked(tmp_path / "bin", f"python{HERE}")
    monkeypatch.setenv("PATH", os.pathsep.join(filter(None, [str(tmp_path / "bin"), path])))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("CUDA_HOME", "CUDA_PATH", "CC", "CXX"):
        monkeypatch.delenv(var, raising=False)
    argv = ["--manifest", str(manifest), "--cache", str(cache or tmp_path / "cache"), "toolchain",
            "--no-provision", *args]  # fmt: skip
    rc = main([*argv, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert main(argv) == rc
    human = capsys.readouterr()
    return rc, doc, human.out, human.err


def test_toolchain_reports_python_gcc_arches_and_every_cuda_at_once(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """gcc 99 missing and CUDA 12.4 neither installed nor in the (empty) cache: one report
    that still shows the Python found, the arch table and each CUDA seen or provisionable
    with the arches it compiles, then one error with both problems (not one per run)."""
    rc, doc, out, err = _toolchain(
        tmp_path, monkeypatch, capsys,
        f'python = "{HERE}"\ncuda = "12.4"\ngcc = "99"\narches = ["7.0"]\n',
    )  # fmt: skip
    seen = {(t["state"], t["version"]): t for t in doc["cuda"]["seen"]}
    installed = [t for t in doc["cuda"]["seen"] if t["state"] == "installed" and t["pinned"]]
    if installed:  # pragma: no cover - a machine with CUDA 12.4 at /usr/local/cuda
        pytest.skip("this machine has CUDA 12.4 installed")
    assert rc == 1 and doc["ok"] is False
    assert [p["where"] for p in doc["problems"]] == ["[build] gcc", "[build] cuda"]
    assert doc["python"]["path"] == str(tmp_path / "bin" / f"python{HERE}")
    assert doc["python"]["source"] == "PATH" and doc["gcc"]["cxx"] is None
    # The cache is empty: both pinned toolkits are offered as downloads, with their verdicts.
    v124 = seen[("provisionable", "12.4.131")]
    assert v124["builds"] == ["7.0"] and v124["refuses"] == [] and v124["pinned"] is True
    assert "sm_70" in v124["compiles"] and "sm_100" not in v124["compiles"]
    v130 = next(t for (state, v), t in seen.items() if state == "provisionable" and v.startswith("13.0"))
    assert v130["refuses"] == ["7.0"] and "sm_70" not in v130["compiles"]
    assert doc["cmake_architectures"] == "70-real;70-virtual" and doc["root"] is None
    # The human report: every part on stdout, then one error naming both problems.
    assert f"python {HERE}" in out and "gcc 99         PROBLEM: no gcc/g++ 99" in out
    assert "arches         7.0 -> sm_70+PTX" in out
    assert "12.4.131   provisionable pinned download  ([build] cuda)" in out
    assert "builds 7.0" in out and "cannot build 7.0" in out
    assert "using: no CUDA toolkit (2 problem(s)" in out
    assert "2 toolchain problems" in err and "[build] gcc: no gcc/g++ 99" in err
    assert "no usable CUDA 12.4 toolkit" in err and "run `pinwheel toolchain`" in err


def test_toolchain_with_a_provisioned_cuda_reports_it_and_uses_it(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """The test cache's CUDA 12.4 (provisioned once per machine by the kernels tests): the
    report lists it as provisioned, probes it, and exits 0. Read only: --no-provision."""
    import shutil

    from pinwheel.compile.toolchain.hostcc import compiler_version
    from pinwheel.compile.toolchain.pins import LOCKS, MARKER
    from testenv import default_root

    cache = Path(default_root()) / "pinwheel"
    if not (cache / "toolchains" / LOCKS["12.4"].dirname / MARKER).is_file():
        pytest.skip("CUDA 12.4 is not provisioned in the test cache (the kernels session does it)")
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ on this machine")
    major = (compiler_version(gxx, host_of(os.environ)) or "0").split(".")[0]
    # nvcc's probe needs the host compiler and binutils: the directory g++ is in.
    rc, doc, out, err = _toolchain(
        tmp_path, monkeypatch, capsys,
        f'python = "{HERE}"\ncuda = "12.4"\ngcc = "{major}"\narches = ["7.0"]\n', cache=cache,
        path=str(Path(gxx).parent),
    )  # fmt: skip
    assert rc == 0, err
    assert doc["ok"] is True and doc["problems"] == [] and doc["version"] == "12.4.131"
    assert doc["source"] == "provisioned" and doc["gcc"]["version"].startswith(f"{major}.")
    provisioned = [t for t in doc["cuda"]["seen"] if t["state"] == "provisioned"]
    assert [t["version"] for t in provisioned][:1] == ["12.4.131"]
    assert provisioned[0]["root"] == doc["root"] and provisioned[0]["builds"] == ["7.0"]
    assert f"using CUDA 12.4.131 (provisioned) at {doc['root']}" in out and "compiles sm_70" in out
    assert "PROBLEM" not in out and "error:" not in err


def test_the_build_stage_takes_the_callers_choice_rather_than_choosing_again(tmp_path) -> None:
    """`pinwheel toolchain` chooses once (its survey) and hands the choice in
    ``BuildRequest.chosen``: the stage uses it. Choosing again here would fail, since the
    manifest pins a Python nobody has."""
    from pinwheel.compile.pipeline import BuildRequest, _choose
    from pinwheel.compile.toolchain.choose import ToolchainChoice
    from pinwheel.manifest import loads
    from pinwheel.progress import SILENT

    text = MANIFEST_HEAD + '\n[build]\ncuda = "12.4"\narches = ["7.0"]\npython = "3.99"\n'
    m = loads(text.encode(), tmp_path / "manifest.toml")
    # an engine build: its wheel is cp399, so the Python is needed (a py3 kernel's is not)
    request = BuildRequest(manifest=m, cache=tmp_path / "c", out_dir=tmp_path / "w",
                           host=host_of({"PATH": os.defpath, "HOME": str(tmp_path)}),
                           engine_source=tmp_path / "engine")  # fmt: skip
    with pytest.raises(ToolchainError, match="no Python 3.99"):
        _choose(request, SILENT)
    given = ToolchainChoice(_config(python=HERE), (), None)
    assert _choose(dataclasses.replace(request, chosen=given), SILENT) is given


# ------------------------------------------------------- `pinwheel build`: the same report, first


def _build(tmp_path: Path, monkeypatch, capsys, build: str) -> tuple[int, dict]:
    """`pinwheel build --offline --json` in the bare environment of :func:`_toolchain`; the
    manifest's upstream commit is in no cache, so reaching it would fail on that."""
    from pinwheel.cli import main

    manifest = tmp_path / "manifest.toml"
    manifest.write_text(MANIFEST_HEAD + "\n[build]\n" + build)
    if not (tmp_path / "bin").exists():
        _linked(tmp_path / "bin", f"python{HERE}")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("CUDA_HOME", "CUDA_PATH", "CC", "CXX"):
        monkeypatch.delenv(var, raising=False)
    rc = main(["--manifest", str(manifest), "--cache", str(tmp_path / "cache"), "--offline",
               "build", "--out", str(tmp_path / "wheels"), "--json"])  # fmt: skip
    return rc, json.loads(capsys.readouterr().out)


def test_build_says_the_toolkit_problem_with_gcc_in_one_report_before_any_fetch(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """gcc 99 and a CUDA 12.8 nothing here has and nothing provisions: `build` names both
    at once (as `pinwheel toolchain` does), before it reaches the upstream or downloads."""
    rc, doc = _build(tmp_path, monkeypatch, capsys,
                     f'python = "{HERE}"\ncuda = "12.8"\narches = ["7.0"]\ngcc = "99"\n')  # fmt: skip
    what = doc["error"]["what"]
    assert rc != 0 and what.startswith("2 toolchain problems"), doc
    assert "[build] gcc" in what and "gcc/g++ 99" in what
    assert "[build] cuda" in what and "no usable CUDA 12.8" in what and "cuda=12.4" in what
    assert "0123456789abcdef" not in what  # the upstream was never reached
    assert not (tmp_path / "cache" / "toolchains").exists()  # nothing downloaded


def test_build_says_a_toolkit_it_cannot_find_or_provision_before_any_fetch(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """No other problem: the toolkit's alone, still before the upstream; a CUDA that can be
    provisioned (12.4 for sm_70) is no problem here (the build provisions it later)."""
    rc, doc = _build(tmp_path, monkeypatch, capsys,
                     f'python = "{HERE}"\ncuda = "12.8"\narches = ["7.0"]\n')  # fmt: skip
    assert rc != 0 and doc["error"]["where"] == "[build] cuda", doc
    assert "no usable CUDA 12.8" in doc["error"]["what"]
    rc, doc = _build(tmp_path, monkeypatch, capsys,
                     f'python = "{HERE}"\ncuda = "12.4"\narches = ["7.0"]\n')  # fmt: skip
    assert rc != 0 and "CUDA" not in doc["error"]["what"], doc
    assert "git" in doc["error"]["what"]  # it went on to the upstream (no git on this PATH)
    assert not (tmp_path / "cache" / "toolchains").exists()


REPO = Path(__file__).resolve().parent.parent


def _kernels_run(tmp_path: Path, *flags: str, command: str = "kernels") -> str:
    """`pinwheel kernels` on a copy of the repository's manifest whose [build] python is one
    nobody has (3.99), offline (--no-provision): what it says about the toolchain."""
    import shutil
    import subprocess

    root = tmp_path / "checkout"
    for part in ("kernels", "patches"):
        shutil.copytree(REPO / part, root / part)
    (root / "locks").mkdir()
    for lock in (REPO / "locks").glob("torch-*.txt"):
        shutil.copy(lock, root / "locks" / lock.name)
    text = (REPO / "manifest.toml").read_text()
    assert '\npython = "3.12"' in text
    (root / "manifest.toml").write_text(text.replace('\npython = "3.12"', '\npython = "3.99"'))
    # this checkout's pinwheel, not whichever the interpreter has installed
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path / "home"),
           "PINWHEEL_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO / "src")}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pinwheel", "--manifest", str(root / "manifest.toml"), command,
         "--no-provision", *flags],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return done.stdout + done.stderr


def test_a_py3_kernel_builds_without_the_pinned_python(tmp_path: Path) -> None:
    """Issue 53: the selftest wheel is py3-none, built with pinwheel's own interpreter; a
    machine without [build] python (Debian 12 has no 3.12) must not be stopped for it."""
    said = _kernels_run(tmp_path, "--name", "pinwheel-selftest")
    assert "[build] python" not in said and "Python 3.99" not in said


def test_a_torch_extension_still_needs_the_pinned_python(tmp_path: Path) -> None:
    said = _kernels_run(tmp_path, "--name", "flash-attention-v100")
    assert "[build] python" in said and "no Python 3.99" in said
    assert "conda-forge" in said and "uv python install 3.99" in said  # ways on, per distribution


def test_toolchain_says_what_needs_the_missing_python_and_what_builds_without_it(
    tmp_path: Path,
) -> None:
    """After the README's first green build on Debian 12 (no 3.12), `pinwheel toolchain`
    failed on [build] python alone, as if that build could not have passed."""
    subs = ("--substitute", "gcc=12", "--substitute", "cuda=12.4")
    said = " ".join(_kernels_run(tmp_path, *subs, command="toolchain").split())
    assert "no Python 3.99" in said
    assert "needed by the engine and flash-attention-v100, not by pinwheel-selftest" in said
    assert ("`tools/replay kernels --name pinwheel-selftest --substitute gcc=12 --substitute "
            "cuda=12.4` builds them without it") in said  # fmt: skip


def test_which_builds_need_the_pinned_python() -> None:
    from pinwheel.compile.toolchain.choose import python_free, python_needed
    from pinwheel.manifest import load

    manifest = load(REPO / "manifest.toml")
    by_name = {k.name: k for k in manifest.kernels}
    assert python_free(by_name["pinwheel-selftest"])  # wheel.py-api = "py3"
    assert not python_free(by_name["flash-attention-v100"])  # a torch extension: cp312
    assert not python_needed([by_name["pinwheel-selftest"]], engine=False)
    assert python_needed([by_name["pinwheel-selftest"]], engine=True)
    assert python_needed([by_name["flash-attention-v100"]], engine=False)

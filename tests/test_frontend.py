"""The PEP 517 frontend kernels build with: the backend's build_wheel alone, pip's bytes.

Real Pythons, real setuptools and pip: a setup.py that counts its runs is built by
pip (``pip wheel --no-build-isolation``, what kernels used before) and by the
frontend; both wheels must be the same bytes, and the frontend must run setup.py
once where pip ran it more often (its metadata hook).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel.compile import frontend
from pinwheel.errors import ManifestError

SETUP = """
import os
from setuptools import setup
with open(os.environ["RUNS_FILE"], "a") as f:
    f.write("run\\n")
setup(name="demo-kernel", version="1.2.3", py_modules=["demo"])
"""


def _project(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "setup.py").write_text(SETUP)
    (root / "demo.py").write_text("VALUE = 42\n")
    return root


def _env(runs: Path) -> dict[str, str]:
    return {**os.environ, "RUNS_FILE": str(runs), "SOURCE_DATE_EPOCH": "1700000000"}


def _runner(env: dict[str, str] | None = None, seen: list | None = None):  # type: ignore[no-untyped-def]
    """The runner pinwheel hands the hook caller, as a real subprocess (output kept)."""

    def run(cmd, cwd, added):  # type: ignore[no-untyped-def]
        if seen is not None:
            seen.append((list(cmd), cwd, dict(added)))
        subprocess.run(list(cmd), cwd=cwd, env={**(env or os.environ), **added}, check=True,
                       capture_output=True)

    return run


def test_the_hook_alone_gives_pips_wheel_and_runs_setup_py_once(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", reason="the build Python needs setuptools")
    pytest.importorskip("wheel", reason="older setuptools need wheel for bdist_wheel")
    by_pip, by_hook = _project(tmp_path / "a" / "src"), _project(tmp_path / "b" / "src")
    out_pip, out_hook = tmp_path / "a" / "dist", tmp_path / "b" / "dist"
    runs_pip, runs_hook = tmp_path / "a" / "runs", tmp_path / "b" / "runs"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--no-cache-dir", "-w", str(out_pip), str(by_pip)],
        env=_env(runs_pip), check=True, capture_output=True,
    )  # fmt: skip
    out_hook.mkdir()
    seen: list = []
    name = frontend.build_wheel(
        sys.executable, by_hook, str(out_hook), {}, _runner(_env(runs_hook), seen)
    )
    assert len(seen) == 1 and seen[0][1] == str(by_hook)  # one process, in the tree
    (wheel_pip,) = out_pip.glob("*.whl")
    assert name == wheel_pip.name
    assert (out_hook / name).read_bytes() == wheel_pip.read_bytes()
    assert runs_hook.read_text().count("run") == 1
    assert runs_pip.read_text().count("run") > 1  # pip's metadata hook ran it too


def test_an_in_tree_backend_gets_the_config_settings(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    (tree / "_backend").mkdir(parents=True)
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "hooks:Backend.api"\n'
        'backend-path = ["_backend"]\n'
    )
    (tree / "_backend" / "hooks.py").write_text(
        "import json, os\n"
        "class Backend:\n"
        "    class api:\n"
        "        @staticmethod\n"
        "        def build_wheel(out, settings=None, metadata_directory=None):\n"
        "            with open(os.path.join(out, 'seen.json'), 'w') as f:\n"
        "                json.dump({'settings': settings, 'cwd': os.getcwd()}, f)\n"
        "            return 'x-1-py3-none-any.whl'\n"
    )
    out = tmp_path / "dist"
    out.mkdir()
    flags = [
        "--config-settings=cmake.define.A=1",
        "--config-settings=build-dir=/b",
        "--config-settings=cmake.define.A=2",
    ]
    settings = frontend.config_settings(flags)
    assert settings == {"cmake.define.A": ["1", "2"], "build-dir": "/b"}
    name = frontend.build_wheel(sys.executable, tree, str(out), settings, _runner())
    assert name == "x-1-py3-none-any.whl"
    seen = json.loads((out / "seen.json").read_text())
    assert seen == {"settings": settings, "cwd": str(tree)}


def test_a_tree_without_pyproject_builds_with_the_legacy_backend(tmp_path: Path) -> None:
    tree = _project(tmp_path / "src")
    assert frontend.backend_of(tree) == frontend.Backend(frontend.LEGACY_BACKEND)
    (tree / "pyproject.toml").write_text('[project]\nname = "x"\n')  # no [build-system]
    assert frontend.backend_of(tree).name == frontend.LEGACY_BACKEND


@pytest.mark.parametrize("entry", ["../outside", "/abs/path", "a/../../b", 7])
def test_a_backend_path_outside_the_tree_is_refused(tmp_path: Path, entry: object) -> None:
    tree = tmp_path / "src"
    tree.mkdir()
    value = json.dumps(entry)
    (tree / "pyproject.toml").write_text(
        f'[build-system]\nbuild-backend = "b"\nbackend-path = [{value}]\n'
    )
    with pytest.raises(ManifestError) as err:
        frontend.backend_of(tree)
    assert "backend-path" in err.value.what and "pyproject.toml" in (err.value.where or "")


def test_a_broken_pyproject_names_the_file(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "pyproject.toml").write_text("[build-system\n")
    with pytest.raises(ManifestError, match="not valid TOML") as err:
        frontend.backend_of(tree)
    assert err.value.next


def test_a_flag_that_is_not_a_config_setting_is_a_bug_not_a_guess() -> None:
    with pytest.raises(ValueError):
        frontend.config_settings(["--config-settings=novalue"])
    with pytest.raises(ValueError):
        frontend.config_settings(["-Cx=1"])


def test_a_backend_that_cannot_be_imported_is_named_with_the_lock_to_check(
    tmp_path: Path,
) -> None:
    """pyproject_hooks' BackendUnavailable, from the build's Python, as pinwheel's error."""
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "no_such_backend_pkg"\n'
    )
    (tmp_path / "dist").mkdir()
    with pytest.raises(frontend.BackendError) as err:
        frontend.build_wheel(sys.executable, tree, str(tmp_path / "dist"), {}, _runner())
    assert "no_such_backend_pkg" in err.value.what and "cannot be imported" in err.value.what
    assert "locks/cmake-build.txt" in (err.value.next or "")


def test_a_failing_build_is_the_runners_error_not_a_wrapped_one(tmp_path: Path) -> None:
    """The hook's process fails: the runner's own error (pinwheel's names the log)."""
    tree = tmp_path / "src"
    (tree / "_b").mkdir(parents=True)
    (tree / "pyproject.toml").write_text(
        '[build-system]\nbuild-backend = "boom"\nbackend-path = ["_b"]\n'
    )
    (tree / "_b" / "boom.py").write_text(
        "def build_wheel(out, settings=None, metadata_directory=None):\n"
        "    raise SystemExit(3)\n"
    )
    (tmp_path / "dist").mkdir()
    with pytest.raises(subprocess.CalledProcessError):
        frontend.build_wheel(sys.executable, tree, str(tmp_path / "dist"), {}, _runner())

"""Every toolchain problem in one report, and the pinned Python found where people keep it.

Real programs: the interpreters are real Pythons (this one, linked under the names and
folders PATH, uv and pyenv use); the compiler probe runs the machine's real gcc.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pinwheel.compile.toolchain import choose
from pinwheel.compile.toolchain.pythons import candidates, find_python
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.manifest.build import BuildConfig

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
        choose(_config(gcc="99", python="3.99", cuda="13.0"), env)
    text = err.value.what
    assert text.startswith("3 toolchain problems")
    assert "[build] gcc" in text and "gcc/g++ 99" in text and "--substitute gcc=" in text
    assert "[build] python" in text and "Python 3.99" in text and "uv python install 3.99" in text
    assert "[build] cuda" in text or "[build] arches" in text


def test_one_problem_is_raised_as_itself(tmp_path: Path) -> None:
    env = {"PATH": os.defpath, "HOME": str(tmp_path)}
    with pytest.raises(ToolchainError) as err:
        choose(_config(python="3.99"), env)
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
    assert [s for s, _ in candidates(HERE, env)] == ["uv", "pyenv"]
    found = find_python(HERE, env)
    assert found is not None and (found.source, found.path) == ("uv", str(uv))
    on_path = _linked(tmp_path / "bin", f"python{HERE}")
    found = find_python(HERE, env | {"PATH": str(tmp_path / "bin")})
    assert found is not None and (found.source, found.path) == ("PATH", str(on_path))
    uv.unlink()
    found = find_python(HERE, env)
    assert found is not None and (found.source, found.path) == ("pyenv", str(pyenv))


def test_a_name_is_a_claim_the_version_is_checked(tmp_path: Path) -> None:
    """A python3.99 on PATH that is really this interpreter is not Python 3.99."""
    _linked(tmp_path / "bin", "python3.99")
    assert find_python("3.99", {"PATH": str(tmp_path / "bin")}) is None

"""`pinwheel wheeldiff` and verify-build's member comparison on real gcc-built shared objects:
each differing member named, and for an ELF member the first differing dynamic symbol
(nvcc's pid-named internal symbols are such a case) or section."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel.wheels.wheeldiff import diff_members
from wheelfactory import make_wheel

pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
REPO = Path(__file__).resolve().parent.parent

# What nvcc 12.4 makes of an anonymous namespace in a unit with no plain external definition:
# the front end's pid ends the name (11156 and 11207 in the engine's two builds).
SOURCE = """
int pinwheel_probe(int x) {{ return x * 3 + {value}; }}
int _ZN44_INTERNAL_8777c600_8_anon3_cu_380d17cd_{pid}4bumpEv(void) {{ return 1; }}
static const char note[] __attribute__((used, section(".pinwheel_note"))) = "{note}";
"""


def so(tmp: Path, name: str, *, pid: int = 11156, value: int = 1, note: str = "a") -> bytes:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / f"{name}.c").write_text(SOURCE.format(pid=pid, value=value, note=note))
    out = tmp / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(tmp / f"{name}.c")],
                   check=True)  # fmt: skip
    return out.read_bytes()


def wheel(tmp: Path, lib: bytes, readme: bytes = b"same\n") -> Path:
    return make_wheel(tmp, {"demo/_C.abi3.so": lib, "demo/README.txt": readme})


def wheeldiff(a: Path, b: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-m", "pinwheel", "wheeldiff", str(a), str(b)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip


def test_a_pid_in_a_symbol_name_is_named_with_the_member(tmp_path: Path) -> None:
    a = wheel(tmp_path / "a", so(tmp_path, "one", pid=11156), b"same\n")
    b = wheel(tmp_path / "b", so(tmp_path, "two", pid=11207), b"changed\n")
    proc = wheeldiff(a, b)
    assert proc.returncode == 5, proc.stderr
    lines = proc.stdout.splitlines()
    assert "differs: demo/README.txt" in lines
    assert "differs: demo-1.0.dist-info/RECORD" in lines
    (elf_line,) = [ln for ln in lines if ln.startswith("differs: demo/_C.abi3.so")]
    assert elf_line == (
        "differs: demo/_C.abi3.so (dynamic symbol "
        "'_ZN44_INTERNAL_8777c600_8_anon3_cu_380d17cd_111564bumpEv' vs "
        "'_ZN44_INTERNAL_8777c600_8_anon3_cu_380d17cd_112074bumpEv')"
    )


def test_a_section_is_named_when_the_symbols_agree(tmp_path: Path) -> None:
    a = wheel(tmp_path / "a", so(tmp_path, "one", note="a"))
    b = wheel(tmp_path / "b", so(tmp_path, "two", note="b"))
    diffs = {d.member: d for d in diff_members(a, b)}
    assert set(diffs) == {"demo/_C.abi3.so", "demo-1.0.dist-info/RECORD"}  # RECORD lists it
    assert (diffs["demo/_C.abi3.so"].change, diffs["demo/_C.abi3.so"].where) == (
        "differs", "section .pinwheel_note")  # fmt: skip
    assert diffs["demo-1.0.dist-info/RECORD"].where is None
    proc = wheeldiff(a, b)
    assert "differs: demo/_C.abi3.so (section .pinwheel_note)" in proc.stdout.splitlines()


def test_the_same_wheel_is_same_and_json_names_members(tmp_path: Path) -> None:
    lib = so(tmp_path, "one")
    a, b = wheel(tmp_path / "a", lib), wheel(tmp_path / "b", lib)
    proc = wheeldiff(a, b)
    assert proc.returncode == 0 and proc.stdout.startswith("same:"), proc.stdout
    c = wheel(tmp_path / "c", so(tmp_path, "three", value=2))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "pinwheel", "--json", "wheeldiff", str(a), str(c)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    doc = json.loads(out.stdout)
    members = {m["member"]: m for m in doc["members"]}
    assert doc["same"] is False
    assert members["demo/_C.abi3.so"]["where"].startswith("section ")


def test_a_broken_wheel_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    proc = wheeldiff(bad, bad)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "not a readable wheel" in proc.stderr

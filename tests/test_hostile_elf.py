"""Hostile input, ELF members: version names that are no version, non-ASCII digits, and a
string table that made ``check`` quadratic.

``check`` reads every native member's symbol versions to find the glibc floor. A
version name of the GLIBC family that is not a version (five parts, 5,000 digits,
Arabic-Indic digits) must end as a finding of that member inside the ELF guard:
``check`` exits with the verification code and ``--json`` stays one document.
``--max-glibc`` and ``[build] max_glibc`` take ASCII digits only. A 4 MB ELF whose
symbol names all run to one NUL at the end of the table is read in linear time
(bench/elf_check.py measures it against the old path). Real parts: ELF files written
byte by byte (tests/elfmaker.py, readable by binutils' readelf), real wheels, the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import elfmaker
from pinwheel.cli import main
from pinwheel.errors import ManifestError
from pinwheel.manifest import load
from pinwheel.release.assemble import _component_lines
from pinwheel.wheels import abifloor, elf
from wheelfactory import make_wheel

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _wheel(tmp_path: Path, so: bytes, name: str = "demo") -> Path:
    out = tmp_path / name
    out.mkdir(exist_ok=True)
    return make_wheel(out, {"demo/_ext.so": so}, dist=name)


def _check_json(tmp_path: Path, *wheels: Path, extra: tuple[str, ...] = ()):
    env = {**os.environ, "PINWHEEL_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "pinwheel", "--json", "check", "--arch", "7.0", "--no-tools",
           "--allow-no-cuda", *extra, *map(str, wheels)]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)


# version name -> (check exit code, what the finding or floor must say)
VERSION_NAMES = {
    "five parts": ("GLIBC_2.3.4.5.6", 6, "1 to 4 groups of ASCII digits"),
    "5,000 digits": ("GLIBC_2." + "7" * 5000, 6, "longer than 4096 bytes"),
    "300 digits": ("GLIBC_2." + "7" * 300, 6, "1 to 4 groups of ASCII digits"),
    "Arabic-Indic digits": ("GLIBC_2.١٧", 6, "1 to 4 groups of ASCII digits"),
    "Arabic-Indic major": ("GLIBC_٢.17", 6, "1 to 4 groups of ASCII digits"),
    "GLIBCXX three parts": ("GLIBCXX_3.4.29", 0, "GLIBCXX 3.4.29"),
    "a release": ("GLIBC_2.17", 0, "GLIBC 2.17"),
    "GLIBC_PRIVATE is no release": ("GLIBC_PRIVATE", 0, ""),
}


@pytest.mark.parametrize("case", sorted(VERSION_NAMES))
def test_check_reads_or_refuses_each_version_name_inside_the_elf_guard(case, tmp_path):
    version, code, gist = VERSION_NAMES[case]
    so = elfmaker.shared_object([("libc.so.6", version)], [(b"memcpy", 2)])
    wheel = _wheel(tmp_path, so)
    proc = _check_json(tmp_path, wheel, extra=("--max-glibc", "2.99"))
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)  # one document, intact
    if code:
        (finding,) = [f for f in doc["findings"] if f["member"] == "demo/_ext.so"]
        assert "cannot read ELF" in finding["message"] and gist in finding["message"], finding
    else:
        floor = doc["wheels"][0]["floor"]
        assert " ".join(f"{k} {v['version']}" for k, v in floor.items()) == gist, doc


@FUZZ
@given(text=st.text(max_size=40))
def test_fuzz_parse_version_is_ascii_digits_or_a_value_error(text):
    try:
        version = abifloor.parse_version(text)
    except ValueError as exc:
        assert "ASCII digits" in str(exc)
        return
    assert all(c in "0123456789." for c in text)
    assert tuple(int(p) for p in text.split(".")) == version and 1 <= len(version) <= 4


@FUZZ
@given(
    tail=st.one_of(
        st.text(max_size=30),
        st.from_regex(r"[0-9]{1,12}(\.[0-9]{1,12}){0,6}", fullmatch=True),
    ),
    family=st.sampled_from(["GLIBC", "GLIBCXX", "CXXABI", "GCC"]),
)
def test_fuzz_requirements_read_a_version_or_raise_value_error(tail, family):
    need = elf.VersionNeed("libc.so.6", f"{family}_{tail}", ("f",))
    try:
        reqs = abifloor.requirements("m.so", [need])
    except ValueError:
        assert family != "GCC" and tail[:1].isdigit()
        return
    for r in reqs:
        assert r.version == tuple(int(p) for p in tail.split(".")) and r.family == family


@FUZZ
@given(data=st.data())
def test_fuzz_garbled_elf_is_an_elf_error_never_another_exception(data):
    good = elfmaker.shared_object(
        [("libc.so.6", "GLIBC_2.17"), ("libstdc++.so.6", "GLIBCXX_3.4.29")],
        [(b"memcpy", 2), (b"_Znwm", 3)],
    )
    blob = bytearray(good)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(blob) - 1))
        blob[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    blob = blob[:cut] if data.draw(st.booleans()) else blob
    try:
        image = elf.parse(bytes(blob))
        needs = elf.version_needs(image, bytes(blob))
        abifloor.requirements("m.so", needs)
    except ValueError:  # ElfError, and a version name that is no version
        pass


def test_the_reader_agrees_with_readelf_on_what_elfmaker_writes(tmp_path):
    so = elfmaker.shared_object(
        [("libc.so.6", "GLIBC_2.17"), ("libc.so.6", "GLIBC_2.34"), ("libm.so.6", "GLIBC_2.29")],
        [(b"memcpy", 2), (b"pthread_create", 3), (b"exp", 4)],
    )
    path = tmp_path / "lib.so"
    path.write_bytes(so)
    text = subprocess.run(["readelf", "-V", str(path)], capture_output=True, text=True).stdout
    needs = elf.version_needs(elf.parse(so), so)
    for need in needs:
        assert f"Name: {need.version}" in text and f"File: {need.library}" in text
    assert [n.symbols for n in needs] == [("memcpy",), ("pthread_create",), ("exp",)]


# --------------------------------------------------------------------------- the 4 MB ELF


def test_a_4_mb_string_table_bomb_is_read_and_checked(tmp_path):
    """Every symbol's name runs to the one NUL at the end of a 2 MB table: read once per
    offset, at most MAX_SYMBOL bytes each (the old reader scanned and copied the rest of
    the table for every symbol: minutes). The pytest timeout is the hang guard only."""
    bomb = elfmaker.string_table_bomb(4 << 20)
    assert len(bomb) >= 4 << 20
    (need,) = elf.version_needs(elf.parse(bomb), bomb)
    assert need.version == "GLIBC_2.17"
    assert need.symbols == ("A" * elf.MAX_SYMBOL + "...",)
    proc = _check_json(tmp_path, _wheel(tmp_path, bomb), extra=("--max-glibc", "2.17"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


def test_a_library_name_longer_than_max_name_is_an_elf_error():
    so = elfmaker.shared_object([("l" * (elf.MAX_NAME + 1), "GLIBC_2.17")], [(b"f", 2)])
    with pytest.raises(elf.ElfError, match="longer than 4096 bytes"):
        elf.version_needs(elf.parse(so), so)


# --------------------------------------------------------------------------- --max-glibc


@pytest.mark.parametrize("value", ["2.٣١", "٢.31", "2.31 ", "2.3.1", "2.1000", "3.1"])
def test_max_glibc_flag_takes_ascii_digits_only(value, tmp_path, capsys):
    wheel = _wheel(tmp_path, elfmaker.shared_object([("libc.so.6", "GLIBC_2.17")], [(b"f", 2)]))
    rc = main(["check", "--arch", "7.0", "--no-tools", "--max-glibc", value, str(wheel)])
    err = capsys.readouterr().err
    assert rc == 2 and "--max-glibc" in err and "next:" in err, err


@pytest.mark.parametrize("value", ["2.٣١", "٢.٣١"])
def test_manifest_max_glibc_takes_ascii_digits_only(value, tmp_path):
    from test_glibc_floor import _manifest

    with pytest.raises(ManifestError, match="max_glibc"):
        load(_manifest(tmp_path, f'max_glibc = "{value}"'))


# --------------------------------------------------------------------------- release notes


def test_release_notes_state_the_floor_read_from_the_elf_not_the_receipts():
    receipt = {
        "components": [
            {
                "wheel": "demo-1.0-py3-none-any.whl",
                "kind": "kernel",
                "sha256": "a" * 64,
                "floor": {
                    "GLIBC": {
                        "version": "2.17",
                        "member": "demo/x.so",
                        "symbol": "memcpy",
                        "library": "libc.so.6",
                    }
                },  # fmt: skip
            }
        ]
    }
    read = abifloor.floor(
        {"demo/x.so": [elf.VersionNeed("libc.so.6", "GLIBC_2.34", ("pthread_create",))]}
    )
    notes = "\n".join(_component_lines(receipt, {"demo-1.0-py3-none-any.whl": read.to_json()}))
    assert "GLIBC 2.34 (pthread_create in demo/x.so)" in notes
    assert "2.17" not in notes

"""The glibc floor: real ELF objects from the system compiler, bound to symbol versions of
different glibc releases (``.symver`` for an old one, the default binding for a new one),
read by pinwheel and compared with binutils' ``objdump -T``; the floor gates ``check``
([build] max_glibc), sets the manylinux tag through auditwheel, and stops ``install``.
"""

from __future__ import annotations

import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from pinwheel.checksums import write_sums
from pinwheel.errors import ManifestError, VerifyError
from pinwheel.manifest import load
from pinwheel.release.assemble import _component_lines
from pinwheel.release.install import InstallRequest, install
from pinwheel.wheels import abifloor, elf, platformtag
from pinwheel.wheels.check import CheckSpec, check_wheels
from pinwheel.wheels.record import BuildRecord
from pinwheel.wheels.wheelset import Built, publish
from wheelfactory import make_wheel

HOST = abifloor.host_glibc()
needs_glibc_234 = pytest.mark.skipif(
    HOST is None or HOST < (2, 34),
    reason=f"pthread_create@GLIBC_2.34 needs a glibc >= 2.34 build host (this one: {HOST})",
)

OLD_C = """#include <string.h>
__asm__(".symver memcpy, memcpy@GLIBC_2.2.5");
void probe_old(char *d, const char *s, size_t n) { memcpy(d, s, n); }
"""
# pthread_create moved into libc.so.6 in glibc 2.34: its default binding is GLIBC_2.34.
NEW_C = """#include <pthread.h>
static void *run(void *a) { return a; }
int probe_new(void) { pthread_t t; return pthread_create(&t, 0, run, 0); }
"""
CXX = """#include <string>
#include <stdexcept>
std::string probe_cxx(const char *s) {
  if (!s) throw std::runtime_error("x");
  return std::string(s) + "!";
}
"""


def compile_so(tmp: Path, name: str, source: str, *extra: str, cxx: bool = False) -> Path:
    src = tmp / (name + (".cc" if cxx else ".c"))
    src.write_text(source)
    out = tmp / f"lib{name}.so"
    cc = "g++" if cxx else "gcc"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src), *extra], check=True)
    return out


def objdump_versions(so: Path) -> dict[str, set[str]]:
    """binutils' view: version -> undefined symbols bound to it (the independent oracle)."""
    out = subprocess.run(["objdump", "-T", str(so)], capture_output=True, text=True, check=True)
    found: dict[str, set[str]] = {}
    for line in out.stdout.splitlines():
        m = re.search(r"\*UND\*\s+\S+\s+\(?([A-Z]+_[\d.]+)\)?\s+(\S+)$", line)
        if m:
            found.setdefault(m.group(1), set()).add(m.group(2))
    return found


def pinwheel_versions(so: Path) -> dict[str, set[str]]:
    blob = so.read_bytes()
    needs = elf.version_needs(elf.parse(blob), blob)
    return {n.version: set(n.symbols) for n in needs if n.symbols}


def wheel_of(tmp: Path, name: str, libs: dict[str, Path]) -> Path:
    files = {f"demo/{member}": path.read_bytes() for member, path in libs.items()}
    return make_wheel(tmp / name, files, dist=name)


@needs_glibc_234
def test_version_needs_agree_with_objdump(tmp_path: Path) -> None:
    old = compile_so(tmp_path, "old", OLD_C)
    new = compile_so(tmp_path, "new", NEW_C)
    cxx = compile_so(tmp_path, "cxx", CXX, cxx=True)
    for so in (old, new, cxx):
        assert pinwheel_versions(so) == objdump_versions(so), so.name
    assert "memcpy" in pinwheel_versions(old)["GLIBC_2.2.5"]
    assert "pthread_create" in pinwheel_versions(new)["GLIBC_2.34"]
    assert any(v.startswith("GLIBCXX_3.4") for v in pinwheel_versions(cxx))
    assert any(v.startswith("CXXABI_1.3") for v in pinwheel_versions(cxx))


@needs_glibc_234
def test_the_floor_is_the_newest_version_with_member_and_symbol(tmp_path: Path) -> None:
    old = compile_so(tmp_path, "old", OLD_C)
    new = compile_so(tmp_path, "new", NEW_C)
    cxx = compile_so(tmp_path, "cxx", CXX, cxx=True)
    wheel = wheel_of(tmp_path, "mixed", {"a_old.so": old, "b_new.so": new, "c_cxx.so": cxx})
    report = check_wheels([wheel], CheckSpec(arches=(), require_cuda=False))
    assert report.ok
    floor = report.wheels[0].floor
    glibc = floor.get("GLIBC")
    assert glibc is not None
    assert (glibc.version, glibc.member, glibc.symbol) == ((2, 34), "demo/b_new.so", "pthread_create")
    glibcxx = floor.get("GLIBCXX")
    assert glibcxx is not None and glibcxx.member == "demo/c_cxx.so"
    assert glibcxx.version >= (3, 4) and floor.get("CXXABI") is not None
    text = "\n".join(report.human_lines())
    assert "floor: GLIBC_2.34" in text and "pthread_create" in text
    assert report.to_json()["wheels"][0]["floor"]["GLIBC"]["version"] == "2.34"

    only_old = wheel_of(tmp_path, "old", {"old.so": old})
    old_floor = check_wheels([only_old], CheckSpec(arches=(), require_cuda=False)).wheels[0].floor
    assert old_floor.glibc == (2, 2, 5)


@needs_glibc_234
def test_max_glibc_fails_a_wheel_above_it_naming_member_and_symbol(tmp_path: Path) -> None:
    new = compile_so(tmp_path, "new", NEW_C)
    old = compile_so(tmp_path, "old", OLD_C)
    wheel = wheel_of(tmp_path, "newer", {"new.so": new, "old.so": old})
    strict = CheckSpec(arches=(), require_cuda=False, max_glibc=(2, 31))
    report = check_wheels([wheel], strict)
    assert not report.ok
    (finding,) = report.errors
    assert finding.rule == "glibc" and finding.member == "demo/new.so"
    assert "GLIBC_2.34 (symbol pthread_create)" in finding.message
    assert "[build] max_glibc 2.31" in finding.message
    assert "max_glibc" in report.next_step() and "docs/build.md" in report.next_step()
    # at the floor itself, and for a wheel of old symbols only, the gate passes
    assert check_wheels([wheel], CheckSpec(arches=(), require_cuda=False, max_glibc=(2, 34))).ok
    only_old = wheel_of(tmp_path, "old", {"old.so": old})
    assert check_wheels([only_old], strict).ok


@pytest.mark.parametrize("value", ["2.31", "2.17", "2.5"])
def test_manifest_takes_max_glibc(tmp_path: Path, value: str) -> None:
    manifest = _manifest(tmp_path, f'max_glibc = "{value}"')
    config = load(manifest).require("build")
    assert config.max_glibc == tuple(int(p) for p in value.split("."))


@pytest.mark.parametrize("value", ['"2.31\\n"', '"3.1"', '"2"', '"2.31.1"', '"latest"', "2.31"])
def test_manifest_refuses_a_malformed_max_glibc(tmp_path: Path, value: str) -> None:
    with pytest.raises(ManifestError) as err:
        load(_manifest(tmp_path, f"max_glibc = {value}")).require("build")
    assert "max_glibc" in str(err.value) and ":" in (err.value.where or "")


def _manifest(tmp: Path, extra: str) -> Path:
    path = tmp / "manifest.toml"
    path.write_text(
        f"""[upstream]
url = "https://example.invalid/engine.git"
commit = "{"a" * 40}"
branch = "main"

[[step]]
action = "pick"
pr = 1
head = "{"b" * 40}"

[build]
cuda = "12.4"
arches = ["7.0"]
{extra}
"""
    )
    return path


@needs_glibc_234
def test_auditwheel_decides_the_manylinux_tag(tmp_path: Path) -> None:
    old = wheel_of(tmp_path, "old", {"old.so": compile_so(tmp_path, "old", OLD_C)})
    new = wheel_of(tmp_path, "new", {"new.so": compile_so(tmp_path, "new", NEW_C)})
    assert platformtag.decide(old).platform == "manylinux_2_5_x86_64"
    assert platformtag.decide(new).platform == "manylinux_2_34_x86_64"


def test_a_library_outside_every_policy_keeps_linux_and_says_why(tmp_path: Path) -> None:
    # libpinwheelprobe.so lives only in the test's folder: no policy allows it, nothing grafts it
    compile_so(tmp_path, "pinwheelprobe", "int probe_dep(void) { return 1; }\n")
    user = compile_so(
        tmp_path,
        "user",
        "int probe_dep(void); int probe_user(void) { return probe_dep(); }\n",
        f"-L{tmp_path}",
        "-lpinwheelprobe",
    )
    wheel = wheel_of(tmp_path, "linked", {"user.so": user})
    decision = platformtag.decide(wheel)
    assert decision.platform == "linux_x86_64" and not decision.manylinux
    assert "libpinwheelprobe.so" in decision.reason


def test_torch_and_cuda_libraries_are_excluded_as_torch_extensions_do(tmp_path: Path) -> None:
    # A stand-in libc10.so (torch's, at run time) built here so the linker records DT_NEEDED.
    c10 = tmp_path / "c10"
    c10.mkdir()
    compile_so(c10, "c10", "int c10_probe(void) { return 1; }\n")
    ext = compile_so(
        tmp_path, "ext", "int c10_probe(void); int ext(void) { return c10_probe(); }\n",
        f"-L{c10}", "-lc10",
    )  # fmt: skip
    wheel = wheel_of(tmp_path, "ext", {"ext.so": ext})
    assert platformtag.decide(wheel).manylinux
    assert not platformtag.decide(wheel, exclude=()).manylinux


def test_retag_changes_only_the_tag_and_stays_a_valid_reproducible_wheel(tmp_path: Path) -> None:
    wheel = wheel_of(tmp_path, "old", {"old.so": compile_so(tmp_path, "old", OLD_C)})
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    out_a.mkdir(), out_b.mkdir()
    a = platformtag.retag(wheel, "manylinux_2_5_x86_64", out_a)
    b = platformtag.retag(wheel, "manylinux_2_5_x86_64", out_b)
    assert a.name == "old-1.0-cp311-cp311-manylinux_2_5_x86_64.whl"
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(wheel) as before, zipfile.ZipFile(a) as after:
        assert [i.filename for i in before.infolist()] == [i.filename for i in after.infolist()]
        meta = after.read("old-1.0.dist-info/WHEEL").decode()
        assert "Tag: cp311-cp311-manylinux_2_5_x86_64" in meta and "linux_x86_64\n" not in meta
        assert after.read("demo/old.so") == before.read("demo/old.so")
    report = check_wheels([a], CheckSpec(arches=(), require_cuda=False))
    assert report.ok, report.human_lines()  # RECORD hashes still match


@needs_glibc_234
def test_publish_records_floor_and_tag_and_the_notes_state_them(tmp_path: Path) -> None:
    new = wheel_of(tmp_path, "newlib", {"new.so": compile_so(tmp_path, "new", NEW_C)})
    record = BuildRecord(source_date_epoch=0, env={}, arches=(), compiled_inputs={}, version="1.0")
    b = Built("newlib", "kernel", new, 1.0, {"origin": "test"}, record)
    out = tmp_path / "wheels"
    result = publish([b], out, spec=CheckSpec(arches=(), require_cuda=False), receipt={})
    (placed,) = result.built
    assert placed.name == "newlib-1.0-cp311-cp311-manylinux_2_34_x86_64.whl"
    receipt = json.loads((out / "provenance.json").read_text())
    (component,) = receipt["components"]
    assert component["floor"]["GLIBC"] == {
        "version": "2.34",
        "member": "demo/new.so",
        "symbol": "pthread_create",
        "library": "libc.so.6",
    }
    assert component["platform_tag"]["platform"] == "manylinux_2_34_x86_64"
    notes = "\n".join(_component_lines(receipt))
    assert "## Where the wheels load" in notes
    assert "GLIBC 2.34 (pthread_create in demo/new.so)" in notes


def test_without_the_locked_auditwheel_the_build_stops_instead_of_renaming_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52: where pinwheel's Python lacked auditwheel, publish kept `linux_x86_64` (a
    second name and sha256 for the same member). Now nothing is published and the error
    names the lock. auditwheel is made unimportable the way Python marks a module absent."""
    import sys

    old = wheel_of(tmp_path, "oldlib", {"old.so": compile_so(tmp_path, "old", OLD_C)})
    record = BuildRecord(source_date_epoch=0, env={}, arches=(), compiled_inputs={}, version="1.0")
    b = Built("oldlib", "kernel", old, 1.0, {"origin": "test"}, record)
    out = tmp_path / "wheels"
    for name in [m for m in sys.modules if m == "auditwheel" or m.startswith("auditwheel.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "auditwheel", None)
    with pytest.raises(platformtag.LockedToolMissing) as err:
        publish([b], out, spec=CheckSpec(arches=(), require_cuda=False), receipt={})
    assert "auditwheel" in err.value.what and "locks/replay.txt" in (err.value.next or "")
    assert not list(out.glob("*.whl")) if out.exists() else True


@needs_glibc_234
def test_install_refuses_a_wheel_above_the_machines_glibc_before_installing(
    tmp_path: Path,
) -> None:
    new = wheel_of(tmp_path, "newlib", {"new.so": compile_so(tmp_path, "new", NEW_C)})
    release = new.parent
    write_sums(release, [new.name])
    venv = tmp_path / "venv"
    with pytest.raises(VerifyError) as err:
        install(InstallRequest(release, venv, None, no_deps=True, target_glibc=(2, 31),
                               allow_unsigned=True))  # fmt: skip
    text = str(err.value)
    assert "GLIBC_2.34" in text and "pthread_create" in text and "demo/new.so" in text
    assert "2.31" in (err.value.next or "")
    assert not venv.exists()  # refused before a venv was made


@needs_glibc_234
def test_check_cli_takes_max_glibc_and_refuses_a_malformed_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pinwheel.cli import main

    wheel = wheel_of(tmp_path, "newer", {"new.so": compile_so(tmp_path, "new", NEW_C)})
    argv = ["check", str(wheel), "--arch", "7.0", "--allow-no-cuda", "--no-tools"]
    assert main([*argv, "--max-glibc", "2.34"]) == 0
    assert "floor: GLIBC_2.34" in capsys.readouterr().out
    assert main([*argv, "--max-glibc", "2.31"]) == 6
    out = capsys.readouterr().out
    assert "demo/new.so: needs GLIBC_2.34 (symbol pthread_create)" in out
    assert main([*argv, "--max-glibc", "2.31;rm"]) == 2

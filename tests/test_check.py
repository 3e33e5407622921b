"""The artifact check on real files: gcc-built .so files with a .nv_fatbin section added by
objcopy, zipped into wheels with a correct RECORD, then broken one way per test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pinwheel.cudaarch import CudaArch, parse_arches
from pinwheel.errors import VerifyError
from pinwheel.wheels import elf
from pinwheel.wheels import fatbin as fatbin_reader
from pinwheel.wheels.check import CheckSpec, check_wheels, find_tools, unsafe_rpath_reason
from wheelfactory import FakeEntry, cuda_so, fatbin, host_so, make_wheel, section

pytestmark = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("objcopy")), reason="needs gcc and objcopy"
)

SM70 = (FakeEntry("sass", 70), FakeEntry("ptx", 70, compressed=True))
SPEC = CheckSpec(arches=parse_arches(["7.0+PTX"]))


def wheel_with(tmp_path: Path, so: Path, member: str = "demo/_C.abi3.so", **kw) -> Path:
    files = {member: so.read_bytes(), "demo/__init__.py": b"from . import _C\n"}
    files.update(kw.pop("extra", {}))
    return make_wheel(tmp_path / "dist", files, **kw)


def messages(report) -> list[str]:
    return [f.line() for f in report.errors]


def test_good_sm70_wheel_passes_and_reports_arches(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "good", section(fatbin(SM70), fatbin([FakeEntry("sass", 70)])))
    report = check_wheels([wheel_with(tmp_path, so)], SPEC)
    assert report.ok, messages(report)
    (wheel,) = report.wheels
    (shared,) = [s for s in wheel.shared_objects if s.is_cuda]
    assert shared.member == "demo/_C.abi3.so"
    assert (shared.sass, shared.ptx, shared.fatbins, shared.compressed) == ((70,), (70,), 2, True)
    assert report.human_lines()[-1].startswith("PASS: 1 wheel(s), 0 error(s)")
    payload = report.to_json()
    assert payload["ok"] is True
    assert payload["wheels"][0]["shared_objects"][0]["sass"] == ["sm_70"]


def test_sm75_only_wheel_fails_naming_the_so_and_arches(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "turing", section(fatbin([FakeEntry("sass", 75), FakeEntry("ptx", 75)])))
    whl = wheel_with(tmp_path, so, member="demo/_moe_C.abi3.so")
    report = check_wheels([whl], SPEC)
    assert not report.ok
    sass = [f for f in report.errors if f.rule == "sass"]
    assert len(sass) == 1
    line = sass[0].line()
    assert whl.name in line and "demo/_moe_C.abi3.so" in line
    assert "found sm_75, need sm_70" in line
    ptx = [f for f in report.errors if f.rule == "ptx"]
    assert ptx and "found compute_75" in ptx[0].message
    with pytest.raises(VerifyError) as err:
        report.raise_if_failed()
    assert err.value.exit_code == 6 and "found sm_75, need sm_70" in str(err.value)


def test_ptx_only_is_not_machine_code(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "ptxonly", section(fatbin([FakeEntry("ptx", 70)])))
    report = check_wheels([wheel_with(tmp_path, so)], CheckSpec(arches=(CudaArch(70),)))
    (finding,) = report.errors
    assert "found none, need sm_70 (PTX only: compute_70)" in finding.message


def test_private_rpath_fails(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "rp", section(fatbin(SM70)), rpath="/home/x/build")
    assert elf.dynamic(elf.parse(so.read_bytes()), so.read_bytes()).rpath == ("/home/x/build",)
    report = check_wheels([wheel_with(tmp_path, so)], SPEC)
    (finding,) = report.errors
    assert finding.rule == "rpath"
    assert "RPATH '/home/x/build': inside a home directory" in finding.line()
    assert "demo/_C.abi3.so" in finding.line()


def test_origin_runpath_passes_and_build_dir_runpath_fails(tmp_path: Path) -> None:
    good = cuda_so(
        tmp_path / "a", "ok", section(fatbin(SM70)), rpath="$ORIGIN/../torch/lib", runpath=True
    )
    assert check_wheels([wheel_with(tmp_path / "a", good)], SPEC).ok
    bad = cuda_so(
        tmp_path / "b", "bad", section(fatbin(SM70)), rpath="/srv/ci/src/build/lib", runpath=True
    )
    report = check_wheels([wheel_with(tmp_path / "b", bad)], SPEC)
    assert [f.rule for f in report.errors] == ["rpath"]
    assert "RUNPATH '/srv/ci/src/build/lib'" in report.errors[0].message


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("$ORIGIN", None),
        ("${ORIGIN}/../lib", None),
        ("/usr/local/cuda/lib64", None),
        ("/root/.cache/x", "inside a home directory"),
        ("/tmp/pip-build-env-1/lib", "inside a temporary directory"),
        ("lib", "relative path resolves against the process's working directory"),
        (
            "/opt/src/cmake-build-release",
            "looks like a build directory (component 'cmake-build-release')",
        ),
        ("/srv/tree/out", "inside the build directory /srv/tree"),
    ],
)
def test_rpath_rules(entry: str, reason: str | None) -> None:
    assert unsafe_rpath_reason(entry, ["/srv/tree"]) == reason


@pytest.mark.parametrize(
    ("member", "entry", "reason"),
    [
        ("demo/_C.abi3.so", "$ORIGIN/..", None),  # site-packages: the wheel's own root
        ("torch/lib/x.so", "$ORIGIN/../../nvidia/cublas/lib", None),
        ("demo/_C.abi3.so", "$ORIGIN/../..", "climbs out of the folder the wheel installs into"),
        ("demo/_C.abi3.so", "${ORIGIN}/../../..", "climbs out of the folder the wheel installs into"),
        ("demo/lib/x.so", "$ORIGIN/../../../etc/../lib", "climbs out of the folder the wheel installs into"),
        ("demo-1.0.data/data/lib/x.so", "$ORIGIN/..", None),
        ("demo-1.0.data/data/lib/x.so", "$ORIGIN/../..", "climbs out of the folder the wheel installs into"),
    ],
)  # fmt: skip
def test_origin_rpath_may_not_climb_out_of_the_install_root(
    member: str, entry: str, reason: str | None
) -> None:
    assert unsafe_rpath_reason(entry, (), member) == reason


def test_origin_rpath_climbing_out_of_the_wheel_fails_the_check(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "climb", section(fatbin(SM70)), rpath="$ORIGIN/../../..")
    report = check_wheels([wheel_with(tmp_path, so)], SPEC)
    (finding,) = report.errors
    assert finding.rule == "rpath" and finding.member == "demo/_C.abi3.so"
    assert "RPATH '$ORIGIN/../../..': climbs out of the folder the wheel installs into" in (
        finding.line()
    )


def test_two_spellings_of_one_file_fail(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "dup", section(fatbin(SM70)))
    whl = wheel_with(tmp_path, so, extra={"demo/x.py": b"good = 1\n", "./demo/x.py": b"evil\n"})
    report = check_wheels([whl], SPEC)
    found = [(f.rule, f.member, f.message) for f in report.errors]
    assert ("zip", "./demo/x.py", "names the same file as 'demo/x.py' (installers disagree on "
            "which wins)") in found, found  # fmt: skip


def test_a_member_that_is_a_file_and_a_folder_fails(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "clash", section(fatbin(SM70)))
    whl = wheel_with(tmp_path, so, extra={"demo/util": b"a file\n", "demo/util/x.py": b"x\n"})
    report = check_wheels([whl], SPEC)
    found = [(f.rule, f.member, f.message) for f in report.errors]
    assert found == [
        ("zip", "demo/util", "is a file and a folder at once (one of them cannot be installed)")
    ]


def test_tampered_record_fails_naming_the_member(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "rec", section(fatbin(SM70)))
    whl = wheel_with(tmp_path, so)
    # Rewrite one member after the RECORD was written (what a tampering mirror would do).
    tampered = tmp_path / "tampered" / whl.name
    tampered.parent.mkdir()
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(tampered, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "demo/__init__.py":
                data = b"import os; os.system('id')\n"
            dst.writestr(info, data)
    report = check_wheels([tampered], SPEC)
    assert {(f.rule, f.member) for f in report.errors} == {("record", "demo/__init__.py")}
    found = " | ".join(f.message for f in report.errors)
    assert "RECORD sha256 mismatch" in found and "RECORD size mismatch" in found


def test_unlisted_and_missing_record_rows_fail(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "rows", section(fatbin(SM70)))
    whl = wheel_with(
        tmp_path, so, record_override={"demo/__init__.py": "demo/gone.py,sha256=AAAA,4"}
    )
    found = {(f.member, f.message) for f in check_wheels([whl], SPEC).errors}
    assert ("demo/__init__.py", "not listed in RECORD") in found
    assert ("demo/gone.py", "listed in RECORD but not in the wheel") in found


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        ("../evil.py", "'..' component"),
        ("/etc/cron.d/evil", "absolute path"),
        ("demo/../../x.pth", "'..' component"),
    ],
)
def test_zip_slip_member_fails(tmp_path: Path, member: str, reason: str) -> None:
    so = cuda_so(tmp_path, "slip", section(fatbin(SM70)))
    report = check_wheels([wheel_with(tmp_path, so, extra={member: b"x = 1\n"})], SPEC)
    zips = [f for f in report.errors if f.rule == "zip"]
    assert [f.member for f in zips] == [member]
    assert reason in zips[0].message


def test_symlink_member_fails(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "link", section(fatbin(SM70)))
    whl = wheel_with(tmp_path, so, symlinks={"demo/libcuda.so": "/usr/lib/libcuda.so"})
    zips = [f for f in check_wheels([whl], SPEC).errors if f.rule == "zip"]
    assert [f.member for f in zips] == ["demo/libcuda.so"]
    assert "symlink member (-> '/usr/lib/libcuda.so')" in zips[0].message


def test_missing_required_member_fails(tmp_path: Path) -> None:
    so = cuda_so(tmp_path, "req", section(fatbin(SM70)))
    whl = wheel_with(tmp_path, so)
    spec = CheckSpec(
        arches=SPEC.arches, required_members=("demo/_C*.so", "demo:demo/_flashmla_C*.so", "other:x")
    )
    report = check_wheels([whl], spec)
    missing = sorted(f.message for f in report.errors)
    assert len(missing) == 2
    assert "required member 'demo/_flashmla_C*.so' is missing" in missing[0]
    assert "required member 'x' is missing" in missing[1]
    assert any("no wheel of distribution 'other'" in f.wheel for f in report.errors)


def test_wheel_without_cuda_objects_fails_unless_allowed(tmp_path: Path) -> None:
    so = host_so(tmp_path, "plain")
    whl = wheel_with(tmp_path, so)
    (finding,) = check_wheels([whl], SPEC).errors
    assert finding.rule == "cuda" and "ELF members: demo/_C.abi3.so" in finding.message
    relaxed = CheckSpec(arches=SPEC.arches, require_cuda=False)
    assert check_wheels([whl], relaxed).ok


def test_corrupt_fatbin_is_reported(tmp_path: Path) -> None:
    blob = bytearray(fatbin(SM70))
    blob[16 + 8 : 16 + 16] = (10**9).to_bytes(8, "little")  # first entry claims 1 GB payload
    so = cuda_so(tmp_path, "corrupt", bytes(blob))
    report = check_wheels([wheel_with(tmp_path, so)], SPEC)
    assert any(f.rule == "fatbin" and "overruns its fatbin" in f.message for f in report.errors)


def test_parse_arches_spellings() -> None:
    assert parse_arches(["7.0", "sm_70+PTX", "80", "compute_75"]) == (
        CudaArch(70, True),
        CudaArch(75, True),
        CudaArch(80, False),
    )
    assert parse_arches(["7.0;8.6+PTX"])[1].torch == "8.6+PTX"


def test_cli_check_json_and_exit_code(tmp_path: Path) -> None:
    good = wheel_with(tmp_path / "g", cuda_so(tmp_path / "g", "g", section(fatbin(SM70))))
    bad = wheel_with(
        tmp_path / "b",
        cuda_so(tmp_path / "b", "b", section(fatbin([FakeEntry("sass", 75)]))),
        dist="bad",
    )
    env = {**os.environ, "PINWHEEL_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "pinwheel", "check", "--arch", "7.0", "--no-tools", "--json"]
    ok = subprocess.run([*cmd, str(good)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    fail = subprocess.run(
        [*cmd, str(good), str(bad)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert fail.returncode == 6
    payload = json.loads(fail.stdout)
    assert payload["ok"] is False
    assert payload["findings"][0]["member"] == "demo/_C.abi3.so"
    assert "found sm_75, need sm_70" in payload["findings"][0]["message"]
    human = subprocess.run(
        [*cmd[:-1], str(bad)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert human.returncode == 6
    assert f"error: {bad.name}: demo/_C.abi3.so: no SASS for sm_70: found sm_75" in human.stdout


def _nvcc_so(tmp_path: Path, gencode: list[str]) -> Path:
    src = tmp_path / "k.cu"
    src.write_text(
        "__global__ void k(float* a) { a[threadIdx.x] *= 2.0f; }\n"
        'extern "C" void go(float* a) { k<<<1, 32>>>(a); }\n'
    )
    so = tmp_path / "k.so"
    cmd = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-o", str(so), str(src)]
    for code in gencode:
        cmd += ["-gencode", code]
    subprocess.run(cmd, check=True)
    return so


@pytest.fixture(scope="module")
def nvcc_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An NVIDIA-made .so: sm_80 and sm_90 SASS, each with its PTX (nvcc 12.x and 13.x both
    target these). Not made by the reader's own writer, so the reader can be wrong here."""
    if not shutil.which("nvcc"):
        if os.environ.get("PINWHEEL_REQUIRE_NVCC"):  # the kernels nox session: must run
            pytest.fail("PINWHEEL_REQUIRE_NVCC is set but no nvcc is on PATH")
        pytest.skip("needs an nvcc (any version) to make a real fatbin")
    return _nvcc_so(
        tmp_path_factory.mktemp("nvcc"),
        ["arch=compute_80,code=[sm_80,compute_80]", "arch=compute_90,code=[sm_90,compute_90]"],
    )


def test_real_nvcc_fatbin_is_read(nvcc_so: Path, tmp_path: Path) -> None:
    data = nvcc_so.read_bytes()
    image = elf.parse(data)
    section = image.section(".nv_fatbin")
    assert section is not None
    blobs = fatbin_reader.parse_section(section.data(data))
    assert set().union(*(b.sass for b in blobs)) == {80, 90}
    assert set().union(*(b.ptx for b in blobs)) == {80, 90}
    # The same through a file reader (what check uses: pread, never the whole file).
    with open(nvcc_so, "rb") as fh:
        reader = elf.FileReader(fh)
        from_file = fatbin_reader.parse_section(reader, section.offset, section.size)
    assert [b.entries for b in from_file] == [b.entries for b in blobs]

    ok = check_wheels(
        [wheel_with(tmp_path / "ok", nvcc_so)], CheckSpec(parse_arches(["8.0+PTX", "9.0"]))
    )
    assert ok.ok, messages(ok)
    (so,) = [s for s in ok.wheels[0].shared_objects if s.is_cuda]
    assert (so.sass, so.ptx) == ((80, 90), (80, 90))
    report = check_wheels([wheel_with(tmp_path / "bad", nvcc_so)], SPEC)
    assert [f.rule for f in report.errors] == ["sass", "ptx"]  # no sm_70, no PTX <= 70
    assert "found sm_80, sm_90, need sm_70" in report.errors[0].message


def _garbled(data: bytes, rng) -> list[bytes]:
    """Truncations at random points (and at header edges), and random bytes flipped."""
    cuts = {0, 3, 4, 16, 51, 52, 63, 64, len(data) // 2, len(data) - 1}
    cuts |= {rng.randrange(len(data)) for _ in range(40)}
    out = [data[:c] for c in sorted(cuts)]
    for _ in range(40):
        flipped = bytearray(data)
        for _ in range(rng.randrange(1, 16)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        out.append(bytes(flipped))
    return out


def test_elf_and_fatbin_readers_never_crash_on_truncated_or_garbled_input(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import random

    rng = random.Random(1234)
    samples = [cuda_so(tmp_path, "fz", section(fatbin(SM70), fatbin([FakeEntry("sass", 75)])))]
    if shutil.which("nvcc"):
        samples.append(request.getfixturevalue("nvcc_so"))
    tried = 0
    for so in samples:
        for blob in _garbled(so.read_bytes(), rng):
            tried += 1
            try:
                image = elf.parse(blob)
                elf.dynamic(image, blob)
                for sec in image.sections:
                    if sec.name in fatbin_reader.SECTIONS and sec.type != elf.SHT_NOBITS:
                        fatbin_reader.parse_section(blob, sec.offset, sec.size)
            except (elf.ElfError, fatbin_reader.FatbinError):
                pass  # a clean refusal; anything else fails the test
    assert tried >= 90
    # Through the whole check: a garbled .so is a finding, never a traceback.
    bad = bytearray(samples[0].read_bytes())
    bad[40:48] = (len(bad) * 4).to_bytes(8, "little")  # e_shoff past the end of the file
    garbled = tmp_path / "garbled.so"
    garbled.write_bytes(bytes(bad))
    report = check_wheels([wheel_with(tmp_path / "g", garbled)], SPEC)
    assert any(f.rule == "fatbin" and "cannot read ELF" in f.message for f in report.errors)


def test_auditwheel_show_runs_when_installed(tmp_path: Path) -> None:
    _, auditwheel = find_tools()
    if auditwheel is None:
        pytest.skip("auditwheel not installed")
    so = cuda_so(tmp_path, "aw", section(fatbin(SM70)))
    report = check_wheels(
        [wheel_with(tmp_path, so)], CheckSpec(arches=SPEC.arches, auditwheel=auditwheel)
    )
    assert report.ok, messages(report)
    assert "platform tag" in (report.wheels[0].auditwheel or "")
    assert any(ln.startswith("  auditwheel show: manylinux_") for ln in report.human_lines())

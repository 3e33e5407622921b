"""The one wheel path: publish() keeps wheels/ a consistent set whatever happens.

Real wheels (zipped with a correct RECORD), the real check, real files; the
crash between the two renames of a swap is recreated on disk, not simulated.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pinwheel.checksums import parse_sums
from pinwheel.cudaarch import parse_arches
from pinwheel.errors import VerifyError
from pinwheel.wheels.check import CheckSpec
from pinwheel.wheels.record import BuildRecord
from pinwheel.wheels.wheelset import Built, publish, recover
from releasekit import make_wheel

SPEC = CheckSpec(arches=(), require_cuda=False)


def built(tmp: Path, component: str, version: str, kind: str = "kernel", seed: int = 0) -> Built:
    wheel = make_wheel(tmp / "scratch" / component / version, component, version, 64, seed)
    return Built(component, kind, wheel, 1.0, {"origin": f"test {component}"},
                 BuildRecord(source_date_epoch=0, env={}, arches=(), compiled_inputs={},
                             version=version))  # fmt: skip


def receipt() -> dict[str, object]:
    return {"schema": "pinwheel.provenance/1", "manifest": {"sha256": "0" * 64}}


def sums_ok(out: Path) -> None:
    subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=out, check=True,
                   capture_output=True)  # fmt: skip


def test_a_second_build_keeps_the_other_components_and_lists_them(tmp_path: Path) -> None:
    out = tmp_path / "wheels"
    publish([built(tmp_path, "alpha", "1.0"), built(tmp_path, "beta", "1.0")], out,
            spec=SPEC, receipt=receipt())  # fmt: skip
    second = publish([built(tmp_path, "beta", "2.0", seed=1)], out, spec=SPEC, receipt=receipt())
    names = sorted(p.name for p in out.glob("*.whl"))
    assert names == ["alpha-1.0-py3-none-any.whl", "beta-2.0-py3-none-any.whl"]
    assert second.kept == ("alpha-1.0-py3-none-any.whl",)
    assert sorted(parse_sums((out / "SHA256SUMS").read_text())) == names
    sums_ok(out)
    prov = json.loads((out / "provenance.json").read_text())
    assert sorted(prov["wheels"]) == names
    assert prov["built"] == ["beta-2.0-py3-none-any.whl"]
    comps = {c["name"]: c for c in prov["components"]}
    assert comps["alpha"]["version"] == "1.0" and comps["beta"]["version"] == "2.0"  # alpha's record kept
    assert not list(tmp_path.glob(".wheels.*"))  # no staging or old dir left


def test_a_wheel_failing_the_check_leaves_the_previous_set_untouched(tmp_path: Path) -> None:
    out = tmp_path / "wheels"
    publish([built(tmp_path, "alpha", "1.0")], out, spec=SPEC, receipt=receipt())
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    strict = CheckSpec(arches=parse_arches(["7.0"]))  # a pure-Python wheel has no sm_70
    with pytest.raises(VerifyError):
        publish([built(tmp_path, "beta", "1.0")], out, spec=strict, receipt=receipt())
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not list(tmp_path.glob(".wheels.*"))


def test_a_wheel_not_vouched_for_by_sha256sums_is_dropped(tmp_path: Path) -> None:
    out = tmp_path / "wheels"
    publish([built(tmp_path, "alpha", "1.0")], out, spec=SPEC, receipt=receipt())
    stray = make_wheel(out, "stray", "0.1")  # put there by hand: no SUMS line
    tampered = out / "alpha-1.0-py3-none-any.whl"
    tampered.write_bytes(tampered.read_bytes() + b"\0")  # no longer matches its SUMS line
    result = publish([built(tmp_path, "beta", "1.0")], out, spec=SPEC, receipt=receipt())
    assert result.kept == ()
    assert sorted(p.name for p in out.glob("*.whl")) == ["beta-1.0-py3-none-any.whl"]
    assert not stray.exists()
    sums_ok(out)


def test_a_swap_interrupted_between_its_renames_is_undone(tmp_path: Path) -> None:
    out = tmp_path / "wheels"
    publish([built(tmp_path, "alpha", "1.0")], out, spec=SPEC, receipt=receipt())
    # The state a kill between `out -> .old` and `staging -> out` leaves behind:
    out.rename(tmp_path / ".wheels.old")
    (tmp_path / ".wheels.staging-99999").mkdir()
    recover(out)
    assert (out / "alpha-1.0-py3-none-any.whl").is_file()
    sums_ok(out)
    assert not list(tmp_path.glob(".wheels.*"))


def test_other_files_in_the_output_dir_survive_a_publish(tmp_path: Path) -> None:
    out = tmp_path / "wheels"
    publish([built(tmp_path, "alpha", "1.0")], out, spec=SPEC, receipt=receipt())
    (out / "NOTES.txt").write_text("mine\n")
    publish([built(tmp_path, "alpha", "1.1")], out, spec=SPEC, receipt=receipt())
    assert (out / "NOTES.txt").read_text() == "mine\n"
    assert [p.name for p in out.glob("*.whl")] == ["alpha-1.1-py3-none-any.whl"]


def test_engine_required_members_wait_for_the_engine(tmp_path: Path) -> None:
    """[build] required_members name the engine's files: a kernel-only set is not judged by
    them, a set with the engine is (and a kept engine still satisfies them)."""
    out = tmp_path / "wheels"
    needs = CheckSpec(arches=(), require_cuda=False, required_members=("engine/__init__.py",))
    publish([built(tmp_path, "kern", "1.0")], out, spec=needs, receipt=receipt())  # no engine
    with pytest.raises(VerifyError) as err:  # an engine wheel without the member
        publish([built(tmp_path, "other", "1.0", kind="engine")], out, spec=needs,
                receipt=receipt())  # fmt: skip
    assert "required member 'engine/__init__.py' is missing" in str(err.value)
    publish([built(tmp_path, "engine", "1.0", kind="engine")], out, spec=needs, receipt=receipt())
    publish([built(tmp_path, "kern", "1.1")], out, spec=needs, receipt=receipt())  # kept engine
    assert sorted(p.name for p in out.glob("*.whl")) == [
        "engine-1.0-py3-none-any.whl",
        "kern-1.1-py3-none-any.whl",
    ]

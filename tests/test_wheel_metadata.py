"""`pinwheel check` holds METADATA and WHEEL to the file name (packaging's parser), and
names direct-URL requirements; real wheels zipped here, real packaging."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from pinwheel.wheels.check import CheckSpec, check_wheels
from pinwheel.wheels.metadata import CAP, direct_references, read_path


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(
    tmp: Path,
    filename: str = "demo-1.0-py3-none-any.whl",
    *,
    info: str = "demo-1.0.dist-info",
    metadata: bytes = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
    tags: str = "Tag: py3-none-any\n",
) -> Path:
    """A wheel with a correct RECORD whose METADATA/WHEEL say what the caller asks."""
    members = {
        "demo/__init__.py": b"",
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n" + tags.encode(),
    }
    rows = [f"{n},{_hash(d)},{len(d)}" for n, d in members.items()] + [f"{info}/RECORD,,"]
    members[f"{info}/RECORD"] = ("\n".join(rows) + "\n").encode()
    path = tmp / filename
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)
    return path


def _metadata_errors(path: Path) -> list[str]:
    report = check_wheels([path], CheckSpec((), require_cuda=False))
    return [f.message for f in report.errors if f.rule == "metadata"]


def test_a_consistent_wheel_passes(tmp_path: Path) -> None:
    assert _metadata_errors(wheel(tmp_path)) == []
    meta = read_path(tmp_path / "demo-1.0-py3-none-any.whl")
    assert (meta.name, meta.version, meta.metadata_version) == ("demo", "1.0", "2.1")
    assert meta.tags == {"py3-none-any"}


def test_version_in_metadata_differs_from_the_file_name(tmp_path: Path) -> None:
    path = wheel(
        tmp_path,
        "demo-1.0+pw.v100.cu124-py3-none-any.whl",
        info="demo-1.0+pw.v100.cu124.dist-info",
        metadata=b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
    )
    errors = _metadata_errors(path)
    assert any("METADATA Version '1.0'" in e and "1.0+pw.v100.cu124" in e for e in errors)


def test_name_and_dist_info_must_match(tmp_path: Path) -> None:
    path = wheel(tmp_path, metadata=b"Metadata-Version: 2.1\nName: other\nVersion: 1.0\n")
    assert any("METADATA Name 'other'" in e for e in _metadata_errors(path))
    path = wheel(tmp_path, "demo-2.0-py3-none-any.whl",
                 metadata=b"Metadata-Version: 2.1\nName: demo\nVersion: 2.0\n")  # fmt: skip
    assert any("demo-1.0.dist-info does not match" in e for e in _metadata_errors(path))


def test_wheel_tags_differ_from_the_file_name_after_a_retag(tmp_path: Path) -> None:
    path = wheel(
        tmp_path,
        "demo-1.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        tags="Tag: cp312-cp312-linux_x86_64\n",
    )
    errors = _metadata_errors(path)
    assert any("WHEEL tags ['cp312-cp312-linux_x86_64']" in e for e in errors), errors


def test_invalid_core_metadata_is_named(tmp_path: Path) -> None:
    path = wheel(tmp_path, metadata=b"Name: demo\nVersion: 1.0\n")  # no Metadata-Version
    assert any("not a valid metadata version" in e for e in _metadata_errors(path))
    path = wheel(tmp_path, metadata=b"Metadata-Version: 2.1\nName: demo\nVersion: not a version\n")
    assert _metadata_errors(path)


def test_hostile_metadata_control_characters_non_ascii_and_size(tmp_path: Path) -> None:
    path = wheel(tmp_path, metadata="Metadata-Version: 2.1\nName: démo\x1b[2J\nVersion: 1.0\n"
                 .encode())  # fmt: skip
    assert _metadata_errors(path)
    huge = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nSummary: " + b"x" * (CAP + 10)
    errors = _metadata_errors(wheel(tmp_path, metadata=huge))
    assert any("larger than" in e for e in errors), errors
    huge_number = b"Metadata-Version: 2.1\nName: demo\nVersion: 1" + b"0" * 5000 + b"\n"
    assert _metadata_errors(wheel(tmp_path, metadata=huge_number))
    no_meta = tmp_path / "bare"
    no_meta.mkdir()
    p = no_meta / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("demo/__init__.py", b"")
    assert not read_path(p).ok


@pytest.mark.parametrize(
    "req",
    [
        "evil @ file:///tmp/evil-1.0-py3-none-any.whl",
        "evil @ git+https://example.invalid/evil.git@main",
        "evil@https://example.invalid/evil.whl",
        "not a requirement ((",
    ],
)
def test_direct_references_are_named(req: str) -> None:
    assert direct_references(("torch>=2.9", req)) == [req]


def test_plain_requirements_are_not_direct_references() -> None:
    assert direct_references(("torch==2.10.0", "numpy>=1.26; python_version>='3.10'")) == []

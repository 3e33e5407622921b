"""torch for a torch-extension kernel is installed only by hash, from the manifest's hashed
lock (``[build.requirements]``): a real venv, a real ``pip --require-hashes`` from a
wheelhouse holding a torch stand-in wheel made here (its hash is that file's sha256); no
lock, a lock pinning another torch, or a file other than the hashed one stops with the
manifest key and the commands that write the lock."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest

from pinwheel import manifest
from pinwheel.compile.buildvenv import BuildVenvError
from pinwheel.compile.kernels import _torch_version, torch_lock, torch_venv
from pinwheel.errors import ManifestError
from pinwheel.manifest.build import Requirements
from pinwheel.options import host as host_of
from pinwheel.progress import SILENT

ROOT = Path(__file__).resolve().parent.parent
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"
TORCH = "2.11.0"


def _config(tmp: Path, lock_text: str | None, torch_index: str | None = None):
    base = manifest.load(ROOT / "manifest.toml").build
    reqs = None
    if lock_text is not None:
        path = tmp / "torch-requirements.txt"
        path.write_text(lock_text)
        reqs = Requirements(path, hashlib.sha256(path.read_bytes()).hexdigest())
    return dataclasses.replace(
        base, python=HERE, torch=TORCH, requirements=reqs, torch_index=torch_index
    )


def _wheel(folder: Path, version: str = TORCH, body: str = "") -> Path:
    """A torch stand-in wheel (metadata and an empty package), made here."""
    folder.mkdir(parents=True, exist_ok=True)
    whl = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f'__version__ = "{version}"\n{body}',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(whl, "w") as zf:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            zf.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), text)
    return whl


def _lock_for(whl: Path) -> str:
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    return f"torch=={TORCH} \\\n    --hash=sha256:{digest}\n"


def test_no_hashed_lock_names_the_key_and_how_to_write_it(tmp_path: Path) -> None:
    config = _config(tmp_path, None, torch_index="https://torch-index.invalid/whl/cu128")
    with pytest.raises(ManifestError) as err:
        torch_venv(config, tmp_path / "cache", SILENT, host_of({}))
    assert err.value.where == "[build.requirements]"
    assert f"torch = {TORCH}" in err.value.what and "only by hash" in err.value.what
    nxt = err.value.next or ""
    assert "uv pip compile --generate-hashes" in nxt and f"torch=={TORCH}" in nxt
    assert "--index-url https://torch-index.invalid/whl/cu128" in nxt
    assert "sha256sum" in nxt and "PINWHEEL_TORCH_PYTHON" in nxt
    assert not (tmp_path / "cache").exists()  # nothing made, nothing downloaded


def test_a_lock_pinning_another_torch_or_no_hash_is_refused(tmp_path: Path) -> None:
    other = _config(tmp_path, "torch==2.10.0 \\\n    --hash=sha256:" + "a" * 64 + "\n")
    with pytest.raises(ManifestError) as err:
        torch_lock(other)
    assert "torch-requirements.txt" in (err.value.where or "")
    assert "pins torch 2.10.0" in err.value.what
    unpinned = _config(tmp_path, "numpy==2.4.6 \\\n    --hash=sha256:" + "b" * 64 + "\n")
    with pytest.raises(ManifestError, match="pins torch not at all"):
        torch_lock(unpinned)


def test_torch_is_installed_by_the_locks_hash(tmp_path: Path) -> None:
    house = tmp_path / "wheelhouse"
    whl = _wheel(house)
    config = _config(tmp_path, _lock_for(whl))
    env = {"PINWHEEL_WHEELHOUSE": str(house)}
    python = torch_venv(config, tmp_path / "cache", SILENT, host_of(env))
    assert _torch_version(python) == TORCH
    assert (tmp_path / "cache") in python.parents
    # Made once: the second call reuses it.
    assert torch_venv(config, tmp_path / "cache", SILENT, host_of(env)) == python
    # Another file under the same name (what an index serving another build would give):
    # pip's --require-hashes refuses it, nothing is installed.
    _wheel(house, body="# another build\n")
    with pytest.raises(BuildVenvError) as err:
        torch_venv(config, tmp_path / "other-cache", SILENT, host_of(env))
    assert "hash" in (err.value.next or "")

"""torch for a torch-extension kernel is installed only by hash, from the manifest's hashed
lock (``[build.torch_lock]``, else ``[build.requirements]``): a real venv, a real
``pip --require-hashes`` from a wheelhouse holding a torch stand-in wheel made here (its hash
is that file's sha256); no lock, a lock pinning another torch or a torch of another CUDA, or
a file other than the hashed one stops with the manifest key and the commands that write
the lock. The system manifests' own locks are read against the torch wheels measured on PyPI
(file, sha256, CUDA runtime) and the card's torch backend."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from pinwheel import manifest
from pinwheel.compile.buildvenv import BuildVenvError, parse_requirements
from pinwheel.compile.kernels import _torch_version, torch_lock, torch_venv
from pinwheel.errors import ManifestError
from pinwheel.manifest.build import Requirements
from pinwheel.manifest.targets import lock_cuda
from pinwheel.options import host as host_of
from pinwheel.progress import SILENT

ROOT = Path(__file__).resolve().parent.parent
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"
TORCH = "2.11.0"


def _reqs(tmp: Path, lock_text: str, name: str = "torch-requirements.txt") -> Requirements:
    path = tmp / name
    path.write_text(lock_text)
    return Requirements(path, hashlib.sha256(path.read_bytes()).hexdigest())


def _config(tmp: Path, lock_text: str | None, torch_index: str | None = None):
    """The flagship's [build] with this torch and ``lock_text`` as [build.requirements]."""
    base = manifest.load(ROOT / "manifest.toml").build
    reqs = _reqs(tmp, lock_text) if lock_text is not None else None
    return dataclasses.replace(
        base, python=HERE, torch=TORCH, requirements=reqs, torch_index=torch_index,
        torch_lock=None,
    )  # fmt: skip


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
    assert err.value.where == "[build.torch_lock]"
    assert f"torch = {TORCH}" in err.value.what and "only by hash" in err.value.what
    nxt = err.value.next or ""
    assert "uv pip compile --generate-hashes" in nxt and f"torch=={TORCH}" in nxt
    assert "--index-url https://torch-index.invalid/whl/cu128" in nxt
    assert "where https://torch-index.invalid/whl/cu128 can be reached" in nxt
    assert "--python-platform" in nxt and "[build.torch_lock]" in nxt
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
    made = torch_venv(config, tmp_path / "cache", SILENT, host_of(env))
    python = made.python
    assert _torch_version(python) == TORCH
    assert (tmp_path / "cache") in python.parents
    # Provenance names the lock it came from, by name and sha256.
    assert made.lock == (config.requirements.path.name, config.requirements.sha256)
    # Made once: the second call reuses it.
    assert torch_venv(config, tmp_path / "cache", SILENT, host_of(env)) == made
    # Another file under the same name (what an index serving another build would give):
    # pip's --require-hashes refuses it, nothing is installed.
    _wheel(house, body="# another build\n")
    with pytest.raises(BuildVenvError) as err:
        torch_venv(config, tmp_path / "other-cache", SILENT, host_of(env))
    assert "hash" in (err.value.next or "")


def _torch_with_runtime(torch: str, runtime: str) -> str:
    """A lock's text: torch and the CUDA runtime it requires (hashes as a lock holds them)."""
    return (
        f"{runtime} \\\n    --hash=sha256:{'c' * 64}\n"
        f"torch=={torch} \\\n    --hash=sha256:{'d' * 64}\n"
    )


def test_the_torch_lock_is_the_kernels_and_wins_over_build_requirements(tmp_path: Path) -> None:
    config = _config(tmp_path, "torch==2.9.1 \\\n    --hash=sha256:" + "a" * 64 + "\n")
    own = _reqs(tmp_path, _torch_with_runtime(TORCH, "nvidia-cuda-runtime==13.0.96"), "t.txt")
    sm120 = dataclasses.replace(config, cuda="13.0", arches=("12.0",), torch_lock=own)
    assert torch_lock(sm120) == own
    # Without it, [build.requirements] is read (and here pins another torch).
    with pytest.raises(ManifestError, match="pins torch 2.9.1") as err:
        torch_lock(dataclasses.replace(sm120, torch_lock=None))
    assert err.value.where == "[build.requirements] (torch-requirements.txt)"


@pytest.mark.parametrize(
    ("cuda", "arches", "torch", "runtime", "problem"),
    [
        # a CUDA 13 torch for a CUDA 12.8 build: cpp_extension refuses the major mismatch
        ("12.8", ("8.0",), "2.11.0", "nvidia-cuda-runtime==13.0.96", "built with CUDA 13.0"),
        # torch 2.11's cu128 wheels carry no sm_70 (manifest.targets.TORCH_DROPPED)
        ("12.8", ("7.0",), "2.11.0", "nvidia-cuda-runtime-cu12==12.8.90", "no sm_70 kernels"),
        ("12.8", ("7.0",), "2.10.0", "nvidia-cuda-runtime-cu12==12.8.90", None),
        ("13.0", ("12.0",), "2.11.0", "nvidia-cuda-runtime==13.0.96", None),
    ],
)
def test_a_locked_torch_of_another_cuda_or_without_the_arch_is_refused(
    tmp_path: Path, cuda: str, arches: tuple[str, ...], torch: str, runtime: str,
    problem: str | None,
) -> None:
    lock = _reqs(tmp_path, _torch_with_runtime(torch, runtime), "torch-lock.txt")
    config = dataclasses.replace(
        _config(tmp_path, None), cuda=cuda, arches=arches, torch=torch, torch_lock=lock
    )
    if problem is None:
        assert torch_lock(config) == lock
        return
    with pytest.raises(ManifestError, match=problem) as err:
        torch_lock(config)
    assert err.value.where == "[build.torch_lock] (torch-lock.txt)"
    assert "lock a torch" in (err.value.next or "")


# The torch wheel pip installs from each system manifest's lock on a cp312 x86_64 machine,
# measured here (`pip install --dry-run --report` and `pip download` against PyPI,
# pinwheel.wheels.fatbin over torch/lib/libtorch_cuda.so): file, sha256, the CUDA of the
# runtime it requires, and the arch the card's GPUs need among its SASS.
MEASURED = {
    "manifest.toml": (
        "torch-2.10.0-3-cp312-cp312-manylinux_2_28_x86_64.whl",  # 915,622,781 bytes
        "98c01b8bb5e3240426dcde1446eed6f40c778091c8544767ef1168fc663a05a6",
        "12.8",  # nvidia-cuda-runtime-cu12==12.8.90; SASS sm_70 75 80 86 89 90 100 120
    ),
    "recipes/sm120-tp2/manifest.toml": (
        "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl",  # 530,712,279 bytes
        "0f68f4ac6d95d12e896c3b7a912b5871619542ec54d3649cf48cc1edd4dd2756",
        "13.0",  # cuda-toolkit==13.0.2; SASS sm_75 80 86 89 90 100 103 120 121
    ),
}
CARD = {"manifest.toml": "v100", "recipes/sm120-tp2/manifest.toml": "sm120"}


def _card_facts(card: str) -> dict:
    return tomllib.loads((ROOT / "tests" / "cards" / f"{card}.toml").read_text())["facts"]


@pytest.mark.parametrize("rel", sorted(MEASURED))
def test_each_system_manifest_locks_the_torch_its_card_builds_with(rel: str) -> None:
    config = manifest.load(ROOT / rel).build
    lock = config.torch_lock
    assert lock is not None and torch_lock(config) == lock  # the kernels' torch is this lock
    text = lock.path.read_text()
    pins = parse_requirements(text, lock.path.name)  # every line pinned and hashed
    version, hashes = pins["torch"]
    _, digest, cuda = MEASURED[rel]
    assert version == config.torch
    assert digest in hashes  # the measured wheel (its CUDA and arches read above) is allowed
    assert lock_cuda({name: pin[0] for name, pin in pins.items()}) == cuda == config.cuda
    facts = _card_facts(CARD[rel])
    if "release.torch_backend" in facts:  # the V100 card: --torch-backend=cu128
        assert facts["release.torch_backend"] == "cu" + cuda.replace(".", "")
    if "build.python" in facts:  # the V100 card: cp312
        assert facts["build.python"] == config.python
    # Resolved for [build] python on Linux x86_64, written to where the manifest points.
    assert f"--python-version {config.python} --python-platform x86_64-manylinux_2_28" in text
    assert f" -o {lock.path.relative_to(ROOT)}\n" in text
    # Portable: no index URL, no find-links, no path of the machine that wrote it.
    for bad in ("--index-url", "--find-links", "http://", "https://", "file:", str(ROOT),
                str(Path.home()), "/tmp/"):  # fmt: skip
        assert bad not in text, bad


def test_a_changed_torch_lock_is_refused_when_the_manifest_loads(tmp_path: Path) -> None:
    here = tmp_path / "sm120-tp2"
    shutil.copytree(ROOT / "recipes" / "sm120-tp2", here)
    (tmp_path / "keys").mkdir()
    shutil.copy(ROOT / "keys" / "allowed_signers", tmp_path / "keys" / "allowed_signers")
    lock = here / "torch-2.11.0-cp312-x86_64.txt"
    manifest.load(here / "manifest.toml")  # as committed: loads
    lock.write_text(lock.read_text().replace("torch==2.11.0", "torch==2.11.1"))
    with pytest.raises(ManifestError, match="sha256 of torch-2.11.0-cp312-x86_64.txt") as err:
        manifest.load(here / "manifest.toml")
    assert "torch_lock" in (err.value.where or "")
    assert "[build.torch_lock] sha256" in (err.value.next or "")


def test_the_gb10_manifest_names_no_torch_and_its_build_says_so(tmp_path: Path) -> None:
    config = manifest.load(ROOT / "recipes" / "gb10-k2" / "manifest.toml").build
    assert config.torch is None and config.torch_lock is None  # FILL IN: not on the card
    with pytest.raises(ManifestError) as err:
        torch_venv(config, tmp_path / "cache", SILENT, host_of({}))
    assert err.value.where == "[build] torch" and "[build.torch_lock]" in err.value.what
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("how", ["dotdot", "absolute", "link"])
def test_a_torch_lock_outside_the_manifests_folder_is_refused(tmp_path: Path, how: str) -> None:
    outside = tmp_path / "elsewhere" / "torch.txt"
    outside.parent.mkdir()
    outside.write_text(_torch_with_runtime(TORCH, "nvidia-cuda-runtime==13.0.96"))
    digest = hashlib.sha256(outside.read_bytes()).hexdigest()
    here = tmp_path / "system"
    here.mkdir()
    path = {"dotdot": "../elsewhere/torch.txt", "absolute": str(outside), "link": "torch.txt"}[how]
    if how == "link":  # a link beside the manifest that resolves outside its folder
        (here / "torch.txt").symlink_to(outside)
    text = (
        '[upstream]\nurl = "https://example.invalid/up.git"\n'
        'commit = "0123456789abcdef0123456789abcdef01234567"\n\n'
        '[build]\ncuda = "13.0"\narches = ["12.0"]\ntorch = "2.11.0"\n\n'
        f'[build.torch_lock]\npath = "{path}"\nsha256 = "{digest}"\n'
    )
    (here / "manifest.toml").write_text(text)
    with pytest.raises(ManifestError, match="a relative path beside the manifest") as err:
        manifest.load(here / "manifest.toml")
    assert "[build.torch_lock]" in (err.value.where or "") and "path" in (err.value.where or "")

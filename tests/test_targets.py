"""Toolchains per target: the arch / CUDA / torch table refuses impossible builds with the
reason and the fix; CUDA 13.0 is provisionable from PyPI; install pins the build's torch."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from pinwheel.checksums import sha256_file, write_sums
from pinwheel.cli import main
from pinwheel.compile.toolchain import (
    LOCKS,
    NOT_PROVISIONABLE,
    ToolchainError,
    ToolkitRequest,
    nvcc_version,
    probe_arches,
    provision_toolkit,
    resolve_toolkit,
)
from pinwheel.errors import ManifestError, PinwheelError
from pinwheel.manifest import loads
from pinwheel.manifest.build import BuildConfig
from pinwheel.manifest.targets import index_cuda, lock_cuda, target_problems
from pinwheel.options import host as host_of
from pinwheel.release import install as install_mod
from releasekit import make_wheel, write_manifest, write_provenance

HEAD = """[upstream]
url = "https://example.invalid/up.git"
commit = "0123456789abcdef0123456789abcdef01234567"

[build]
"""
CU130 = "https://torch-index.invalid/whl/cu130"


def build_table(tmp_path: Path, body: str) -> BuildConfig:
    path = tmp_path / "manifest.toml"
    text = HEAD + body
    path.write_text(text)
    return loads(text.encode(), path).build  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("body", "needle", "fix"),
    [
        ('cuda = "13.0"\narches = ["7.0"]\n', "dropped sm_70",
         'cuda = "12.4"'),
        ('cuda = "12.4"\narches = ["12.0"]\n', "first targets sm_120 in CUDA 12.8", '"12.8"'),
        ('cuda = "12.8"\narches = ["12.1"]\n', "first targets sm_121 in CUDA 12.9", '"12.9"'),
        ('cuda = "12.8"\narches = ["7.0"]\ntorch = "2.11.0"\n'
         'torch_index = "https://torch-index.invalid/whl/cu128"\n',
         "carries no sm_70 kernels (dropped from 2.11 on)", "cu126"),
        (f'cuda = "12.4"\narches = ["8.0"]\ntorch = "2.11.0"\ntorch_index = "{CU130}"\n',
         "same CUDA major", "cu12x"),
        ('cuda = "12.4"\narches = ["7.0"]\ntorch = "2.11.0"\n'
         f'torch_index = "{CU130}"\n', "same CUDA major", "cu12x"),
        ('cuda = "12.4"\narches = ["7.0"]\ntorch_index = "http://x/cu124"\n', "https://", ""),
    ],
)  # fmt: skip
def test_impossible_combinations_are_refused_at_load(
    tmp_path: Path, body: str, needle: str, fix: str
) -> None:
    with pytest.raises(ManifestError) as exc:
        build_table(tmp_path, body)
    text = str(exc.value)
    assert needle in text and fix in text and "[build]" in text


@pytest.mark.parametrize(
    "body",
    [
        'cuda = "12.4"\narches = ["7.0"]\ntorch = "2.9.1"\n',  # the V100 card
        'cuda = "12.6"\narches = ["7.0"]\ntorch = "2.11.0"\n'
        'torch_index = "https://torch-index.invalid/whl/cu126"\n',  # cu126 keeps sm_70
        f'cuda = "13.0"\narches = ["12.0"]\ntorch = "2.11.0"\ntorch_index = "{CU130}"\n',
        f'cuda = "13.0"\narches = ["12.1"]\ntorch = "2.13.0"\ntorch_index = "{CU130}"\n',
        'cuda = "12.9"\narches = ["12.1"]\n',
    ],
)
def test_possible_combinations_load(tmp_path: Path, body: str) -> None:
    cfg = build_table(tmp_path, body)
    assert cfg.torch_index is None or cfg.torch_index.startswith("https://")


def test_index_cuda() -> None:
    assert index_cuda(CU130) == "13.0"
    assert index_cuda("https://torch-index.invalid/whl/cu128/") == "12.8"
    assert index_cuda("https://example.invalid/simple") is None


def test_lock_cuda_reads_the_cuda_runtime_a_torch_lock_pins() -> None:
    # As PyPI's torch 2.10.0 (CUDA 12) and 2.11.0 (CUDA 13, suffix dropped) require them.
    assert lock_cuda({"torch": "2.10.0", "nvidia-cuda-runtime-cu12": "12.8.90"}) == "12.8"
    assert lock_cuda({"cuda-toolkit": "13.0.2", "nvidia-cuda-runtime": "13.0.96"}) == "13.0"
    assert lock_cuda({"torch": "2.11.0", "nvidia-cuda-runtime-fake": "9.9"}) is None
    assert lock_cuda({"torch": "2.11.0+cpu", "numpy": "2.4.6"}) is None  # a CPU torch


def test_toolchain_refuses_before_probing(tmp_path: Path) -> None:
    """A BuildConfig made in code (not loaded) is checked at toolchain time too."""
    cfg = BuildConfig(python="3.11", cuda="13.0", arches=("7.0",), ptx=True, torch=None,
                      label=None, version=None)  # fmt: skip
    with pytest.raises(ToolchainError) as exc:
        resolve_toolkit(ToolkitRequest(cfg, tmp_path, host_of({"PATH": "/nonexistent"}), provision=False))
    assert "cannot compile for arch 7.0" in str(exc.value) and "12.4" in str(exc.value)
    assert target_problems("13.0", ("12.0", "12.1"), None, None) == []


def test_cuda_13_lock_is_wheels_only_and_pins_sha256s() -> None:
    lock = LOCKS["13.0"]
    assert lock.version == "13.0.88" and lock.debs == ()
    projects = {w.project for w in lock.wheels}
    assert projects == {"nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt",
                        "nvidia-cuda-runtime", "nvidia-cuda-cccl"}  # fmt: skip
    for pin in lock.wheels:
        assert len(pin.sha256) == 64 and pin.filename.startswith(pin.project.replace("-", "_"))
    assert "only ptxas" in NOT_PROVISIONABLE["12.8"]


def test_cuda_12_8_without_an_install_says_why_it_is_not_provisioned(tmp_path: Path) -> None:
    cfg = BuildConfig(python="3.11", cuda="12.8", arches=("12.0",), ptx=True, torch=None,
                      label=None, version=None)  # fmt: skip
    with pytest.raises(ToolchainError) as exc:
        resolve_toolkit(ToolkitRequest(cfg, tmp_path, host_of({"PATH": "/nonexistent"}), provision=True))
    if "12.8" in str(exc.value) and "only ptxas" not in str(exc.value):
        pytest.skip("this machine has a CUDA 12.8 install")  # pragma: no cover
    assert "install CUDA 12.8 (NVIDIA's CUDA repository" in str(exc.value)
    assert "set CUDA_HOME to it" in str(exc.value)
    # sm_120 starts at CUDA 12.8: of the provisionable 12.4 and 13.0 only 13.0 is offered.
    assert "--substitute cuda=13.0, the provisionable CUDA that compiles 12.0" in str(exc.value)
    assert "cuda=12.4" not in str(exc.value)


CU13_WHEELS = os.environ.get("PINWHEEL_CU13_WHEELS")


@pytest.mark.slow
@pytest.mark.skipif(not CU13_WHEELS, reason="set PINWHEEL_CU13_WHEELS to a dir with the 5 wheels")
def test_cuda_13_assembles_from_the_pinned_wheels_and_compiles_sm120(tmp_path: Path) -> None:
    downloads = tmp_path / "toolchains" / "downloads"
    downloads.mkdir(parents=True)
    for pin in LOCKS["13.0"].wheels:
        shutil.copy(Path(str(CU13_WHEELS)) / pin.filename, downloads / pin.filename)
    env = {"PATH": "/usr/bin:/bin"}
    root = provision_toolkit(LOCKS["13.0"], tmp_path, env)
    assert nvcc_version(root / "bin" / "nvcc", env=env) == "13.0.88"
    assert (root / "lib64" / "libcudart.so").resolve().name == "libcudart.so.13"
    probe_arches(root / "bin" / "nvcc", ("12.0", "12.1"), env=env)


def _release(tmp_path: Path, torch: dict | None) -> Path:
    """A real release made by `pinwheel release` from a test-kit build: a wheel, SHA256SUMS,
    and the build's provenance (with ``torch`` when given)."""
    build = tmp_path / "wheels"
    made = make_wheel(build, "exllamav3", "0.0.43")
    write_sums(build, [made.name])
    write_provenance(build, {made.name: sha256_file(made)})
    if torch is not None:
        path = build / "provenance.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "torch": torch}))
    manifest = write_manifest(tmp_path)
    assert main(["--manifest", str(manifest), "release", "--no-sign"]) == 0
    return tmp_path / "release"


@contextlib.contextmanager
def torch_index(tmp_path: Path, version: str) -> Iterator[str]:
    """A PEP 503 index on 127.0.0.1 serving one stand-in ``torch`` wheel (a real wheel named
    torch: the real one is gigabytes; what is checked is which index and version install
    takes it from)."""
    root = tmp_path / "index"
    make_wheel(root / "simple" / "torch", "torch", version)
    handler = functools.partial(_Quiet, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/simple/"
    finally:
        httpd.shutdown()
        httpd.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _installed(venv: Path, name: str) -> str:
    probe = f"import importlib.metadata as m; print(m.version({name!r}))"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.release
@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_install_pins_the_torch_and_index_the_build_used(
    tmp_path: Path, installer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real release whose provenance records torch 2.11.0+cu130 from an index: install
    resolves that torch from that index into the venv's lock, by hash, and installs exactly
    the lock, so the engine venv is the runtime lock (issue 47: this case used to install
    torch apart and skip the lock). The torch here is a stand-in wheel this test builds
    (a real wheel named torch, a few bytes; the real one is about 800 MB)."""
    version = "2.11.0+cu130"
    venv = tmp_path / "venv"
    with torch_index(tmp_path, version) as index:
        rel = _release(tmp_path, {"version": version, "index": index})
        result = install_mod.install(
            install_mod.InstallRequest(rel, venv, "cu128", installer=installer,
                                       allow_unsigned=True)  # torch pinning, not signatures
        )
    assert result.torch == version and result.lock == install_mod.RESOLVED
    assert _installed(venv, "torch") == version
    assert _installed(venv, "exllamav3") == "0.0.43"
    standin = tmp_path / "index" / "simple" / "torch" / f"torch-{version}-py3-none-any.whl"
    doc = tomllib.loads((venv / install_mod.RESOLVED).read_text())
    (torch,) = [p for p in doc["packages"] if p["name"] == "torch"]
    assert torch["version"] == version
    (wheel,) = torch["wheels"]
    assert wheel["hashes"] == {"sha256": sha256_file(standin)}
    assert wheel["url"].startswith(index)  # from the build's index, by hash
    (resolve,) = [c for c in result.commands if "compile" in c or "lock" in c]
    assert list(resolve[resolve.index("--extra-index-url"):][:2]) == ["--extra-index-url", index]
    assert not any("--torch-backend=cu128" in a for c in result.commands for a in c)
    assert not any("--index-url" in c for c in result.commands)  # no torch installed apart
    # and the venv is the runtime lock, whole: nothing unpinned, nothing left out
    out = tmp_path / "pylock.toml"
    capsys.readouterr()
    rc = main(["--json", "runtime-lock", str(venv), "--release", str(rel), "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    got = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in got["pinned"]} == {"torch"}
    assert not got.get("left_out") and not got.get("unpinned")
    assert sha256_file(standin) in out.read_text()


def test_a_resolved_lock_with_another_torch_or_index_is_refused(tmp_path: Path) -> None:
    """The lock the installer resolved is checked, not trusted: another torch version, or the
    build's version taken from another host than the recorded index, installs nothing."""
    from pinwheel.errors import VerifyError
    from pinwheel.release import pylock

    def lock(version: str, url: str) -> pylock.Lock:
        path = tmp_path / install_mod.RESOLVED
        path.write_text(
            f'lock-version = "1.0"\ncreated-by = "t"\n[[packages]]\nname = "torch"\n'
            f'version = "{version}"\n[[packages.wheels]]\nurl = "{url}"\n'
            f'hashes = {{sha256 = "{"a" * 64}"}}\n'
        )
        return pylock.check(path)

    pin = install_mod.TorchPin("2.11.0+cu130", "https://torch.example/whl/cu130")
    whl = "torch-2.11.0%2Bcu130-cp312-cp312-manylinux_2_28_x86_64.whl"
    install_mod._check_torch(lock("2.11.0+cu130", f"https://torch.example/whl/cu130/{whl}"), pin)
    with pytest.raises(VerifyError, match="the build used torch 2.11.0"):
        install_mod._check_torch(lock("2.11.0", "https://torch.example/whl/cu130/"
                                         "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"), pin)
    with pytest.raises(VerifyError, match="somewhere other than the build's torch index"):
        install_mod._check_torch(lock("2.11.0+cu130", f"https://mirror.example/{whl}"), pin)


@pytest.mark.release
def test_install_without_a_torch_record_keeps_the_backend(tmp_path: Path) -> None:
    rel = _release(tmp_path, None)
    result = install_mod.install(
        install_mod.InstallRequest(rel, tmp_path / "venv", "cu128", installer="uv",
                                   allow_unsigned=True)  # torch pinning, not signatures
    )
    assert result.torch is None
    assert _installed(tmp_path / "venv", "exllamav3") == "0.0.43"
    (install,) = [c for c in result.commands if "install" in c and "--python" in c]
    assert "--torch-backend=cu128" in install


@pytest.mark.release
def test_a_provenance_file_that_is_not_a_receipt_pins_nothing(tmp_path: Path) -> None:
    """The one provenance reader decides: a bare {"torch": ...} without the schema is not
    a provenance receipt, so install refuses it rather than pin from it."""
    build = tmp_path / "rel"
    made = make_wheel(build, "exllamav3", "0.0.43")
    (build / "provenance.json").write_text(json.dumps({"torch": {"version": "6.6.6"}}))
    path = build / "provenance.json"
    # (install reads a provenance only as the verified SHA256SUMS lists it: issue 20)
    with pytest.raises(PinwheelError):
        install_mod.torch_pin(build, {path.name: sha256_file(path)})
    write_provenance(build, {made.name: sha256_file(made)})
    path.write_text(json.dumps({**json.loads(path.read_text()), "torch": {"version": "6.6.6"}}))
    pin = install_mod.torch_pin(build, {path.name: sha256_file(path)})
    assert pin is not None and pin.version == "6.6.6" and pin.index is None


@pytest.mark.parametrize(
    ("torch", "dropped"),
    [
        ("2.11.0", True),
        ("2.11.0rc1", True),  # a release candidate of 2.11 is 2.11's wheels
        ("2.11.0.dev20260101", True),  # so is a nightly
        ("2.12.0+cu128", True),  # a local label is not part of the order
        ("2.10.0", False),
        ("2.10.1.post1", False),
        ("2.9.1", False),
    ],
)
def test_the_torch_that_dropped_an_arch_is_compared_by_pep_440(torch: str, dropped: bool) -> None:
    cu128 = "https://torch-index.invalid/whl/cu128"
    problems = target_problems("12.8", ("7.0",), torch, cu128)
    assert any("no sm_70 kernels" in p.what for p in problems) is dropped

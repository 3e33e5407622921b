"""[build] parsing, apt source discovery, .deb unpacking and the arch probe, on real files
and the machine's real nvcc 13 (which must be refused for sm_70)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pinwheel.compile.toolchain import (
    LOCKS,
    ToolchainError,
    ToolkitRequest,
    nvcc_version,
    probe_arches,
    resolve_toolkit,
)
from pinwheel.compile.toolchain.apt import debian_sources
from pinwheel.compile.toolchain.download import check_download
from pinwheel.compile.toolchain.pins import DebPin
from pinwheel.compile.toolchain.unpack import unpack_deb
from pinwheel.errors import ManifestError
from pinwheel.manifest import loads
from pinwheel.manifest.build import BuildConfig
from pinwheel.options import host as host_of

pytestmark = pytest.mark.kernels

HEAD = """[upstream]
url = "https://example.invalid/up.git"
commit = "0123456789abcdef0123456789abcdef01234567"
"""


def build_table(tmp_path: Path, body: str) -> BuildConfig:
    path = tmp_path / "manifest.toml"
    text = HEAD + "\n[build]\n" + body
    path.write_text(text)
    return loads(text.encode(), path).build


def test_build_table_full(tmp_path: Path) -> None:
    cfg = build_table(
        tmp_path,
        'cuda = "12.4"\narches = ["8.0", "7.0"]\ntorch = "2.9.1"\nlabel = "glm53card"\n'
        'version = "1.5.2.dev1486"\nrequired_members = ["vllm/_C.abi3.so"]\n'
        'runner_labels = ["self-hosted", "v100"]\n[build.env]\nMAX_JOBS = 2\n',
    )
    assert cfg.arches == ("7.0", "8.0")  # sorted: PTX goes with the lowest
    assert cfg.cmake_architectures == "70-real;80-real;70-virtual"
    assert cfg.torch_arch_list == "7.0+PTX;8.0"
    assert cfg.full_version == "1.5.2.dev1486+glm53card"
    assert cfg.env == {"MAX_JOBS": "2"}
    assert cfg.runner_labels == ("self-hosted", "v100")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('arches = ["7.0"]\n', "key 'cuda': expected this key"),
        ('cuda = "12"\narches = ["7.0"]\n', "CUDA major.minor"),
        ('cuda = "12.4"\narches = ["sm_70"]\n', "arches written like"),
        ('cuda = "12.4"\narches = []\n', "at least one arch"),
        ('cuda = "12.4"\narches = ["7.0", "7.0"]\n', "each arch once"),
        ('cuda = "12.4"\narches = ["7.0"]\nlabel = "GLM card"\n', "PEP 440 local label"),
        ('cuda = "12.4"\narches = ["7.0"]\nversion = "v1"\n', "PEP 440 public version"),
        ('cuda = "12.4"\narches = ["7.0"]\nptx = "yes"\n', "true or false"),
        ('cuda = "12.4"\narches = ["7.0"]\ncudaa = "x"\n', "unknown key 'cudaa'"),
        ('cuda = "12.4"\narches = ["7.0"]\n[build.env]\nmax-jobs = "2"\n', "environment variable"),
    ],
)
def test_build_table_errors_name_the_key(tmp_path: Path, body: str, needle: str) -> None:
    with pytest.raises(ManifestError) as exc:
        build_table(tmp_path, body)
    assert needle in str(exc.value)
    assert "manifest.toml:" in str(exc.value) and "[build]" in str(exc.value)


def test_debian_sources_reads_both_formats_and_skips_third_party(tmp_path: Path) -> None:
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text(
        "# comment\ndeb [arch=amd64 signed-by=/k/one.gpg] http://mirror.one/debian bookworm main\n"
        "deb-src http://mirror.src/debian bookworm main\n"
        "deb https://vendor.example/apt cloud-sdk main\n"
    )
    (etc / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.two/debian/\nSuites: trixie trixie-updates\n"
        "Components: main\nSigned-By: /k/two.gpg\n\n"
        "Types: deb\nURIs: http://mirror.off/debian\nSuites: trixie\nEnabled: no\n"
    )
    (etc / "sources.list.d" / "vendor.sources.disabled").write_text(
        "Types: deb\nURIs: http://disabled/debian\nSuites: trixie\n"
    )
    found = debian_sources(etc)
    assert [(s.uri, s.signed_by) for s in found] == [
        ("http://mirror.one/debian", "/k/one.gpg"),
        ("http://mirror.two/debian", "/k/two.gpg"),
    ]


@pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="needs dpkg-deb to make a real .deb")
def test_unpack_deb_streams_only_pinned_files(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: demo\nVersion: 1.0\nArchitecture: amd64\nMaintainer: t <t@t>\nDescription: d\n"
    )
    tool = root / "usr/lib/demo/bin/tool"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho tool\n")
    tool.chmod(0o755)
    (root / "usr/lib/demo/bin/crt").mkdir()
    (root / "usr/lib/demo/bin/crt/link.stub").write_text("stub")
    (root / "usr/share/doc/demo").mkdir(parents=True)
    (root / "usr/share/doc/demo/README").write_text("not wanted")
    deb = tmp_path / "demo.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)],
                   check=True, capture_output=True)  # fmt: skip
    pin = DebPin("demo", "1.0", "0" * 64, (("usr/lib/demo/bin/tool", "bin/tool"),
                                          ("usr/lib/demo/bin/crt", "bin/crt")))  # fmt: skip
    dest = tmp_path / "tree"
    unpack_deb(deb, pin, dest)
    assert os.access(dest / "bin/tool", os.X_OK)
    assert (dest / "bin/crt/link.stub").read_text() == "stub"
    assert not (dest / "usr").exists() and not list(dest.rglob("README"))
    missing = DebPin("demo", "1.0", "0" * 64, (("usr/lib/demo/bin/nvcc", "bin/nvcc"),))
    with pytest.raises(ToolchainError, match="lacks bin/nvcc"):
        unpack_deb(deb, missing, tmp_path / "tree2")


def test_tampered_download_is_refused_and_removed(tmp_path: Path) -> None:
    pin = LOCKS["12.4"].debs[0]
    fake = tmp_path / pin.filename
    fake.write_bytes(b"not the package")
    with pytest.raises(ToolchainError) as exc:
        check_download(fake, pin.sha256, "http://mirror.test/debian")
    assert pin.sha256 in str(exc.value) and "re-pin LOCKS" in str(exc.value)
    assert not fake.exists()


def test_every_lock_pins_real_sha256s() -> None:
    for lock in LOCKS.values():
        for pin in (*lock.debs, *lock.wheels):
            assert len(pin.sha256) == 64 and int(pin.sha256, 16) and pin.files


CUDA13 = Path("/usr/local/cuda/bin/nvcc")
needs_cuda13 = pytest.mark.skipif(
    not CUDA13.is_file() or not nvcc_version(CUDA13, env={"PATH": os.defpath}).startswith("13."),
    reason="needs this machine's CUDA 13 nvcc at /usr/local/cuda (the negative case)",
)


@needs_cuda13
def test_nvcc_13_is_refused_for_sm70_with_why_and_what_to_do() -> None:
    with pytest.raises(ToolchainError) as exc:
        probe_arches(CUDA13, ("7.0",), env={"PATH": os.defpath})
    text = str(exc.value)
    assert "cannot compile for arch 7.0" in text
    assert "CUDA 13 dropped Volta" in text and "compute_70" in text
    assert 'cuda = "12.4"' in text and "pinwheel toolchain" in text


@needs_cuda13
def test_resolve_refuses_cuda13_even_when_the_manifest_asks_for_it(tmp_path: Path) -> None:
    cfg = BuildConfig(python="3.11", cuda="13.0", arches=("7.0",), ptx=True, torch=None,
                      label=None, version=None)  # fmt: skip
    env = {"CUDA_HOME": str(CUDA13.parent.parent), "PATH": os.defpath}
    with pytest.raises(ToolchainError, match="cannot compile for arch 7.0"):
        resolve_toolkit(ToolkitRequest(cfg, tmp_path / "cache", host_of(env), provision=False))


@needs_cuda13
def test_resolve_without_provisioning_lists_what_it_rejected(tmp_path: Path) -> None:
    cfg = BuildConfig(python="3.11", cuda="12.4", arches=("7.0",), ptx=True, torch=None,
                      label=None, version=None)  # fmt: skip
    env = {"CUDA_HOME": str(CUDA13.parent.parent), "PATH": os.defpath}
    with pytest.raises(ToolchainError) as exc:
        resolve_toolkit(ToolkitRequest(cfg, tmp_path / "cache", host_of(env), provision=False))
    text = str(exc.value)
    assert "CUDA 13.0" in text and "[build] cuda pins 12.4" in text
    assert "pinwheel toolchain" in text


def test_resolve_searches_the_requests_environment_not_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA_HOME of this process is not looked at; the request's CUDA_PATH is. Stand-in:
    the two "toolkits" are shell scripts that answer `nvcc --version` with a CUDA 11.8
    release line (the finder rejects both by version, before any compile)."""
    for name in ("process", "request"):
        nvcc = tmp_path / name / "bin" / "nvcc"
        nvcc.parent.mkdir(parents=True)
        nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
        nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "process"))
    cfg = BuildConfig(python="3.11", cuda="12.4", arches=("7.0",), ptx=True, torch=None,
                      label=None, version=None)  # fmt: skip
    env = {"CUDA_PATH": str(tmp_path / "request"), "PATH": "/usr/bin:/bin"}
    with pytest.raises(ToolchainError) as exc:
        resolve_toolkit(ToolkitRequest(cfg, tmp_path / "cache", host_of(env), provision=False))
    text = str(exc.value)
    assert f"CUDA_PATH {tmp_path / 'request'}: CUDA 11.8.89" in text
    assert str(tmp_path / "process") not in text


def _logging_host_compilers(folder: Path, log: Path) -> dict[str, str]:
    """gcc and g++ that log each run and then run the machine's: the probe's PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("gcc", "g++"):
        real = shutil.which(name)
        assert real is not None
        (folder / name).write_text(f'#!/bin/sh\necho "{name}" >> "{log}"\nexec {real} "$@"\n')
        (folder / name).chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.defpath}"}


@needs_cuda13
def test_a_passing_probe_is_remembered_per_cache_and_redone_when_its_inputs_move(
    tmp_path: Path,
) -> None:
    """The real nvcc 13 probing sm_90 through logging gcc/g++: the second probe in the same
    cache runs no compiler; a touched host compiler, another arch or another cache probes
    again; a failing probe (sm_70 on CUDA 13) is never remembered."""
    log = tmp_path / "host-compiler.log"
    env = _logging_host_compilers(tmp_path / "bin", log)
    cache = tmp_path / "cache"

    def runs() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    probe_arches(CUDA13, ("9.0",), env=env, cache=cache)
    first = runs()
    assert first > 0
    probe_arches(CUDA13, ("9.0",), env=env, cache=cache)
    assert runs() == first  # remembered: nothing compiled
    probe_arches(CUDA13, ("9.0",), env=env, cache=tmp_path / "other-cache")
    assert runs() > first  # per cache
    second = runs()
    (tmp_path / "bin" / "g++").write_text((tmp_path / "bin" / "g++").read_text())  # ctime moves
    probe_arches(CUDA13, ("9.0",), env=env, cache=cache)
    assert runs() > second
    for _ in range(2):
        with pytest.raises(ToolchainError, match="cannot compile for arch 7.0"):
            probe_arches(CUDA13, ("7.0",), env=env, cache=cache)


def test_a_probe_record_through_a_link_a_fifo_or_malformed_is_no_record(tmp_path: Path) -> None:
    from pinwheel.compile.toolchain import probememo

    cache, key = tmp_path / "cache", "a" * 64
    probememo.remember(cache, key, ("9.0",))
    record = cache / probememo.SUBDIR / f"{key}.json"
    assert probememo.passed(cache, key) and not probememo.passed(cache, "b" * 64)
    good = record.read_bytes()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(good)
    record.unlink()
    record.symlink_to(elsewhere)
    assert not probememo.passed(cache, key)
    record.unlink()
    os.mkfifo(record)  # no writer: opening it to read would block
    assert not probememo.passed(cache, key)
    record.unlink()
    for bad in (b"\xff\xfe", b'{"format": 1, "key": "' + b"a" * 63 + b'\x1b"}', b"[" * 100,
                b'{"format": 1e999, "key": "' + b"a" * 64 + b'"}', b"{}" + b" " * 70000):  # fmt: skip
        record.write_bytes(bad)
        assert not probememo.passed(cache, key), bad
    assert not probememo.passed(None, key)

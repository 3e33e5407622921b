"""The cards' toolchains, or an explicit substitution that every output states.

[build] pins the card's CUDA and gcc. A build on a machine without them stops before
anything long runs and names two ways on; `--substitute` / [build.substitute] builds
with another toolchain and provenance.json, `pinwheel check` and the release notes'
first line say so. The host compilers here are this machine's real gcc/g++; the real
kernel build with the substitution is in the closing note (it downloads CUDA 12.4).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel.checksums import sha256_file, write_sums
from pinwheel.cli import main
from pinwheel.compile.toolchain import ToolchainError, choose, find_host_compiler, parse_flags
from pinwheel.errors import EXIT_VERIFY, ManifestError, UsageError
from pinwheel.manifest import model as manifest
from pinwheel.manifest.build import BuildConfig
from pinwheel.options import host as host_of
from pinwheel.wheels.substitute import apply, cuda_advice, from_receipt, headline, undeclared
from releasekit import make_wheel, write_manifest, write_provenance

ROOT = Path(__file__).resolve().parent.parent
V100 = ROOT / "manifest.toml"
GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="no g++ on this machine")


def _gxx_major() -> str:
    from pinwheel.compile.toolchain.hostcc import compiler_version

    version = compiler_version("g++", host_of(os.environ))
    assert version
    return version.split(".")[0]


def test_the_v100_manifest_pins_the_cards_toolchain():
    build = manifest.load(V100).build
    assert (build.python, build.cuda, build.gcc, build.arches) == ("3.12", "12.8", "14", ("7.0",))
    assert build.substitute == ()  # the committed manifest substitutes nothing


def test_flags_override_and_every_substitution_is_recorded():
    config = manifest.load(V100).build
    effective, subs = apply(config, parse_flags(["cuda=12.4", "gcc=12"]))
    assert (effective.cuda, effective.gcc) == ("12.4", "12")
    assert [(s.key, s.pinned, s.used, s.source) for s in subs] == [
        ("cuda", "12.8", "12.4", "--substitute"),
        ("gcc", "14", "12", "--substitute"),
    ]
    assert headline(subs) == (
        "SUBSTITUTED TOOLCHAIN (not the one [build] pins): CUDA 12.4 instead of 12.8 "
        "([build] cuda; --substitute); gcc/g++ 12 instead of 14 ([build] gcc; --substitute)"
    )
    same, none = apply(config, {"cuda": "12.8"})  # the pinned one: nothing substituted
    assert none == () and same == config


@pytest.mark.parametrize("flag", ["cuda", "cuda=12", "python=3.11", "gcc=14.2", "cuda=12.4;rm"])
def test_bad_flags_are_refused(flag):
    with pytest.raises(UsageError, match="--substitute"):
        parse_flags([flag])


def test_a_substitute_that_cannot_build_the_arch_is_refused():
    config = manifest.load(V100).build
    with pytest.raises(UsageError, match="cannot compile for arch 7.0"):
        apply(config, {"cuda": "13.0"})  # CUDA 13 dropped sm_70


def test_a_refused_cuda_substitute_offers_the_one_that_fits_not_an_edit_of_build(capsys):
    """13.0 for sm_70: the way on is --substitute cuda=12.4 (the flag the user is already
    using), never 13.0 again and never "set [build] cuda" that contradicts the flag."""
    code = main(["--manifest", str(V100), "--json", "kernels", "--substitute", "cuda=13.0"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2, doc
    err = doc["error"]
    assert err["where"] == "--substitute cuda=13.0"
    assert "CUDA 13.0 cannot compile for arch 7.0" in err["what"]
    assert err["next"].startswith("use --substitute cuda=12.4, the provisionable CUDA that "
                                  "compiles 7.0")  # fmt: skip
    assert "13.0" not in err["next"] and "[build] cuda" not in err["next"]


def _build(**kw: object) -> BuildConfig:
    base = dict(python="3.12", cuda="12.8", arches=("7.0",), ptx=True, torch=None, label=None,
                version=None)  # fmt: skip
    return BuildConfig(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arches", "offered", "refused"),
    [
        (("7.0",), "--substitute cuda=12.4, the provisionable CUDA that compiles 7.0", "13.0"),
        (("11.0",), "--substitute cuda=13.0, the provisionable CUDA that compiles 11.0", "12.4"),
        (("9.0",), "--substitute cuda=V, V one of the provisionable CUDAs 12.4, 13.0,", None),
    ],
)
def test_cuda_advice_lists_only_what_the_arches_accept(arches, offered, refused):
    """A CUDA that cannot compile one of the manifest's arches is never suggested: sm_70
    stops at CUDA 12, sm_110 starts at 13.0, sm_90 takes either."""
    advice = cuda_advice(_build(arches=arches), ("12.4", "13.0"))
    assert advice is not None and advice.startswith(offered)
    if refused:
        assert refused not in advice


def test_no_cuda_is_suggested_when_none_compiles_every_arch(tmp_path):
    """sm_70 + sm_110: 12.4 lacks sm_110 and 13.0 dropped sm_70. No --substitute is offered
    (each would be refused); the way on says why. Both from the substitution and from
    resolving the pinned CUDA on a machine without it (sm_103 alone: only 13.0 fits)."""
    from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit

    config = _build(arches=("7.0", "11.0"))
    assert cuda_advice(config, ("12.4", "13.0")) is None
    with pytest.raises(UsageError) as err:
        apply(config, {"cuda": "12.4"}, provisionable=("12.4", "13.0"))
    assert "--substitute" not in (err.value.next or "")
    assert "no provisionable CUDA (12.4, 13.0) compiles every one of [build] arches (7.0, 11.0)" \
        in (err.value.next or "")  # fmt: skip
    env = {"PATH": str(tmp_path)}  # no nvcc on it
    with pytest.raises(ToolchainError) as found:
        resolve_toolkit(ToolkitRequest(_build(arches=("11.0",), cuda="12.9"), tmp_path / "c",
                                       host_of(env), provision=False))  # fmt: skip
    assert "--substitute cuda=13.0, the provisionable CUDA that compiles 11.0" in found.value.next
    assert "12.4" not in found.value.next


def _v100_copy(tmp_path: Path, extra: str) -> Path:
    """The V100 manifest with ``extra`` appended, beside the kernels/, patches/ and locks/
    (its torch lock) it names."""
    path = tmp_path / "manifest.toml"
    path.write_text(V100.read_text() + "\n" + extra)
    for folder in ("kernels", "patches", "locks"):
        if not (tmp_path / folder).exists():
            shutil.copytree(ROOT / folder, tmp_path / folder)
    return path


def test_a_manifest_substitution_needs_a_reason_and_is_recorded_with_it(tmp_path):
    table = '[build.substitute]\ncuda = "12.4"\n'
    with pytest.raises(ManifestError, match="'reason'"):
        manifest.load(_v100_copy(tmp_path, table))
    path = _v100_copy(tmp_path, table + 'reason = "only Debian 12.4 here"\n')
    config = manifest.load(path).build
    _, subs = apply(config)
    assert [(s.used, s.source, s.reason) for s in subs] == [
        ("12.4", "[build.substitute]", "only Debian 12.4 here")
    ]
    _, subs = apply(config, {"cuda": "12.6"})  # the flag wins over the manifest
    assert [(s.used, s.source) for s in subs] == [("12.6", "--substitute")]


def test_a_bad_manifest_substitution_names_its_line(tmp_path):
    path = _v100_copy(tmp_path, '[build.substitute]\ngcc = "fourteen"\nreason = "x"\n')
    with pytest.raises(ManifestError) as err:
        manifest.load(path)
    assert f"manifest.toml:{len(path.read_text().splitlines()) - 1}" in str(err.value)


@needs_gxx
def test_the_pinned_gcc_is_found_and_handed_to_the_build():
    major = _gxx_major()
    host = find_host_compiler(major, host_of(os.environ))
    assert host is not None and host.version.startswith(major + ".")
    assert host.env()["CUDAHOSTCXX"] == host.cxx and Path(host.cxx).is_file()


@needs_gxx
def test_a_missing_gcc_names_what_was_found_and_the_substitution():
    major = _gxx_major()
    other = "14" if major != "14" else "13"
    with pytest.raises(ToolchainError) as err:
        find_host_compiler(other, host_of(os.environ))
    assert f"no gcc/g++ {other}" in err.value.what and f"g++ {major}." in err.value.what
    assert f"--substitute gcc={major}" in (err.value.next or "")


@needs_gxx
def test_the_v100_build_stops_in_seconds_without_gcc_14_then_without_cuda_12_8(
    tmp_path, capsys, monkeypatch
):
    if _gxx_major() == "14":
        pytest.skip("this machine has gcc 14")
    for var in ("CUDA_HOME", "CUDA_PATH", "CXX", "CC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PINWHEEL_CACHE", str(tmp_path / "cache"))
    out = str(tmp_path / "w")
    code = main(["--manifest", str(V100), "kernels", "--out", out])
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0 and "no gcc/g++ 14, which [build] gcc pins" in err
    assert f"--substitute gcc={_gxx_major()}" in err
    gcc = f"gcc={_gxx_major()}"
    code = main(["--manifest", str(V100), "kernels", "--substitute", gcc, "--out", out])
    err = " ".join(capsys.readouterr().err.split())
    if "no usable CUDA 12.8 toolkit" not in err:
        pytest.skip(f"this machine has a CUDA 12.8 toolkit (exit {code})")
    assert code != 0 and "SUBSTITUTED TOOLCHAIN" in err and "gcc/g++ 12 instead of 14" in err
    # Only the provisionable CUDA that compiles sm_70: 13.0 dropped it, so it is not offered.
    assert "--substitute cuda=12.4, the provisionable CUDA that compiles 7.0" in err
    assert "cuda=13.0" not in err and "13.0)" not in err
    assert not (tmp_path / "w").exists()  # nothing built, nothing written


def test_choose_applies_then_finds(tmp_path):
    config = manifest.load(V100).build
    choice = choose(config, host_of(os.environ), {"gcc": _gxx_major()} if GXX else None)
    assert choice.config.gcc == (_gxx_major() if GXX else "14")
    assert choice.environment(host_of({"HOME": "/h"})).child["HOME"] == "/h"


# --------------------------------------------------------------------------- stated downstream


def _build_output(tmp_path: Path, subs: list[dict] | None, cuda: str = "12.4.131") -> Path:
    build = tmp_path / "wheels"
    wheel = make_wheel(build, "pwb", "2.0", payload=1000, seed=2)
    write_sums(build, [wheel.name])
    write_provenance(build, {wheel.name: sha256_file(wheel)})
    data = json.loads((build / "provenance.json").read_text())
    data["toolchain"]["cuda"] = cuda
    if subs is not None:
        data["substitutions"] = subs
    (build / "provenance.json").write_text(json.dumps(data))
    return build


SUBS = [
    {"key": "cuda", "pinned": "12.8", "used": "12.4", "source": "--substitute", "reason": None},
    {"key": "gcc", "pinned": "14", "used": "12", "source": "--substitute", "reason": None},
]


def _kit_manifest(tmp_path: Path) -> Path:
    path = write_manifest(tmp_path)
    path.write_text(path.read_text() + '\n[build]\ncuda = "12.8"\ngcc = "14"\narches = ["7.0"]\n')
    return path


def test_release_notes_state_the_substitution_on_their_first_line(tmp_path):
    build = _build_output(tmp_path, SUBS)
    m = write_manifest(tmp_path)  # no [build]: the release check takes the wheel as it is
    rel = tmp_path / "rel"
    assert main(["--manifest", str(m), "release", "--from", str(build), "--out", str(rel),
                 "--no-sign"]) == 0  # fmt: skip
    first = (rel / "RELEASE_NOTES.md").read_text().splitlines()[0]
    assert first.startswith("**SUBSTITUTED TOOLCHAIN")
    assert "CUDA 12.4 instead of 12.8" in first and "gcc/g++ 12 instead of 14" in first


def test_check_states_a_recorded_substitution(tmp_path, capsys):
    build = _build_output(tmp_path, SUBS)
    m = _kit_manifest(tmp_path)
    wheel = str(next(build.glob("*.whl")))
    code = main(["--manifest", str(m), "check", "--allow-no-cuda", "--no-tools", wheel])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[0].startswith("SUBSTITUTED TOOLCHAIN")
    assert "CUDA 12.4 instead of 12.8" in out.splitlines()[0]


def test_check_fails_a_toolchain_difference_no_substitution_explains(tmp_path, capsys):
    build = _build_output(tmp_path, None)  # built with 12.4, records nothing
    m = _kit_manifest(tmp_path)
    wheel = str(next(build.glob("*.whl")))
    code = main(["--manifest", str(m), "check", "--allow-no-cuda", "--no-tools", wheel])
    out = capsys.readouterr().out
    assert code == EXIT_VERIFY
    assert "FAIL toolchain: built with CUDA 12.4.131, [build] pins 12.8" in out
    assert "FAIL toolchain: built with gcc/g++ 12, [build] pins 14" in out


def test_an_older_receipt_without_substitutions_reads_as_none():
    assert from_receipt({"toolchain": {}}) == ()
    config = manifest.load(V100).build
    receipt = {"toolchain": {"cuda": "12.8.93", "gcc": "g++ (GCC) 14.2.0"}}
    assert undeclared(receipt, config) == []


# --------------------------------------------------------------------------- cp312


def _config(python: str):
    import dataclasses

    return dataclasses.replace(manifest.load(V100).build, python=python)


def test_the_torch_extension_venv_is_made_from_the_pinned_python():
    import sys

    from pinwheel.compile.kernels import KernelBuildError, build_interpreter

    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert build_interpreter(_config(here), host_of(os.environ)) == sys.executable
    other = "3.12" if here != "3.12" else "3.11"
    found = shutil.which(f"python{other}")
    if found is None:
        pytest.skip(f"no python{other} on this machine")
    try:  # a PATH name that does not run (a pyenv shim of a version not selected) is
        # passed over for uv's and pyenv's own interpreters (compile.toolchain.pythons)
        got = build_interpreter(_config(other), host_of(os.environ))
    except KernelBuildError as exc:
        assert subprocess.run([found, "-c", ""], capture_output=True).returncode != 0
        assert f"no Python {other}" in exc.what
        return
    probe = subprocess.run([got, "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert probe.stdout.strip() == str(tuple(int(x) for x in other.split(".")))


def test_no_python_of_the_pinned_version_stops_with_the_fix():
    from pinwheel.compile.kernels import KernelBuildError, build_interpreter

    with pytest.raises(KernelBuildError) as err:
        build_interpreter(_config("3.99"), host_of(os.environ))
    assert "no Python 3.99" in err.value.what and "cp399" in (err.value.next or "")


def test_a_given_torch_python_of_another_version_is_refused():
    import sys

    from pinwheel.compile.kernels import torch_venv
    from pinwheel.progress import SILENT

    with pytest.raises(ManifestError, match=r"is Python 3\.\d+, \[build\] python pins 3.99"):
        torch_venv(_config("3.99"), Path("/nonexistent"), SILENT,
                   host_of({"PINWHEEL_TORCH_PYTHON": sys.executable}))  # fmt: skip


def test_a_pinned_cuda_the_arches_refuse_offers_only_a_substitute_that_fits(tmp_path):
    """[build] cuda 12.4 with sm_110 (first in 13.0): besides editing [build], the one
    substitution offered is 13.0, from choose() and from resolving the toolkit alike."""
    from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit

    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    config = _build(cuda="12.4", arches=("11.0",), python=here)
    env = {"PATH": os.defpath, "HOME": str(tmp_path)}
    with pytest.raises(ToolchainError) as chosen:
        choose(config, host_of(env))
    with pytest.raises(ToolchainError) as found:
        resolve_toolkit(ToolkitRequest(config, tmp_path / "c", host_of(env), provision=False))
    for err in (chosen.value, found.value):
        assert err.where == "[build] cuda" and "cannot compile for arch 11.0" in err.what
        assert "--substitute cuda=13.0, the provisionable CUDA that compiles 11.0" in err.next
        assert "cuda=12.4" not in err.next

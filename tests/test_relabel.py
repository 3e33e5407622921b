"""Variant labels: every published wheel's version names its variant, consistently in the file
name, .dist-info, METADATA and RECORD; real wheels, the real check, real pip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pinwheel.errors import VerifyError
from pinwheel.wheels.check import CheckSpec, check_wheels
from pinwheel.wheels.metadata import read_path
from pinwheel.wheels.record import BuildRecord
from pinwheel.wheels.relabel import relabel, variant_label
from pinwheel.wheels.wheelset import Built, publish
from releasekit import make_wheel

LABEL = "pw.glm53card.cu128.torch2.10"


@pytest.mark.parametrize(
    ("system", "cuda", "torch", "want"),
    [
        ("glm53card", "12.8", "2.10.0", "pw.glm53card.cu128.torch2.10"),
        ("glm53card", "12.4.131", "2.9.1", "pw.glm53card.cu124.torch2.9"),  # a toolkit's version
        ("glm53-card", None, None, "pw.glm53card.cpu"),  # no CUDA, no torch
        ("GB10 K2", "13.0", "2.10.0+cu130", "pw.gb10k2.cu130.torch2.10"),
    ],
)
def test_variant_label(system: str, cuda: str | None, torch: str | None, want: str) -> None:
    assert variant_label(system, cuda, torch) == want


@pytest.mark.parametrize(
    ("system", "torch"), [("--", None), ("\x1b[2J", None), ("é", None), ("v100", "not-a-version")]
)
def test_variant_label_refuses_what_is_not_a_label(system: str, torch: str | None) -> None:
    with pytest.raises(VerifyError):
        variant_label(system, "12.8", torch)


def test_relabel_keeps_name_metadata_record_and_tags_consistent(tmp_path: Path) -> None:
    upstream = make_wheel(tmp_path / "up", "exllamav3", "0.0.43", payload=3000, seed=1,
                          tag="py3-none-any", requires_dist=("torch>=2.6",))  # fmt: skip
    made = relabel(upstream, LABEL, tmp_path / "out")
    assert made.name == f"exllamav3-0.0.43+{LABEL}-py3-none-any.whl"
    report = check_wheels([made], CheckSpec((), require_cuda=False))
    assert report.ok, report.human_lines()
    meta = read_path(made)
    assert meta.version == f"0.0.43+{LABEL}" and meta.requires_dist == ("torch>=2.6",)
    with zipfile.ZipFile(made) as zf, zipfile.ZipFile(upstream) as old:
        assert not any(n.startswith("exllamav3-0.0.43.dist-info/") for n in zf.namelist())
        assert zf.read("exllamav3/blob.bin") == old.read("exllamav3/blob.bin")
        assert b"# exllamav3" in zf.read(f"exllamav3-0.0.43+{LABEL}.dist-info/METADATA")
    assert relabel(made, LABEL, tmp_path / "again") == made  # already labelled: untouched


def test_a_labelled_pin_is_never_met_by_the_upstream_release(tmp_path: Path) -> None:
    """pip with both wheels offered: the labelled pin takes ours; a pin on another variant
    finds no match, never upstream's plain 0.0.43."""
    links = tmp_path / "links"
    upstream = make_wheel(links, "exllamav3", "0.0.43", seed=1)
    relabel(upstream, LABEL, links)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}

    def pip(spec: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install",
             "--disable-pip-version-check", "--no-index", "--find-links", str(links), spec],
            capture_output=True, text=True, env=env,
        )  # fmt: skip

    assert pip(f"exllamav3==0.0.43+{LABEL}").returncode == 0
    shown = subprocess.run(
        [str(venv / "bin/python"), "-c",
         "import importlib.metadata as m; print(m.version('exllamav3'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert shown == f"0.0.43+{LABEL}"
    other = pip("exllamav3==0.0.43+pw.gb10.cu130.torch2.10")
    assert other.returncode != 0 and "No matching distribution" in other.stderr


def test_publish_labels_every_wheel_and_records_what_it_was(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "scratch", "exllamav3", "0.0.43", 64, 0)
    record = BuildRecord(source_date_epoch=0, env={}, arches=(), compiled_inputs={},
                         version="0.0.43")  # fmt: skip
    kernel = Built("exllamav3", "kernel", wheel, 1.0, {"origin": "test"}, record)
    out = tmp_path / "wheels"
    result = publish([kernel], out, spec=CheckSpec((), require_cuda=False),
                     receipt={"schema": "pinwheel.provenance/1"}, label=LABEL)  # fmt: skip
    name = f"exllamav3-0.0.43+{LABEL}-py3-none-any.whl"
    assert sorted(result.wheels) == [name]
    prov = json.loads((out / "provenance.json").read_text())
    (comp,) = prov["components"]
    assert comp["wheel"] == name and comp["label"] == LABEL
    assert comp["relabelled_from"] == "exllamav3-0.0.43-py3-none-any.whl"


def test_a_kernel_that_links_no_torch_never_names_one_in_its_label(tmp_path: Path) -> None:
    """One build, [build] torch pinned (the shipped manifest: 2.10): the engine and a
    torch-extension kernel name the torch they compiled against; a CMake kernel names none
    (it was labelled torch2.10 before, a fact about no byte in it). Through the stage's
    own label function and publish, names and provenance together."""
    from pinwheel.compile.pipeline import build_variant
    from pinwheel.compile.toolchain.toolkit import Toolkit
    from pinwheel.manifest import model

    manifest = model.load(Path(__file__).parent.parent / "manifest.toml")
    config = manifest.build
    assert config.torch  # the case needs a pinned torch
    toolkit = Toolkit(tmp_path, tmp_path / "nvcc", "12.8.93", ("7.0",), "test")

    def built(name: str, builder: str, torch: str | None) -> Built:
        wheel = make_wheel(tmp_path / f"scratch-{name}", name, "0.1.0", 64, 0)
        rec = BuildRecord(source_date_epoch=0, env={}, arches=(), compiled_inputs={},
                          builder=builder, torch=torch)  # fmt: skip
        return Built(name, "kernel", wheel, 1.0, {"origin": "test"}, rec)

    cmake = built("selftest", "cmake", None)
    ext = built("ext", "torch", "2.10.0+cu128")
    system = config.label or manifest.name
    result = publish([cmake, ext], tmp_path / "wheels", spec=CheckSpec((), require_cuda=False),
                     receipt={"schema": "pinwheel.provenance/1"},
                     label=lambda b: build_variant(manifest, config, toolkit, b))  # fmt: skip
    assert sorted(result.wheels) == [
        f"ext-0.1.0+pw.{system}.cu128.torch2.10-py3-none-any.whl",
        f"selftest-0.1.0+pw.{system}.cu128-py3-none-any.whl",
    ]
    prov = json.loads((tmp_path / "wheels" / "provenance.json").read_text())
    labels = {c["name"]: c["label"] for c in prov["components"]}
    assert labels == {"selftest": f"pw.{system}.cu128", "ext": f"pw.{system}.cu128.torch2.10"}
    assert build_variant(manifest, config, toolkit).endswith(".torch2.10")  # the engine's

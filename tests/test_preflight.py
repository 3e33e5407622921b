"""Preflight on this GPU-less machine.

The topology parser reads real `nvidia-smi topo -m` formats (fixtures under
tests/fixtures/topo: a DGX-1 V100 hybrid cube-mesh with NICs and ANSI
underlines, a PCIe-only two-socket box from a newer driver, a terminal copy
with spaces). nvidia-smi itself cannot run here (no GPU, no driver), so the
whole-preflight tests put a stand-in `nvidia-smi` script on PATH that prints
captured output; gcc, ninja, the Python probe and the disk check are real.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.cudaarch import CudaArch
from pinwheel.errors import ManifestError, PinwheelError
from pinwheel.manifest import model as manifest
from pinwheel.manifest.serve import Engine
from pinwheel.serve.preflight import (
    FAIL,
    OK,
    SKIP,
    WARN,
    Options,
    check_engine,
    check_nvcc,
    device_indices,
    parse_gpu_csv,
    parse_nvcc_release,
    parse_topo,
    preflight,
)

ROOT = Path(__file__).resolve().parent.parent
TOPO = Path(__file__).parent / "fixtures" / "topo"
V100_CSV = "".join(
    f"{i}, Tesla V100-SXM2-32GB, 7.0, 32768, 00000000:{0x1A + i:02X}:00.0\n" for i in range(8)
)


def test_dgx1_v100_cube_mesh():
    topo = parse_topo((TOPO / "dgx1-v100.txt").read_text())
    assert topo.gpus == tuple(range(8))
    assert topo.link(0, 3) == "NV2" and topo.link(0, 1) == "NV1" and topo.link(0, 4) == "NV2"
    assert topo.link(0, 5) == "SYS" and topo.link(5, 0) == "SYS"
    # each GPU: 3 links inside its quad + 1 across
    assert len(topo.nvlink_pairs) == 16 and len(topo.pcie_pairs) == 12
    assert all(topo.nvlinked(a, b) for a in range(4) for b in range(4) if a != b)


def test_pcie_only_box_from_a_newer_driver():
    topo = parse_topo((TOPO / "pcie-4x-v100.txt").read_text())
    assert topo.gpus == (0, 1, 2, 3)
    assert topo.nvlink_pairs == ()
    assert topo.link(0, 1) == "PIX" and topo.link(1, 2) == "SYS" and topo.link(2, 3) == "PIX"


def test_space_separated_terminal_copy():
    topo = parse_topo((TOPO / "sxm2-4x-v100-spaces.txt").read_text())
    assert len(topo.nvlink_pairs) == 6 and topo.pcie_pairs == ()


def test_topo_without_a_matrix_says_what_to_run():
    with pytest.raises(PinwheelError, match="nvidia-smi topo -m"):
        parse_topo("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_gpu_csv_including_unified_memory_and_old_drivers():
    gpus = parse_gpu_csv("0, NVIDIA GB10, 12.1, [N/A], 0000000F:01:00.0\n")
    assert gpus[0].compute_capability == CudaArch(121) and gpus[0].memory_mib is None
    assert parse_gpu_csv(V100_CSV)[7].memory_mib == 32768
    with pytest.raises(PinwheelError, match="driver"):
        parse_gpu_csv('Field "compute_cap" is not a valid field to query.\n')


def test_nvcc_release():
    text = (
        "Cuda compilation tools, release 12.4, V12.4.131\nBuild cuda_12.4.r12.4/compiler.34097967_0"
    )
    assert parse_nvcc_release(text) == "12.4"


# --------------------------------------------------------------------------- whole preflight


def _stand_in_smi(tmp_path: Path, csv: str, topo: str) -> Path:
    """A stand-in for nvidia-smi (no driver here) printing captured output."""
    (tmp_path / "gpus.csv").write_text(csv)
    (tmp_path / "topo.txt").write_text(topo)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in
          topo) cat {tmp_path / "topo.txt"} ;;
          --query-gpu=*) cat {tmp_path / "gpus.csv"} ;;
          *) echo "unexpected: $*" >&2; exit 9 ;;
        esac
        """)
    )
    smi.chmod(0o755)
    return smi


def _fake_engine(tmp_path: Path, quant: str, arch: str) -> Path:
    """An installed-looking engine package whose registries name ``quant`` and ``arch``."""
    pkg = tmp_path / "site" / "vllm"
    (pkg / "model_executor/layers/quantization").mkdir(parents=True)
    (pkg / "model_executor/models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model_executor/layers/quantization/__init__.py").write_text(
        f'QUANTIZATION_METHODS = ["awq", "{quant}"]\n'
    )
    (pkg / "model_executor/models/registry.py").write_text(f'_MODELS = {{"{arch}": ("x", "y")}}\n')
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def _opts(
    tmp_path,
    profile="card",
    topo="dgx1-v100.txt",
    devices=None,
    csv=V100_CSV,
    python=None,
    model=None,
):
    serve = manifest.load(ROOT / "manifest.toml").serve
    prof = serve.profile(profile)
    return Options(
        profile=prof,
        config=serve,
        python=str(python or _fake_engine(tmp_path, "exl3", "GlmMoeDsaForCausalLM")),
        model=model,
        devices=device_indices(prof, devices),
        nvidia_smi=str(_stand_in_smi(tmp_path, csv, (TOPO / topo).read_text())),
    )


def _by_name(checks):
    return {c.name: c for c in checks}


def test_card_on_a_dgx1_quad_is_clean_on_gpus_and_topology(tmp_path):
    checks = _by_name(preflight(_opts(tmp_path, devices="0,1,2,3", model=tmp_path / "model")))
    assert checks["gpu count"].status == OK
    assert checks["compute capability"].status == OK
    assert checks["gpu memory"].status == OK
    assert checks["topology"].status == OK, checks["topology"].detail
    assert checks["engine"].status == OK and "exl3" in checks["engine"].detail
    assert checks["python"].status == OK
    # real free space of this disk against the profile's model_disk_gib
    free_gib = shutil.disk_usage(tmp_path).free / 2**30
    need = float(re.search(r"needs (\d+) GiB", checks["disk"].detail).group(1))
    assert checks["disk"].status == (OK if free_gib >= need else FAIL), checks["disk"].detail
    # every failing or warning check names its next command
    assert all(c.next for c in checks.values() if c.status in (FAIL, WARN))


def test_tp_group_across_the_cube_mesh_warns_with_nccl_advice(tmp_path):
    checks = _by_name(preflight(_opts(tmp_path, devices="0,1,4,5")))
    topo = checks["topology"]
    assert topo.status == WARN
    assert "GPU0-GPU5 SYS" in topo.detail and "GPU1-GPU4 SYS" in topo.detail
    assert "NCCL_P2P_LEVEL=NVL" in topo.next


def test_pcie_box_warns_for_every_pair(tmp_path):
    checks = _by_name(preflight(_opts(tmp_path, topo="pcie-4x-v100.txt")))
    assert checks["topology"].status == WARN
    assert checks["topology"].detail.count("GPU") == 12  # 6 pairs, 2 GPUs each


def test_wrong_gpus_fail_with_the_fix(tmp_path):
    csv = "0, NVIDIA H200, 9.0, 143771, 00000000:19:00.0\n"
    checks = _by_name(preflight(_opts(tmp_path, csv=csv, topo="sxm2-4x-v100-spaces.txt")))
    assert (
        checks["gpu count"].status == FAIL and "needs 4 GPUs, found 1" in checks["gpu count"].detail
    )
    assert "--profile" in checks["gpu count"].next


def test_small_or_wrong_arch_gpus_fail(tmp_path):
    csv = "".join(f"{i}, Tesla V100-PCIE-16GB, 7.0, 16384, 0:{i}\n" for i in range(3))
    csv += "3, Tesla T4, 7.5, 15360, 0:3\n"
    checks = _by_name(preflight(_opts(tmp_path, csv=csv, topo="pcie-4x-v100.txt")))
    assert (
        checks["compute capability"].status == FAIL
        and "GPU3 is cc 7.5" in checks["compute capability"].detail
    )
    assert checks["gpu memory"].status == FAIL and "32 GiB" in checks["gpu memory"].detail


def test_stock_vllm_is_refused():
    info = {"path": "/nowhere/vllm", "version": "0.11.0", "python": [3, 11, 7]}
    check = check_engine(Engine("vllm", "exl3", "GlmMoeDsaForCausalLM"), info)
    assert check.status == FAIL and "pinwheel install" in check.next


def test_engine_missing_architecture_is_named(tmp_path):
    python = _fake_engine(tmp_path, "exl3", "DeepseekV3ForCausalLM")
    opts = _opts(tmp_path, python=python)
    # The V100 card names no architecture; the GB10 card's is the real one to look for.
    engine = dataclasses.replace(
        opts.config.engine, architecture="Glm5NextForConditionalGeneration"
    )
    opts = dataclasses.replace(opts, config=dataclasses.replace(opts.config, engine=engine))
    checks = _by_name(preflight(opts))
    assert checks["engine"].status == FAIL
    assert "architecture 'Glm5NextForConditionalGeneration'" in checks["engine"].detail


def test_missing_engine_interpreter(tmp_path):
    checks = _by_name(preflight(_opts(tmp_path, python=tmp_path / "no-such-python")))
    assert checks["python"].status == FAIL and "--python" in checks["python"].next


def test_cli_prints_every_check_and_exits_1_on_failure(tmp_path, capsys, monkeypatch):
    smi = _stand_in_smi(
        tmp_path, "0, NVIDIA H200, 9.0, 143771, 0:19\n", (TOPO / "dgx1-v100.txt").read_text()
    )
    python = _fake_engine(tmp_path, "exl3", "GlmMoeDsaForCausalLM")
    code = main(
        [
            "preflight",
            "--manifest",
            str(ROOT / "manifest.toml"),
            "--nvidia-smi",
            str(smi),
            "--python",
            str(python),
            "--json",
        ]
    )
    assert code == 1
    out = capsys.readouterr()
    assert '"gpu count"' in out.out and "next:" in out.err
    print(out.out)  # the seconds it took, for the log (no timing assert)


def test_cpu_profile_skips_gpu_checks(tmp_path):
    m = manifest.load(Path(__file__).parent / "fixtures" / "qualify-cpu.toml")
    serve = m.serve
    opts = Options(
        profile=serve.profile(),
        config=serve,
        python=sys.executable,
        model=None,
        devices=(),
        nvidia_smi=str(tmp_path / "absent"),
    )
    checks = _by_name(preflight(opts))
    assert checks["gpus"].status == SKIP and checks["topology"].status == SKIP
    if shutil.which("gcc"):
        assert checks["gcc"].status == OK


def _stand_in_selftest(tmp_path: Path, result: dict) -> Path:
    """No GPU here: an interpreter that answers the self-test script with a canned result
    in the shape the real script prints (the real run is in the device report)."""
    import json

    (tmp_path / "result.json").write_text(json.dumps(result))
    py = tmp_path / "selftest-python"
    py.write_text(f"#!/bin/sh\ncat {tmp_path / 'result.json'}\n")
    py.chmod(0o755)
    return py


def test_selftest_names_a_corrupted_pair_and_the_nccl_fix(tmp_path):
    from pinwheel.serve.preflight import run_selftest

    result = {
        "via": "pinwheel_selftest",
        "devices": 2,
        "pairs": [
            {"src": 0, "dst": 1, "peer": True, "ok": True},
            {"src": 1, "dst": 0, "peer": True, "ok": False},
        ],
        "gemm": [
            {"device": 0, "err": 0.0, "err_kind": "max abs err", "ok": True, "jit": False},
            {"device": 1, "err": 0.0, "err_kind": "max abs err", "ok": True, "jit": False},
        ],
    }
    opts = _opts(tmp_path, python=_stand_in_selftest(tmp_path, result))
    p2p, gemm = run_selftest(opts)
    assert p2p.status == FAIL and "GPU1->GPU0" in p2p.detail and "NCCL_P2P_DISABLE=1" in p2p.next
    assert gemm.status == OK


def test_selftest_on_one_gpu_skips_pairs_but_checks_the_gemm(tmp_path):
    from pinwheel.serve.preflight import run_selftest

    result = {
        "via": "torch",
        "devices": 1,
        "pairs": [],
        "gemm": [{"device": 0, "err": 0.5, "err_kind": "max rel err", "ok": False, "jit": None}],
    }
    p2p, gemm = run_selftest(_opts(tmp_path, python=_stand_in_selftest(tmp_path, result)))
    assert p2p.status == SKIP and gemm.status == FAIL and "pinwheel install" in gemm.next


def test_real_capture_from_an_h200_with_ansi_underlines():
    """Captured with `nvidia-smi topo -m > file` on the device machine (driver 580)."""
    text = (TOPO / "h200-1gpu-captured.txt").read_text()
    assert "\x1b[4m" in text
    topo = parse_topo(text)
    assert topo.gpus == (0,) and topo.links == {}


def test_card_profile_on_a_one_gpu_box_fails_count_and_skips_topology(tmp_path):
    csv = "0, NVIDIA H200, 9.0, 143771, 00000000:00:06.0\n"
    checks = _by_name(preflight(_opts(tmp_path, csv=csv, topo="h200-1gpu-captured.txt")))
    assert checks["gpu count"].status == FAIL
    assert checks["topology"].status == SKIP and "GPU1, GPU2, GPU3" in checks["topology"].detail


def test_preflight_says_which_python_it_tests(tmp_path, capsys):
    m = tmp_path / "manifest.toml"
    shutil.copy(Path(__file__).parent / "fixtures" / "qualify-cpu.toml", m)
    main(["preflight", "--manifest", str(m), "--python", sys.executable])
    seen = capsys.readouterr()
    out = " ".join((seen.out + seen.err).split())
    assert f"engine python: {sys.executable} (from --python)" in out
    assert "pass --python VENV/bin/python" in out


def _stand_in_nvcc(root: Path, release: str) -> Path:
    """A stand-in nvcc (no CUDA toolkit on CI) printing what the real one prints."""
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        f"echo 'Cuda compilation tools, release {release}, V{release}.131'\n"
    )
    nvcc.chmod(0o755)
    return nvcc


def test_nvcc_is_looked_up_in_the_environment_the_caller_gives(tmp_path):
    """CUDA_HOME and PATH come from Options (the CLI's typed environment, options.host),
    never from this process's os.environ."""
    good = _stand_in_nvcc(tmp_path / "cuda-12.9", "12.9")
    wrong = _stand_in_nvcc(tmp_path / "cuda-13.0", "13.0")
    base = _opts(tmp_path)
    check = check_nvcc(dataclasses.replace(base, cuda_home=good.parent.parent))
    assert (check.status, check.detail) == (OK, f"nvcc 12.9 at {good}")
    check = check_nvcc(dataclasses.replace(base, search_path=str(wrong.parent)))
    assert check.status != OK and str(wrong) in check.detail and "13.0" in check.detail


@pytest.mark.parametrize(
    ("want", "release", "ok"),
    [("12.8", "12.8", True), ("12.8", "12.9", True), ("12.8", "12.10", True),
     ("12.8", "12.4", False), ("12.8", "13.0", False), ("12.8", "11.8", False),
     ("12", "12.0", True), ("12", "12.4", True), ("12", "13.1", False)],
)  # fmt: skip
def test_the_runtime_cuda_is_the_cards_minor_or_later_within_its_major(tmp_path, want, release, ok):
    """The V100 card: "You still need the CUDA 12.8 toolkit ... at runtime". A profile's
    ``cuda = "12.8"`` takes 12.8 and later 12.x (12.10 compared as a number, not as text);
    12.4 (which ``cuda = 12`` let through) and 13.0 fail, naming what is needed."""
    nvcc = _stand_in_nvcc(tmp_path / f"cuda-{release}", release)
    base = _opts(tmp_path)
    opts = dataclasses.replace(
        base, profile=dataclasses.replace(base.profile, cuda=want),
        cuda_home=nvcc.parent.parent,
    )  # fmt: skip
    check = check_nvcc(opts)
    assert (check.status == OK) is ok, check
    if not ok:
        major = want.split(".")[0]
        needed = f"CUDA {want} or a later {major}.x" if "." in want else f"CUDA {major}.x"
        assert needed in check.detail and needed in (check.next or "")


@pytest.mark.parametrize("value", ["12.8.1", "twelve", "", "9", "9.0", True, 12.8, "12.\u0668", "1" * 40])
def test_a_runtime_cuda_that_is_not_a_version_names_the_key(tmp_path, value):
    text = (ROOT / "manifest.toml").read_text()
    cut = text.replace('cuda = "12.8"  # card: 02 step 3', f"cuda = {_toml(value)}  # card: 02 step 3", 1)
    assert cut != text
    with pytest.raises(ManifestError) as err:  # read as the shipped manifest, in place
        manifest.loads(cut.encode(), ROOT / "manifest.toml")
    assert "cuda" in err.value.where and "major.minor" in err.value.what


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\") + '"'


def test_human_output_keeps_literal_brackets(tmp_path, capsys):
    """Check details are text: rich markup ate "[serve.profile.tp2]" from the all-reduce
    check's detail on the 2 x H200 run, and eats any bracketed path the same way."""
    smi = _stand_in_smi(
        tmp_path, "0, NVIDIA H200, 9.0, 143771, 0:19\n", (TOPO / "dgx1-v100.txt").read_text()
    )
    engine = _fake_engine(tmp_path, "exl3", "GlmMoeDsaForCausalLM")
    venv = tmp_path / "[venv]"
    venv.mkdir()
    python = venv / "python"
    python.write_text(engine.read_text())
    python.chmod(0o755)
    code = main(
        ["preflight", "--manifest", str(ROOT / "manifest.toml"), "--nvidia-smi", str(smi),
         "--python", str(python)]
    )  # fmt: skip
    assert code == 1  # one GPU for a four-GPU profile
    captured = capsys.readouterr()
    out = captured.out + captured.err
    (line,) = [x for x in out.splitlines() if "engine Python" in x]
    assert f"({python})" in line


def test_a_toolkit_already_in_the_cache_is_pointed_at_not_provisioned_again(tmp_path):
    """Stand-in nvcc (no CUDA 12 here by default): the cache layout is what `pinwheel
    toolchain` writes, marker included."""
    wrong = _stand_in_nvcc(tmp_path / "cuda-13.0", "13.0")
    cached = _stand_in_nvcc(tmp_path / "cache" / "toolchains" / "cuda-12.8.93", "12.8")
    root = cached.parent.parent
    (root / ".pinwheel-toolkit.json").write_text("{}\n")
    # an older 12.x in the cache is no answer to the card's 12.8: never pointed at
    older = _stand_in_nvcc(tmp_path / "cache" / "toolchains" / "cuda-12.4.131", "12.4")
    (older.parent.parent / ".pinwheel-toolkit.json").write_text("{}\n")
    base = dataclasses.replace(_opts(tmp_path), search_path=str(wrong.parent))
    check = check_nvcc(dataclasses.replace(base, cache=tmp_path / "cache"))
    assert check.status != OK
    assert check.next is not None and f"export CUDA_HOME={root}" in check.next
    assert "provision" not in check.next.split("(")[0]
    # no cache toolkit: provisioning is the advice
    check = check_nvcc(dataclasses.replace(base, cache=tmp_path / "empty"))
    assert check.next is not None and check.next.startswith("provision CUDA 12.8 or a later 12.x")


def test_engine_python_is_compared_with_the_manifests_pin(tmp_path):
    """The shipped manifest pins [build] python = "3.12": the release's cp312 wheels do not
    install into another minor version, so an engine Python that differs FAILs with the way
    to make the right venv; the one running here passes when the pin names it."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    other = "3.12" if here != "3.12" else "3.11"
    pinned = manifest.load(ROOT / "manifest.toml").build.python  # type: ignore[union-attr]
    assert pinned == "3.12"
    base = _opts(tmp_path)
    wrong = _by_name(preflight(dataclasses.replace(base, pinned_python=other)))
    assert wrong["python"].status == FAIL
    assert f"pins {other}" in wrong["python"].detail and f"Python {other}" in wrong["python"].next
    # a command that exists, into a venv install makes with that Python (not `install` alone)
    assert "`pinwheel install fetched-release --venv engine-venv`" in wrong["python"].next
    right = _by_name(preflight(dataclasses.replace(base, pinned_python=here)))
    assert right["python"].status == OK and "as [build] python pins" in right["python"].detail
    unpinned = _by_name(preflight(base))
    assert unpinned["python"].status == OK


def test_preflight_reads_the_pin_from_the_manifest(tmp_path, capsys):
    smi = _stand_in_smi(
        tmp_path, "0, NVIDIA H200, 9.0, 143771, 0:19\n", (TOPO / "dgx1-v100.txt").read_text()
    )
    python = _fake_engine(tmp_path, "exl3", "GlmMoeDsaForCausalLM")
    main(["preflight", "--manifest", str(ROOT / "manifest.toml"), "--nvidia-smi", str(smi),
          "--python", str(python), "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    (check,) = [c for c in doc["checks"] if c["name"] == "python"]
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert (check["status"] == "ok") == (here == "3.12"), check

"""One model of a CUDA arch: every place that reads an arch spelling reads it through
``pinwheel.cudaarch`` and so agrees on what it means."""

from __future__ import annotations

import pytest

from pinwheel.cudaarch import CudaArch, parse_arch, parse_dotted
from pinwheel.errors import UsageError
from pinwheel.serve.preflight import parse_gpu_csv
from pinwheel.source.buildsources import loose_intersection


@pytest.mark.parametrize("ptx", ["+PTX", "+ptx", "+Ptx"])
def test_a_ptx_entry_in_a_cmake_list_covers_newer_minors_in_every_spelling_the_parser_takes(ptx):
    # The parser reads "+ptx" as PTX (case-insensitive); the old intersection tested
    # entry.endswith("+PTX") and rstrip("+PTX") (a set of characters, not a suffix), so a
    # lowercase entry covered nothing newer.
    assert parse_arch("8.0" + ptx).ptx
    assert loose_intersection("7.5;8.0" + ptx, ["8.0", "8.6", "9.0"]) == ["8.0", "8.6", "9.0"]


def test_family_and_plain_entries_in_a_cmake_list():
    assert loose_intersection("10.0f", ["10.0", "10.3", "12.0"]) == ["10.0", "10.3"]
    assert loose_intersection("10.0f+PTX", ["10.3", "12.0"]) == ["10.3", "12.0"]
    assert loose_intersection("8.0;9.0a", ["8.0", "8.6", "9.0"]) == ["8.0", "9.0"]
    # entries the parser refuses (a stray suffix, a bare number) cover nothing
    assert loose_intersection("8.0PTX;80;8.0+PTXX", ["8.6"]) == []


def test_the_dotted_spelling_is_strict():
    assert parse_dotted("7.0") == CudaArch(70)
    assert parse_dotted("12.1", suffix=False) == CudaArch(121)
    assert (
        parse_dotted("9.0a") == CudaArch(90, suffix="a") and parse_dotted("9.0a").dotted == "9.0a"
    )
    for bad in (
        "7.0\n",
        " 7.0",
        "sm_70",
        "70",
        "7.0+PTX",
        "123.4",
        "7.10",
        "\u0667.\u0660",
        "7.0\x00",
    ):
        with pytest.raises(UsageError):
            parse_dotted(bad)
    with pytest.raises(UsageError):
        parse_dotted("9.0a", suffix=False)  # a compute capability has no suffix


def test_nvidia_smi_capabilities_are_arches_or_unknown():
    gpus = parse_gpu_csv(
        "0, NVIDIA GB10, 12.1, [N/A], 0000000F:01:00.0\n1, X, [N/A], 1024, 0000:02:00.0\n"
    )
    assert gpus[0].compute_capability == CudaArch(121)
    assert gpus[1].compute_capability is None

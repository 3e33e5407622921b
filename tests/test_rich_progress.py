"""Byte progress on a terminal (pinwheel.cli.reporting.RichReporter), drawn by real rich onto a
terminal-like console of a given width: bytes inside a spinner, and the figures on the line
at 80 columns whatever the name's length."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from pinwheel.cli.reporting import RichReporter

DEB = "CUDA 12.4.131: unpacking nvidia-cuda-dev_12.4.127~12.4.1-2_amd64.deb"
WHEEL = "nvidia_cuda_nvcc_cu12-12.4.131-py3-none-manylinux2014_x86_64.whl"


def _screen(width: int, draw) -> list[str]:  # type: ignore[no-untyped-def]
    """What the terminal was sent, split at carriage returns and newlines, escapes removed."""
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=True, soft_wrap=True,
                  highlight=False, markup=False, color_system=None)  # fmt: skip
    draw(RichReporter(con))
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    return [seg for seg in re.split(r"[\r\n]", text) if seg.strip()]


def test_a_transfer_inside_a_spinner_shows_its_bytes() -> None:
    """The ~890 MB CUDA unpack runs inside `resolving CUDA ...`: its bar is drawn under the
    spinner (a nested live display), not replaced by its name alone."""

    def draw(r: RichReporter) -> None:
        with r.status("resolving CUDA 12.4 for 7.0"), r.transfer(DEB, 933_853_452) as advance:
            advance(933_853_452)

    lines = _screen(120, draw)
    assert any("933.9/933.9 MB" in line for line in lines), lines


@pytest.mark.parametrize("width", [24, 40, 60, 80, 120])
@pytest.mark.parametrize("name", [DEB, WHEEL])
def test_the_byte_figures_stay_on_the_line_at_any_width(width: int, name: str) -> None:
    """From 24 columns up the byte figures are whole on the name's line; under 62 the bar,
    speed and time give way to them."""
    from pinwheel.cli.reporting import NARROW

    def draw(r: RichReporter) -> None:
        with r.transfer(name, 22_265_199) as advance:
            advance(22_265_199)

    lines = _screen(width, draw)
    done = [line for line in lines if "22.3/22.3 MB" in line]
    assert done, lines
    assert all(len(line) <= width for line in lines), lines
    end = "0:00:00" if width >= NARROW else "22.3/22.3 MB"
    assert all(line.rstrip().endswith(end) for line in done), done
    assert all(line.startswith(name[:4]) for line in done), done  # the name's start kept


def test_fit_keeps_both_ends_of_a_long_name() -> None:
    from pinwheel.cli.reporting import fit

    assert fit("short.whl", 40) == "short.whl"
    cut = fit(WHEEL, 30)
    assert len(cut) == 30 and cut.startswith("nvidia_cuda_nvc") and cut.endswith("x86_64.whl")
    assert "…" in cut

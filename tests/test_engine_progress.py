"""A long engine build reports ninja's progress and is stopped whole when interrupted.

Real subprocesses stand in for the backend (a shell script printing ninja's step lines);
no compiler is involved.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from pinwheel.compile import engine
from pinwheel.compile.engine import BuildPlan, ninja_progress, run_build
from pinwheel.progress import LineReporter
from procwait import gone


def test_ninja_progress_takes_the_last_step_line() -> None:
    log = b"-- Configuring done\n[1/103] Building CXX object a.o\n[44/103] Building CUDA object "
    log += b"CMakeFiles/_C.dir/csrc/quantization/marlin/sm70_marlin_u8_gemm.cu.o\nwarning: x\n"
    assert ninja_progress(log) == (
        44, 103, "Building CUDA object CMakeFiles/_C.dir/csrc/quantization/marlin/sm70_marlin_u8_gemm.cu.o"
    )  # fmt: skip
    assert ninja_progress(b"running build_ext\n") is None
    assert ninja_progress(b"[3/9] Building \x1b]0;title\x07x.o\n") == (
        3,
        9,
        "Building ?]0;title?x.o",
    )


def _plan(tmp_path: Path, script: str) -> BuildPlan:
    work = tmp_path / "work"
    work.mkdir()
    return BuildPlan(
        source=tmp_path, out_dir=work / "dist", work=work, python=sys.executable,
        command=("sh", "-c", script), version="1.0", arches=(), set_env={},
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )  # fmt: skip


def test_a_long_build_reports_its_ninja_step(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(engine, "PROGRESS_EVERY", 0.5)
    plan = _plan(
        tmp_path,
        "echo '[1/3] Building CXX object a.o'; sleep 1.5; echo '[2/3] Building CUDA object b.o';"
        " sleep 1.5; : > work/dist/x-1.0-py3-none-any.whl",
    )
    stream = io.StringIO()
    (wheel,) = run_build(plan, LineReporter(stream))
    lines = stream.getvalue().splitlines()
    assert wheel.name == "x-1.0-py3-none-any.whl"
    assert any(line.startswith("compiling [2/3] Building CUDA object b.o") for line in lines)
    assert lines[0] == f"build log: {plan.log}"  # where to look, before the wait


def test_a_build_still_configuring_is_not_silent(tmp_path: Path, monkeypatch) -> None:
    """Before ninja's first step (CMake configuring, a build environment installing) a
    line still comes every PROGRESS_EVERY seconds, naming the log."""
    monkeypatch.setattr(engine, "PROGRESS_EVERY", 0.5)
    plan = _plan(tmp_path, "echo '-- Configuring'; sleep 2; : > work/dist/x-1.0-py3-none-any.whl")
    stream = io.StringIO()
    run_build(plan, LineReporter(stream))
    waits = [ln for ln in stream.getvalue().splitlines() if ln.startswith("configuring")]
    assert len(waits) >= 2 and all(str(plan.log) in ln for ln in waits)


def test_the_default_progress_interval_is_at_most_30_seconds() -> None:
    assert 0 < engine.PROGRESS_EVERY <= 30


def test_an_interrupted_build_leaves_no_compiler_running(tmp_path: Path) -> None:
    """The backend's children (cmake, ninja, nvcc) die with it, not only the backend."""
    pidfile = tmp_path / "child.pid"
    plan = _plan(tmp_path, f"sleep 60 & echo $! > {pidfile}; wait")
    # Python ignores SIGINT when it started with SIGINT ignored (a job sent to the
    # background by a non-interactive shell): Ctrl-C's handler, explicitly, for the test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))  # like Ctrl-C
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_build(plan)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    child = int(pidfile.read_text())
    if not gone(child):  # reaped by init shortly after the group's SIGKILL
        pytest.fail(f"the build's child {child} still runs")

"""SIGTERM stops a pinwheel run like Ctrl-C: its child's whole process group goes too.

Real processes: a Python that runs a child shell (its own group, as builds are) which
starts a grandchild ``sleep``; the Python gets SIGTERM. Inside
``terminate_as_interrupt`` the runner's Ctrl-C cleanup kills the group (exit 143, the
sleep is gone); without it the interpreter dies at once and the sleep runs on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pinwheel.cli.stopsignal import Terminated, terminate_as_interrupt
from procwait import gone

SRC = Path(__file__).resolve().parent.parent / "src"

SCRIPT = """
import contextlib, sys
from pinwheel import runner
from pinwheel.cli.stopsignal import terminate_as_interrupt
pidfile, guarded = sys.argv[1], sys.argv[2] == "1"
cmd = runner.Command(("sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"), new_session=True,
                     check=False)
with terminate_as_interrupt() if guarded else contextlib.nullcontext():
    try:
        runner.run(cmd)
    except KeyboardInterrupt as stop:
        sys.exit(getattr(stop, "exit_code", 130))
"""


def _run_and_terminate(tmp_path: Path, guarded: bool) -> tuple[int, int]:
    pidfile = tmp_path / f"sleep-{int(guarded)}.pid"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(pidfile), str(int(guarded))],
                            env=env)  # fmt: skip
    for _ in range(100):
        if pidfile.is_file() and pidfile.read_text().strip():
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the child never started")
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30), int(pidfile.read_text())


def test_sigterm_takes_the_childs_group_with_it(tmp_path: Path) -> None:
    code, sleeper = _run_and_terminate(tmp_path, guarded=True)
    assert code == 128 + signal.SIGTERM
    assert gone(sleeper), f"the build's grandchild {sleeper} still runs"


def test_without_it_sigterm_orphans_the_child(tmp_path: Path) -> None:
    code, sleeper = _run_and_terminate(tmp_path, guarded=False)
    try:
        assert code == -signal.SIGTERM
        assert not gone(sleeper)  # what pinwheel did before: the build ran on
    finally:
        os.kill(sleeper, signal.SIGKILL)


def test_an_ignored_signal_stays_ignored() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with terminate_as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            with pytest.raises(Terminated) as stop:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            assert stop.value.exit_code == 143
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    finally:
        signal.signal(signal.SIGHUP, previous)

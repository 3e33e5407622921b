"""The one subprocess runner and the one reporting channel, on real processes and streams."""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import pytest

from pinwheel import runner
from pinwheel.errors import EXIT_VERIFY, PinwheelError, VerifyError
from pinwheel.progress import SILENT, LineReporter
from pinwheel.source import gitcli
from procwait import gone

PY = sys.executable


class Recorder:
    """A Reporter that keeps what it was told (the interface is four methods)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def detail(self, message: str) -> None:
        self.lines.append(("detail", message))

    def status(self, message: str):  # type: ignore[no-untyped-def]
        return SILENT.status(message)

    def transfer(self, name: str, total: int | None, done: int = 0):  # type: ignore[no-untyped-def]
        return SILENT.transfer(name, total, done)


def test_capture_keeps_both_streams_and_logs_the_command() -> None:
    rec = Recorder()
    cmd = runner.Command(
        (PY, "-c", "import sys; print('out'); print('err', file=sys.stderr)"), what="probe"
    )
    done = runner.run(cmd, rec)
    assert done.ok and done.text == "out" and done.err_text == "err"
    assert rec.lines and rec.lines[0][0] == "detail" and rec.lines[0][1].startswith("$ ")
    assert "probe" not in rec.lines[0][1] and "-c" in rec.lines[0][1]


def test_a_missing_executable_is_a_project_error_with_a_next_step(tmp_path: Path) -> None:
    cmd = runner.Command((str(tmp_path / "no-such-tool"), "--version"), what="the tool")
    with pytest.raises(PinwheelError) as err:
        runner.run(cmd)
    assert "not found" in err.value.what and "the tool" in err.value.what
    assert err.value.next and "install" in err.value.next


def test_a_missing_working_directory_is_named(tmp_path: Path) -> None:
    cmd = runner.Command((PY, "-c", "pass"), cwd=tmp_path / "gone")
    with pytest.raises(PinwheelError, match="does not exist"):
        runner.run(cmd)


def test_a_failure_quotes_the_last_lines_and_uses_the_requested_error_type() -> None:
    script = "import sys; print('first', file=sys.stderr); print('last words', file=sys.stderr); sys.exit(3)"
    cmd = runner.Command((PY, "-c", script), what="checker", error=VerifyError, next="fix it")
    with pytest.raises(VerifyError) as err:
        runner.run(cmd)
    assert err.value.exit_code == EXIT_VERIFY
    assert "exit 3" in err.value.what and "last words" in err.value.what
    assert err.value.next == "fix it"
    # check=False hands the status back instead
    done = runner.run(runner.Command((PY, "-c", script), check=False))
    assert done.returncode == 3 and done.tail()[-1] == "last words"


def test_a_timeout_stops_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # The command starts a grandchild that would outlive a plain kill of its parent.
    script = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    cmd = runner.Command((PY, "-c", script), what="sleeper", timeout=2, new_session=True)
    started = time.monotonic()
    with pytest.raises(PinwheelError, match="did not finish within 2 s"):
        runner.run(cmd)
    assert time.monotonic() - started < 30
    grandchild = int(pidfile.read_text())
    if not gone(grandchild):  # reaped by init shortly after the group's SIGKILL
        pytest.fail(f"grandchild {grandchild} survived the timeout")


def test_log_output_goes_to_the_file_and_a_failure_quotes_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "build.log"
    script = "import sys; print('compiling a'); print('boom', file=sys.stderr); sys.exit(1)"
    cmd = runner.Command((PY, "-c", script), what="build", output="log", log_file=log)
    with pytest.raises(PinwheelError) as err:
        runner.run(cmd)
    text = log.read_text()
    assert text.startswith("$ ") and "compiling a" in text and "boom" in text
    assert "boom" in err.value.what and str(log) in (err.value.where or "")


def test_environment_is_declared_not_read_by_the_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_DIR", "/nonexistent")
    monkeypatch.setenv("PINWHEEL_RUNNER_TEST", "inherited")
    probe = "import os; print(os.environ.get('GIT_DIR'), os.environ.get('PINWHEEL_RUNNER_TEST'), os.environ.get('ADDED'))"
    inherit = runner.run(runner.Command((PY, "-c", probe)))
    assert inherit.text == "/nonexistent inherited None"
    shaped = runner.run(
        runner.Command((PY, "-c", probe), env_unset_prefixes=("GIT_",), env_set={"ADDED": "1"})
    )
    assert shaped.text == "None inherited 1"
    whole = runner.run(runner.Command((PY, "-c", probe), env={"ADDED": "2"}))
    assert whole.text == "None None 2"


def test_spawn_refuses_capture_and_stop_ends_the_group(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        runner.spawn(runner.Command((PY, "-c", "pass")))
    proc = runner.spawn(
        runner.Command(
            (PY, "-c", "import time; print('re' + 'ady', flush=True); time.sleep(60)"),
            output="log",
            log_file=tmp_path / "server.log",
            new_session=True,
        )
    )
    for _ in range(100):
        if "ready" in (tmp_path / "server.log").read_text():
            break
        time.sleep(0.05)
    proc.stop(grace_s=5)
    assert proc.returncode is not None
    assert runner.tail_of(tmp_path / "server.log")[-1] == "ready"


def test_git_runs_under_the_policy_whatever_the_callers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inherited GIT_DIR / GIT_CONFIG_* cannot steer pinwheel's git."""
    repo = tmp_path / "r.git"
    gitcli.git(["init", "-q", "--bare", "--", str(repo)])
    decoy = tmp_path / "decoy.git"
    gitcli.git(["init", "-q", "--bare", "--", str(decoy)])
    monkeypatch.setenv("GIT_DIR", str(decoy))
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.hooksPath")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", str(tmp_path / "evil-hooks"))
    got = gitcli.out(["rev-parse", "--absolute-git-dir"], git_dir=repo)
    assert Path(got) == repo.resolve()
    assert gitcli.out(["config", "core.hooksPath"], git_dir=repo) == "/dev/null"
    cmd = gitcli.command(["status"], git_dir=repo)
    assert cmd.env_unset_prefixes == ("GIT_",) and cmd.env_set["LC_ALL"] == "C"
    with pytest.raises(PinwheelError) as err:
        gitcli.git(
            ["rev-parse", "--verify", "--end-of-options", "nope"],
            git_dir=repo,
            what="git rev-parse",
        )
    assert "git rev-parse failed" in err.value.what


def test_line_reporter_keeps_brackets_and_hides_detail_unless_verbose() -> None:
    stream = io.StringIO()
    rep = LineReporter(stream)
    rep.info("[build] step [1/3] done")
    rep.detail("$ git fetch")
    with rep.transfer("wheel.whl", 2048) as advance:
        advance(1500)
        advance(548)
    text = stream.getvalue()
    assert "[build] step [1/3] done" in text and "$ git fetch" not in text
    assert "wheel.whl (2.0 KiB)" in text and "2.0 KiB in" in text
    verbose = io.StringIO()
    LineReporter(verbose, verbose=True).detail("$ git fetch")
    assert verbose.getvalue() == "$ git fetch\n"


def test_rich_reporter_prints_literal_text() -> None:
    from rich.console import Console

    from pinwheel.cli.reporting import RichReporter

    out = io.StringIO()
    rep = RichReporter(Console(file=out, width=200, force_terminal=False), verbose=True)
    rep.info("[build] [bold]x[/bold] [red]")
    rep.detail("$ cmd [x]")
    with rep.status("step [1/2]"):
        rep.info("inner [y]")
    with rep.transfer("[file].whl", 10) as advance:
        advance(10)
    text = out.getvalue()
    assert "[build] [bold]x[/bold] [red]" in text and "$ cmd [x]" in text
    assert "inner [y]" in text and "[file].whl" in text


def test_the_one_log_tail_reader_reads_only_the_end_and_never_blocks(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    with open(log, "w") as f:
        f.write("x" * 2_000_000 + "\n")  # a long line the tail cuts into
        f.writelines(f"line {i}\n" for i in range(100))
    assert runner.tail_of(log, 3) == ["line 97", "line 98", "line 99"]
    assert len(runner.read_tail(log)) == 64 * 1024
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes: opening it for reading would wait forever
    assert runner.tail_of(fifo) == []
    assert runner.tail_of(tmp_path / "missing") == [] and runner.tail_of(tmp_path) == []

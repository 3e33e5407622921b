"""The one way pinwheel runs a subprocess: a frozen :class:`Command` in, a :class:`Completed` out.

Modelled on pypa/build's injected runner. A stage describes what it wants run
(argv, directory, environment, where the output goes, a deadline) and this
module runs it, logs the command through the :class:`~pinwheel.progress.Reporter`
and turns the ways a subprocess fails into the project's errors, each with
what / where / next:

* the executable is missing or cannot be started -> ``error`` (default
  :class:`~pinwheel.errors.PinwheelError`), ``next`` says what provides it;
* it ran past ``timeout`` -> the same error type, its process group killed;
* it exited non-zero and ``check`` is set -> the same error type, with the
  last lines it wrote (or the log file's tail) in the message.

Environment: ``env=None`` inherits this process's environment (the only place
a stage's subprocess sees it, and only by asking); ``env_unset_prefixes`` drops
inherited keys (git's ``GIT_*``), ``env_set`` adds keys on top. Stages never
read ``os.environ`` themselves: the CLI resolves what they need into requests.

Output: ``"capture"`` keeps stdout and stderr as bytes; ``"log"`` writes both,
interleaved, to ``log_file`` (long builds); ``"discard"`` drops them.

Background processes: :func:`spawn` returns a :class:`Process`, the project's own
handle (``pid``, ``poll``, ``stop``, ``kill``), so no other module needs
``subprocess`` or its types.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal, NoReturn

from pinwheel.errors import PinwheelError
from pinwheel.progress import SILENT, Reporter

Output = Literal["capture", "log", "discard"]

#: Lines of a failed command's output quoted in its error.
TAIL_LINES = 15


@dataclass(frozen=True)
class Command:
    """One subprocess to run, described completely (nothing else is consulted)."""

    argv: tuple[str, ...]
    what: str = ""  # what it does, for messages: "git fetch", "uv pip install"
    cwd: Path | None = None
    env: Mapping[str, str] | None = None  # the whole environment; None: inherit this process's
    env_set: Mapping[str, str] = field(default_factory=dict)
    env_unset_prefixes: tuple[str, ...] = ()
    input: bytes | None = None
    output: Output = "capture"
    log_file: Path | None = None  # output="log": stdout+stderr go here
    timeout: float | None = None
    check: bool = True  # a non-zero exit raises
    new_session: bool = False  # own process group: a timeout or Ctrl-C kills all of it
    error: type[PinwheelError] = PinwheelError
    where: str | None = None
    next: str | None = None  # for a non-zero exit; missing tools get their own hint
    missing_hint: str | None = None  # "install git" -- when argv[0] is not found
    redact: bool = False  # the argv/output may hold credentials (URLs): redact in messages

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("Command needs an argv")
        object.__setattr__(self, "argv", tuple(str(a) for a in self.argv))
        if self.output == "log" and self.log_file is None:
            raise ValueError("output='log' needs a log_file")

    @property
    def label(self) -> str:
        return self.what or Path(self.argv[0]).name

    @property
    def shell(self) -> str:
        """The command as a person would type it (for logs and `next:` lines)."""
        text = shlex.join(self.argv)
        if self.cwd is not None:
            text = f"cd {shlex.quote(str(self.cwd))} && {text}"
        return _redact(text) if self.redact else text

    def environment(self) -> dict[str, str] | None:
        """The child's environment; None when it is exactly this process's."""
        if self.env is None and not self.env_set and not self.env_unset_prefixes:
            return None
        base = dict(os.environ if self.env is None else self.env)
        if self.env_unset_prefixes:
            base = {k: v for k, v in base.items() if not k.startswith(self.env_unset_prefixes)}
        base.update(self.env_set)
        return base


@dataclass(frozen=True)
class Completed:
    """What a command did: its exit status and (``output="capture"``) what it wrote."""

    command: Command
    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def text(self) -> str:
        """stdout decoded (undecodable bytes replaced), stripped."""
        return self.stdout.decode(errors="replace").strip()

    @property
    def err_text(self) -> str:
        return self.stderr.decode(errors="replace").strip()

    def tail(self, lines: int = TAIL_LINES) -> list[str]:
        """The last lines it wrote: stderr, else stdout, else its log file."""
        text = self.err_text or self.text
        if not text and self.command.log_file is not None:
            with contextlib.suppress(OSError):
                text = read_tail(self.command.log_file).decode(errors="replace").strip()
        out = text.splitlines()[-lines:]
        return [_redact(x) for x in out] if self.command.redact else out

    def failure(self) -> PinwheelError:
        """The error for a non-zero exit (callers with their own wording may build theirs)."""
        cmd = self.command
        tail = self.tail()
        head = f"{cmd.label} failed (exit {self.returncode})"
        if len(tail) == 1:
            what = f"{head}: {tail[0]}"
        elif tail:
            what = head + ":\n    " + "\n    ".join(tail)
        else:
            what = head
        where = cmd.where or cmd.shell
        if cmd.log_file is not None and str(cmd.log_file) not in where:
            where += f" (log: {cmd.log_file})"
        return cmd.error(what, where=where, next=cmd.next or f"rerun by hand: {cmd.shell}")


def run(cmd: Command, reporter: Reporter = SILENT) -> Completed:
    """Run ``cmd`` to the end; raise its ``error`` when it cannot start, times out or fails."""
    reporter.detail(f"$ {cmd.shell}")
    started = time.monotonic()
    log: IO[bytes] | None = None
    try:
        if cmd.output == "log":
            assert cmd.log_file is not None
            cmd.log_file.parent.mkdir(parents=True, exist_ok=True)
            log = _open_log(cmd.log_file)
            log.write(f"$ {cmd.shell}\n".encode())
            log.flush()
        proc = _popen(cmd, log)
        try:
            stdout, stderr = proc.communicate(cmd.input, timeout=cmd.timeout)
        except subprocess.TimeoutExpired:
            _kill(proc, cmd.new_session)
            proc.communicate()
            raise cmd.error(
                f"{cmd.label} did not finish within {cmd.timeout:g} s; stopped",
                where=cmd.where or cmd.shell,
                next=cmd.next or f"rerun by hand to see where it stops: {cmd.shell}",
            ) from None
        except BaseException:  # Ctrl-C: do not leave the child (or its group) running
            _kill(proc, cmd.new_session)
            with contextlib.suppress(Exception):
                proc.communicate(timeout=5)
            raise
    finally:
        if log is not None:
            log.close()
    done = Completed(cmd, proc.returncode, stdout or b"", stderr or b"", time.monotonic() - started)
    if cmd.check and not done.ok:
        raise done.failure()
    return done


class Process:
    """A command started by :func:`spawn`: poll it, stop it (SIGTERM then SIGKILL), kill it.

    Signals go to its whole process group when the command asked for its own
    session (``new_session``), else to the process alone.
    """

    def __init__(self, command: Command, popen: subprocess.Popen[bytes]) -> None:
        self.command = command
        self._popen = popen

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def poll(self) -> int | None:
        """Its exit status once it has ended, else None."""
        return self._popen.poll()

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; reaped either way."""
        if self._popen.poll() is not None:
            return
        group = self.command.new_session
        _signal(self._popen, signal.SIGTERM, group)
        try:
            self._popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal(self._popen, signal.SIGKILL, group)
            self._popen.wait()

    def kill(self) -> None:
        """SIGKILL and reap."""
        _kill(self._popen, self.command.new_session)


def spawn(cmd: Command, reporter: Reporter = SILENT) -> Process:
    """Start ``cmd`` in the background (servers, polled builds); ``Process.stop`` ends it.

    Output goes where ``cmd.output`` says (``"capture"`` is not allowed: nobody
    would drain the pipe). The caller owns the process.
    """
    if cmd.output == "capture":
        raise ValueError("spawn() cannot capture output; use output='log' or 'discard'")
    reporter.detail(f"$ {cmd.shell} &")
    if cmd.output != "log":
        return Process(cmd, _popen(cmd, None))
    assert cmd.log_file is not None
    cmd.log_file.parent.mkdir(parents=True, exist_ok=True)
    with _open_log(cmd.log_file) as log:
        log.write(f"$ {cmd.shell}\n".encode())
        log.flush()
        return Process(cmd, _popen(cmd, log))  # the child keeps its own copy of the descriptor


def replace_process(cmd: Command, reporter: Reporter = SILENT) -> NoReturn:
    """Become ``cmd`` (``exec``): for `pinwheel serve`, whose server is the process itself.

    Only the CLI calls this. A missing program is raised like :func:`run` does.
    """
    reporter.detail(f"exec {cmd.shell}")
    env = cmd.environment()
    if cmd.cwd is not None:
        os.chdir(cmd.cwd)
    try:
        os.execvpe(cmd.argv[0], list(cmd.argv), env if env is not None else dict(os.environ))
    except OSError as exc:
        raise _start_error(cmd, exc) from None


def tail_of(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last lines of a log file (its last 64 KiB read, however large it grew); [] when
    it cannot be read. The one log-tail reader: errors and progress about any log use it."""
    if not Path(path).is_file():  # a FIFO or device would block or never end
        return []
    try:
        return read_tail(path).decode(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return []


def _open_log(path: Path) -> IO[bytes]:
    """``path`` truncated for a child's output; a link planted there (``build.log ->
    /victim``) is replaced by a file, never written through."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError:
        if not os.path.islink(path):
            raise
        os.unlink(path)
        fd = os.open(path, flags | os.O_EXCL, 0o644)
    return os.fdopen(fd, "wb")


def _popen(cmd: Command, log: IO[bytes] | None) -> subprocess.Popen[bytes]:
    if cmd.output == "capture":
        stdout: int | IO[bytes] | None = subprocess.PIPE
        stderr: int | IO[bytes] | None = subprocess.PIPE
    elif cmd.output == "log":
        stdout, stderr = log, subprocess.STDOUT
    else:  # "discard"
        stdout = stderr = subprocess.DEVNULL
    try:
        return subprocess.Popen(
            list(cmd.argv),
            cwd=cmd.cwd,
            env=cmd.environment(),
            stdin=subprocess.PIPE if cmd.input is not None else subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=cmd.new_session,
        )
    except OSError as exc:
        raise _start_error(cmd, exc) from None


def _start_error(cmd: Command, exc: OSError) -> PinwheelError:
    """Why ``cmd`` could not start: a missing directory, program, or an unrunnable file."""
    if cmd.cwd is not None and not Path(cmd.cwd).is_dir():
        return cmd.error(
            f"cannot run {cmd.label}: its directory {cmd.cwd} does not exist",
            where=cmd.where or cmd.shell,
            next=cmd.next or "check the path (was the cache moved or cleaned?)",
        )
    if isinstance(exc, FileNotFoundError):
        missing = exc.filename if exc.filename not in (None, cmd.argv[0]) else cmd.argv[0]
        return cmd.error(
            f"cannot run {cmd.label}: {missing} not found",
            where=cmd.where or cmd.shell,
            next=cmd.missing_hint or f"install {Path(cmd.argv[0]).name} or put it on PATH",
        )
    return cmd.error(
        f"cannot run {cmd.label}: {exc.strerror or exc}",
        where=cmd.where or cmd.shell,
        next=cmd.missing_hint or f"check that {cmd.argv[0]} is an executable program",
    )


def _signal(proc: subprocess.Popen[bytes], sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def _kill(proc: subprocess.Popen[bytes], group: bool) -> None:
    if proc.poll() is None:
        _signal(proc, signal.SIGKILL, group)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def read_tail(path: Path, size: int = 64 * 1024) -> bytes:
    """The last ``size`` bytes of ``path`` (OSError when it cannot be read)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - size))
        return f.read()


def _redact(text: str) -> str:
    from pinwheel.urls import redact

    return redact(text)

"""Run a command in a pseudo-terminal of a given width, as a person's terminal would.

    python tests/ptyrun.py --columns 120 -- pytest -m "not slow"

The child's stdin, stdout and stderr are the terminal (isatty() is true), the window is
COLUMNS x 50 (TIOCSWINSZ) and $COLUMNS/$LINES are not set, so the width comes from the
terminal as it does for someone typing the command. Output is copied to this process's
stdout; the exit status is the child's. noxfile.py's `terminal` session uses it so that a
test which reads the caller's width, colour or TTY by accident fails in CI too.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import struct
import subprocess
import sys
import termios


def run(argv: list[str], columns: int, rows: int = 50) -> int:
    main, child = os.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.setdefault("TERM", "xterm-256color")
    proc = subprocess.Popen(
        argv, stdin=child, stdout=child, stderr=child, env=env, start_new_session=True,
        close_fds=True,
    )  # fmt: skip
    os.close(child)
    out = sys.stdout.buffer
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the terminal's last writer has gone
            break
        if not chunk:
            break
        out.write(chunk)
        out.flush()
    os.close(main)
    return proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--columns", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    return run(command, args.columns)


if __name__ == "__main__":
    sys.exit(main())

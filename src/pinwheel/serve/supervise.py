"""A server process for qualification: started in its own process group, always stopped.

In: the :class:`~pinwheel.serve.recipe.Launch` of a profile, the environment to
run it in, and an output directory. Out: a :class:`~pinwheel.serve.qualify.Target`
for the time the ``with`` block runs; the log is ``out/server.log`` and the pid
``out/server.pid``. The whole process group is stopped on the way out
(SIGTERM, then SIGKILL after ``grace_s``), whatever happened inside.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path

from pinwheel import runner
from pinwheel.fsutil import atomic_write_text
from pinwheel.progress import SILENT, Reporter
from pinwheel.serve.qualify import Target
from pinwheel.serve.recipe import Launch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def started_server(
    run: Launch,
    out: Path,
    *,
    environ: Mapping[str, str],
    url: str,
    reporter: Reporter = SILENT,
    grace_s: float = 30.0,
) -> Iterator[Target]:
    out.mkdir(parents=True, exist_ok=True)
    log = out / "server.log"
    cmd = runner.Command(
        tuple(run.argv),
        what="the server",
        env={**environ, **run.env},
        output="log",
        log_file=log,
        new_session=True,
        missing_hint="pass --python with the engine venv's python",
    )
    proc = runner.spawn(cmd, reporter)
    atomic_write_text(out / "server.pid", f"{proc.pid}\n")
    reporter.info(f"started server pid {proc.pid} at {url}; log: {log}")
    try:
        yield Target(url=url, log=log, alive=proc.poll)
    finally:
        proc.stop(grace_s)  # its whole process group (new_session)

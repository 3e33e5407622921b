"""Downloads checked against their pins: files by URL with resume (HTTP Range), wheels
through ``pip download``.

:func:`fetch_resumable` keeps what arrived in ``.<name>.part`` beside the target when it
is interrupted (Ctrl-C, a dropped connection); the next run asks for the rest with
``Range: bytes=N-`` and appends it, or starts again from zero when the server answers
the whole file (no Range support). Either way the whole file is hashed at the end and
renamed into place only when it has the pinned sha256.
"""

from __future__ import annotations

import http.client
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import confine, runner
from pinwheel.checksums import sha256_file
from pinwheel.compile.toolchain.pins import WheelPin
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.net.httpget import USER_AGENT, Bounds, RedirectRefused, urlopen
from pinwheel.progress import SILENT, Reporter, human_bytes
from pinwheel.urls import redact

# A stalled connection (no byte for this long) is an error; the partial file is kept.
READ_TIMEOUT_S = 60.0
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def verified(path: Path, sha256: str) -> bool:
    """``path`` exists and has the pinned sha256."""
    return path.is_file() and sha256_file(path) == sha256


def check_download(path: Path, sha256: str, origin: str) -> Path:
    """``path`` if it has the pinned sha256; else it is deleted and the error names both."""
    actual = sha256_file(path)
    if actual != sha256:
        path.unlink()
        raise ToolchainError(
            f"{path.name} from {origin} has sha256 {actual}, the lock pins {sha256}",
            where=f"toolchain lock ({path.name})",
            next="the mirror serves a different file: check the mirror, or re-pin LOCKS "
            "in pinwheel/compile/toolchain/pins.py after reviewing the new file",
        )
    return path


def fetch_wheel(pin: WheelPin, downloads: Path, environ: Mapping[str, str]) -> Path:
    """``pin``'s wheel in ``downloads``, verified; ``pip download`` runs in ``environ``."""
    target = downloads / pin.filename
    if verified(target, pin.sha256):
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--platform", "manylinux2014_x86_64", "--implementation", "py",
            "--dest", tmp, f"{pin.project}=={pin.version}",
        ]  # fmt: skip
        out = runner.run(
            runner.Command(tuple(cmd), env=environ, check=False, error=ToolchainError)
        )
        got = Path(tmp) / pin.filename
        if out.returncode != 0 or not got.is_file():
            names = ", ".join(p.name for p in Path(tmp).iterdir()) or "nothing"
            raise ToolchainError(
                f"pip could not download {pin.filename} (got {names}): {out.err_text[-300:]}",
                where=f"{pin.project}=={pin.version}",
                next="check the network and pip's index configuration",
            )
        check_download(got, pin.sha256, "the package index")
        os.replace(got, target)
    return target


@dataclass(frozen=True)
class Fetched:
    """A verified download: where it is, the bytes this run moved, the bytes a partial
    file from an earlier run gave (``resumed_from``; 0: from the start)."""

    path: Path
    received: int
    resumed_from: int


def partial_of(dest: Path) -> Path:
    """Where an interrupted download of ``dest`` keeps its bytes."""
    return dest.with_name(f".{dest.name}.part")


def _fail(url: str, what: str, next: str = "check the network and run it again: the bytes "
          "already downloaded are kept and the download resumes") -> ToolchainError:
    return ToolchainError(what, where=redact(url)[:200], next=next)


def _open(url: str, offset: int) -> tuple[Any, int]:
    """The answer to a GET of ``url`` from ``offset`` and the offset it really starts at
    (0 when the server sends the whole file: it ignored the Range)."""
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    req = urllib.request.Request(url, headers=headers)
    try:
        resp = urlopen(req, timeout=READ_TIMEOUT_S)
    except RedirectRefused as exc:
        raise _fail(url, f"{exc.problem}: {redact(exc.url)[:200]}",
                    "use a mirror that serves the file itself") from None  # fmt: skip
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and offset:  # the part is not a prefix the server knows: restart
            return _open(url, 0)
        raise _fail(url, f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise _fail(url, f"cannot connect: {getattr(exc, 'reason', exc)}") from None
    if offset and resp.status == 206:
        m = _CONTENT_RANGE.fullmatch((resp.headers.get("Content-Range") or "").strip())
        if m is None or int(m.group(1)) != offset:
            resp.close()
            raise _fail(url, f"the server answered the range from {offset} with "
                        f"Content-Range {resp.headers.get('Content-Range')!r}",
                        "use another mirror")  # fmt: skip
        return resp, offset
    return resp, 0


def fetch_resumable(
    url: str, dest: Path, sha256: str, size: int | None = None, reporter: Reporter = SILENT
) -> Fetched:
    """``url`` into ``dest`` with the pinned ``sha256``, continuing a partial file an earlier
    run left; ``size`` (when known) caps what is accepted. The byte progress goes to
    ``reporter.transfer``; an interrupted run keeps the partial file."""
    if dest.is_file() and sha256_file(dest) == sha256:
        return Fetched(dest, 0, 0)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = partial_of(dest)
    if part.is_symlink() or (part.exists() and not part.is_file()):
        confine.remove(dest.parent, part)  # never written through
    have = part.stat().st_size if part.is_file() else 0
    if size is not None and have > size:
        part.unlink()
        have = 0
    resp, start = _open(url, have)
    if have and not start:
        reporter.info(f"{dest.name}: the server does not resume (no Range support): "
                      f"downloading again from 0 ({human_bytes(have)} were here)")  # fmt: skip
        part.unlink()
    elif have:
        reporter.info(f"{dest.name}: resuming at {human_bytes(start)} ({start} bytes kept "
                      "from an interrupted download)")  # fmt: skip
    cap = (size - start) if size is not None else 1 << 40
    bounds = Bounds(dest.name, cap, lambda what, next: _fail(url, what, next))
    received = 0
    with resp, confine.open_append(dest.parent, part) as out:
        announced = bounds.announced(resp.headers.get("Content-Length"))
        total = start + announced if announced is not None else size
        with reporter.transfer(dest.name, total, start) as advance:
            try:
                for block in bounds.blocks(resp):
                    out.write(block)
                    received += len(block)
                    advance(len(block))
            except (TimeoutError, OSError, http.client.HTTPException) as exc:
                raise _fail(url, f"{dest.name}: the transfer stopped after "
                            f"{human_bytes(start + received)}: {exc}") from None  # fmt: skip
    if announced is not None and received != announced:  # the connection closed early
        raise _fail(url, f"{dest.name}: the transfer stopped after {human_bytes(start + received)}"
                    f" of {human_bytes(start + announced)}")  # fmt: skip
    got = sha256_file(part)
    if got != sha256:
        part.unlink()
        raise ToolchainError(
            f"{dest.name} from {redact(url)[:200]} has sha256 {got}, the lock pins {sha256}"
            + (f" (resumed at byte {start}: the partial file was removed)" if start else ""),
            where=f"toolchain lock ({dest.name})",
            next="run it again (it downloads from the start); if it persists, the mirror "
            "serves another file: check the mirror, or re-pin LOCKS in "
            "pinwheel/compile/toolchain/pins.py after reviewing the new file",
        )
    os.replace(part, dest)
    return Fetched(dest, received, start)


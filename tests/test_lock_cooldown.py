"""`pinwheel lock --tools --cooldown DAYS` (locks.yml passes 7): uv takes no file uploaded in
the last DAYS days (UV_EXCLUDE_NEWER, which pinwheel sets and no caller's UV_ setting
reaches). A real uv against a PEP 691 JSON index on loopback that says when each file was
uploaded: a week-old release is taken, yesterday's waits."""

from __future__ import annotations

import datetime
import functools
import hashlib
import http.server
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localhttp import LocalHTTP
from pinwheel.compile.toollocks import (
    LockError,
    cooldown_cutoff,
    run_uv,
    uv_environment,
)
from test_torchlocks import _uv, _wheel

NOW = datetime.datetime(2026, 12, 7, 12, 0, 0, tzinfo=datetime.UTC)


class JsonIndex(LocalHTTP):
    """``/simple/demo/`` as PEP 691 JSON with each file's ``upload-time``; ``/files/``."""

    def __init__(self, folder: Path, uploads: dict[str, datetime.datetime]) -> None:
        files = []
        for name, when in uploads.items():
            data = (folder / name).read_bytes()
            files.append({
                "filename": name, "url": f"/files/{name}",
                "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
                "upload-time": when.strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
            })  # fmt: skip
        page = json.dumps({"meta": {"api-version": "1.1"}, "name": "demo", "files": files})

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path.rstrip("/") != "/simple/demo":
                    super().do_GET()  # /files/ (HEAD too)
                    return
                body = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._serve(functools.partial(Handler, directory=str(folder.parent)))  # type: ignore[arg-type]


@pytest.fixture
def index(tmp_path: Path) -> Iterator[JsonIndex]:
    folder = tmp_path / "files"
    folder.mkdir()
    old = _wheel(folder, "demo", "1.0").name
    new = _wheel(folder, "demo", "1.1").name
    uploads = {old: NOW - datetime.timedelta(days=30), new: NOW - datetime.timedelta(days=1)}
    with JsonIndex(folder, uploads) as server:
        yield server


def _locked(index: JsonIndex, tmp_path: Path, cutoff: str | None) -> str:
    stage = tmp_path / "stage"
    stage.mkdir(exist_ok=True)
    # a caller's own exclude-newer never decides it: only the one pinwheel computes
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
               "UV_EXCLUDE_NEWER": "2000-01-01T00:00:00Z",
               "UV_CACHE_DIR": str(tmp_path / "uv-cache")}  # fmt: skip
    cmd = [_uv(), "pip", "compile", "--quiet", "--no-python-downloads", "--generate-hashes",
           "--index-url", f"{index.url}simple", "--output-file", "out.txt", "-"]  # fmt: skip
    env = uv_environment(environ, exclude_newer=cutoff)
    env["UV_CACHE_DIR"] = environ["UV_CACHE_DIR"]
    run_uv(cmd, stage, env, stdin=b"demo\n")
    return (stage / "out.txt").read_text()


def test_a_cooldown_takes_the_week_old_release_not_yesterdays(
    index: JsonIndex, tmp_path: Path
) -> None:
    assert "demo==1.1" in _locked(index, tmp_path, None)
    cutoff = cooldown_cutoff(7, NOW)
    assert cutoff == "2026-11-30T12:00:00Z"
    assert "demo==1.0" in _locked(index, tmp_path, cutoff)


def test_the_cooldown_is_days_within_a_year() -> None:
    assert cooldown_cutoff(0, NOW) is None
    assert cooldown_cutoff(366, NOW) == "2025-12-06T12:00:00Z"
    for days in (-1, 367):
        with pytest.raises(LockError, match="expected 0 to 366") as err:
            cooldown_cutoff(days, NOW)
        assert "--cooldown 7" in (err.value.next or "")


def test_the_cooldown_is_not_in_the_locks_header() -> None:
    """A lock's header names pinwheel's command only, so a weekly cutoff changes no lock."""
    env = uv_environment({"UV_EXCLUDE_NEWER": "x"}, exclude_newer="2026-11-30T12:00:00Z")
    assert env["UV_EXCLUDE_NEWER"] == "2026-11-30T12:00:00Z"
    assert env["UV_CUSTOM_COMPILE_COMMAND"] == "pinwheel lock --tools"
    assert "UV_EXCLUDE_NEWER" not in uv_environment({"UV_EXCLUDE_NEWER": "x"})

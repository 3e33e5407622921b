"""One redirect rule for every HTTP client, `cache clean` only on pinwheel's cache, and
`serve` of an image engine as the recipe runs it.

Redirects: ``httpget.redirect_problem`` is the one allowlist (same scheme, https or
http only); ``httpget`` (``--reuse-from``) and ``release.download`` (``fetch``) open
every URL through ``httpget.urlopen``, so a 30x to ``ftp://``, ``file://`` or from
https to http is refused before anything connects, and never retried.
``serve.client`` follows no redirect at all (http.client). Real parts: a real HTTP
server answering 302, a real FTP-looking listener that records whether anything
connected, the CLI's main(), stand-in container runtimes that record their argv (no
container engine runs here).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostile_server import Server, raw_headers
from pinwheel.cli import main
from pinwheel.errors import PinwheelError
from pinwheel.net import httpget
from pinwheel.source import cache as source_cache
from pinwheel.source import cachetool

pytestmark = pytest.mark.timeout(120)


class _Listener:
    """A TCP port that records whether anyone connected (what an FTP server would see)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connected = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connected = True
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


def _redirect(to: str):
    return raw_headers([("Location", to), ("Content-Length", "0")], status=302)


# case -> where the server redirects (FTP: the listener's port)
REFUSED = {
    "ftp": "ftp://127.0.0.1:{port}/SHA256SUMS",
    "file": "file:///etc/hostname",
    "data": "data:text/plain,hello",
    "https to http": None,  # only meaningful from https; covered by the unit table
    "http to https": "https://127.0.0.1:{port}/SHA256SUMS",
}


@pytest.mark.parametrize("case", [c for c in sorted(REFUSED) if REFUSED[c]])
def test_reuse_from_refuses_a_redirect_to_another_scheme_without_connecting(case, tmp_path):
    listener = _Listener()
    try:
        target = REFUSED[case].format(port=listener.port)
        with Server({"/r/SHA256SUMS": _redirect(target)}) as srv:
            with pytest.raises(PinwheelError) as err:
                httpget.get_bytes(srv.url + "/r/SHA256SUMS", what="SHA256SUMS", cap=1 << 20,
                                  deadline=30)  # fmt: skip
        assert "redirect" in err.value.what and err.value.next
        assert not listener.connected
    finally:
        listener.close()


@pytest.mark.parametrize("case", [c for c in sorted(REFUSED) if REFUSED[c]])
def test_fetch_refuses_a_redirect_to_another_scheme_at_once(case, tmp_path, capsys):
    listener = _Listener()
    hits: list[str] = []
    try:
        target = REFUSED[case].format(port=listener.port)

        def counted(h):
            hits.append(h.path)
            _redirect(target)(h)

        with Server({"/rel/SHA256SUMS": counted}) as srv:
            rc = main(["fetch", srv.url + "/rel/", "--dest", str(tmp_path / "dl")])
        err = capsys.readouterr().err
        assert rc != 0 and "redirect" in err and "next:" in err and "Traceback" not in err, err
        assert len(hits) == 1  # refused, not retried
        assert not listener.connected
    finally:
        listener.close()


def test_a_same_scheme_redirect_is_followed(tmp_path):
    body = b"x" * 10
    with Server({"/a": _redirect("/b"), "/b": raw_headers([("Content-Length", "10")], body)}) as s:
        assert httpget.get_bytes(s.url + "/a", what="a", cap=100, deadline=30) == body


# (from, to) -> refused?
RULE = {
    ("https://a/x", "https://b/y"): False,
    ("http://a/x", "http://a/y"): False,
    ("https://a/x", "http://a/x"): True,
    ("http://a/x", "https://a/x"): True,
    ("https://a/x", "ftp://a/x"): True,
    ("http://a/x", "file:///etc/passwd"): True,
    ("http://a/x", "data:,x"): True,
    ("http://a/x", "//a/y"): True,  # scheme-less: urljoin makes it absolute first in urllib
    ("http://a/x", "HTTP://a/y"): False,
}


@pytest.mark.parametrize(("old", "new"), sorted(RULE))
def test_the_one_redirect_rule(old, new):
    assert (httpget.redirect_problem(old, new) is not None) == RULE[(old, new)]


@settings(max_examples=150, deadline=None, database=None)
@given(scheme=st.text(alphabet="abcdefghijklmnopqrstuvwxyz+-.", max_size=8),
       old=st.sampled_from(["http", "https"]))  # fmt: skip
def test_fuzz_redirect_rule_allows_only_the_same_http_scheme(scheme, old):
    problem = httpget.redirect_problem(f"{old}://a/x", f"{scheme}://b/y")
    assert (problem is None) == (scheme == old)


# --------------------------------------------------------------------------- cache clean


def test_cache_clean_refuses_a_folder_without_the_marker(tmp_path, capsys):
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / "notes.txt").write_text("mine")
    rc = main(["--cache", str(home), "cache", "clean", "--yes"])
    err = capsys.readouterr().err
    assert rc == 2 and "not pinwheel's cache" in err and "next:" in err, err
    assert (home / "notes.txt").read_text() == "mine" and (home / "projects").is_dir()


@pytest.mark.parametrize(
    "marker",
    [
        b"",  # empty
        b"Signature: 8a477f597d28d172789f06886806bc55\n# made by another tool\n",
        b"created by pinwheel",  # no signature
    ],
)
def test_cache_clean_refuses_a_marker_that_is_not_pinwheels(marker, tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    (root / source_cache.TAG).write_bytes(marker)
    (root / "keep.txt").write_text("x")
    with pytest.raises(PinwheelError, match="not pinwheel's cache"):
        cachetool.clean(root, apply=True)
    assert (root / "keep.txt").exists()


def test_cache_clean_refuses_a_fifo_marker_without_hanging(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    os.mkfifo(root / source_cache.TAG)
    with pytest.raises(PinwheelError, match="not pinwheel's cache"):
        cachetool.clean(root, apply=True)


def test_cache_clean_empties_a_marked_cache_and_keeps_the_marker(tmp_path):
    root = tmp_path / "c"
    source_cache.mark(root)
    (root / "toolchains" / "x").mkdir(parents=True)
    (root / "locks").mkdir()
    outcome = cachetool.clean(root, apply=True)
    assert outcome.applied and sorted(p.name for p in root.iterdir()) == ["CACHEDIR.TAG", "locks"]
    assert source_cache.is_marked(root)


# --------------------------------------------------------------------------- serve on an image

ROOT = Path(__file__).resolve().parent.parent
SM120 = ROOT / "recipes" / "sm120-tp2" / "manifest.toml"


def test_serve_of_an_image_engine_needs_no_host_vllm_and_publishes_the_serve_port(tmp_path):
    """The host's Python has no vLLM (this venv's); the stand-in docker records argv."""
    from pinwheel.manifest import model as manifest

    port = manifest.load(SM120).serve.port
    assert port != 8000  # the case means something only when [serve] port is not vLLM's
    bindir = tmp_path / "bin"
    bindir.mkdir()
    prog = bindir / "docker"
    prog.write_text(f"#!/bin/sh\nexec {sys.executable} -c "
                    "'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")  # fmt: skip
    prog.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "CUDA_VISIBLE_DEVICES")}
    env |= {"PATH": f"{bindir}{os.pathsep}{env['PATH']}", "PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    model = tmp_path / "model"
    model.mkdir()
    out = subprocess.run([sys.executable, "-m", "pinwheel", "--manifest", str(SM120), "serve",
                          "--model", str(model), "--host", "127.0.0.1"],
                         env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)
    assert argv[0] == "run" and argv[argv.index("-p") + 1].startswith(f"127.0.0.1:{port}:")

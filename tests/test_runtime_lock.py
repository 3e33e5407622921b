"""`pinwheel runtime-lock`: pylock.toml from the venv qualification ran in.

Real venvs (``python -m venv``), real pip installing locally built wheels from a local HTTP
server and from files; the lock is then shipped by ``pinwheel release --lock`` and installed by
``pinwheel install``. A hash is written only where it is known; the rest is reported. The venv
is a tree someone else filled: hostile dist-info folders (links, chains, FIFOs, control
characters, huge numbers, non-ASCII, nesting bombs) are refused without being followed.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import tomllib
import urllib.parse
from pathlib import Path

import pytest

from localhttp import LocalHTTP
from pinwheel.checksums import sha256_file
from pinwheel.cli import main
from pinwheel.errors import EXIT_VERIFY
from pinwheel.release import envlock
from pinwheel.validate import version_problem
from releasekit import ReleaseServer, make_wheel, write_manifest, write_provenance

pytestmark = pytest.mark.release


def _venv(path: Path, *, with_pip: bool = False) -> Path:
    cmd = [sys.executable, "-m", "venv", str(path)]
    subprocess.run(cmd if with_pip else [*cmd, "--without-pip"], check=True)
    return path


def _pip(venv: Path, *args: str) -> None:
    """This interpreter's pip installing into ``venv`` (no index, ever)."""
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"),
                    "install", "-q", "--no-index", "--disable-pip-version-check", *args],
                   check=True)  # fmt: skip


def _lock(venv: Path, out: Path, *extra: str) -> int:
    return main(["runtime-lock", str(venv), "--out", str(out), *extra])


@pytest.fixture
def built(tmp_path: Path):
    """A release of pwa (requires pwb==2.0) and pwb 2.0 served on a live local server."""
    served = tmp_path / "served"
    pwb = make_wheel(served, "pwb", "2.0", payload=2_000, seed=2)
    build = tmp_path / "wheels"
    pwa = make_wheel(build, "pwa", "1.0", seed=1, requires_dist=("pwb==2.0",))
    write_provenance(build, {pwa.name: sha256_file(pwa)})
    manifest = write_manifest(tmp_path)
    assert main(["--manifest", str(manifest), "release", "--no-sign"]) == 0
    with ReleaseServer(served) as srv:
        yield tmp_path / "release", srv.url, pwb, manifest


def test_a_real_venv_gives_the_lock_a_release_ships_and_install_installs(built, tmp_path, capsys):
    release, url, pwb, manifest = built
    venv = _venv(tmp_path / "qual", with_pip=True)  # what `pinwheel install` makes: with pip
    _pip(venv, url + pwb.name, str(release / "pwa-1.0-py3-none-any.whl"))
    out = tmp_path / "pylock.toml"

    # pip and setuptools came with the venv: no hash is known for them, so nothing is written.
    assert _lock(venv, out, "--release", str(release)) == EXIT_VERIFY
    err = " ".join(capsys.readouterr().err.split())
    assert "pip " in err and "no recorded hash" in err and "was not written" in err
    assert not out.exists()

    assert _lock(venv, out, "--release", str(release), "--leave-out", "pip",
                 "--leave-out", "setuptools") == 0  # fmt: skip
    doc = tomllib.loads(out.read_text())
    (pkg,) = doc["packages"]
    assert pkg["name"] == "pwb" and pkg["version"] == "2.0"
    assert pkg["wheels"] == [{"name": pwb.name, "url": url + pwb.name,
                              "hashes": {"sha256": sha256_file(pwb)}}]  # fmt: skip
    ours = doc["tool"]["pinwheel"]
    assert ours["release-wheels"] == [{
        "name": "pwa", "version": "1.0", "wheel": "pwa-1.0-py3-none-any.whl",
        "sha256": sha256_file(release / "pwa-1.0-py3-none-any.whl")}]  # fmt: skip
    assert {d["name"] for d in ours["left-out"]} == {"pip", "setuptools"}
    assert ours["hash-from"] == {"pwb": "direct_url.json"}

    # The release carries it; install takes pwb from it, hash-checked.
    shipped = tmp_path / "shipped"
    assert main(["--manifest", str(manifest), "release", "--no-sign", "--lock", str(out),
                 "--out", str(shipped)]) == 0  # fmt: skip
    assert "pylock.toml" in (shipped / "SHA256SUMS").read_text()
    target = tmp_path / "target"
    capsys.readouterr()
    assert main(["--json", "install", str(shipped), "--venv", str(target), "--installer", "pip",
                 "--allow-unsigned"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["lock"] == "pylock.toml"
    got = subprocess.run([str(target / "bin/python"), "-c", "import pwa, pwb; print(pwb.VALUE)"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert got.strip() == "pwb 2.0"


def test_release_refuses_a_runtime_lock_made_with_other_wheels(built, tmp_path, capsys):
    release, url, pwb, manifest = built
    venv = _venv(tmp_path / "qual")
    _pip(venv, url + pwb.name, str(release / "pwa-1.0-py3-none-any.whl"))
    out = tmp_path / "pylock.toml"
    assert _lock(venv, out, "--release", str(release)) == 0
    # A rebuilt pwa (other bytes, same name) is not what qualification ran.
    (tmp_path / "wheels" / "pwa-1.0-py3-none-any.whl").unlink()
    again = make_wheel(tmp_path / "wheels", "pwa", "1.0", 50, 7, requires_dist=("pwb==2.0",))
    write_provenance(tmp_path / "wheels", {again.name: sha256_file(again)})
    capsys.readouterr()
    rc = main(["--manifest", str(manifest), "release", "--no-sign", "--lock", str(out),
               "--out", str(tmp_path / "rebuilt")])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert rc == EXIT_VERIFY and "other wheels than this release's" in err
    assert "next: install this release" in err and not (tmp_path / "rebuilt").exists()


def test_a_local_file_and_an_index_install_are_reported_never_pinned(built, tmp_path, capsys):
    _release, _url, pwb, _manifest = built
    venv = _venv(tmp_path / "qual")
    _pip(venv, str(pwb))  # direct_url.json: file://, with the hash
    out = tmp_path / "pylock.toml"
    assert _lock(venv, out) == EXIT_VERIFY
    err = " ".join(capsys.readouterr().err.split())
    assert f"sha256 {sha256_file(pwb)}): a local file no one else can fetch" in err
    assert not out.exists()

    other = _venv(tmp_path / "qual2")
    _pip(other, "--find-links", str(pwb.parent), "pwb==2.0")  # as from an index: no hash recorded
    assert _lock(other, out) == EXIT_VERIFY
    assert "pwb 2.0: installed by pip with no recorded hash" in " ".join(
        capsys.readouterr().err.split()
    )


def test_a_lock_the_venv_was_installed_from_supplies_the_hash(built, tmp_path, capsys):
    _release, url, pwb, _manifest = built
    venv = _venv(tmp_path / "qual")
    _pip(venv, "--find-links", str(pwb.parent), "pwb==2.0")
    given = tmp_path / "given.toml"

    def lock_text(sha: str) -> str:
        return ('lock-version = "1.0"\ncreated-by = "t"\n\n[[packages]]\nname = "pwb"\n'
                f'version = "2.0"\n\n[[packages.wheels]]\nname = "{pwb.name}"\n'
                f'url = "{url}{pwb.name}"\nhashes = {{sha256 = "{sha}"}}\n')  # fmt: skip

    given.write_text(lock_text(sha256_file(pwb)))
    out = tmp_path / "pylock.toml"
    assert _lock(venv, out, "--lock", str(given)) == 0
    doc = tomllib.loads(out.read_text())
    assert doc["packages"][0]["wheels"][0]["hashes"]["sha256"] == sha256_file(pwb)
    assert doc["tool"]["pinwheel"]["hash-from"] == {"pwb": "lock"}

    # Where direct_url.json recorded the hash, a lock that says another is refused for it.
    pinned = _venv(tmp_path / "qual3")
    _pip(pinned, url + pwb.name)
    given.write_text(lock_text("0" * 64))
    out.unlink()
    assert _lock(pinned, out, "--lock", str(given)) == EXIT_VERIFY
    assert "has no wheel of the sha256 direct_url.json records" in " ".join(
        capsys.readouterr().err.split()
    )
    assert not out.exists()


def test_a_release_wheel_installed_from_other_bytes_is_not_the_release_s(built, tmp_path, capsys):
    release, url, pwb, _manifest = built
    venv = _venv(tmp_path / "qual")
    fake = make_wheel(tmp_path / "fake", "pwa", "1.0", seed=5, payload=100)
    _pip(venv, url + pwb.name, str(fake))
    assert _lock(venv, tmp_path / "l.toml", "--release", str(release)) == EXIT_VERIFY
    err = " ".join(capsys.readouterr().err.split())
    assert "not installed from the release's pwa-1.0-py3-none-any.whl" in err


def test_leave_out_names_only_an_unpinned_package(built, tmp_path, capsys):
    _release, url, pwb, _manifest = built
    venv = _venv(tmp_path / "qual")
    _pip(venv, url + pwb.name)
    assert _lock(venv, tmp_path / "l.toml", "--leave-out", "pwb") == EXIT_VERIFY
    assert "--leave-out names what is not an unpinned package" in capsys.readouterr().err


def test_a_venv_that_sees_its_base_packages_is_refused(tmp_path, capsys):
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True)  # fmt: skip
    assert _lock(venv, tmp_path / "l.toml") == EXIT_VERIFY
    assert "include-system-site-packages = true" in capsys.readouterr().err


# --------------------------------------------------------------------------- hostile venvs

SP = "lib/python3.11/site-packages"


def _fake_venv(root: Path) -> Path:
    """A venv tree (no interpreter needed: runtime-lock never runs the venv's Python)."""
    (root / SP).mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n"
                                     "version = 3.11.7\n")  # fmt: skip
    return root


def _dist(venv: Path, name: str = "pwx", version: str = "1.0", *, meta: bytes | None = None,
          record: bytes | None = None, direct: bytes | None = None) -> Path:  # fmt: skip
    d = venv / SP / f"{name}-{version}.dist-info"
    d.mkdir()
    (d / "METADATA").write_bytes(meta if meta is not None
                                 else f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 .encode())  # fmt: skip
    (d / "WHEEL").write_text("Wheel-Version: 1.0\nTag: py3-none-any\n")
    (d / "RECORD").write_bytes(record if record is not None else f"{name}/x.py,,\n".encode())
    if direct is not None:
        (d / "direct_url.json").write_bytes(direct)
    return d


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _link_chain_out(d: Path, outside: Path) -> None:
    """METADATA -> a -> b -> a file outside the venv: a chain, each link harmless alone."""
    (d / "METADATA").unlink()
    (d / "b").symlink_to(outside)
    (d / "a").symlink_to("b")
    (d / "METADATA").symlink_to("a")


ESC = "\x1b]0;pwned\x07\x1b[2J"


@pytest.mark.parametrize(
    ("make", "gist"),
    [
        (lambda v, o: _link_chain_out(_dist(v), o), "is a symlink (never followed here)"),
        (lambda v, o: _fifo(_dist(v) / "RECORD"), "is a FIFO, not a regular file"),
        (lambda v, o: (v / SP / "pwy-1.0.dist-info").symlink_to(o.parent, target_is_directory=True),
         "a link or not a folder"),
        (lambda v, o: _dist(v, meta=f"Metadata-Version: 2.1\nName: pw{ESC}x\nVersion: 1\n".encode()),
         "is not a package name"),
        (lambda v, o: _dist(v, meta="Metadata-Version: 2.1\nName: pŵx\nVersion: 1\n".encode()),
         "is not a package name"),
        (lambda v, o: _dist(v, meta=b"Metadata-Version: 2.1\nName: pwx\nVersion: 1" + b"0" * 5000
                           + b"\n"), "at most 128 characters"),
        (lambda v, o: _dist(v, record=b"pwx/x.py,sha256=AAAA,1\n"), "not a sha256 hash"),
        (lambda v, o: _dist(v, record=b"pwx/x.py,," + b"9" * 5000 + b"\n"), "is not a byte count"),
        (lambda v, o: _dist(v, record=f"pwx/{ESC}.py,,\n".encode()), "malformed row"),
        (lambda v, o: _dist(v, direct=b"[" * 5000 + b"]" * 5000), "nested"),
        (lambda v, o: _dist(v, direct=b'{"url": "https://e.invalid/\xff"}'), "not UTF-8"),
        (lambda v, o: _dist(v, direct=json.dumps({"url": f"https://e.invalid/{ESC}",
                                                  "archive_info": {}}).encode()),
         "not a plain URL"),
        (lambda v, o: _dist(v, direct=json.dumps({"url": "https://e.invalid/pwx-1.0-py3-none-any"
                                                  ".whl", "archive_info": {"hashes": {
                                                      "sha256": "1" * 70}}}).encode()),
         "not a sha256"),
        (lambda v, o: os.truncate(_dist(v) / "METADATA", 1 << 30), "more than the"),
    ],
    ids=["link-chain", "fifo", "dist-info-link", "control-chars", "non-ascii", "huge-version",
         "bad-hash", "huge-size", "control-in-record", "nesting-bomb", "not-utf8", "url-escapes",
         "long-sha", "1-gib-sparse"],
)  # fmt: skip
def test_a_hostile_dist_info_is_reported_never_followed_and_nothing_is_written(
    tmp_path, capsys, make, gist
):
    venv = _fake_venv(tmp_path / "v")
    outside = tmp_path / "outside" / "secret"
    outside.parent.mkdir()
    _fifo(outside)  # were it ever opened for reading without O_NONBLOCK, the test would hang
    make(venv, outside)
    out = tmp_path / "pylock.toml"
    assert _lock(venv, out) == EXIT_VERIFY
    err = capsys.readouterr().err
    assert gist in " ".join(err.split()), err
    assert "\x1b" not in err and "\x07" not in err  # shown, not obeyed
    assert not out.exists()


def test_a_site_packages_reached_through_a_link_is_refused(tmp_path, capsys):
    venv = _fake_venv(tmp_path / "v")
    real = tmp_path / "elsewhere"
    shutil.move(str(venv / "lib"), str(real))
    (venv / "lib").symlink_to(real)
    assert _lock(venv, tmp_path / "l.toml") == EXIT_VERIFY
    assert "no lib/ folder (a symlink is not followed)" in capsys.readouterr().err


def test_a_pyvenv_cfg_that_is_a_fifo_is_refused_without_waiting(tmp_path, capsys):
    venv = _fake_venv(tmp_path / "v")
    _fifo(venv / "pyvenv.cfg")
    assert _lock(venv, tmp_path / "l.toml") == EXIT_VERIFY
    assert "is a FIFO" in capsys.readouterr().err


def test_version_problem_bounds_a_huge_number_instead_of_raising():
    assert version_problem("1" + "0" * 5000) is not None  # was ValueError from int()
    assert version_problem("2.11.0+pw.sm120tp2.cu130.torch2.11") is None


def test_render_refuses_a_value_that_is_not_plain_ascii():
    env = envlock.EnvLock(Path("v"), None, (envlock.Pinned("pwb", "2.0\n[x]", (), "lock"),), (),
                          (), ())  # fmt: skip
    with pytest.raises(ValueError, match="not plain ASCII"):
        envlock.render(env)


def test_qualify_names_the_venv_its_engine_python_belongs_to(tmp_path):
    from pinwheel.cli.serve_cmds import _venv_of

    venv = _fake_venv(tmp_path / "v")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)  # a venv's python links to its base
    assert _venv_of(str(venv / "bin" / "python")) == venv.absolute()
    assert _venv_of(sys.executable if not (Path(sys.prefix) / "pyvenv.cfg").is_file()
                    else "/usr/bin/python3") is None  # fmt: skip


def test_install_resolves_a_lock_first_so_runtime_lock_pins_every_package(
    tmp_path, capsys, monkeypatch
):
    """Issue 47 item 5: a dependency installed from an index recorded no hash, so
    runtime-lock refused the qualification venv (and the relock job always skipped).
    install now resolves the dependencies into a hashed PEP 751 lock first (uv pip
    compile), installs exactly that, and keeps it in the venv: runtime-lock pins all."""
    from pinwheel.release.install import RESOLVED
    from test_static_index import IndexServer

    upstream = tmp_path / "up"
    dep = make_wheel(upstream / "wheels", "pwdep", "5.0", payload=2_000, seed=5)
    write_provenance(upstream / "wheels", {dep.name: sha256_file(dep)})
    up_manifest = write_manifest(upstream)
    assert main(["--manifest", str(up_manifest), "release", "--no-sign"]) == 0
    assert main(["--manifest", str(up_manifest), "index", str(upstream / "release"),
                 "--out", str(upstream / "index")]) == 0  # fmt: skip
    build = tmp_path / "wheels"
    made = make_wheel(build, "pweng", "1.0", payload=3_000, seed=6, requires_dist=("pwdep>=5",))
    write_provenance(build, {made.name: sha256_file(made)})
    manifest = write_manifest(tmp_path)
    assert main(["--manifest", str(manifest), "release", "--no-sign"]) == 0
    venv = tmp_path / "qualify-venv"
    monkeypatch.setenv("UV_NO_CONFIG", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    with IndexServer(upstream / "index") as srv:
        monkeypatch.setenv("UV_INDEX_URL", f"{srv.url}all/simple/")
        rc = main(["--manifest", str(manifest), "install", str(tmp_path / "release"),
                   "--venv", str(venv), "--installer", "uv", "--allow-unsigned"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    resolved = (venv / RESOLVED).read_text()
    assert sha256_file(dep) in resolved and f"{srv.url}files/{dep.name}" in resolved
    capsys.readouterr()
    out = tmp_path / "pylock.toml"
    rc = main(["--json", "runtime-lock", str(venv), "--release", str(tmp_path / "release"),
               "--out", str(out)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in doc["pinned"]} == {"pwdep"}
    assert [r["wheel"] for r in doc["release_wheels"]] == [made.name]
    assert sha256_file(dep) in out.read_text()


class ChangingIndex(LocalHTTP):
    """A plain directory index (``python -m http.server``: no hashes on its pages, so the
    resolver downloads each file to hash it) whose files can be swapped for other bytes
    after their first download: ``changed[path] = bytes`` serves those from the second GET
    of ``path`` on, what a server that is altered between the lock and the install does."""

    def __init__(self, root: Path):
        self.changed: dict[str, bytes] = {}
        self.gets: dict[str, int] = {}
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
                super().__init__(*args, directory=str(root), **kwargs)

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                path = urllib.parse.unquote(self.path.split("?")[0])
                server.gets[path] = server.gets.get(path, 0) + 1
                body = server.changed.get(path)
                if body is None or server.gets[path] == 1:
                    super().do_GET()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._serve(Handler)


def _pip_only_from(monkeypatch: pytest.MonkeyPatch, index: str) -> None:
    """pip sees no user or site configuration, no cache and no index but ``index``."""
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_INDEX_URL", index)


@pytest.fixture
def engine(tmp_path: Path):
    """A release of pweng (requires pwdep>=5, pwlib) and an index serving pwdep 5.0 (which
    requires pwlib) and pwlib 1.0 and 2.0."""
    served = tmp_path / "served" / "simple"
    dep = make_wheel(served / "pwdep", "pwdep", "5.0", payload=2_000, seed=5,
                     requires_dist=("pwlib>=1",))  # fmt: skip
    make_wheel(served / "pwlib", "pwlib", "1.0", payload=500, seed=6)
    lib = make_wheel(served / "pwlib", "pwlib", "2.0", payload=500, seed=7)
    build = tmp_path / "wheels"
    made = make_wheel(build, "pweng", "1.0", payload=3_000, seed=8,
                      requires_dist=("pwdep>=5", "pwlib"))  # fmt: skip
    write_provenance(build, {made.name: sha256_file(made)})
    manifest = write_manifest(tmp_path)
    assert main(["--manifest", str(manifest), "release", "--no-sign"]) == 0
    with ChangingIndex(tmp_path / "served") as srv:
        yield tmp_path / "release", srv, dep, lib, made


def test_install_with_pip_resolves_the_same_lock_first_and_the_venv_is_that_lock(
    engine, tmp_path, capsys, monkeypatch
):
    """Issue 47 item 5 with pip: `pinwheel install --installer pip` resolves the release
    wheels' dependencies into the hashed lock (pip lock) before anything is installed,
    installs exactly that lock, then the release wheel by hash; the venv holds the lock's
    packages and the release's wheel and nothing else, so runtime-lock pins it whole."""
    from pinwheel.release import envlock, pylock
    from pinwheel.release.install import RESOLVED

    release, srv, dep, lib, made = engine
    _pip_only_from(monkeypatch, f"{srv.url}simple/")
    venv = tmp_path / "qualify-venv"
    rc = main(["--json", "install", str(release), "--venv", str(venv), "--installer", "pip",
               "--allow-unsigned"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["lock"] == RESOLVED
    lock = pylock.check(venv / RESOLVED)
    assert dict(lock.packages) == {"pwdep": "5.0", "pwlib": "2.0"}
    assert {w.sha256 for ws in lock.wheels.values() for w in ws} == {
        sha256_file(dep), sha256_file(lib)}  # fmt: skip
    dists, bad, _python = envlock.installed(venv)
    assert not bad
    assert {(d.name, d.version) for d in dists} == {*lock.packages, ("pweng", "1.0")}
    out = tmp_path / "pylock.toml"
    rc = main(["--json", "runtime-lock", str(venv), "--release", str(release),
               "--out", str(out)])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in doc["pinned"]} == {"pwdep", "pwlib"} and not doc["left_out"]
    assert [r["wheel"] for r in doc["release_wheels"]] == [made.name]


def test_install_with_pip_refuses_a_file_changed_on_the_index_after_the_lock(
    engine, tmp_path, capsys, monkeypatch
):
    """The lock is what installs: pwlib's file changes on the index between `pip lock`
    (which hashed what it downloaded) and the install; pip refuses the other bytes and
    nothing of the lock or the release is installed."""
    release, srv, _dep, lib, _made = engine
    _pip_only_from(monkeypatch, f"{srv.url}simple/")
    other = make_wheel(tmp_path / "other", "pwlib", "2.0", payload=500, seed=99)
    srv.changed[f"/simple/pwlib/{lib.name}"] = other.read_bytes()
    venv = tmp_path / "qualify-venv"
    rc = main(["install", str(release), "--venv", str(venv), "--installer", "pip",
               "--allow-unsigned"])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert rc != 0 and "DO NOT MATCH THE HASHES" in err, err
    assert sha256_file(lib) in err and sha256_file(other) in err
    assert srv.gets[f"/simple/pwlib/{lib.name}"] == 2  # hashed once by the lock, refused once
    from pinwheel.release import envlock

    assert [d.name for d in envlock.installed(venv)[0]] == []

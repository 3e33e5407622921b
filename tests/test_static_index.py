"""`pinwheel index`: a static PEP 503/691 index per variant, installed from with real pip and
real uv through a real local HTTP server, hashes required, nothing from any other index.

The server is the standard library's: a directory request returns ``index.html``, or
``index.json`` when the client's Accept header asks for PEP 691 JSON first (the rule
docs/release.md gives for nginx); ``json=False`` serves HTML only, as a plain static host.
"""

from __future__ import annotations

import hashlib
import html.parser
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

from localhttp import LocalHTTP
from pinwheel.checksums import sha256_file
from pinwheel.cli import main
from pinwheel.errors import EXIT_VERIFY
from pinwheel.release.pyindex import JSON_TYPE, variant_of
from releasekit import make_key, make_wheel, write_manifest, write_provenance

pytestmark = pytest.mark.release

V100 = "v100.cu124.torch2.10"
GB10 = "gb10.cu130.torch2.10"
A_V100 = f"pwa-1.0+pw.{V100}-py3-none-any.whl"
A_GB10 = f"pwa-1.0+pw.{GB10}-py3-none-any.whl"
B = "pwb-2.0-py3-none-any.whl"


class IndexServer(LocalHTTP):
    """Serve ``root``; log (path, content type) of every answer."""

    def __init__(self, root: Path, json_pages: bool = True):
        self.root, self.json_pages = root, json_pages
        self.log: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                server._answer(self)

        self._serve(Handler)

    def _answer(self, h: http.server.BaseHTTPRequestHandler) -> None:
        path = (self.root / urllib.parse.unquote(h.path.split("?")[0]).lstrip("/")).resolve()
        if not path.is_relative_to(self.root.resolve()):
            h.send_error(404)
            return
        ctype = "application/octet-stream"
        if path.is_dir():
            accept = h.headers.get("Accept", "")
            wants_json = self.json_pages and accept.split(",")[0].strip().startswith(JSON_TYPE)
            path = path / ("index.json" if wants_json else "index.html")
            ctype = JSON_TYPE if wants_json else "text/html"
        if not path.is_file():
            h.send_error(404)
            return
        body = path.read_bytes()
        with self.lock:
            self.log.append((h.path, ctype))
        h.send_response(200)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(manifest, release dir, allowed_signers): two variants of pwa, a shared pwb."""
    root = tmp_path_factory.mktemp("idx")
    build = root / "wheels"
    for label, seed in ((V100, 1), (GB10, 2)):
        make_wheel(build, "pwa", f"1.0+pw.{label}", payload=20_000, seed=seed,
                   requires_dist=("pwb>=2",), requires_python=">=3.8, <4")  # fmt: skip
    make_wheel(build, "pwb", "2.0", payload=5_000, seed=3, requires_python=">=3.8")
    names = sorted(p.name for p in build.glob("*.whl"))
    write_provenance(build, {n: sha256_file(build / n) for n in names})
    key, signers = make_key(root / "keys")
    manifest = write_manifest(root, release='[release]\nallowed_signers = "keys/allowed_signers"\n')
    assert main(["--manifest", str(manifest), "release", "--key", str(key)]) == 0
    return manifest, root / "release", signers


def _index(release: tuple[Path, Path, Path], out: Path) -> Path:
    manifest, rel, _ = release
    assert main(["--manifest", str(manifest), "index", str(rel), "--out", str(out)]) == 0
    return out


def _env(tmp: Path) -> dict[str, str]:
    """No user config, no cache, no interpreter downloads: only the index given on the line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1", UV_NO_CONFIG="1",
               UV_PYTHON_DOWNLOADS="never", UV_CACHE_DIR=str(tmp / "uv-cache"))  # fmt: skip
    return env


def _uv() -> str:
    exe = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")
    if exe is None:
        pytest.skip("uv is not installed (pip install --group test (locks/tests.txt))")
    return exe


def _venv(tmp: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python"


def _install(installer: str, python: Path, url: str, req: Path, tmp: Path):  # type: ignore[no-untyped-def]
    if installer == "pip":
        cmd = [sys.executable, "-m", "pip", "--python", str(python), "install",
               "--disable-pip-version-check", "--no-cache-dir"]  # fmt: skip
    else:
        cmd = [_uv(), "pip", "install", "--python", str(python), "--no-cache"]
    cmd += ["--index-url", url, "--require-hashes", "-r", str(req)]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(tmp), timeout=300)


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links.append(dict(attrs))


def test_layout_per_variant_hashes_metadata_and_requires_python(
    release: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    out = _index(release, tmp_path / "index")
    rel = release[1]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [GB10, V100, "files", "index.html", ".pinwheel-index"])  # fmt: skip
    page = (out / V100 / "simple" / "pwa" / "index.html").read_text()
    parser = _Links()
    parser.feed(page)
    (link,) = parser.links  # the v100 page holds the v100 build only
    sha = sha256_file(rel / A_V100)
    assert link["href"] == f"../../../files/{A_V100.replace('+', '%2B')}#sha256={sha}"
    assert link["data-requires-python"] == "<4,>=3.8"  # packaging's spelling, unescaped
    assert "&lt;4,&gt;=3.8" in page
    meta = (out / "files" / f"{A_V100}.metadata").read_bytes()
    assert link["data-core-metadata"] == link["data-dist-info-metadata"]
    assert link["data-core-metadata"] == "sha256=" + hashlib.sha256(meta).hexdigest()
    assert b"Requires-Dist: pwb>=2" in meta
    doc = json.loads((out / GB10 / "simple" / "pwa" / "index.json").read_text())
    assert doc["meta"]["api-version"] == "1.1" and doc["versions"] == [f"1.0+pw.{GB10}"]
    (entry,) = doc["files"]
    assert entry["hashes"] == {"sha256": sha256_file(rel / A_GB10)}
    assert entry["size"] == (rel / A_GB10).stat().st_size
    root = json.loads((out / GB10 / "simple" / "index.json").read_text())
    assert [p["name"] for p in root["projects"]] == ["pwa", "pwb"]  # pwb: in every variant
    # the same release gives the same bytes
    again = _index(release, tmp_path / "again")
    for p in out.rglob("*"):
        if p.is_file():
            assert p.read_bytes() == (again / p.relative_to(out)).read_bytes(), p


def test_variant_of_reads_the_local_label() -> None:
    assert variant_of(A_V100) == V100
    assert variant_of(B) is None
    assert variant_of("pwa-1.0+glm53card-py3-none-any.whl") is None  # not pinwheel's label


@pytest.mark.parametrize(("installer", "json_pages"),
                         [("pip", True), ("pip", False), ("uv", True), ("uv", False)])  # fmt: skip
def test_install_from_the_index_with_hashes(
    release: tuple[Path, Path, Path], tmp_path: Path, installer: str, json_pages: bool
) -> None:
    out = _index(release, tmp_path / "index")
    rel = release[1]
    python = _venv(tmp_path)
    req = tmp_path / "req.txt"
    req.write_text(
        f"pwa==1.0+pw.{V100} --hash=sha256:{sha256_file(rel / A_V100)}\n"
        f"pwb==2.0 --hash=sha256:{sha256_file(rel / B)}\n"
    )
    with IndexServer(out, json_pages) as server:
        done = _install(installer, python, f"{server.url}{V100}/simple/", req, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        served = list(server.log)
    got = subprocess.run([str(python), "-c", "import pwa, pwb; print(pwa.VALUE, pwb.VALUE)"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert got.strip() == f"pwa 1.0+pw.{V100} pwb 2.0"
    pages = {ctype for path, ctype in served if path.endswith("/simple/pwa/")}
    assert pages == ({JSON_TYPE} if json_pages else {"text/html"})
    assert not any(GB10 in path for path, _ in served)  # the other variant is never touched


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_wheel_altered_on_the_server_is_refused(
    release: tuple[Path, Path, Path], tmp_path: Path, installer: str
) -> None:
    out = _index(release, tmp_path / "index")
    rel = release[1]
    target = out / "files" / B
    target.unlink()  # a hard link to the release: replace, never write through
    # a valid wheel of the same name and version with other bytes: only the hash tells
    other = make_wheel(tmp_path / "other", "pwb", "2.0", payload=5_000, seed=99,
                       requires_python=">=3.8")  # fmt: skip
    data = other.read_bytes()
    target.write_bytes(data)
    python = _venv(tmp_path)
    req = tmp_path / "req.txt"
    req.write_text(
        f"pwa==1.0+pw.{V100} --hash=sha256:{sha256_file(rel / A_V100)}\n"
        f"pwb==2.0 --hash=sha256:{sha256_file(rel / B)}\n"
    )
    with IndexServer(out) as server:
        done = _install(installer, python, f"{server.url}{V100}/simple/", req, tmp_path)
    assert done.returncode != 0
    assert "hash" in (done.stderr + done.stdout).lower()
    assert sha256_file(rel / B) != hashlib.sha256(data).hexdigest()


def test_index_refuses_a_tampered_release_and_writes_nothing(
    release: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    manifest, rel, _ = release
    copy = tmp_path / "rel"
    shutil.copytree(rel, copy)
    data = bytearray((copy / B).read_bytes())
    data[-30] ^= 1
    (copy / B).write_bytes(bytes(data))
    rc = main(["--manifest", str(manifest), "index", str(copy), "--out", str(tmp_path / "o")])
    assert rc == EXIT_VERIFY
    assert not (tmp_path / "o").exists()


def test_index_refuses_a_wheel_whose_metadata_disagrees_with_its_name(
    release: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A relabel that renamed the file and left METADATA alone: signed, but not indexable."""
    from pinwheel.checksums import write_sums

    manifest = write_manifest(tmp_path)  # no allowed_signers: this set is unsigned
    bad = tmp_path / "bad"
    bad.mkdir()
    made = make_wheel(tmp_path / "w", "pwc", "1.0", seed=4)
    (bad / "pwc-1.0+pw.v100-py3-none-any.whl").write_bytes(made.read_bytes())
    write_sums(bad, ["pwc-1.0+pw.v100-py3-none-any.whl"])
    rc = main(["--manifest", str(manifest), "index", str(bad), "--out", str(tmp_path / "o")])
    assert rc == EXIT_VERIFY
    assert "METADATA Version '1.0'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- issue 47 item 6


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_the_hashed_requirements_beside_the_index_install_in_one_line(
    release: tuple[Path, Path, Path], tmp_path: Path, installer: str
) -> None:
    """The user writes no hash: the requirements file pinwheel wrote, read over HTTP."""
    out = _index(release, tmp_path / "index")
    rel = release[1]
    text = (out / V100 / "requirements.txt").read_text()
    assert f"pwa==1.0+pw.{V100} --hash=sha256:{sha256_file(rel / A_V100)}" in text
    assert f"pwb==2.0 --hash=sha256:{sha256_file(rel / B)}" in text
    assert A_GB10 not in text and sha256_file(rel / A_GB10) not in text
    python = _venv(tmp_path)
    with IndexServer(out) as server:
        base = f"{server.url}{V100}/"
        req = tmp_path / "req-url"
        cmd = ([sys.executable, "-m", "pip", "--python", str(python), "install",
                "--disable-pip-version-check", "--no-cache-dir"] if installer == "pip"
               else [_uv(), "pip", "install", "--python", str(python), "--no-cache"])  # fmt: skip
        if installer == "uv":  # uv reads -r from a file: downloaded as a user would
            req.write_bytes((out / V100 / "requirements.txt").read_bytes())
            source = str(req)
        else:
            source = base + "requirements.txt"
        done = subprocess.run([*cmd, "--require-hashes", "-r", source, "--index-url",
                               base + "simple/"], capture_output=True, text=True,
                              env=_env(tmp_path), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = subprocess.run([str(python), "-c", "import pwa, pwb; print(pwa.VALUE, pwb.VALUE)"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert got.strip() == f"pwa 1.0+pw.{V100} pwb 2.0"


class StaticFiles(LocalHTTP):
    """``python -m http.server`` in a thread (GET and HEAD): an upstream package host."""

    def __init__(self, root: Path):
        class Quiet(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
                super().__init__(*args, directory=str(root), **kwargs)

            def log_message(self, *args: object) -> None:
                pass

        self._serve(Quiet)


def _dep_lock(tmp: Path, dep: Path, url: str) -> Path:
    """A PEP 751 lock (written by packaging.pylock) pinning ``dep`` at ``url`` by sha256."""
    from packaging.pylock import Package, PackageWheel, Pylock
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    from pinwheel.release import pylock

    lock = Pylock(lock_version=Version("1.0"), created_by="test", packages=[
        Package(name=canonicalize_name("pwdep"), version=Version("5.0"), wheels=[
            PackageWheel(name=dep.name, url=url + dep.name,
                         hashes={"sha256": sha256_file(dep)})])])  # fmt: skip
    path = tmp / "pylock.toml"
    path.write_text(pylock.render(lock))
    return path


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_an_engine_index_points_to_every_dependency_its_lock_pins(
    tmp_path: Path, installer: str
) -> None:
    """An engine wheel that needs pwdep: the release's pylock.toml pins pwdep on another
    server; the index lists it there by sha256, so `--require-hashes` with this index alone
    installs the engine and its dependency."""
    deps = tmp_path / "upstream"
    dep = make_wheel(deps, "pwdep", "5.0", payload=3_000, seed=7)
    build = tmp_path / "wheels"
    make_wheel(build, "pweng", "1.0", payload=9_000, seed=8, requires_dist=("pwdep>=5",))
    names = sorted(p.name for p in build.glob("*.whl"))
    write_provenance(build, {n: sha256_file(build / n) for n in names})
    manifest = write_manifest(tmp_path)
    python = _venv(tmp_path)
    with StaticFiles(deps) as upstream:
        lock = _dep_lock(tmp_path, dep, upstream.url)
        assert main(["--manifest", str(manifest), "release", "--no-sign", "--lock",
                     str(lock)]) == 0  # fmt: skip
        out = tmp_path / "release-index"
        assert main(["--manifest", str(manifest), "index", str(tmp_path / "release"),
                     "--out", str(out)]) == 0  # fmt: skip
        text = (out / "all" / "requirements.txt").read_text()
        assert f"pwdep==5.0 --hash=sha256:{sha256_file(dep)}" in text
        page = (out / "all" / "simple" / "pwdep" / "index.html").read_text()
        assert f'{upstream.url}{dep.name}#sha256={sha256_file(dep)}' in page
        with IndexServer(out) as server:
            req = tmp_path / "req.txt"
            req.write_text(text)
            done = _install(installer, python, f"{server.url}all/simple/", req, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = subprocess.run([str(python), "-c", "import pweng, pwdep; print(pwdep.VALUE)"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert got.strip() == "pwdep 5.0"


def test_an_index_without_a_lock_says_what_to_run_and_that_command_installs_by_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A release without pylock.toml: the index cannot hash pwdep (nothing it holds pins
    it), so requirements.txt, the text output and --json say so and give the commands that
    install with every dependency hashed; the pip one is run here as written, against the
    index and a package host for pwdep, and installs both, pwdep by the hash it locked."""
    import shlex

    build = tmp_path / "wheels"
    make_wheel(build, "pweng", "1.0", payload=1_000, seed=8, requires_dist=("pwdep>=5",))
    names = sorted(p.name for p in build.glob("*.whl"))
    write_provenance(build, {n: sha256_file(build / n) for n in names})
    manifest = write_manifest(tmp_path)
    assert main(["--manifest", str(manifest), "release", "--no-sign"]) == 0
    out = tmp_path / "release-index"
    capsys.readouterr()
    assert main(["--manifest", str(manifest), "--json", "index", str(tmp_path / "release"),
                 "--out", str(out)]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["unserved"] == ["pwdep"]
    fetch, pip = doc["steps"]["all"]
    # fetch's own folder: in a checkout, --dest release is the release folder, refused
    assert fetch.startswith("pinwheel fetch BASE/files/ --allowed-signers")
    assert "--dest" not in fetch and "pinwheel install fetched-release --venv VENV" in fetch
    assert pip == ("pip lock --extra-index-url BASE/all/simple/ -o pylock.toml pweng==1.0 && "
                   "pip install -r pylock.toml")  # fmt: skip
    text = (out / "all" / "requirements.txt").read_text()
    assert "no hash here: pwdep" in text and f"#   {pip}" in text and f"#   {fetch}" in text
    assert main(["--manifest", str(manifest), "index", str(tmp_path / "release"),
                 "--out", str(out)]) == 0  # fmt: skip
    said = capsys.readouterr().out
    assert "no hash here for pwdep" in said and f"all: {pip}" in said

    upstream = tmp_path / "upstream" / "simple" / "pwdep"
    dep = make_wheel(upstream, "pwdep", "5.0", payload=3_000, seed=7)
    python = _venv(tmp_path)
    work = tmp_path / "stranger"
    work.mkdir()
    with IndexServer(out) as server, StaticFiles(tmp_path / "upstream") as host:
        env = {**_env(tmp_path), "PIP_INDEX_URL": f"{host.url}simple/"}  # pip's configured index
        for step in pip.replace("BASE/", server.url).split(" && "):
            argv = shlex.split(step)
            assert argv[0] == "pip"
            done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python),
                                   *argv[1:]], cwd=work, capture_output=True, text=True,
                                  env=env, timeout=300)  # fmt: skip
            assert done.returncode == 0, done.stderr[-3000:]
    lock = (work / "pylock.toml").read_text()
    assert sha256_file(dep) in lock and sha256_file(tmp_path / "release" / names[0]) in lock
    got = subprocess.run([str(python), "-c", "import pweng, pwdep; print(pwdep.VALUE)"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert got.strip() == "pwdep 5.0"


def test_index_and_release_folders_are_world_readable(
    release: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A web server running as another user reads them (mkdtemp made them 0700)."""
    old = os.umask(0o022)
    try:
        out = _index(release, tmp_path / "index")
    finally:
        os.umask(old)
    modes = {p.relative_to(out): p.stat().st_mode & 0o777 for p in [out, *out.rglob("*")]}
    assert {m for p, m in modes.items() if (out / p).is_dir()} == {0o755}
    assert {m for p, m in modes.items() if (out / p).is_file()} == {0o644}
    assert release[1].stat().st_mode & 0o777 == 0o755


def test_out_refuses_a_folder_it_did_not_make(
    release: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest, rel, _ = release
    mine = tmp_path / "site"
    mine.mkdir()
    (mine / "keep.txt").write_text("the user's\n")
    rc = main(["--manifest", str(manifest), "index", str(rel), "--out", str(mine)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "did not make" in err and "--out" in err
    assert sorted(p.name for p in mine.iterdir()) == ["keep.txt"]
    before = sorted(p.name for p in rel.iterdir())
    rc = main(["--manifest", str(manifest), "index", str(rel), "--out", str(rel)])
    assert rc == 2 and "the release folder" in capsys.readouterr().err
    assert sorted(p.name for p in rel.iterdir()) == before
    # a folder the index made is replaced; an empty one is taken
    out = _index(release, tmp_path / "index")
    assert _index(release, out) == out and (out / "index.html").is_file()
    (tmp_path / "empty").mkdir()
    assert (_index(release, tmp_path / "empty") / ".pinwheel-index").is_file()


@pytest.mark.parametrize("label", ["index.html", "files", "index.json", "requirements.txt"])
def test_a_variant_label_that_collides_with_the_index_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], label: str
) -> None:
    build = tmp_path / "wheels"
    made = make_wheel(build, "pwa", f"1.0+pw.{label}", seed=1)
    write_provenance(build, {made.name: sha256_file(made)})
    manifest = write_manifest(tmp_path)
    assert main(["--manifest", str(manifest), "release", "--no-sign"]) == 0
    capsys.readouterr()
    out = tmp_path / "o"
    rc = main(["--manifest", str(manifest), "index", str(tmp_path / "release"), "--out",
               str(out)])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert rc == EXIT_VERIFY and made.name in err and "the index's own name" in err
    assert not out.exists()


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_the_variant_lock_with_a_base_url_installs_over_http(
    release: tuple[Path, Path, Path], tmp_path: Path, installer: str
) -> None:
    """`index --base-url BASE`: VARIANT/pylock.toml names each wheel by absolute URL, so
    `uv pip install -r BASE/VARIANT/pylock.toml` (and pip >= 26.1's `-r`) installs it from a
    plain static server (a relative `path` cannot be followed from a URL)."""
    served = tmp_path / "site"
    served.mkdir()
    python = _venv(tmp_path)
    manifest, rel, _ = release
    with StaticFiles(served) as server:
        base = f"{server.url}idx/"
        assert main(["--manifest", str(manifest), "index", str(rel), "--out",
                     str(served / "idx"), "--base-url", base]) == 0  # fmt: skip
        text = (served / "idx" / V100 / "pylock.toml").read_text()
        assert f'url = "{base}files/{urllib.parse.quote(A_V100)}"' in text
        assert "path = " not in text
        url = f"{base}{V100}/pylock.toml"
        cmd = ([sys.executable, "-m", "pip", "--python", str(python), "install",
                "--disable-pip-version-check", "--no-cache-dir"] if installer == "pip"
               else [_uv(), "pip", "install", "--python", str(python), "--no-cache"])  # fmt: skip
        done = subprocess.run([*cmd, "-r", url], capture_output=True, text=True,
                              env=_env(tmp_path), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = subprocess.run([str(python), "-c", "import pwa, pwb; print(pwa.VALUE, pwb.VALUE)"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert got.strip() == f"pwa 1.0+pw.{V100} pwb 2.0"


def test_the_variant_lock_without_a_base_url_installs_from_a_local_copy(
    release: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --base-url the lock names wheels by relative path and says so: installed from
    a local copy of OUT (uv), and the printed instructions give that form."""
    out = _index(release, tmp_path / "index")
    said = capsys.readouterr().out
    assert "local copy" in said and "--base-url" in said
    text = (out / V100 / "pylock.toml").read_text()
    assert f'path = "../files/{A_V100}"' in text and "url = " not in text.split("pwb")[0]
    python = _venv(tmp_path)
    done = subprocess.run([_uv(), "pip", "install", "--python", str(python), "--no-cache", "-r",
                           str(out / V100 / "pylock.toml")], capture_output=True, text=True,
                          env=_env(tmp_path), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("base", [
    "ftp://127.0.0.1/idx/", "https://user:secret@example.org/idx/",
    "https://example.org/idx/?token=x", "https://example.org/idx/#frag",
    "https://example.org/idx", "not a url/",
])  # fmt: skip
def test_a_bad_base_url_is_refused_and_writes_nothing(
    release: tuple[Path, Path, Path], tmp_path: Path, base: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    manifest, rel, _ = release
    out = tmp_path / "index"
    code = main(["--manifest", str(manifest), "index", str(rel), "--out", str(out),
                 "--base-url", base])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and not out.exists()
    assert "--base-url" in err and "secret" not in err

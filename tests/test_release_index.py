"""Publishing to a real PEP 503 index: pypiserver started here, twine through `pinwheel publish`.

Then the wheels come back two ways: `pip install --require-hashes` from the
index, and `pinwheel fetch` of the index's project page checked against the
release's signed SHA256SUMS.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pinwheel.checksums import sha256_file
from pinwheel.cli import main
from pinwheel.errors import EXIT_VERIFY
from releasekit import make_key, make_wheel, write_manifest, write_provenance

pytestmark = pytest.mark.release

WHEEL = "pwidx-3.1-py3-none-any.whl"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pypiserver(tmp_path: Path) -> Iterator[str]:
    exe = shutil.which("pypi-server", path=os.path.dirname(sys.executable)) or shutil.which(
        "pypi-server"
    )
    if exe is None:
        pytest.skip("pypiserver is not installed (pip install --group test (locks/tests.txt))")
    packages = tmp_path / "index"
    packages.mkdir()
    port = _free_port()
    # -a . -P . : no authentication, so twine's upload needs no real credentials.
    proc = subprocess.Popen(
        [
            exe,
            "run",
            "-i",
            "127.0.0.1",
            "-p",
            str(port),
            "-a",
            ".",
            "-P",
            ".",
            "--disable-fallback",
            str(packages),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(200):
            try:
                with urllib.request.urlopen(url + "simple/", timeout=1) as resp:
                    resp.read()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"pypiserver exited: {proc.stderr.read().decode()[-500:]}")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.fixture
def signed_release(tmp_path: Path) -> tuple[Path, Path]:
    build = tmp_path / "wheels"
    made = make_wheel(build, "pwidx", "3.1", payload=30_000, seed=3)
    write_provenance(build, {made.name: sha256_file(made)})  # release refuses an unpinned build
    key, _signers = make_key(tmp_path / "keys")
    manifest = write_manifest(
        tmp_path,
        release="""
[release]
allowed_signers = "keys/allowed_signers"
""",
    )
    assert main(["--manifest", str(manifest), "release", "--key", str(key)]) == 0
    return manifest, tmp_path / "release"


def test_twine_upload_then_pip_require_hashes_and_fetch_back(
    pypiserver: str, signed_release: tuple[Path, Path], tmp_path: Path
) -> None:
    manifest, release = signed_release
    env_before = dict(os.environ)
    os.environ.update(TWINE_USERNAME="ci", TWINE_PASSWORD="ci")
    try:
        rc = main(
            [
                "--manifest",
                str(manifest),
                "publish",
                "--to",
                "index",
                "--repository-url",
                pypiserver,
            ]
        )
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    assert rc == 0

    # pip, hash-pinned, from the index only
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    req = tmp_path / "req.txt"
    req.write_text(f"pwidx==3.1 --hash=sha256:{sha256_file(release / WHEEL)}\n")
    subprocess.run(
        [
            str(venv / "bin/python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--require-hashes",
            "--no-cache-dir",
            "--index-url",
            pypiserver + "simple/",
            "--no-deps",
            "-r",
            str(req),
        ],
        check=True,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", "import pwidx; print(pwidx.VALUE)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert out.strip() == "pwidx 3.1"

    # a wrong hash must make pip refuse: the check above is a real one
    req.write_text("pwidx==3.1 --hash=sha256:" + "0" * 64 + "\n")
    bad = subprocess.run(
        [
            str(venv / "bin/python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--require-hashes",
            "--no-cache-dir",
            "--force-reinstall",
            "--index-url",
            pypiserver + "simple/",
            "--no-deps",
            "-r",
            str(req),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )
    assert bad.returncode != 0 and "HASHES" in bad.stderr.upper()

    # pinwheel fetch from the index project page, checked against the signed sums
    dest = tmp_path / "dl"
    rc = main(
        [
            "--manifest",
            str(manifest),
            "fetch",
            pypiserver + "simple/pwidx/",
            "--sums",
            str(release / "SHA256SUMS"),
            "--dest",
            str(dest),
        ]
    )
    assert rc == 0
    assert sha256_file(dest / WHEEL) == sha256_file(release / WHEEL)


def test_publish_refuses_a_release_that_does_not_verify(
    signed_release: tuple[Path, Path], capsys
) -> None:
    manifest, release = signed_release
    data = bytearray((release / WHEEL).read_bytes())
    data[3] ^= 1
    (release / WHEEL).write_bytes(bytes(data))
    rc = main(
        [
            "--manifest",
            str(manifest),
            "publish",
            "--to",
            "index",
            "--repository-url",
            "http://127.0.0.1:9/",
        ]
    )
    assert rc == EXIT_VERIFY
    assert "sha256 mismatch" in capsys.readouterr().err


def test_github_plan_lists_exactly_the_release_files(
    signed_release: tuple[Path, Path], capsys
) -> None:
    import json

    manifest, release = signed_release
    text = manifest.read_text() + '\n[release.github]\nrepo = "owner/engine"\n'
    manifest.write_text(text.replace("[release]\n", "[release]\n", 1))
    rc = main(["--manifest", str(manifest), "--json", "publish", "--to", "github"])
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["tag"] == "kit-20261010"
    assert sorted(Path(f).name for f in plan["files"]) == sorted(p.name for p in release.iterdir())


def test_publish_runs_twine_check_strict_first(tmp_path: Path, capsys) -> None:
    """A wheel with no long description: twine check --strict warns, so nothing is uploaded
    (the repository URL is a closed port: reaching the upload would fail differently)."""
    import base64
    import hashlib
    import zipfile

    build = tmp_path / "wheels"
    build.mkdir()
    info = "pwbare-1.0.dist-info"
    members = {
        "pwbare/__init__.py": b"",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: pwbare\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rows = [
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
        for n, d in members.items()
    ] + [f"{info}/RECORD,,"]
    members[f"{info}/RECORD"] = ("\n".join(rows) + "\n").encode()
    wheel = build / "pwbare-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)
    write_provenance(build, {wheel.name: sha256_file(wheel)})
    manifest = write_manifest(tmp_path)
    assert main(["--manifest", str(manifest), "release", "--no-sign"]) == 0
    capsys.readouterr()
    rc = main(["--manifest", str(manifest), "publish", "--to", "index",
               "--repository-url", "http://127.0.0.1:9/"])  # fmt: skip
    assert rc == EXIT_VERIFY
    err = capsys.readouterr().err
    assert "twine check --strict refused" in err and "long_description" in err

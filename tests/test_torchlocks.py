"""`pinwheel lock --tools` refreshes the torch locks the repository's manifests pin
([build.torch_lock]) on a real uv: against a real HTTPS package index on 127.0.0.1 (a
PEP 503 folder of torch and CUDA-runtime wheels made here, under a certificate authority
made here) named by the manifest's [build] torch_index, in checkouts made in tmp_path. The
opt-in tests at the end (`pytest -m network`, skipped when the index cannot be reached)
refresh a system manifest's lock against the real index and compare it with the committed
bytes, and run `pinwheel --json lock --tools --check` on this checkout.
"""

from __future__ import annotations

import datetime
import difflib
import functools
import hashlib
import http.server
import ipaddress
import os
import shutil
import ssl
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localhttp import LocalHTTP
from pinwheel import manifest, validate
from pinwheel.compile import torchlocks
from pinwheel.compile.toollocks import LockError
from pinwheel.errors import ManifestError

ROOT = Path(__file__).resolve().parent.parent
UV = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _uv() -> str:
    if not Path(UV).exists():
        pytest.skip("uv is not installed here (the test extra installs it)")
    return UV


# --------------------------------------------------------------------------- a real index


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A wheel made here: metadata, an empty package, RECORD."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{dist}/__init__.py": "",
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    whl = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for member, text in {**files, f"{info}/RECORD": record}.items():
            zf.writestr(zipfile.ZipInfo(member, (2020, 1, 1, 0, 0, 0)), text)
    return whl


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A certificate authority and a certificate it signed for 127.0.0.1 (cryptography)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, issuer: str, key: Any, signer: Any, ca: bool) -> x509.Certificate:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            b = b.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return b.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    ca = build("pinwheel test CA", "pinwheel test CA", ca_key, ca_key, True)
    leaf = build("127.0.0.1", "pinwheel test CA", key, ca_key, False)
    pem = serialization.Encoding.PEM
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf.public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip
    return paths


class Index(LocalHTTP):
    """A PEP 503 index over https on 127.0.0.1: ``/simple/<project>/`` and ``/files/``;
    every path asked for is recorded."""

    url_suffix = "/simple"

    def __init__(self, folder: Path, cert: Path, key: Path) -> None:
        self.folder = folder
        self.requests: list[str] = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self._serve(functools.partial(Handler, directory=str(folder)))  # type: ignore[arg-type]
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.httpd.server_address[1]}/simple"

    def add(self, whl: Path) -> None:
        project = whl.name.split("-")[0].replace("_", "-")
        digest = hashlib.sha256(whl.read_bytes()).hexdigest()
        page = Path(self.folder) / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        with page.open("a") as f:
            f.write(f'<a href="../../files/{whl.name}#sha256={digest}">{whl.name}</a>\n')


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[Index, dict[str, str]]]:
    """The index (torch 2.11.0 built with CUDA 13.0: it requires nvidia-cuda-runtime 13.0)
    and the environment uv trusts its certificate authority in."""
    folder = tmp_path / "index"
    (folder / "files").mkdir(parents=True)
    ca, cert, key = _certificates(tmp_path)
    server = Index(folder, cert, key)
    for whl in (
        _wheel(folder / "files", "torch", "2.11.0", ("nvidia-cuda-runtime==13.0.96",)),
        _wheel(folder / "files", "nvidia-cuda-runtime", "13.0.96"),
    ):
        server.add(whl)
    # A machine's own index and find-links settings, which must not decide the pins.
    environ = {**os.environ, "SSL_CERT_FILE": str(ca),
               "UV_INDEX_URL": "http://127.0.0.1:9/never-used",
               "PIP_FIND_LINKS": str(tmp_path / "never-used")}  # fmt: skip
    with server:
        yield server, environ


# --------------------------------------------------------------------------- a checkout


STALE = (
    "# This file was autogenerated by uv via the following command:\n"
    "#    printf 'torch==2.11.0\\n' | uv pip compile --generate-hashes --python-version 3.12 "
    "--python-platform x86_64-manylinux_2_28 --no-emit-index-url --no-emit-find-links - -o {out}\n"
    "torch==2.11.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
)


def _manifest_text(lock: str, digest: str, *, cuda: str, arches: str, index: str) -> str:
    return (
        "# a system of the test checkout\n"
        f'[upstream]\nurl = "https://example.invalid/up.git"\ncommit = "{COMMIT}"\n\n'
        "[build]\n"
        'python = "3.12"  # the cards\' cp312\n'
        f'cuda = "{cuda}"\narches = [{arches}]\ntorch = "2.11.0"\n'
        f'torch_index = "{index}"\n\n'
        "[build.torch_lock]\n"
        "# torch for the kernels, by hash\n"
        f'path = "{lock}"  # lock: the command is in its header\n'
        f'sha256 = "{digest}"  # lock: sha256sum of that file\n'
    )


def _system(repo: Path, folder: str, lock: str, *, cuda: str = "13.0", arches: str = '"12.0"',
            index: str, lock_text: str | None = None) -> tuple[Path, Path]:  # fmt: skip
    """A manifest at ``folder`` (relative to ``repo``) and its torch lock ``lock`` beside it."""
    here = repo / folder
    here.mkdir(parents=True, exist_ok=True)
    path = here / lock
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(lock_text or STALE.format(out=path.relative_to(repo).as_posix()))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    m = here / "manifest.toml"
    m.write_text(_manifest_text(lock, digest, cuda=cuda, arches=arches, index=index))
    return m, path


def _snapshot(repo: Path) -> dict[str, bytes]:
    return {p.relative_to(repo).as_posix(): p.read_bytes()
            for p in sorted(repo.rglob("*")) if p.is_file()}  # fmt: skip


def test_refresh_rewrites_each_lock_and_only_its_manifests_sha256(
    tmp_path: Path, index: tuple[Index, dict[str, str]]
) -> None:
    server, environ = index
    repo = tmp_path / "checkout"
    top, top_lock = _system(repo, ".", "locks/torch-2.11.0-cp312-x86_64.txt", index=server.url)
    sub, sub_lock = _system(repo, "recipes/sm120", "torch-2.11.0-cp312-x86_64.txt",
                            index=server.url)  # fmt: skip
    (repo / "recipes" / "notorch").mkdir()  # a manifest without [build.torch_lock]: left alone
    (repo / "recipes" / "notorch" / "manifest.toml").write_text(
        f'[upstream]\nurl = "https://example.invalid/up.git"\ncommit = "{COMMIT}"\n'
    )
    example = repo / "recipes" / "examples" / "x.toml"  # not a manifest of the repository
    example.parent.mkdir()
    example.write_text("not = 'read'\n")
    request = torchlocks.TorchLockRequest(repo.resolve(), _uv(), environ, check=True)

    before = _snapshot(repo)
    checked = torchlocks.refresh(request)
    assert _snapshot(repo) == before  # --check writes nothing
    assert [(r.manifest, r.path) for r in checked] == [
        ("manifest.toml", "locks/torch-2.11.0-cp312-x86_64.txt"),
        ("recipes/sm120/manifest.toml", "recipes/sm120/torch-2.11.0-cp312-x86_64.txt"),
    ]
    assert all(r.changed and "+nvidia-cuda-runtime==13.0.96" in r.diff for r in checked)
    assert all(r.platform == "x86_64-manylinux_2_28" for r in checked)

    old_manifest = sub.read_text()
    done = torchlocks.refresh(torchlocks.TorchLockRequest(repo.resolve(), UV, environ))
    assert [r.new_sha256 for r in done] == [r.new_sha256 for r in checked]
    for m, lock, r in ((top, top_lock, done[0]), (sub, sub_lock, done[1])):
        text = lock.read_text()
        assert hashlib.sha256(lock.read_bytes()).hexdigest() == r.new_sha256
        # resolved from the manifest's index, with the runtime torch requires, by hash
        runtime = (server.folder / "files" / "nvidia_cuda_runtime-13.0.96-py3-none-any.whl")
        assert f"--hash=sha256:{hashlib.sha256(runtime.read_bytes()).hexdigest()}" in text
        assert "torch==2.11.0 \\\n    --hash=sha256:" in text and "a" * 64 not in text
        # the header names pinwheel's command and the uv command, the lock by its path here
        header = text.splitlines()[1]
        assert header.startswith("#    pinwheel lock --tools, or by hand: printf 'torch==2.11.0\\n'")
        assert (f"--python-version 3.12 --python-platform x86_64-manylinux_2_28 --index-url "
                f"{server.url} --no-emit-index-url") in header  # fmt: skip
        assert header.endswith(f" -o {r.path}")
        # no path of this machine, nothing of the machine's UV_/PIP_ settings
        for bad in (str(tmp_path), "/tmp/", "127.0.0.1:9", "never-used", "file:"):
            assert bad not in text, bad
        assert manifest.load(m).build.torch_lock.sha256 == r.new_sha256  # it still loads
    # Only the sha256 value changed in the manifest: its comments and every other line kept.
    new_manifest = sub.read_text()
    changed = [(a, b) for a, b in zip(old_manifest.splitlines(), new_manifest.splitlines(),
                                      strict=True) if a != b]  # fmt: skip
    assert changed == [(
        f'sha256 = "{done[1].old_sha256}"  # lock: sha256sum of that file',
        f'sha256 = "{done[1].new_sha256}"  # lock: sha256sum of that file',
    )]  # fmt: skip
    assert example.read_text() == "not = 'read'\n"

    again = torchlocks.refresh(torchlocks.TorchLockRequest(repo.resolve(), UV, environ, True))
    assert [r.changed for r in again] == [False, False] and not any(r.diff for r in again)


def test_a_torch_that_no_longer_fits_the_manifest_stops_and_nothing_is_written(
    tmp_path: Path, index: tuple[Index, dict[str, str]]
) -> None:
    server, environ = index
    repo = tmp_path / "checkout"
    # The first system fits (CUDA 13.0, sm_120): its lock would be rewritten were it alone.
    _system(repo, ".", "locks/torch-2.11.0-cp312-x86_64.txt", index=server.url)
    # The index's torch 2.11.0 is a CUDA 13.0 build; this system builds with CUDA 12.8.
    _system(repo, "recipes/v100", "torch-2.11.0-cp312-x86_64.txt", cuda="12.8",
            arches='"8.0"', index=server.url)  # fmt: skip
    before = _snapshot(repo)
    with pytest.raises(LockError) as err:
        torchlocks.refresh(torchlocks.TorchLockRequest(repo.resolve(), _uv(), environ))
    assert "built with CUDA 13.0" in err.value.what and "nothing was written" in err.value.what
    assert err.value.where == ("recipes/v100/torch-2.11.0-cp312-x86_64.txt "
                               "(recipes/v100/manifest.toml [build.torch_lock])")  # fmt: skip
    assert "lock a torch built with CUDA 12.x" in (err.value.next or "")
    assert _snapshot(repo) == before


@pytest.mark.parametrize(
    ("header_platform", "problem"),
    [
        ("--index-url=https://127.0.0.1:9/simple", "a platform like x86_64-manylinux_2_28"),
        ("x86_64-manylinux_2_28;curl", "a platform like x86_64-manylinux_2_28"),
        ("X86_64-MANYLINUX", "a platform like x86_64-manylinux_2_28"),
    ],
)
def test_a_hostile_platform_in_a_locks_header_never_reaches_uv(
    tmp_path: Path, index: tuple[Index, dict[str, str]], header_platform: str, problem: str
) -> None:
    server, environ = index
    repo = tmp_path / "checkout"
    text = STALE.replace("x86_64-manylinux_2_28", header_platform)
    _system(repo, ".", "locks/torch.txt", index=server.url, lock_text=text)
    before = _snapshot(repo)
    with pytest.raises(LockError) as err:
        torchlocks.refresh(torchlocks.TorchLockRequest(repo.resolve(), _uv(), environ))
    assert "--python-platform" in err.value.what and problem in err.value.what
    assert err.value.where == "locks/torch.txt (header)"
    assert server.requests == []  # uv never ran
    assert _snapshot(repo) == before


def test_hostile_manifest_values_stop_before_uv(
    tmp_path: Path, index: tuple[Index, dict[str, str]]
) -> None:
    server, environ = index
    repo = tmp_path / "checkout"
    m, _ = _system(repo, ".", "locks/torch-2.11.0-cp312-x86_64.txt", index=server.url)
    good = m.read_text()
    for key, value in (("torch", "--index-url=https://x.invalid"), ("python", "--3.12"),
                       ("torch_index", "http://127.0.0.1:9/simple")):  # fmt: skip
        line = next(x for x in good.splitlines() if x.startswith(f"{key} = "))
        m.write_text(good.replace(line, f'{key} = "{value}"'))
        with pytest.raises(ManifestError) as err:  # refused where the manifest is read
            torchlocks.refresh(torchlocks.TorchLockRequest(repo.resolve(), _uv(), environ))
        assert key in (err.value.where or ""), (key, err.value)
    assert server.requests == []
    # the checks themselves, as refresh applies them to what reaches uv's argv
    assert validate.python_minor_problem("3.12") is None
    for bad in ("3.12\n", "--3.12", "3.12.1", " 3.12", "3"):
        assert validate.python_minor_problem(bad), bad
    assert validate.python_platform_problem("x86_64-manylinux_2_28") is None
    assert validate.python_platform_problem("aarch64-manylinux_2_28") is None
    for bad in ("-x86_64", "x86_64 --index-url", "x86_64\n", "", "a-b-c-d-e"):
        assert validate.python_platform_problem(bad), bad


def test_a_manifest_linked_from_outside_or_a_lock_naming_no_platform_is_refused(
    tmp_path: Path, index: tuple[Index, dict[str, str]]
) -> None:
    server, environ = index
    outside, _ = _system(tmp_path / "elsewhere", "sys", "torch-2.11.0-cp312-x86_64.txt",
                         index=server.url)  # fmt: skip
    repo = tmp_path / "checkout"
    (repo / "recipes" / "linked").mkdir(parents=True)
    (repo / "recipes" / "linked" / "manifest.toml").symlink_to(outside)
    before = _snapshot(tmp_path / "elsewhere")
    with pytest.raises(LockError, match="resolves outside the repository") as err:
        torchlocks.refresh(torchlocks.TorchLockRequest(repo.resolve(), _uv(), environ))
    assert err.value.where == "recipes/linked/manifest.toml"
    assert _snapshot(tmp_path / "elsewhere") == before

    repo = tmp_path / "checkout2"
    headless = "torch==2.11.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    _system(repo, ".", "torch.txt", index=server.url, lock_text=headless)
    with pytest.raises(LockError, match="names no platform") as err:
        torchlocks.refresh(torchlocks.TorchLockRequest(repo.resolve(), UV, environ))
    assert err.value.where == "torch.txt" and "cp<XY>-<machine>" in (err.value.next or "")
    # named for its machine, the lock resolves for that machine on manylinux_2_28
    assert torchlocks.platform_of(headless, "torch-2.11.0-cp312-aarch64.txt") == (
        "aarch64-manylinux_2_28")
    assert server.requests == []


# --------------------------------------------------------------------------- the real index


def _index_reachable(uv: str, tmp_path: Path) -> bool:
    """Whether uv reaches its default package index (a one-package resolution)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    env.update(UV_NO_CONFIG="1", UV_HTTP_TIMEOUT="20")
    proc = subprocess.run([uv, "pip", "compile", "--quiet", "-"], input="packaging\n",
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    return proc.returncode == 0


@pytest.mark.slow
@pytest.mark.network
def test_a_system_manifests_torch_lock_refreshes_to_the_committed_bytes(tmp_path: Path) -> None:
    uv = _uv()
    if not _index_reachable(uv, tmp_path):
        pytest.skip("the package index cannot be reached from here")
    repo = tmp_path / "checkout"
    shutil.copytree(ROOT / "recipes" / "sm120-tp2", repo / "recipes" / "sm120-tp2")
    shutil.copytree(ROOT / "keys", repo / "keys")
    lock = repo / "recipes" / "sm120-tp2" / "torch-2.11.0-cp312-x86_64.txt"
    committed = lock.read_text()
    (r,) = torchlocks.refresh(torchlocks.TorchLockRequest(repo.resolve(), uv, dict(os.environ)))
    diff = "".join(difflib.unified_diff(committed.splitlines(True), lock.read_text().splitlines(True),
                                        "committed", "refreshed", n=0))  # fmt: skip
    assert not r.changed and not diff, (
        "the index moved: `pinwheel lock --tools` would rewrite it\n" + diff
    )
    assert manifest.load(repo / "recipes" / "sm120-tp2" / "manifest.toml").build.torch_lock


@pytest.mark.slow
@pytest.mark.network
def test_lock_tools_check_reports_each_manifests_torch_lock_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command on this checkout: every tool lock and both system torch locks resolved,
    nothing written (git's view of the files before and after is the same)."""
    import json

    from pinwheel.cli import main

    if not _index_reachable(_uv(), tmp_path):
        pytest.skip("the package index cannot be reached from here")
    watched = [ROOT / "manifest.toml", ROOT / "recipes" / "sm120-tp2" / "manifest.toml",
               *sorted((ROOT / "locks").glob("*.txt")), *sorted(ROOT.glob("recipes/*/*.txt"))]  # fmt: skip
    before = {p: p.read_bytes() for p in watched}
    code = main(["--json", "lock", "--tools", "--check"])
    doc = json.loads(capsys.readouterr().out)
    assert {p: p.read_bytes() for p in watched} == before
    assert doc["check"] is True
    torch = {t["manifest"]: t for t in doc["torch_locks"]}
    assert set(torch) == {"manifest.toml", "recipes/sm120-tp2/manifest.toml"}
    assert torch["manifest.toml"]["path"] == "locks/torch-2.10.0-cp312-x86_64.txt"
    assert torch["recipes/sm120-tp2/manifest.toml"]["torch"] == "2.11.0"
    for t in torch.values():
        # the sha256 the manifest pins now is the one --check compared against
        loaded = manifest.load(ROOT / t["manifest"]).build.torch_lock
        assert t["old_sha256"] == loaded.sha256
        assert t["platform"] == "x86_64-manylinux_2_28"
    changed = any(lock["changed"] for lock in doc["locks"] + doc["torch_locks"])
    assert code == (1 if changed else 0)

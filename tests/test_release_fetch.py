"""Release assembly, fetch and install against a real local HTTP server.

Real parts: wheels built here, ssh-keygen keys and signatures, `pinwheel release`
through the CLI, a ThreadingHTTPServer with real Range support, uv and pip
installing into fresh venvs, sha256sum checking the release by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pinwheel.checksums import sha256_file, write_sums
from pinwheel.cli import main
from pinwheel.errors import EXIT_VERIFY, VerifyError
from pinwheel.release.download import FetchError, FetchOptions, fetch_release, resolve_source
from releasekit import ReleaseServer, make_key, make_wheel, write_manifest, write_provenance

pytestmark = pytest.mark.release

BIG = "pwa-1.0-py3-none-any.whl"
SMALL = "pwb-2.0-py3-none-any.whl"


@dataclass(frozen=True)
class Kit:
    root: Path
    manifest: Path
    build: Path
    release: Path
    key: Path
    signers: Path


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    root = tmp_path_factory.mktemp("kit")
    build = root / "wheels"
    make_wheel(build, "pwa", "1.0", payload=600_000, seed=1)
    make_wheel(build, "pwb", "2.0", payload=40_000, seed=2)
    write_sums(build, [BIG, SMALL])
    write_provenance(build, {BIG: sha256_file(build / BIG), SMALL: sha256_file(build / SMALL)})
    (build / "qualification.json").write_text(
        json.dumps({"verdict": "pass", "figures": {"decode_tok_s": 41.5, "needle_7k": True}})
    )
    key, signers = make_key(root / "keys")
    manifest = write_manifest(
        root,
        release="""
[release]
allowed_signers = "keys/allowed_signers"
principal = "release@pinwheel.test"
torch_backend = "cpu"
""",
    )
    rc = main(["--manifest", str(manifest), "release", "--key", str(key)])
    assert rc == 0
    return Kit(root, manifest, build, root / "release", key, signers)


def opts(kit: Kit, **kw: object) -> FetchOptions:
    base: dict[str, object] = dict(
        timeout=1.0,
        retries=2,
        backoff=0.01,
        allowed_signers=kit.signers,
        principal="release@pinwheel.test",
    )
    base.update(kw)
    return FetchOptions(**base)  # type: ignore[arg-type]


def served_copy(kit: Kit, tmp_path: Path) -> Path:
    copy = tmp_path / "served"
    shutil.copytree(kit.release, copy)
    return copy


def no_final_files(dest: Path) -> list[str]:
    """Names in dest that a user could mistake for verified downloads."""
    return sorted(p.name for p in dest.iterdir()) if dest.exists() else []


# --------------------------------------------------------------------------- release


def test_release_dir_is_complete_signed_and_checkable_by_hand(kit: Kit) -> None:
    names = sorted(p.name for p in kit.release.iterdir())
    assert names == sorted(
        [
            BIG,
            SMALL,
            "provenance.json",
            "qualification.json",
            "RELEASE_NOTES.md",
            "SHA256SUMS",
            "SHA256SUMS.sig",
            "attestation.intoto.jsonl",  # in-toto/SLSA, DSSE; SHA256SUMS is its subject
        ]
    )
    # The plain tools a V100 owner already uses must agree.
    subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=kit.release, check=True)
    with open(kit.release / "SHA256SUMS", "rb") as fh:
        subprocess.run(
            [
                "ssh-keygen",
                "-Y",
                "verify",
                "-f",
                str(kit.signers),
                "-I",
                "release@pinwheel.test",
                "-n",
                "pinwheel",
                "-s",
                str(kit.release / "SHA256SUMS.sig"),
            ],
            stdin=fh,
            check=True,
            capture_output=True,
        )
    notes = (kit.release / "RELEASE_NOTES.md").read_text()
    for expected in (
        "Fix MTP init on SM70",
        "EXL3 kernels for V100",
        "`Ada <ada@x>`",  # a code span: no raw HTML, and an email never mentions anyone
        "`Lin <lin@x>`",
        "8" * 40,
        "12.4.131",
        "sm_70",
        "decode_tok_s",
        "41.5",
        "1" * 40,
        BIG,
    ):
        assert expected in notes, expected


def test_release_refuses_a_wheel_that_differs_from_the_build_sums(
    kit: Kit, tmp_path: Path, capsys
) -> None:
    build = tmp_path / "wheels"
    shutil.copytree(kit.build, build)
    data = bytearray((build / SMALL).read_bytes())
    data[100] ^= 1
    (build / SMALL).write_bytes(bytes(data))
    rc = main(
        [
            "--manifest",
            str(kit.manifest),
            "release",
            "--from",
            str(build),
            "--out",
            str(tmp_path / "rel"),
            "--no-sign",
        ]
    )
    assert rc == EXIT_VERIFY
    assert SMALL in capsys.readouterr().err
    assert not (tmp_path / "rel").exists()


def test_release_without_provenance_is_refused_unless_allow_unverified(
    kit: Kit, tmp_path: Path, capsys
) -> None:
    build = tmp_path / "wheels"
    build.mkdir()
    shutil.copy(kit.build / SMALL, build)
    cmd = ["--manifest", str(kit.manifest), "release", "--from", str(build)]
    cmd += ["--out", str(tmp_path / "rel"), "--no-sign"]
    assert main(cmd) == EXIT_VERIFY
    err = capsys.readouterr().err
    assert "no provenance.json" in err and "--allow-unverified" in err
    assert not (tmp_path / "rel").exists()
    assert main([*cmd, "--allow-unverified"]) == 0
    notes = (tmp_path / "rel" / "RELEASE_NOTES.md").read_text()
    assert notes.splitlines()[0].startswith("**UNVERIFIED RELEASE**")
    assert "no provenance.json" in notes.splitlines()[0]
    assert "not recorded" in notes and "Fix MTP init on SM70" in notes
    assert not (tmp_path / "rel" / "SHA256SUMS.sig").exists()


# --------------------------------------------------------------------------- fetch: good paths


def test_clean_fetch_then_install_with_uv_into_a_fresh_venv(kit: Kit, tmp_path: Path) -> None:
    dest, venv = tmp_path / "dl", tmp_path / "venv"
    with ReleaseServer(kit.release) as srv:
        rc = main(["--manifest", str(kit.manifest), "fetch", srv.url, "--dest", str(dest)])
    assert rc == 0
    subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=dest, check=True)
    assert not [p for p in dest.iterdir() if p.name.endswith(".part")]
    rc = main(
        [
            "--manifest",
            str(kit.manifest),
            "install",
            str(dest),
            "--venv",
            str(venv),
            "--installer",
            "uv",
        ]
    )
    assert rc == 0
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", "import pwa, pwb; print(pwa.VALUE, '|', pwb.VALUE)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert out.strip() == "pwa 1.0 | pwb 2.0"


def test_install_with_pip_require_hashes(kit: Kit, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    rc = main(
        [
            "--manifest",
            str(kit.manifest),
            "--json",
            "install",
            str(kit.release),
            "--venv",
            str(venv),
            "--installer",
            "pip",
            "--no-deps",
        ]
    )
    assert rc == 0
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", "import pwa; print(pwa.VALUE)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert out.strip() == "pwa 1.0"


def test_pip_install_refuses_a_wheel_changed_after_fetch(kit: Kit, tmp_path: Path, capsys) -> None:
    wheels = served_copy(kit, tmp_path)
    data = bytearray((wheels / SMALL).read_bytes())
    data[-10] ^= 0xFF
    (wheels / SMALL).write_bytes(bytes(data))
    rc = main(
        [
            "--manifest",
            str(kit.manifest),
            "install",
            str(wheels),
            "--venv",
            str(tmp_path / "venv"),
            "--installer",
            "pip",
        ]
    )
    assert rc == EXIT_VERIFY
    assert "sha256 mismatch" in capsys.readouterr().err
    assert not (tmp_path / "venv").exists()


def test_interrupted_download_resumes_with_a_range_request(kit: Kit, tmp_path: Path) -> None:
    dest = tmp_path / "dl"
    with ReleaseServer(kit.release) as srv:
        srv.behaviour[BIG] = __import__("releasekit").Behaviour("truncate-once")
        result = fetch_release(resolve_source(srv.url), dest, opts(kit))
        ranges = srv.log.ranges(BIG)
    size = (kit.release / BIG).stat().st_size
    assert ranges == [f"bytes={size // 2}-"], srv.log.requests
    assert sha256_file(dest / BIG) == sha256_file(kit.release / BIG)
    assert {f.name for f in result.files} >= {BIG, SMALL}


def test_partial_left_by_an_earlier_run_is_resumed(kit: Kit, tmp_path: Path) -> None:
    dest = tmp_path / "dl"
    dest.mkdir()
    data = (kit.release / BIG).read_bytes()
    (dest / f".{BIG}.part").write_bytes(data[:250_000])
    with ReleaseServer(kit.release) as srv:
        result = fetch_release(resolve_source(srv.url), dest, opts(kit))
        ranges = srv.log.ranges(BIG)
    assert ranges == ["bytes=250000-"]
    big = next(f for f in result.files if f.name == BIG)
    assert big.resumed_from == 250_000
    assert (dest / BIG).read_bytes() == data


def test_a_500_once_is_retried(kit: Kit, tmp_path: Path) -> None:
    from releasekit import Behaviour

    with ReleaseServer(kit.release) as srv:
        srv.behaviour[SMALL] = Behaviour("500-once")
        fetch_release(resolve_source(srv.url), tmp_path / "dl", opts(kit))
        assert srv.behaviour[SMALL].used == 2
    assert sha256_file(tmp_path / "dl" / SMALL) == sha256_file(kit.release / SMALL)


def test_directory_source(kit: Kit, tmp_path: Path) -> None:
    result = fetch_release(resolve_source(str(kit.release)), tmp_path / "dl", opts(kit))
    assert result.signed_by == "release@pinwheel.test"
    subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=tmp_path / "dl", check=True)


# --------------------------------------------------------------------------- fetch: refusals


def test_flipped_byte_is_refused_and_the_partial_deleted(kit: Kit, tmp_path: Path) -> None:
    served = served_copy(kit, tmp_path)
    data = bytearray((served / BIG).read_bytes())
    data[len(data) // 2] ^= 0x01
    (served / BIG).write_bytes(bytes(data))
    dest = tmp_path / "dl"
    with ReleaseServer(served) as srv, pytest.raises(VerifyError) as err:
        fetch_release(resolve_source(srv.url), dest, opts(kit))
    assert f"sha256 mismatch for {BIG}" in str(err.value)
    assert BIG not in no_final_files(dest)
    assert f".{BIG}.part" not in no_final_files(dest)
    assert "SHA256SUMS" not in no_final_files(dest)


def test_wheel_missing_from_sums_is_refused(kit: Kit, tmp_path: Path) -> None:
    served = served_copy(kit, tmp_path)
    make_wheel(served, "evil", "0.1", payload=10)
    dest = tmp_path / "dl"
    with ReleaseServer(served) as srv, pytest.raises(VerifyError) as err:
        fetch_release(resolve_source(srv.url), dest, opts(kit))
    assert "evil-0.1-py3-none-any.whl" in str(err.value) and "not listed" in str(err.value)
    assert no_final_files(dest) == []
    # asking for it by name is refused too, with or without a listing
    with ReleaseServer(served) as srv, pytest.raises(VerifyError):
        srv.listing = False
        fetch_release(resolve_source(srv.url), dest, opts(kit), only=("evil-0.1-py3-none-any.whl",))
    assert no_final_files(dest) == []


def test_unsigned_or_badly_signed_sums_are_refused(kit: Kit, tmp_path: Path, capsys) -> None:
    served = served_copy(kit, tmp_path)
    # Re-point a wheel's hash: the signature no longer covers these sums.
    sums = (served / "SHA256SUMS").read_text().replace(sha256_file(served / SMALL), "0" * 64)
    (served / "SHA256SUMS").write_text(sums)
    dest = tmp_path / "dl"
    with ReleaseServer(served) as srv:
        rc = main(
            [
                "--manifest",
                str(kit.manifest),
                "fetch",
                srv.url,
                "--dest",
                str(dest),
                "--retries",
                "0",
            ]
        )
        err = capsys.readouterr().err
        assert rc == EXIT_VERIFY
        assert "signature over SHA256SUMS does not verify" in err
        assert no_final_files(dest) == []
        (served / "SHA256SUMS.sig").unlink()
        with pytest.raises(VerifyError, match="SHA256SUMS.sig not found"):
            fetch_release(resolve_source(srv.url), dest, opts(kit))
    # a signature by a key that is not in allowed_signers
    other_key, _ = make_key(tmp_path / "other", "mallory@x")
    subprocess.run(
        [
            "ssh-keygen",
            "-Y",
            "sign",
            "-q",
            "-f",
            str(other_key),
            "-n",
            "pinwheel",
            str(served / "SHA256SUMS"),
        ],
        check=True,
    )
    with ReleaseServer(served) as srv, pytest.raises(VerifyError, match="does not verify"):
        fetch_release(resolve_source(srv.url), dest, opts(kit, principal=None))
    assert no_final_files(dest) == []


@pytest.mark.parametrize(
    "kind, message",
    [
        ("404", "not found (HTTP 404)"),
        ("500", "HTTP 500"),
        ("stall", "stalled: no data for 0.5 s"),
    ],
)
def test_server_failures_end_with_a_clear_error(
    kit: Kit, tmp_path: Path, kind: str, message: str
) -> None:
    from releasekit import Behaviour

    dest = tmp_path / "dl"
    with ReleaseServer(kit.release, stall_seconds=2.0) as srv:
        srv.behaviour[BIG] = Behaviour(kind)
        with pytest.raises(FetchError) as err:
            fetch_release(resolve_source(srv.url), dest, opts(kit, timeout=0.5, retries=1))
        used = srv.behaviour[BIG].used
    text = str(err.value)
    assert message in text and BIG in text
    assert used == (1 if kind == "404" else 2)  # 404 is final; others retried once
    assert BIG not in no_final_files(dest)
    assert "SHA256SUMS" not in no_final_files(dest)
    if kind == "stall":  # the bytes that did arrive are kept for a resume, under the temp name
        assert "resumes" in text and (dest / f".{BIG}.part").exists()


def test_sums_404_is_a_clear_error(kit: Kit, tmp_path: Path, capsys) -> None:
    with ReleaseServer(tmp_path) as srv:
        rc = main(
            [
                "fetch",
                srv.url,
                "--dest",
                str(tmp_path / "dl"),
                "--retries",
                "0",
                "--manifest",
                str(tmp_path / "none.toml"),
                "--allow-unsigned",
            ]
        )
    assert rc == 1
    assert "SHA256SUMS: not found (HTTP 404)" in capsys.readouterr().err


def test_disk_full_on_a_tiny_tmpfs(kit: Kit, tmp_path: Path) -> None:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        with ReleaseServer(kit.release) as srv, pytest.raises(FetchError) as err:
            fetch_release(resolve_source(srv.url), mnt, opts(kit))
        text = str(err.value)
        assert BIG in text and ("not enough space" in text or "disk full" in text)
        assert BIG not in no_final_files(mnt) and f".{BIG}.part" not in no_final_files(mnt)
        # the real ENOSPC path too, with the free-space check out of the way
        import pinwheel.release.download as dl

        real_check = dl._check_space
        dl._check_space = lambda *a: None  # type: ignore[assignment]
        try:
            with ReleaseServer(kit.release) as srv, pytest.raises(FetchError, match="disk full"):
                fetch_release(resolve_source(srv.url), mnt, opts(kit))
        finally:
            dl._check_space = real_check  # type: ignore[assignment]
        assert BIG not in no_final_files(mnt) and f".{BIG}.part" not in no_final_files(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_cli_reports_exit_code_and_next_step_in_a_subprocess(kit: Kit, tmp_path: Path) -> None:
    served = served_copy(kit, tmp_path)
    data = bytearray((served / SMALL).read_bytes())
    data[5] ^= 0x40
    (served / SMALL).write_bytes(bytes(data))
    with ReleaseServer(served) as srv:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pinwheel",
                "--manifest",
                str(kit.manifest),
                "fetch",
                srv.url,
                "--dest",
                str(tmp_path / "dl"),
            ],
            capture_output=True,
            text=True,
        )
    assert proc.returncode == EXIT_VERIFY
    assert f"sha256 mismatch for {SMALL}" in proc.stderr and "next:" in proc.stderr
    assert SMALL not in no_final_files(tmp_path / "dl")


def test_install_without_uv_says_it_fell_back_and_what_it_lost(
    kit: Kit, tmp_path: Path, capsys, monkeypatch
) -> None:
    """A machine without uv (stand-in: find_uv answers None; this venv has uv): auto falls
    back to pip and says that --torch-backend was not applied."""
    from pinwheel.release import install as install_mod

    monkeypatch.setattr(install_mod, "find_uv", lambda: None)
    venv = tmp_path / "venv"
    rc = main(
        ["--manifest", str(kit.manifest), "install", str(kit.release), "--venv", str(venv),
         "--no-deps", "--torch-backend", "cu128"]
    )  # fmt: skip
    seen = capsys.readouterr()
    assert rc == 0, seen.err
    assert "uv not found: installed with pip" in seen.err
    assert "--torch-backend cu128 was not applied" in seen.err
    assert "with pip" in seen.out

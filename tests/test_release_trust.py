"""Signatures on by default, the in-toto/SLSA attestation and `pinwheel verify-release`.

Real parts: ssh-keygen keys and signatures (and ssh-keygen verifying the DSSE signature by
hand), `pinwheel release` through the CLI, a real local HTTP server, pip into a fresh venv.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pinwheel.checksums import sha256_file
from pinwheel.cli import main
from pinwheel.errors import EXIT_VERIFY
from pinwheel.release import attest
from releasekit import ReleaseServer, make_key, make_wheel, write_manifest, write_provenance

pytestmark = pytest.mark.release

A = "pwa-1.0-py3-none-any.whl"
B = "pwb-2.0-py3-none-any.whl"
REPO = Path(__file__).parents[1]


@dataclass(frozen=True)
class Rel:
    manifest: Path
    dir: Path
    key: Path
    signers: Path


@pytest.fixture(scope="module")
def rel(tmp_path_factory: pytest.TempPathFactory) -> Rel:
    root = tmp_path_factory.mktemp("trust")
    build = root / "wheels"
    make_wheel(build, "pwa", "1.0", payload=8_000, seed=1)
    make_wheel(build, "pwb", "2.0", payload=4_000, seed=2)
    write_provenance(build, {n: sha256_file(build / n) for n in (A, B)})
    key, signers = make_key(root / "keys")
    manifest = write_manifest(root, release='[release]\nallowed_signers = "keys/allowed_signers"\n')
    rc = main(["--manifest", str(manifest), "release", "--key", str(key),
               "--builder-id", "https://ci.example.invalid/release.yml@refs/tags/v1"])  # fmt: skip
    assert rc == 0
    return Rel(manifest, root / "release", key, signers)


def _copy(rel: Rel, tmp: Path) -> Path:
    out = tmp / "copy"
    shutil.copytree(rel.dir, out)
    return out


def _verify(rel: Rel, source: str, *extra: str) -> int:
    return main(["--json", "verify-release", source, "--allowed-signers", str(rel.signers), *extra])


def _envelope(directory: Path) -> dict:
    return json.loads((directory / attest.FILENAME).read_text())


def _statement(envelope: dict) -> dict:
    return json.loads(base64.b64decode(envelope["payload"]))


# --------------------------------------------------------------------------- on by default


def test_fetch_without_signers_is_refused_and_nothing_is_fetched(rel: Rel, tmp_path, capsys):
    bare = write_manifest(tmp_path)  # no [release] allowed_signers
    dest = tmp_path / "dl"
    rc = main(["--manifest", str(bare), "fetch", str(rel.dir), "--dest", str(dest)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == EXIT_VERIFY and "no allowed_signers" in err and "--allow-unsigned" in err
    assert not dest.exists()


def test_install_without_signers_is_refused_before_the_venv(rel: Rel, tmp_path, capsys):
    bare = write_manifest(tmp_path)
    venv = tmp_path / "venv"
    rc = main(["--manifest", str(bare), "install", str(rel.dir), "--venv", str(venv), "--no-deps"])
    assert rc == EXIT_VERIFY and "no allowed_signers" in capsys.readouterr().err
    assert not venv.exists()


def test_allow_unsigned_is_stated_in_the_output_and_the_install_receipt(rel: Rel, tmp_path, capsys):
    bare = write_manifest(tmp_path)
    venv = tmp_path / "venv"
    rc = main(["--manifest", str(bare), "install", str(rel.dir), "--venv", str(venv),
               "--no-deps", "--installer", "pip", "--allow-unsigned"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "SIGNATURE NOT VERIFIED (--allow-unsigned)" in out
    receipt = json.loads((venv / "pinwheel-install.json").read_text())
    assert receipt["allow_unsigned"] is True
    assert receipt["signature"] == "SIGNATURE NOT VERIFIED (--allow-unsigned)"
    assert receipt["wheels"] == {A: sha256_file(rel.dir / A), B: sha256_file(rel.dir / B)}
    rc = main(["--manifest", str(bare), "fetch", str(rel.dir), "--dest", str(tmp_path / "d"),
               "--allow-unsigned", "--allowed-signers", str(rel.signers)])  # fmt: skip
    assert rc == 2  # contradictory flags: a usage error, nothing fetched
    assert not (tmp_path / "d").exists()


def test_a_verified_install_says_who_signed(rel: Rel, tmp_path, capsys):
    venv = tmp_path / "venv"
    rc = main(["--manifest", str(rel.manifest), "install", str(rel.dir), "--venv", str(venv),
               "--no-deps", "--installer", "pip"])  # fmt: skip
    assert rc == 0 and "signed by release@pinwheel.test" in capsys.readouterr().out
    receipt = json.loads((venv / "pinwheel-install.json").read_text())
    assert receipt["signature"] == "verified: signed by release@pinwheel.test"
    assert receipt["allow_unsigned"] is False


def test_the_committed_allowed_signers_lists_no_key_and_fetch_says_fill_in(
    rel: Rel, tmp_path, capsys
):
    committed = REPO / "keys" / "allowed_signers"
    rc = main(["--manifest", str(rel.manifest), "fetch", str(rel.dir), "--dest",
               str(tmp_path / "dl"), "--allowed-signers", str(committed)])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert rc == EXIT_VERIFY and "lists no key (FILL IN" in err
    assert not (tmp_path / "dl").exists()
    from pinwheel.manifest import load

    for path in [REPO / "manifest.toml", *sorted(REPO.glob("recipes/*/manifest.toml"))]:
        config = load(path).release
        assert config is not None and config.allowed_signers is not None, path
        assert config.allowed_signers.resolve() == committed.resolve(), path


# --------------------------------------------------------------------------- the attestation


def test_statement_is_in_toto_slsa_and_ssh_keygen_verifies_the_dsse_signature(rel: Rel, tmp_path):
    env = _envelope(rel.dir)
    assert env["payloadType"] == "application/vnd.in-toto+json"
    doc = _statement(env)
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in doc["subject"]}
    assert subjects == {A: sha256_file(rel.dir / A), B: sha256_file(rel.dir / B),
                        "SHA256SUMS": sha256_file(rel.dir / "SHA256SUMS")}  # fmt: skip
    pred = doc["predicate"]
    assert (
        pred["runDetails"]["builder"]["id"] == "https://ci.example.invalid/release.yml@refs/tags/v1"
    )
    deps = {d["name"]: d for d in pred["buildDefinition"]["resolvedDependencies"]}
    from pinwheel.manifest import load

    assert deps["manifest.toml"]["digest"] == {"sha256": load(rel.manifest).sha256}
    assert deps["provenance.json"]["digest"] == {"sha256": sha256_file(rel.dir / "provenance.json")}
    assert deps["upstream base"]["digest"] == {"gitCommit": "1" * 40}
    assert deps["step 2"]["uri"].endswith("@refs/pull/12/head")
    # by hand, with OpenSSH alone: the signature covers the DSSE PAE bytes
    payload = base64.b64decode(env["payload"])
    sig = tmp_path / "sig"
    sig.write_bytes(base64.b64decode(env["signatures"][0]["sig"]))
    pae = attest.pae(env["payloadType"], payload)
    assert pae.startswith(b"DSSEv1 28 application/vnd.in-toto+json ")
    ok = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(rel.signers), "-I",
                         "release@pinwheel.test", "-n", "pinwheel-attestation", "-s", str(sig)],
                        input=pae, capture_output=True)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    wrong_ns = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(rel.signers), "-I",
                               "release@pinwheel.test", "-n", "pinwheel", "-s", str(sig)],
                              input=pae, capture_output=True)  # fmt: skip
    assert wrong_ns.returncode != 0  # not a SHA256SUMS signature


def test_verify_release_passes_on_a_dir_and_a_url(rel: Rel, capsys):
    assert _verify(rel, str(rel.dir)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["attestation_signed_by"] == "release@pinwheel.test"
    assert sorted(doc["subjects"]) == sorted([A, B, "SHA256SUMS"])
    assert doc["sigstore"] == []
    with ReleaseServer(rel.dir) as srv:
        assert _verify(rel, srv.url) == 0
    assert json.loads(capsys.readouterr().out)["sums_signed_by"] == "release@pinwheel.test"


def test_verify_release_refuses_a_tampered_wheel(rel: Rel, tmp_path, capsys):
    copy = _copy(rel, tmp_path)
    other = make_wheel(tmp_path / "o", "pwb", "2.0", payload=4_000, seed=77)
    (copy / B).unlink()
    shutil.copy(other, copy / B)
    assert _verify(rel, str(copy)) == EXIT_VERIFY
    assert "sha256 mismatch" in capsys.readouterr().err


def test_verify_release_refuses_a_tampered_statement(rel: Rel, tmp_path, capsys):
    copy = _copy(rel, tmp_path)
    env = _envelope(copy)
    doc = _statement(env)
    doc["predicate"]["runDetails"]["builder"]["id"] = "https://evil.example.invalid/"
    env["payload"] = base64.b64encode(json.dumps(doc).encode()).decode()  # old signature kept
    (copy / attest.FILENAME).write_text(json.dumps(env))
    assert _verify(rel, str(copy)) == EXIT_VERIFY
    assert "attestation's signature does not verify" in capsys.readouterr().err


def test_verify_release_refuses_an_attestation_by_a_wrong_signer(rel: Rel, tmp_path, capsys):
    copy = _copy(rel, tmp_path)
    evil_key, _ = make_key(tmp_path / "evil", principal="release@pinwheel.test")
    attest.write_envelope(copy, _statement(_envelope(copy)), evil_key)  # same statement
    assert _verify(rel, str(copy)) == EXIT_VERIFY
    assert "attestation's signature does not verify" in capsys.readouterr().err
    # and a whole release signed by another key: SHA256SUMS is refused first
    _, evil_signers = make_key(tmp_path / "evil2")
    rc = main(["verify-release", str(rel.dir), "--allowed-signers", str(evil_signers)])
    assert rc == EXIT_VERIFY and "does not verify" in capsys.readouterr().err


def test_verify_release_refuses_subjects_that_do_not_match(rel: Rel, tmp_path, capsys):
    """Signed by the right key, but the statement leaves a wheel out: still refused."""
    copy = _copy(rel, tmp_path)
    doc = _statement(_envelope(copy))
    doc["subject"] = [s for s in doc["subject"] if s["name"] != B]
    attest.write_envelope(copy, doc, rel.key)
    assert _verify(rel, str(copy)) == EXIT_VERIFY
    assert f"{B} is not a subject of the attestation" in capsys.readouterr().err


def test_a_sigstore_bundle_without_an_identity_to_expect_is_reported_not_verified(
    rel: Rel, tmp_path, capsys
):
    """No [release.github] repo and no --sigstore-repo: reported, never called verified
    (tests/test_sigstore_bundle.py verifies a real one)."""
    copy = _copy(rel, tmp_path)
    (copy / "SHA256SUMS.sigstore.json").write_text(
        '{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}'
    )
    assert _verify(rel, str(copy)) == 0
    (line,) = json.loads(capsys.readouterr().out)["sigstore"]
    assert "NOT verified" in line
    assert "--sigstore-repo" in line or "sigstore-python is not installed" in line


@pytest.mark.parametrize(
    "envelope",
    [
        b"not json\x1b[2J",
        b'{"payloadType": "application/vnd.in-toto+json", "payload": "!!!", "signatures": []}',
        b'{"payloadType": "text/plain", "payload": "", "signatures": []}',
        b"[" * 5000 + b"]" * 5000,
        '{"payloadType": "application/vnd.in-toto+json", "payload": "é"}'.encode(),
    ],
)
def test_a_hostile_envelope_is_refused_cleanly(rel: Rel, tmp_path, capsys, envelope: bytes):
    copy = _copy(rel, tmp_path)
    (copy / attest.FILENAME).write_bytes(envelope)
    assert _verify(rel, str(copy)) == EXIT_VERIFY
    err = capsys.readouterr().err
    assert attest.FILENAME in err and "Traceback" not in err


def test_a_huge_envelope_is_refused_before_it_is_read(rel: Rel, tmp_path, capsys):
    copy = _copy(rel, tmp_path)
    with open(copy / attest.FILENAME, "r+b") as fh:
        fh.truncate(1 << 30)  # sparse: never read
    assert _verify(rel, str(copy)) == EXIT_VERIFY
    assert "more than" in capsys.readouterr().err


def test_an_unsigned_release_carries_an_unsigned_envelope_that_verify_refuses(tmp_path, capsys):
    build = tmp_path / "wheels"
    made = make_wheel(build, "pwa", "1.0", seed=5)
    write_provenance(build, {made.name: sha256_file(made)})
    manifest = write_manifest(tmp_path)
    assert main(["--manifest", str(manifest), "release", "--no-sign"]) == 0
    assert _envelope(tmp_path / "release")["signatures"] == []
    _, signers = make_key(tmp_path / "k")
    rc = main(["verify-release", str(tmp_path / "release"), "--allowed-signers", str(signers)])
    assert rc == EXIT_VERIFY
    capsys.readouterr()
    rc = main(["--json", "verify-release", str(tmp_path / "release"), "--allow-unsigned"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["allow_unsigned"] is True and doc["attestation_signed_by"] is None

"""`pinwheel verify-release` verifies a Sigstore bundle beside the release offline.

Real parts: a real Sigstore bundle (public-good instance, GitHub Actions identity, Rekor
entry) and the file it signs, from pypi-attestations 0.0.30's sdist on PyPI (Apache-2.0;
tests/fixtures/sigstore/README.md); sigstore-python (the `sigstore` extra, locked) with
its embedded trusted root; ssh-keygen keys signing SHA256SUMS and pinwheel's own DSSE
attestation. Every test runs with sockets blocked: a connection attempt fails the test.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from pinwheel.checksums import SUMS, sha256_file, write_sums
from pinwheel.cli import main
from pinwheel.errors import EXIT_VERIFY
from pinwheel.release import attest, signing, sigstorebundle
from releasekit import make_key, make_wheel, write_manifest

try:
    import sigstore  # noqa: F401

    HAVE_SIGSTORE = True
except ImportError:
    HAVE_SIGSTORE = False

# Each test's skip fails under CI (PINWHEEL_CI=1: conftest.DECLARED names sigstore-python).
pytestmark = [
    pytest.mark.release,
    pytest.mark.skipif(
        not HAVE_SIGSTORE,
        reason="sigstore-python is not installed (the sigstore extra, in locks/tests.txt)",
    ),
]

FIX = Path(__file__).parent / "fixtures" / "sigstore"
ARTIFACT = "pypi_attestation_models-0.0.4a2.tar.gz"
BUNDLE = ARTIFACT + ".sigstore"
SIGNER_REPO = "trailofbits/pypi-attestation-models"  # the bundle's certificate names it
IDENTITY = f"https://github.com/{SIGNER_REPO}/.github/workflows/release.yml@refs/tags/v0.0.4a2"


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every way out of the machine fails the test (and is recorded)."""
    tried: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        tried.append(repr(args)[:200])
        raise AssertionError(f"network used during offline verification: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return tried


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_key(tmp_path_factory.mktemp("sigstore-keys"))


def _release(root: Path, key: Path, files: dict[str, Path], bundle: Path | None = None) -> Path:
    """A release signed as `pinwheel release` signs one: SHA256SUMS over ``files`` and its
    signature, pinwheel's DSSE attestation (every wheel and SHA256SUMS its subjects), and
    the bundle beside them."""
    out = root / "release"
    out.mkdir(parents=True)
    for name, src in files.items():
        shutil.copy(src, out / name)
    write_sums(out, sorted(files))
    signing.sign(out / SUMS, key)
    subjects = {n: sha256_file(out / n) for n in (*files, SUMS) if n.endswith((".whl", SUMS))}
    attest.write_envelope(out, attest.statement(subjects, [], attest.LOCAL_BUILDER, {}, {}), key)
    shutil.copy(bundle or FIX / BUNDLE, out / BUNDLE)
    return out


def _verify(directory: Path, signers: Path, *extra: str) -> int:
    return main(["--json", "verify-release", str(directory), "--allowed-signers", str(signers),
                 *extra])  # fmt: skip


def test_a_real_bundle_verifies_offline(tmp_path, keys, capsys, no_network):
    key, signers = keys
    rel = _release(tmp_path, key, {ARTIFACT: FIX / ARTIFACT})
    assert _verify(rel, signers, "--sigstore-repo", SIGNER_REPO) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sigstore_verified"] == [BUNDLE]
    (line,) = doc["sigstore"]
    assert f"signed by {IDENTITY}" in line and "verified offline" in line
    assert no_network == []


def test_the_identity_comes_from_the_manifest_and_a_wrong_one_fails(tmp_path, keys, capsys):
    key, signers = keys
    rel = _release(tmp_path, key, {ARTIFACT: FIX / ARTIFACT})
    (tmp_path / "good").mkdir()
    (tmp_path / "other").mkdir()
    good = write_manifest(tmp_path / "good", release=f'[release.github]\nrepo = "{SIGNER_REPO}"\n')
    rc = main(["--manifest", str(good), "--json", "verify-release", str(rel),
               "--allowed-signers", str(signers)])  # fmt: skip
    assert rc == 0 and json.loads(capsys.readouterr().out)["sigstore_verified"] == [BUNDLE]
    # the same repository, another workflow: the policy is the whole SAN, not the repository
    other = write_manifest(tmp_path / "other", release=(
        f'[release.github]\nrepo = "{SIGNER_REPO}"\n'
        '[release.sigstore]\nworkflow = ".github/workflows/publish.yml"\n'))  # fmt: skip
    rc = main(["--manifest", str(other), "verify-release", str(rel),
               "--allowed-signers", str(signers)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == EXIT_VERIFY
    assert f"identity {IDENTITY} is not" in err and ".github/workflows/publish.yml" in err
    assert BUNDLE in err and "[release.sigstore]" in err and "Traceback" not in err
    # another repository named on the command line
    assert _verify(rel, signers, "--sigstore-repo", "pinwheel-org/pinwheel") == EXIT_VERIFY
    err = capsys.readouterr().err
    assert "https://github.com/pinwheel-org/pinwheel/.github/workflows/release.yml" in err


def test_a_tampered_artifact_fails_even_under_correct_pinwheel_signatures(tmp_path, keys, capsys):
    """SHA256SUMS and pinwheel's attestation are re-signed over the changed file: only the
    Sigstore bundle still knows the original bytes."""
    key, signers = keys
    changed = tmp_path / ARTIFACT
    changed.write_bytes(FIX.joinpath(ARTIFACT).read_bytes() + b"\0")
    rel = _release(tmp_path / "r", key, {ARTIFACT: changed})
    assert _verify(rel, signers, "--sigstore-repo", SIGNER_REPO) == EXIT_VERIFY
    err = capsys.readouterr().err
    assert f"{BUNDLE} is signed by {IDENTITY} but does not match the release" in err
    assert f"{ARTIFACT}: sha256 {sha256_file(changed)} is not the attested" in err
    assert "pinwheel fetch" in err


def test_a_subject_that_is_not_in_the_release_or_a_wheel_it_leaves_out_fails(
    tmp_path, keys, capsys
):
    key, signers = keys
    # the signed file under another name: the bundle's subject is not a file of the release
    rel = _release(tmp_path / "renamed", key, {"renamed-0.1.tar.gz": FIX / ARTIFACT})
    assert _verify(rel, signers, "--sigstore-repo", SIGNER_REPO) == EXIT_VERIFY
    assert f"subject {ARTIFACT} is not a file of the release" in capsys.readouterr().err
    # a wheel the bundle does not cover (and SHA256SUMS is not its subject)
    wheel = make_wheel(tmp_path / "w", "pwx", "1.0", payload=100)
    rel = _release(tmp_path / "extra", key, {ARTIFACT: FIX / ARTIFACT, wheel.name: wheel})
    assert _verify(rel, signers, "--sigstore-repo", SIGNER_REPO) == EXIT_VERIFY
    assert f"{wheel.name} is not a subject of the bundle (nor is {SUMS})" in (
        capsys.readouterr().err
    )


def test_a_changed_signature_or_statement_does_not_verify(tmp_path, keys, capsys):
    key, signers = keys
    doc = json.loads(FIX.joinpath(BUNDLE).read_text())
    sig = doc["dsseEnvelope"]["signatures"][0]["sig"]
    doc["dsseEnvelope"]["signatures"][0]["sig"] = ("A" if sig[0] != "A" else "B") + sig[1:]
    forged = tmp_path / "forged.sigstore"
    forged.write_text(json.dumps(doc))
    rel = _release(tmp_path / "r", key, {ARTIFACT: FIX / ARTIFACT}, bundle=forged)
    assert _verify(rel, signers, "--sigstore-repo", SIGNER_REPO) == EXIT_VERIFY
    err = capsys.readouterr().err
    assert f"{BUNDLE} does not verify offline" in err and "Traceback" not in err


def _junk_certificate() -> bytes:
    doc = json.loads(FIX.joinpath(BUNDLE).read_text())
    material = doc["verificationMaterial"]
    key = "certificate" if "certificate" in material else "x509CertificateChain"
    if key == "certificate":
        material[key]["rawBytes"] = "anVuaw=="  # base64 of b"junk"
    else:
        material[key]["certificates"][0]["rawBytes"] = "anVuaw=="
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "content",
    [
        _junk_certificate(),
        b"not json\x1b[2J",
        b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}',
        b'{"mediaType": "text/html"}',
        b"[" * 5000 + b"]" * 5000,
    ],
)
def test_a_hostile_bundle_is_refused_cleanly(tmp_path, keys, capsys, content: bytes):
    key, signers = keys
    hostile = tmp_path / "hostile"
    hostile.write_bytes(content)
    rel = _release(tmp_path / "r", key, {ARTIFACT: FIX / ARTIFACT}, bundle=hostile)
    assert _verify(rel, signers, "--sigstore-repo", SIGNER_REPO) == EXIT_VERIFY
    err = capsys.readouterr().err
    assert BUNDLE in err and "Traceback" not in err and "\x1b[2J" not in err


def test_a_huge_bundle_is_refused_before_it_is_read(tmp_path, keys, capsys):
    key, signers = keys
    rel = _release(tmp_path, key, {ARTIFACT: FIX / ARTIFACT})
    with open(rel / BUNDLE, "r+b") as fh:
        fh.truncate(1 << 30)  # sparse: never read
    assert _verify(rel, signers, "--sigstore-repo", SIGNER_REPO) == EXIT_VERIFY
    assert "more than" in capsys.readouterr().err


def test_without_an_identity_to_expect_the_bundle_is_reported_not_verified(
    tmp_path, keys, capsys
):
    key, signers = keys
    rel = _release(tmp_path, key, {ARTIFACT: FIX / ARTIFACT})
    assert _verify(rel, signers) == 0
    doc = json.loads(capsys.readouterr().out)
    (line,) = doc["sigstore"]
    assert doc["sigstore_verified"] == []
    assert "NOT verified: no identity to expect" in line and "--sigstore-repo" in line


def test_the_identity_policy_is_the_whole_san() -> None:
    policy = sigstorebundle.IdentityPolicy(SIGNER_REPO)
    assert policy.san_matches(IDENTITY)
    for san in (
        IDENTITY.replace("refs/tags/", "refs/heads/"),
        IDENTITY.replace(SIGNER_REPO, SIGNER_REPO + "-fork"),
        IDENTITY.replace("release.yml", "release.yml.evil"),
        IDENTITY + " x",
        f"https://github.com/{SIGNER_REPO}/.github/workflows/release.yml@refs/tags/",
    ):
        assert not policy.san_matches(san), san


def test_the_log_index_comes_from_the_public_bundle_json(tmp_path, keys, capsys):
    """The Rekor index said is the bundle file's own tlogEntries[0].logIndex (read here from
    the fixture's JSON), through Bundle.to_json, never sigstore-python's private objects."""
    key, signers = keys
    raw = json.loads((FIX / BUNDLE).read_text())
    want = int(raw["verificationMaterial"]["tlogEntries"][0]["logIndex"])
    rel = _release(tmp_path, key, {ARTIFACT: FIX / ARTIFACT})
    assert _verify(rel, signers, "--sigstore-repo", SIGNER_REPO) == 0
    (line,) = json.loads(capsys.readouterr().out)["sigstore"]
    assert f"Rekor entry {want}," in line
    source = Path(sigstorebundle.__file__).read_text()
    assert "._inner" not in source  # no private attribute of sigstore-python's objects


def test_the_one_private_sigstore_name_kept_is_still_there():
    """sigstorebundle reads the public-good trusted root sigstore-python embeds, from its
    resource folder sigstore._store (private: the public offline API reads the user's TUF
    cache instead). This fails, naming it, the day a sigstore release moves that file."""
    import hashlib
    import urllib.parse
    from importlib import resources

    from sigstore.models import TrustedRoot

    ref = resources.files("sigstore._store").joinpath(
        urllib.parse.quote(sigstorebundle.PUBLIC_GOOD_TUF, safe=""), "trusted_root.json"
    )
    with resources.as_file(ref) as path:
        assert Path(path).is_file(), f"sigstore-python no longer embeds {ref}"
        TrustedRoot.from_file(str(path))  # still the format the public API reads
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    root, said = sigstorebundle._trusted_root(__import__("sigstore.models").models)
    assert said == digest and root is not None

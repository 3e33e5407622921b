"""Every file of a release travels with it and is checked wherever it lands (issue 47 items
3, 4 and 7; issue 53 item 3): fetch carries SHA256SUMS, its signature, the in-toto
attestation and a Sigstore bundle; fetch, install and verify-release refuse the same
tampering; the attestation names the GitHub Actions run that made it; a first key is one
command; every refusal names a command and flags that exist.

Real parts: `pinwheel release` through the CLI with ssh-keygen keys, a real HTTP server on
loopback (releasekit.ReleaseServer, and `pinwheel index` served by the static-index test's
server), pip installing into fresh venvs, a real Sigstore bundle (tests/fixtures/sigstore).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pinwheel.checksums import SIG, SUMS, sha256_file
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
    root: Path
    manifest: Path
    dir: Path
    key: Path
    signers: Path


@pytest.fixture(scope="module")
def rel(tmp_path_factory: pytest.TempPathFactory) -> Rel:
    root = tmp_path_factory.mktemp("carry")
    build = root / "wheels"
    make_wheel(build, "pwa", "1.0", payload=6_000, seed=1)
    make_wheel(build, "pwb", "2.0", payload=3_000, seed=2)
    write_provenance(build, {n: sha256_file(build / n) for n in (A, B)})
    key, signers = make_key(root / "keys")
    manifest = write_manifest(root, release='[release]\nallowed_signers = "keys/allowed_signers"\n')
    assert main(["--manifest", str(manifest), "release", "--key", str(key)]) == 0
    return Rel(root, manifest, root / "release", key, signers)


def _cli(rel: Rel, *argv: str) -> int:
    return main(["--manifest", str(rel.manifest), *argv])


def _tamper_attestation(directory: Path) -> None:
    """Another builder in the statement, the signature left as it was."""
    path = directory / attest.FILENAME
    env = json.loads(path.read_text())
    doc = json.loads(base64.b64decode(env["payload"]))
    doc["predicate"]["runDetails"]["builder"]["id"] = "https://evil.invalid/builder"
    env["payload"] = base64.b64encode(json.dumps(doc).encode()).decode()
    path.write_text(json.dumps(env) + "\n")


# --------------------------------------------------------------------------- item 3: fetch


@pytest.mark.parametrize("listing", [True, False])
def test_fetch_carries_the_attestation_and_verify_release_passes_on_what_it_wrote(
    rel: Rel, tmp_path: Path, capsys: pytest.CaptureFixture[str], listing: bool
) -> None:
    """fetch used to leave attestation.intoto.jsonl behind: verify-release on its folder
    always exited 6."""
    dest = tmp_path / "dl"
    with ReleaseServer(rel.dir) as srv:
        srv.listing = listing  # a GitHub release base has no listing page
        assert _cli(rel, "fetch", srv.url, "--dest", str(dest)) == 0
    out = capsys.readouterr().out
    assert "attestation.intoto.jsonl: 3 subjects match, signed by release@pinwheel.test" in out
    for name in (SUMS, SIG, attest.FILENAME, A, B):
        assert (dest / name).read_bytes() == (rel.dir / name).read_bytes(), name
    assert _cli(rel, "verify-release", str(dest)) == 0
    assert "release OK" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["server", "folder"])
def test_a_tampered_attestation_is_refused_by_fetch_install_and_verify_release(
    rel: Rel, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(rel.dir, bad)
    _tamper_attestation(bad)
    dest = tmp_path / "dl"
    if where == "server":
        with ReleaseServer(bad) as srv:
            assert _cli(rel, "fetch", srv.url, "--dest", str(dest)) == EXIT_VERIFY
            assert _cli(rel, "verify-release", srv.url) == EXIT_VERIFY
    else:
        assert _cli(rel, "fetch", str(bad), "--dest", str(dest)) == EXIT_VERIFY
        assert _cli(rel, "verify-release", str(bad)) == EXIT_VERIFY
    err = capsys.readouterr().err
    assert err.count("the attestation's signature does not verify") == 2, err
    assert not (dest / SUMS).exists() and not (dest / attest.FILENAME).exists()  # not "complete"
    venv = tmp_path / "venv"
    assert _cli(rel, "install", str(bad), "--venv", str(venv), "--no-deps",
                "--installer", "pip") == EXIT_VERIFY  # fmt: skip
    assert "the attestation's signature does not verify" in capsys.readouterr().err
    assert not venv.exists()


def test_install_refuses_a_signed_release_without_its_attestation(
    rel: Rel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(rel.dir, bare)
    (bare / attest.FILENAME).unlink()
    venv = tmp_path / "venv"
    assert _cli(rel, "install", str(bare), "--venv", str(venv), "--no-deps") == EXIT_VERIFY
    err = " ".join(capsys.readouterr().err.split())
    assert "carries no attestation" in err and "pinwheel fetch" in err and not venv.exists()


def test_a_verified_install_checks_the_attestation_and_says_so(
    rel: Rel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    venv = tmp_path / "venv"
    assert _cli(rel, "--json", "install", str(rel.dir), "--venv", str(venv), "--no-deps",
                "--installer", "pip") == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["attestation"][0].startswith("attestation.intoto.jsonl: 3 subjects match, "
                                            "signed by release@pinwheel.test")  # fmt: skip


def test_fetch_with_sums_from_an_index_keeps_the_signature_and_install_checks_it(
    rel: Rel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fetch INDEX --sums URL` checked the signature and dropped it: install then refused."""
    from test_static_index import IndexServer

    index = tmp_path / "index"
    assert _cli(rel, "index", str(rel.dir), "--out", str(index)) == 0
    dest = tmp_path / "dl"
    with IndexServer(index) as srv:
        assert _cli(rel, "fetch", f"{srv.url}all/simple/pwa/", "--sums",
                    f"{srv.url}files/SHA256SUMS", "--dest", str(dest)) == 0  # fmt: skip
        assert _cli(rel, "verify-release", f"{srv.url}all/simple/pwa/", "--sums",
                    f"{srv.url}files/SHA256SUMS") == 0  # fmt: skip
        assert _cli(rel, "verify-release", f"{srv.url}files/") == 0
    assert (dest / SIG).read_bytes() == (rel.dir / SIG).read_bytes()
    assert (dest / attest.FILENAME).is_file()
    capsys.readouterr()
    venv = tmp_path / "venv"
    assert _cli(rel, "install", str(dest), "--venv", str(venv), "--no-deps",
                "--installer", "pip") == 0  # fmt: skip
    assert "signed by release@pinwheel.test" in capsys.readouterr().out


# --------------------------------------------------------------------------- item 3: Sigstore


def test_a_tampered_sigstore_bundle_is_refused_by_fetch_install_and_verify_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("sigstore")
    from test_sigstore_bundle import ARTIFACT, BUNDLE, FIX, SIGNER_REPO, _release

    key, signers = make_key(tmp_path / "keys")
    doc = json.loads(FIX.joinpath(BUNDLE).read_text())
    sig = doc["dsseEnvelope"]["signatures"][0]["sig"]
    doc["dsseEnvelope"]["signatures"][0]["sig"] = ("A" if sig[0] != "A" else "B") + sig[1:]
    forged = tmp_path / "forged.sigstore"
    forged.write_text(json.dumps(doc))
    good = _release(tmp_path / "good", key, {ARTIFACT: FIX / ARTIFACT})
    bad = _release(tmp_path / "bad", key, {ARTIFACT: FIX / ARTIFACT}, bundle=forged)
    flags = ["--allowed-signers", str(signers), "--sigstore-repo", SIGNER_REPO]
    with ReleaseServer(good) as srv:  # the good one is carried and verified
        assert main(["--json", "fetch", srv.url, "--dest", str(tmp_path / "ok"), *flags]) == 0
    lines = json.loads(capsys.readouterr().out)["attestation"]
    assert any(f"{BUNDLE}: Sigstore bundle verified offline" in line for line in lines)
    assert (tmp_path / "ok" / BUNDLE).read_bytes() == (good / BUNDLE).read_bytes()
    with ReleaseServer(bad) as srv:
        assert main(["fetch", srv.url, "--dest", str(tmp_path / "dl"), *flags]) == EXIT_VERIFY
        assert main(["verify-release", srv.url, *flags]) == EXIT_VERIFY
    assert main(["install", str(bad), "--venv", str(tmp_path / "v"), *flags]) == EXIT_VERIFY
    err = capsys.readouterr().err
    assert err.count(f"{BUNDLE} does not verify offline") == 3, err
    assert not (tmp_path / "dl" / SUMS).exists() and not (tmp_path / "v").exists()


# --------------------------------------------------------------------------- item 4: builder


def test_release_under_github_actions_names_the_workflow_as_its_builder(
    rel: Rel, tmp_path: Path
) -> None:
    """The variables Actions sets, nothing passed by hand: the builder used to be local."""
    out = tmp_path / "ci-release"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env.update(GITHUB_ACTIONS="true", CI="true", GITHUB_SERVER_URL="https://github.com",
               GITHUB_REPOSITORY="pinwheel-org/pinwheel", GITHUB_RUN_ID="123456789",
               GITHUB_RUN_ATTEMPT="2", GITHUB_REF="refs/tags/kit-20261010",
               GITHUB_WORKFLOW_REF="pinwheel-org/pinwheel/.github/workflows/release.yml"
               "@refs/tags/kit-20261010")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pinwheel", "--manifest", str(rel.manifest), "release",
         "--key", str(rel.key), "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    envelope = json.loads((out / attest.FILENAME).read_text())
    run = json.loads(base64.b64decode(envelope["payload"]))["predicate"]["runDetails"]
    assert run["builder"]["id"] == ("https://github.com/pinwheel-org/pinwheel/.github/workflows/"
                                    "release.yml@refs/tags/kit-20261010")  # fmt: skip
    assert run["metadata"]["invocationId"] == (
        "https://github.com/pinwheel-org/pinwheel/actions/runs/123456789/attempts/2")
    env.pop("GITHUB_ACTIONS")  # not in Actions: a local build, whatever else is set
    local = tmp_path / "local-release"
    subprocess.run([sys.executable, "-m", "pinwheel", "--manifest", str(rel.manifest),
                    "release", "--key", str(rel.key), "--out", str(local)],
                   check=True, capture_output=True, env=env, cwd=tmp_path)  # fmt: skip
    envelope = json.loads((local / attest.FILENAME).read_text())
    run = json.loads(base64.b64decode(envelope["payload"]))["predicate"]["runDetails"]
    assert run == {"builder": {"id": attest.LOCAL_BUILDER}}


def test_a_hostile_workflow_ref_is_a_usage_error_naming_the_variable(
    rel: Rel, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_WORKFLOW_REF", "o/r/.github/workflows/x.yml@refs/tags/v1 --x")
    assert _cli(rel, "release", "--no-sign", "--out", str(tmp_path / "r")) == 2
    assert "GITHUB_WORKFLOW_REF" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_release_yml_passes_no_builder_by_hand() -> None:
    text = (REPO / ".github/workflows/release.yml").read_text()
    assert "--builder-id" not in text and "github.workflow_ref" not in text
    assert "GITHUB_WORKFLOW_REF:" not in text and "GITHUB_WORKFLOW_REF=" not in text


# --------------------------------------------------------------------------- item 7: keys


def test_keygen_makes_a_first_key_that_release_signs_with_and_fetch_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build = tmp_path / "wheels"
    made = make_wheel(build, "pwa", "1.0", seed=1)
    write_provenance(build, {made.name: sha256_file(made)})
    (tmp_path / "keys").mkdir()
    shutil.copy(REPO / "keys" / "allowed_signers", tmp_path / "keys" / "allowed_signers")
    manifest = write_manifest(tmp_path, release='[release]\nallowed_signers = '
                              '"keys/allowed_signers"\nprincipal = "kit-release"\n')  # fmt: skip
    key = tmp_path / "secret" / "release_key"
    rc = main(["--manifest", str(manifest), "release", "--key", str(tmp_path / "none")])
    assert rc != 0  # no key yet
    capsys.readouterr()
    assert main(["--manifest", str(manifest), "keygen", "--key", str(key)]) == 0
    out = capsys.readouterr().out
    assert "kit-release" in out and "pinwheel release --key" in out
    lines = (tmp_path / "keys" / "allowed_signers").read_text().splitlines()
    assert lines[-1].startswith('kit-release namespaces="pinwheel,pinwheel-attestation" ssh-ed25519 ')
    assert lines[0].startswith("#")  # the file's comments are kept
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert main(["--manifest", str(manifest), "release", "--key", str(key)]) == 0
    assert main(["--manifest", str(manifest), "verify-release", str(tmp_path / "release")]) == 0
    capsys.readouterr()
    assert main(["--manifest", str(manifest), "keygen", "--key", str(key)]) == 1
    assert "never overwritten" in capsys.readouterr().err


def _flags_of(command: str) -> set[str]:
    """The flags `pinwheel COMMAND --help` lists (the parser's own truth)."""
    done = subprocess.run([sys.executable, "-m", "pinwheel", command, "--help"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    import re

    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", done.stdout))


def _named_flags(text: str) -> set[str]:
    import re

    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", text))


def test_release_with_a_key_the_signers_file_lacks_names_flags_release_has(
    rel: Rel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It suggested --allow-unsigned and --allowed-signers, which release rejects."""
    (tmp_path / "keys").mkdir()
    shutil.copy(REPO / "keys" / "allowed_signers", tmp_path / "keys" / "allowed_signers")
    build = tmp_path / "wheels"
    made = make_wheel(build, "pwa", "1.0", seed=1)
    write_provenance(build, {made.name: sha256_file(made)})
    manifest = write_manifest(tmp_path, release='[release]\nallowed_signers = '
                              '"keys/allowed_signers"\n')  # fmt: skip
    rc = main(["--manifest", str(manifest), "release", "--key", str(rel.key)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == EXIT_VERIFY and "pinwheel keygen" in err and "--no-sign" in err
    assert _named_flags(err) <= _flags_of("release") | _flags_of("keygen"), err
    assert not (tmp_path / "release").exists()


# --------------------------------------------------------------------------- issue 53 item 3


def test_fetch_never_writes_into_the_build_output_or_the_release(
    rel: Rel, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    for dest in (rel.root / "wheels", rel.dir):
        before = sorted(p.name for p in dest.iterdir())
        assert _cli(rel, "fetch", str(rel.dir), "--dest", str(dest)) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "never share a folder" in err and "--dest" in err
        assert sorted(p.name for p in dest.iterdir()) == before
    # the default is its own folder, which install reads by default
    monkeypatch.chdir(tmp_path)
    assert _cli(rel, "fetch", str(rel.dir)) == 0
    assert (tmp_path / "fetched-release" / SUMS).is_file()


def test_install_refuses_pinwheel_s_own_venv_unless_named(
    rel: Rel, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """`install` into .venv of a checkout wrote over pinwheel's own environment."""
    own = tmp_path / "checkout"
    (own / ".venv").mkdir(parents=True)
    monkeypatch.chdir(own)
    monkeypatch.setattr(sys, "prefix", str(own / ".venv"))
    assert _cli(rel, "install", str(rel.dir), "--no-deps") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "pinwheel itself runs from" in err and "--venv" in err
    assert not (own / ".venv" / "bin").exists()


def test_verify_release_messages_name_its_own_command_and_flags(
    rel: Rel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = write_manifest(tmp_path)
    with ReleaseServer(rel.dir) as srv:
        rc = main(["--manifest", str(bare), "verify-release", srv.url])
        err = " ".join(capsys.readouterr().err.split())
        assert rc == EXIT_VERIFY and "pinwheel verify-release" in err
        assert "pinwheel fetch" not in err
        assert _named_flags(err) <= _flags_of("verify-release"), err
        rc = main(["--manifest", str(bare), "verify-release", f"{srv.url}simple/pwa/",
                   "--allow-unsigned"])  # fmt: skip
        err = " ".join(capsys.readouterr().err.split())
        assert rc != 0 and "--sums" in err
        assert _named_flags(err) <= _flags_of("verify-release"), err
        # a page of an index pinwheel made: the signed release is at BASE/files/
        rc = main(["--manifest", str(bare), "verify-release", f"{srv.url}all/simple/pwa/",
                   "--allow-unsigned"])  # fmt: skip
        err = " ".join(capsys.readouterr().err.split())
        assert rc != 0 and f"--sums {srv.url}files/SHA256SUMS" in err, err
        assert f"or give {srv.url}files/ itself as the source" in err

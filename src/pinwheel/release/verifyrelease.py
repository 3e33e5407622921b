"""``pinwheel verify-release DIR|URL``: SHA256SUMS, its signature, every file, and the
in-toto attestation (:mod:`pinwheel.release.attest`) checked together.

A URL is fetched first into a temporary directory (every file SHA256SUMS lists, checked
as ``fetch`` checks it, with the attestation and any Sigstore bundle the server has:
``fetch`` carries them); then the directory is verified as a local one is.
"""

from __future__ import annotations

from pathlib import Path

from pinwheel.release import attest, signing, sigstorebundle
from pinwheel.release.assemble import verify_release
from pinwheel.release.download import FetchOptions, fetch_release, resolve_source

COMMAND = "pinwheel verify-release"


def verify_release_dir(
    directory: Path,
    *,
    allowed_signers: Path | None,
    principal: str | None,
    allow_unsigned: bool = False,
    sigstore_policy: sigstorebundle.IdentityPolicy | None = None,
) -> attest.ReleaseCheck:
    """Signatures required unless ``allow_unsigned``; a Sigstore bundle beside the release
    is verified offline against ``sigstore_policy``; raises VerifyError on any failure."""
    signing.require_signers(allowed_signers, allow_unsigned, COMMAND)
    verified = verify_release(directory, allowed_signers=allowed_signers, principal=principal)
    return attest.check_attestation(
        directory, verified, allowed_signers=allowed_signers, principal=principal,
        sigstore_policy=sigstore_policy,
    )  # fmt: skip


def fetch_for_verify(url: str, dest: Path, opts: FetchOptions) -> None:
    """A release URL (or an index project page with ``opts.sums``) into ``dest``: the files
    SHA256SUMS lists (each checked), the signature, the attestation, and a Sigstore bundle
    when the server has one."""
    signing.require_signers(opts.allowed_signers, opts.allow_unsigned, COMMAND)
    fetch_release(resolve_source(url), dest, opts)

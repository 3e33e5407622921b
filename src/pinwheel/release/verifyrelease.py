"""``pinwheel verify-release DIR|URL``: SHA256SUMS, its signature, every file, and the
in-toto attestation (:mod:`pinwheel.release.attest`) checked together.

A URL is fetched first into a temporary directory (every file SHA256SUMS lists,
checked as ``fetch`` checks it, plus the attestation and a Sigstore bundle when
the server has them); then the directory is verified as a local one is.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

from pinwheel.checksums import SUMS
from pinwheel.fsutil import atomic_write_bytes
from pinwheel.release import attest, signing, sigstorebundle
from pinwheel.release.assemble import verify_release
from pinwheel.release.download import FetchError, fetch_release, get_small, resolve_source


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
    signing.require_signers(allowed_signers, allow_unsigned, "pinwheel verify-release")
    verified = verify_release(directory, allowed_signers=allowed_signers, principal=principal)
    return attest.check_attestation(
        directory, verified, allowed_signers=allowed_signers, principal=principal,
        sigstore_policy=sigstore_policy,
    )  # fmt: skip


def fetch_for_verify(url: str, dest: Path, opts: Any) -> None:
    """A release URL into ``dest``: the files SHA256SUMS lists (each checked), the
    signature, the attestation, and a Sigstore bundle when the server has one."""
    fetch_release(resolve_source(url), dest, opts)
    base = url if url.endswith("/") else url + "/"
    for name in (attest.FILENAME, f"{SUMS}.sigstore.json"):
        try:
            data = get_small(urllib.parse.urljoin(base, name), opts, name)
        except FetchError as err:
            if "not found" not in err.what:
                raise
            continue
        atomic_write_bytes(dest / name, data)

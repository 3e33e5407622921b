"""A Sigstore bundle beside a release (GitHub's build-provenance attestation), verified offline.

``actions/attest-build-provenance`` signs an in-toto statement whose subjects are the
files ``SHA256SUMS`` lists (``subject-checksums``) with a short-lived Fulcio certificate
for the workflow's OIDC identity, and logs it in Rekor; the bundle
(``application/vnd.dev.sigstore.bundle.v0.3+json``, or the 0.1/0.2 media types) holds
the certificate, the DSSE envelope and the log entry with its inclusion proof and signed
entry timestamp. ``verify-release`` checks a bundle named ``*.sigstore.json`` or
``*.sigstore`` beside the release:

1. read through :mod:`pinwheel.untrusted` (regular file, size and depth bounded, JSON)
   before sigstore-python parses it;
2. sigstore-python (the ``sigstore`` extra, hash-locked in ``locks/``) verifies the
   certificate chain to the Sigstore public-good Fulcio CA, the signed certificate
   timestamps, the Rekor entry (inclusion proof and signed entry timestamp, against the
   Rekor keys of the root) and the DSSE signature, against the trusted root embedded in
   that pinned package: no TUF refresh, no cache in the user's home, no socket;
3. the identity policy (:class:`IdentityPolicy`): the certificate's issuer is exactly
   GitHub Actions' OIDC issuer and its SAN is exactly
   ``https://github.com/OWNER/REPO/WORKFLOW@refs/tags/TAG`` (any tag name);
4. the statement's subjects against the release: every subject is ``SHA256SUMS`` or a
   file it lists, with the same sha256, and every wheel is covered (by its own subject,
   or by ``SHA256SUMS`` being one).

In: the release directory, the verified ``SHA256SUMS`` entries, the policy (None: the
bundle is reported, not verified). Out: one :class:`BundleCheck` per bundle. Any failure
is a ``VerifyError`` naming the bundle, what failed and what to do.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import untrusted, validate
from pinwheel.checksums import SUMS, sha256_file
from pinwheel.errors import VerifyError

SUFFIXES = (".sigstore.json", ".sigstore")
MEDIA_TYPES = (
    "application/vnd.dev.sigstore.bundle.v0.3+json",
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
    "application/vnd.dev.sigstore.bundle+json;version=0.2",
    "application/vnd.dev.sigstore.bundle+json;version=0.1",
)
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
DEFAULT_WORKFLOW = ".github/workflows/release.yml"
IN_TOTO = "application/vnd.in-toto+json"
STATEMENT_TYPES = ("https://in-toto.io/Statement/v1", "https://in-toto.io/Statement/v0.1")
# The public-good instance's TUF repository: sigstore-python embeds its trusted root
# under this name (the root the package was released with, pinned by the lock's hash).
PUBLIC_GOOD_TUF = "https://tuf-repo-cdn.sigstore.dev"
AGAIN = "do not install this release; fetch it from the publisher again (`pinwheel fetch URL`)"

BUNDLE = untrusted.Kind("Sigstore bundle", 4 * untrusted.MiB, 32, VerifyError, AGAIN)


@dataclass(frozen=True)
class IdentityPolicy:
    """Who must have signed: the release workflow of one GitHub repository, on a tag."""

    repository: str  # owner/name
    workflow: str = DEFAULT_WORKFLOW  # path in the repository
    issuer: str = GITHUB_ISSUER

    @property
    def expected(self) -> str:
        return f"https://github.com/{self.repository}/{self.workflow}@refs/tags/TAG"

    def san_matches(self, san: str) -> bool:
        prefix = f"https://github.com/{self.repository}/{self.workflow}@refs/tags/"
        return san.startswith(prefix) and validate.tag_problem(san[len(prefix):]) is None


@dataclass(frozen=True)
class BundleCheck:
    """One bundle: verified (``identity`` set) or only present (``reason`` says why)."""

    name: str
    verified: bool
    reason: str = ""  # why it was not verified
    identity: str = ""  # the certificate's SAN
    subjects: tuple[str, ...] = ()
    covers_sums: bool = False  # SHA256SUMS itself is a subject
    log_index: int | None = None
    trusted_root_sha256: str = ""

    @property
    def line(self) -> str:
        if not self.verified:
            return f"{self.name}: Sigstore bundle present, NOT verified: {self.reason}"
        covered = (
            f"{SUMS} (and so every file it lists)"
            if self.covers_sums
            else f"{len(self.subjects)} file(s) of {SUMS}"
        )
        return (
            f"{self.name}: Sigstore bundle verified offline: signed by {self.identity}, "
            f"Rekor entry {self.log_index}, subjects match {covered}; trusted root: "
            f"sigstore-python's embedded public-good root (sha256 {self.trusted_root_sha256})"
        )


def bundles(directory: Path) -> list[Path]:
    """The bundle files beside a release, by name (regular files are checked on read)."""
    return sorted(p for p in directory.iterdir() if p.name.endswith(SUFFIXES))


def _sigstore() -> Any:
    """sigstore-python's modules, or None when the extra is not installed."""
    try:
        from sigstore import errors, models  # type: ignore[import-not-found,unused-ignore]
        from sigstore.verify import Verifier, policy  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return errors, models, Verifier, policy


def _trusted_root(models: Any) -> tuple[Any, str]:
    """The public-good trusted root embedded in the pinned sigstore package.

    The one private name kept (``sigstore._store``, its resource folder): the public
    ``ClientTrustConfig.production(offline=True)`` reads whatever the user's TUF cache in
    HOME holds (seeding it from this same file on first use), so the root, and the sha256
    said, would follow that cache instead of the hash-locked package.
    tests/test_sigstore_bundle.py fails the day the embedded file moves."""
    from importlib import resources

    try:
        ref = resources.files("sigstore._store").joinpath(
            urllib.parse.quote(PUBLIC_GOOD_TUF, safe=""), "trusted_root.json"
        )
        with resources.as_file(ref) as path:
            data = Path(path).read_bytes()
            return models.TrustedRoot.from_file(str(path)), hashlib.sha256(data).hexdigest()
    except (OSError, ModuleNotFoundError, ValueError) as exc:
        raise VerifyError(
            f"the installed sigstore-python has no readable embedded public-good trusted root "
            f"({type(exc).__name__}: {str(exc)[:200]})",
            where="sigstore._store",
            next="install the locked sigstore (`pip install --require-hashes -r "
            "locks/replay.txt`) and run `pinwheel verify-release` again",
        ) from None


def _log_index(bundle: Any, path: Path) -> int:
    """The bundle's Rekor log index, from its public serialization (``Bundle.to_json``: the
    protobuf-specs bundle format), not from sigstore-python's private ``_inner`` objects."""
    try:
        doc = json.loads(bundle.to_json())
        return int(doc["verificationMaterial"]["tlogEntries"][0]["logIndex"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise VerifyError(
            f"{path.name} verified but names no Rekor log index ({type(exc).__name__})",
            where=str(path),
            next=AGAIN,
        ) from None


class _Policy:
    """sigstore's VerificationPolicy protocol: issuer exactly, SAN by the workflow rule."""

    def __init__(self, want: IdentityPolicy, sigstore_policy: Any, error: type[Exception]):
        self._want = want
        self._issuer = sigstore_policy.AnyOf(
            [sigstore_policy.OIDCIssuerV2(want.issuer), sigstore_policy.OIDCIssuer(want.issuer)]
        )
        self._error = error
        self.seen = ""

    def verify(self, cert: Any) -> None:
        from cryptography.x509 import SubjectAlternativeName, UniformResourceIdentifier

        try:
            self._issuer.verify(cert)
        except self._error:
            raise self._error(f"the certificate's OIDC issuer is not {self._want.issuer}") from None
        san = cert.extensions.get_extension_for_class(SubjectAlternativeName).value
        uris = san.get_values_for_type(UniformResourceIdentifier)
        self.seen = ", ".join(uris) or "(no URI)"
        if not any(self._want.san_matches(u) for u in uris):
            raise self._error(
                f"the certificate's identity {self.seen} is not {self._want.expected}"
            )


def _read(path: Path) -> bytes:
    raw = untrusted.read_bytes(path, BUNDLE)
    doc = untrusted.parse_json(raw, BUNDLE, str(path))
    if not isinstance(doc, dict) or doc.get("mediaType") not in MEDIA_TYPES:
        media = doc.get("mediaType") if isinstance(doc, dict) else None
        raise untrusted.fail(
            BUNDLE, f"not a Sigstore bundle (mediaType {str(media)[:80]!r})", str(path)
        )
    if "dsseEnvelope" not in doc:
        raise untrusted.fail(
            BUNDLE, "the bundle signs no in-toto statement (no dsseEnvelope)", str(path)
        )
    return raw


def _subjects(payload_type: str, payload: bytes, where: str) -> dict[str, str]:
    if payload_type != IN_TOTO:
        raise untrusted.fail(BUNDLE, f"the envelope's payloadType is not {IN_TOTO}", where)
    doc = untrusted.parse_json(payload, BUNDLE, f"{where} statement")
    if not isinstance(doc, dict) or doc.get("_type") not in STATEMENT_TYPES:
        raise untrusted.fail(BUNDLE, "the payload is not an in-toto statement", where)
    out: dict[str, str] = {}
    for s in doc.get("subject") or []:
        name = s.get("name") if isinstance(s, dict) else None
        digest = (s.get("digest") or {}).get("sha256") if isinstance(s, dict) else None
        if (
            not isinstance(name, str)
            or not isinstance(digest, str)
            or not validate.is_sha256(digest, any_case=True)
            or name in out
        ):
            raise untrusted.fail(
                BUNDLE, f"a subject without one name and sha256: {str(s)[:160]}", where
            )
        out[name] = digest.lower()
    if not out:
        raise untrusted.fail(BUNDLE, "the statement has no subjects", where)
    return out


def _match(subjects: Mapping[str, str], sums: Mapping[str, str], sums_sha256: str) -> list[str]:
    problems = []
    files = {**sums, SUMS: sums_sha256}
    for name, digest in sorted(subjects.items()):
        if name not in files:
            problems.append(f"subject {name} is not a file of the release ({SUMS} lists none)")
        elif files[name] != digest:
            problems.append(f"{name}: sha256 {files[name]} is not the attested {digest}")
    if SUMS not in subjects:
        for name in sorted(n for n in sums if n.endswith(".whl") and n not in subjects):
            problems.append(f"{name} is not a subject of the bundle (nor is {SUMS})")
    return problems


def check(
    directory: Path, sums: Mapping[str, str], policy: IdentityPolicy | None
) -> tuple[BundleCheck, ...]:
    """Every bundle beside the release at ``directory`` whose verified SHA256SUMS entries
    are ``sums``; raises VerifyError on the first bundle that does not verify."""
    found = bundles(directory)
    if not found:
        return ()
    mods = _sigstore()
    if mods is None or policy is None:
        reason = (
            "sigstore-python is not installed (the `sigstore` extra: tools/replay and the "
            "tests lock have it; else `pip install --require-hashes -r locks/replay.txt`)"
            if mods is None
            else "no identity to expect: set [release.github] repo (or [release.sigstore] "
            "repository) in the manifest, or pass --sigstore-repo OWNER/NAME"
        )
        return tuple(BundleCheck(p.name, False, reason=reason) for p in found)
    errors, models, verifier_cls, sigstore_policy = mods
    root, root_sha256 = _trusted_root(models)
    verifier = verifier_cls(trusted_root=root)
    sums_sha256 = sha256_file(directory / SUMS)
    out = []
    for path in found:
        raw = _read(path)
        try:
            bundle = models.Bundle.from_json(raw)
        except (errors.Error, ValueError, TypeError, KeyError) as exc:
            raise VerifyError(
                f"{path.name} is not a valid Sigstore bundle: {str(exc)[:300]}",
                where=str(path),
                next=AGAIN,
            ) from None
        want = _Policy(policy, sigstore_policy, errors.VerificationError)
        try:
            payload_type, payload = verifier.verify_dsse(bundle, want)
        except (errors.Error, ValueError, TypeError, KeyError) as exc:
            raise VerifyError(
                f"{path.name} does not verify offline against Sigstore's public-good root and "
                f"the identity {policy.expected} (issuer {policy.issuer}): {str(exc)[:400]}",
                where=str(path),
                next=(
                    f"{AGAIN}; if the release workflow moved, set [release.sigstore] "
                    "repository/workflow in the manifest (or --sigstore-repo) and run "
                    "`pinwheel verify-release` again"
                ),
            ) from None
        subjects = _subjects(payload_type, payload, str(path))
        problems = _match(subjects, sums, sums_sha256)
        if problems:
            raise VerifyError(
                f"{path.name} is signed by {want.seen} but does not match the release:\n    "
                + "\n    ".join(problems[:20]),
                where=str(path),
                next=AGAIN,
            )
        out.append(
            BundleCheck(
                path.name,
                True,
                identity=want.seen,
                subjects=tuple(sorted(subjects)),
                covers_sums=SUMS in subjects,
                log_index=_log_index(bundle, path),
                trusted_root_sha256=root_sha256,
            )
        )
    return tuple(out)

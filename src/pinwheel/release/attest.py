"""The release's standard attestation: an in-toto Statement v1 with a SLSA provenance v1
predicate, in a DSSE envelope signed with the release key; and ``verify-release``.

Subjects are every wheel and ``SHA256SUMS``, by sha256. ``resolvedDependencies``
name what the build consumed: the manifest (its sha256), the upstream base and
each replayed step's head (git commits), each component's source commit and
its build-time sources, each hashed build environment ([build.requirements])
and ``provenance.json`` itself. ``runDetails.builder.id`` is the builder the
caller names (the CI workflow, else ``urn:pinwheel:builder:local``).

Signing uses the release key through OpenSSH, as SHA256SUMS does: DSSE
signs the pre-authentication encoding (PAE) of (payloadType, payload), and
the signature here is ``ssh-keygen -Y sign -n pinwheel-attestation`` over
exactly those PAE bytes, stored base64-encoded (the armored SSHSIG text) in
the envelope's ``sig``. The namespace differs from SHA256SUMS's, so neither
signature can stand for the other. Standard DSSE tooling that expects raw
ECDSA/Ed25519 signatures cannot check it; ``ssh-keygen -Y verify`` can
(docs/release.md shows the commands).

A Sigstore bundle (GitHub's build-provenance attestation, ``*.sigstore.json``)
beside the release is verified offline by :mod:`pinwheel.release.sigstorebundle`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import untrusted
from pinwheel.checksums import SUMS, sha256_files
from pinwheel.errors import VerifyError
from pinwheel.fsutil import atomic_write_text
from pinwheel.release import signing, sigstorebundle

FILENAME = "attestation.intoto.jsonl"  # one DSSE envelope, one line
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "urn:pinwheel:build-type:release:v1"
LOCAL_BUILDER = "urn:pinwheel:builder:local"

ENVELOPE = untrusted.Kind(
    FILENAME,
    16 * 1024 * 1024,
    32,
    VerifyError,
    "do not install this release; fetch it from the publisher again",
)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what the signature covers."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


# --------------------------------------------------------------------------- the statement


def _git(url: str, ref: str | None, commit: str, name: str) -> dict[str, Any]:
    uri = f"git+{url}" + (f"@{ref}" if ref else "")
    return {"name": name, "uri": uri, "digest": {"gitCommit": commit}}


def resolved_dependencies(
    manifest_name: str,
    manifest_sha256: str,
    provenance: Mapping[str, Any],
    provenance_sha256: str | None,
) -> list[dict[str, Any]]:
    """What the build consumed, each with a digest (entries without one are left out)."""
    deps: list[dict[str, Any]] = [{"name": manifest_name, "digest": {"sha256": manifest_sha256}}]
    if provenance_sha256:
        deps.append({"name": "provenance.json", "digest": {"sha256": provenance_sha256}})
    upstream = provenance.get("upstream") or {}
    url = str(upstream.get("url") or "")
    if url and upstream.get("base"):
        deps.append(_git(url, upstream.get("branch"), str(upstream["base"]), "upstream base"))
    for step in provenance.get("steps") or []:
        if isinstance(step, dict) and step.get("head") and url:
            ref = f"refs/pull/{step['pr']}/head" if step.get("pr") else None
            deps.append(_git(url, ref, str(step["head"]), f"step {step.get('number')}"))
    for comp in provenance.get("components") or []:
        if not isinstance(comp, dict):
            continue
        src = comp.get("source") or {}
        if isinstance(src, dict) and src.get("url") and src.get("commit"):
            deps.append(_git(str(src["url"]), None, str(src["commit"]),
                             f"{comp.get('name')} source"))  # fmt: skip
        for s in comp.get("sources") or []:
            if isinstance(s, dict) and s.get("url") and s.get("commit") and not s.get("omitted"):
                deps.append(_git(str(s["url"]), s.get("ref"), str(s["commit"]),
                                 f"{comp.get('name')} build source {s.get('name')}"))  # fmt: skip
        req = comp.get("requirements")
        if isinstance(req, dict) and req.get("requirements_sha256"):
            deps.append({
                "name": f"{comp.get('name')} build environment ([build.requirements])",
                "digest": {"sha256": str(req["requirements_sha256"])},
            })  # fmt: skip
    return deps


def statement(
    subjects: Mapping[str, str],
    dependencies: list[dict[str, Any]],
    builder_id: str,
    external: Mapping[str, Any],
    internal: Mapping[str, Any],
    invocation_id: str | None = None,
) -> dict[str, Any]:
    """An in-toto Statement v1 with a SLSA provenance v1 predicate (no clock: reproducible)."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": n, "digest": {"sha256": d}} for n, d in sorted(subjects.items())],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": dict(external),
                "internalParameters": dict(internal),
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": builder_id},
                **({"metadata": {"invocationId": invocation_id}} if invocation_id else {}),
            },
        },
    }


def _keyid(key: Path) -> str:
    """The key's OpenSSH SHA256 fingerprint, from its .pub beside it ("" without one)."""
    pub = key.with_name(key.name + ".pub") if key.suffix != ".pub" else key
    try:
        blob = base64.b64decode(pub.read_text().split()[1], validate=True)
    except (OSError, IndexError, ValueError):
        return ""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def write_envelope(directory: Path, doc: Mapping[str, Any], key: Path | None) -> Path:
    """``directory/attestation.intoto.jsonl``: the statement in a DSSE envelope, signed with
    ``key`` (unsigned: an envelope with no signatures, which verify-release refuses)."""
    payload = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")
    signatures = []
    if key is not None:
        with tempfile.TemporaryDirectory(prefix="pinwheel-dsse.") as tmp:
            blob = Path(tmp) / "pae"
            blob.write_bytes(pae(PAYLOAD_TYPE, payload))
            sig = signing.sign(blob, key, namespace=signing.ATTESTATION_NAMESPACE)
            signatures.append(
                {"keyid": _keyid(key), "sig": base64.b64encode(sig.read_bytes()).decode()}
            )
    envelope = {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": signatures,
    }
    path = directory / FILENAME
    atomic_write_text(path, json.dumps(envelope, sort_keys=True) + "\n")
    return path


# --------------------------------------------------------------------------- verify-release


@dataclass(frozen=True)
class ReleaseCheck:
    """What verify-release found (it raises on any failure; this is the passing story)."""

    dir: Path
    sums_signed_by: str | None
    attestation_signed_by: str | None
    subjects: tuple[str, ...]
    builder: str
    dependencies: int
    sigstore: tuple[str, ...]  # one line per bundle found: what could and could not be checked
    bundles: tuple[sigstorebundle.BundleCheck, ...]
    unsigned: bool  # --allow-unsigned: no signature was checked


def _envelope(path: Path) -> tuple[dict[str, Any], bytes, list[bytes]]:
    raw = untrusted.read_bytes(path, ENVELOPE)
    doc = untrusted.parse_json(raw, ENVELOPE, str(path))
    if not isinstance(doc, dict) or doc.get("payloadType") != PAYLOAD_TYPE:
        raise untrusted.fail(ENVELOPE, f"not a DSSE envelope of {PAYLOAD_TYPE}", str(path))
    try:
        payload = base64.b64decode(str(doc.get("payload", "")), validate=True)
        sigs = [
            base64.b64decode(str(s.get("sig", "")), validate=True)
            for s in doc.get("signatures") or []
            if isinstance(s, dict)
        ]
    except ValueError:
        raise untrusted.fail(ENVELOPE, "payload or sig is not base64", str(path)) from None
    statement_doc = untrusted.parse_json(payload, ENVELOPE, f"{path} payload")
    if not isinstance(statement_doc, dict):
        raise untrusted.fail(ENVELOPE, "the payload is not a JSON object", str(path))
    return statement_doc, payload, sigs


def _subjects(doc: Mapping[str, Any], where: str) -> dict[str, str]:
    if doc.get("_type") != STATEMENT_TYPE or doc.get("predicateType") != PREDICATE_TYPE:
        raise untrusted.fail(
            ENVELOPE, f"not an in-toto {STATEMENT_TYPE} with a {PREDICATE_TYPE} predicate", where
        )
    out: dict[str, str] = {}
    for s in doc.get("subject") or []:
        digest = (s.get("digest") or {}).get("sha256") if isinstance(s, dict) else None
        name = s.get("name") if isinstance(s, dict) else None
        if not isinstance(name, str) or not isinstance(digest, str) or name in out:
            raise untrusted.fail(ENVELOPE, f"a subject without one name and sha256: {s!r}"[:200],
                                 where)  # fmt: skip
        out[name] = digest.lower()
    if not out:
        raise untrusted.fail(ENVELOPE, "the statement has no subjects", where)
    return out


@dataclass(frozen=True)
class SumsChecked:
    """SHA256SUMS as already checked (its signature when signers were given): the entries
    and who signed them (None: not checked, --allow-unsigned)."""

    sums: Mapping[str, str]
    signed_by: str | None


def check_attestation(
    directory: Path,
    verified: SumsChecked | Any,
    *,
    allowed_signers: Path | None,
    principal: str | None,
    sigstore_policy: sigstorebundle.IdentityPolicy | None = None,
    partial: bool = False,
) -> ReleaseCheck:
    """The attestation of a release whose SHA256SUMS ``verified`` already checked
    (:func:`pinwheel.release.assemble.verify_release`): its signature, then its subjects
    against the files and SHA256SUMS, both ways; then any Sigstore bundle beside it
    (:func:`pinwheel.release.sigstorebundle.check`, offline, against ``sigstore_policy``).
    ``partial``: a subject that is not in ``directory`` (``fetch --file``, ``install
    --allow-partial``) only has to be SHA256SUMS's entry. Raises VerifyError on the first
    failure."""
    path = directory / FILENAME
    if not path.is_file():
        raise VerifyError(
            f"no {FILENAME} in {directory}: the release carries no attestation",
            where=str(directory),
            next="fetch the release again with `pinwheel fetch URL|DIR --dest DIR` (it carries "
            "the attestation); a release made by `pinwheel release` has one",
        )
    doc, payload, sigs = _envelope(path)
    attested_by = None
    if allowed_signers is not None:
        if not sigs:
            raise VerifyError(
                f"{FILENAME} is not signed",
                where=str(path),
                next="do not install this release; the publisher must sign it (`pinwheel "
                "release --key`)",
            )
        problems = []
        for sig in sigs:
            try:
                attested_by = signing.verify(
                    pae(PAYLOAD_TYPE, payload), sig, allowed_signers, principal,
                    what=FILENAME, namespace=signing.ATTESTATION_NAMESPACE,
                )  # fmt: skip
                break
            except VerifyError as exc:
                problems.append(exc.what)
        if attested_by is None:
            raise VerifyError(
                f"the attestation's signature does not verify: {'; '.join(problems)}",
                where=str(path),
                next="do not install this release; fetch it from the publisher again",
            )
    subjects = _subjects(doc, str(path))
    on_disk = {p.name for p in directory.glob("*.whl")} | {SUMS}
    hashed = sha256_files([directory / n for n in sorted(on_disk)])
    actual = {n: hashed[directory / n] for n in on_disk}
    listed_wheels = {n for n in verified.sums if n.endswith(".whl")}
    problems = []
    for name in sorted(on_disk | listed_wheels):
        if name not in subjects:
            problems.append(f"{name} is not a subject of the attestation")
    for name, digest in sorted(subjects.items()):
        if name not in actual and partial and name in verified.sums:
            if verified.sums[name] != digest:
                problems.append(f"{name}: the attested sha256 is not SHA256SUMS's")
        elif name not in actual:
            problems.append(f"subject {name} is not in the release")
        elif actual[name] != digest:
            problems.append(f"{name}: sha256 {actual[name]} is not the attested {digest}")
        elif name != SUMS and verified.sums.get(name) != digest:
            problems.append(f"{name}: the attested sha256 is not SHA256SUMS's")
    if problems:
        raise VerifyError(
            "the attestation does not match the release:\n    " + "\n    ".join(problems[:20]),
            where=str(path),
            next="do not install this release; fetch it from the publisher again",
        )
    run = (doc.get("predicate") or {}).get("runDetails") or {}
    builder = str((run.get("builder") or {}).get("id") or "")
    deps = ((doc.get("predicate") or {}).get("buildDefinition") or {}).get(
        "resolvedDependencies"
    ) or []
    bundles = sigstorebundle.check(directory, verified.sums, sigstore_policy)
    return ReleaseCheck(
        dir=directory,
        sums_signed_by=verified.signed_by,
        attestation_signed_by=attested_by,
        subjects=tuple(sorted(subjects)),
        builder=builder,
        dependencies=len(deps) if isinstance(deps, list) else 0,
        sigstore=tuple(b.line for b in bundles),
        bundles=bundles,
        unsigned=allowed_signers is None,
    )


def check_carried(
    directory: Path,
    verified: SumsChecked | Any,
    *,
    allowed_signers: Path | None,
    principal: str | None,
    sigstore_policy: sigstorebundle.IdentityPolicy | None = None,
    partial: bool = False,
) -> ReleaseCheck | None:
    """What ``fetch`` and ``install`` check beside SHA256SUMS: the attestation (required
    when signers are given; without them, --allow-unsigned, checked when present) and every
    Sigstore bundle beside it. None: an unsigned release that carries no attestation."""
    if allowed_signers is None and not os.path.lexists(directory / FILENAME):
        return None
    return check_attestation(
        directory, verified, allowed_signers=allowed_signers, principal=principal,
        sigstore_policy=sigstore_policy, partial=partial,
    )  # fmt: skip

"""Signatures over SHA256SUMS with OpenSSH (``ssh-keygen -Y``): nothing new to install.

Signing covers every file in a release through SHA256SUMS. Verification is
offline: an ``allowed_signers`` file (``principal namespaces="pinwheel" ssh-ed25519 AAAA...``)
committed beside the manifest says whose keys count.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pinwheel import runner, untrusted
from pinwheel.errors import PinwheelError, VerifyError
from pinwheel.fsutil import atomic_write_text
from pinwheel.printable import shown_cmd

NAMESPACE = "pinwheel"
# DSSE envelopes (the in-toto attestation) are signed in their own namespace: a signature
# over SHA256SUMS can never stand for one over an attestation, or the reverse.
ATTESTATION_NAMESPACE = "pinwheel-attestation"
# An allowed_signers principal: an identity such as an email, never an option or a pattern list.
_PRINCIPAL = re.compile(r"[A-Za-z0-9_.+@][A-Za-z0-9_.+@=-]*")


def check_principal(name: str, where: str = "--principal / [release] principal") -> str:
    """``name`` if it is a plain principal; ssh-keygen never sees an option from config."""
    if not _PRINCIPAL.fullmatch(name):
        raise VerifyError(
            f"not a principal: {name[:80]!r} (letters, digits, . _ + @ = -; not starting with -)",
            where=where,
            next="use the identity exactly as the first field of allowed_signers spells it",
        )
    return name


SIGNERS = untrusted.Kind(
    "allowed_signers",
    1024 * 1024,
    0,
    VerifyError,
    "use the publisher's allowed_signers file (one line per key; see `man ssh-keygen`)",
)
ALLOW_UNSIGNED = "--allow-unsigned"
UNSIGNED_NOTE = "SIGNATURE NOT VERIFIED (--allow-unsigned)"


def require_signers(allowed_signers: Path | None, allow_unsigned: bool, where: str) -> None:
    """Refuse to go on without ``allowed_signers`` unless the user said --allow-unsigned.

    Without signers, SHA256SUMS is trusted from the same server as the wheels: whoever
    can replace a wheel there can replace its line too.
    """
    if allowed_signers is None and not allow_unsigned:
        raise VerifyError(
            "no allowed_signers: SHA256SUMS would be trusted from the same place as the "
            "wheels, so nothing was fetched or installed",
            where=where,
            next="pass --allowed-signers FILE (the publisher's allowed_signers, from a "
            "channel you trust: the project's repository), set [release] allowed_signers, "
            f"or pass {ALLOW_UNSIGNED} to accept an unverified release (every output says so)",
        )


def listed_keys(allowed_signers: Path) -> int:
    """How many key lines ``allowed_signers`` holds (comments and blank lines aside)."""
    data = untrusted.read_bytes(allowed_signers, SIGNERS)
    lines = untrusted.text(data, SIGNERS, str(allowed_signers)).splitlines()
    return sum(1 for line in lines if line.strip() and not line.lstrip().startswith("#"))


def _ssh_keygen() -> str:
    exe = shutil.which("ssh-keygen")
    if exe is None:
        raise PinwheelError(
            "ssh-keygen not found (OpenSSH 8.1+ signs and verifies releases)",
            next="install openssh-client, or pass --no-sign / leave allowed_signers unset",
        )
    return exe


def sign(path: Path, key: Path, namespace: str = NAMESPACE) -> Path:
    """Write ``path.sig``, signed with the private key ``key`` (or its .pub with an agent)."""
    sig = path.with_name(path.name + ".sig")
    sig.unlink(missing_ok=True)  # ssh-keygen refuses to overwrite
    if not key.exists():
        raise PinwheelError(
            f"signing key {key} does not exist",
            where="[release] signing_key / --key",
            next="pass --key PATH to an ssh private key, or --no-sign",
        )
    proc = runner.run(
        runner.Command(
            # The file after "--": a path is never read as an option.
            (_ssh_keygen(), "-Y", "sign", "-q", "-f", str(key.absolute()), "-n", namespace)
            + ("--", str(path.absolute())),
            what="ssh-keygen -Y sign",
            check=False,
        )
    )
    if proc.returncode != 0 or not sig.exists():
        raise PinwheelError(
            f"ssh-keygen could not sign {path.name}: {proc.err_text}",
            where=str(key),
            next="check the key (with a passphrase: run ssh-agent and pass the .pub)",
        )
    return sig


def verify(
    data: bytes,
    signature: bytes,
    allowed_signers: Path,
    principal: str | None,
    *,
    what: str = "SHA256SUMS",
    namespace: str = NAMESPACE,
) -> str:
    """Check ``signature`` over ``data``; return the principal that signed it, else raise."""
    if not allowed_signers.is_file():
        raise VerifyError(
            f"allowed_signers file {allowed_signers} does not exist",
            where="[release] allowed_signers / --allowed-signers",
            next="point it at the release's published allowed_signers file",
        )
    if listed_keys(allowed_signers) == 0:
        raise VerifyError(
            f"allowed_signers file {allowed_signers} lists no key (FILL IN: the project's "
            "release key has not been published there yet)",
            where="[release] allowed_signers / --allowed-signers",
            next="add the release key's line (`PRINCIPAL namespaces=\"pinwheel,"
            f"{ATTESTATION_NAMESPACE}\" ssh-ed25519 AAAA...`), or pass {ALLOW_UNSIGNED} "
            "without --allowed-signers to accept an unverified release",
        )
    exe = _ssh_keygen()
    with tempfile.TemporaryDirectory(prefix="pinwheel-sig.") as tmp:
        sig = Path(tmp) / "sig"
        sig.write_bytes(signature)
        principals = [principal] if principal else _find_principals(exe, sig, allowed_signers)
        for name in principals:
            check_principal(name, where=str(allowed_signers))
            proc = runner.run(
                runner.Command(
                    (exe, "-Y", "verify", "-f", str(allowed_signers.absolute()), "-I", name)
                    + ("-n", namespace, "-s", str(sig.absolute())),
                    what="ssh-keygen -Y verify",
                    input=data,
                    check=False,
                    error=VerifyError,
                )
            )
            if proc.returncode == 0:
                return name
        detail = (
            proc.err_text
            if principals
            else ("no key in allowed_signers made this signature")
        )
    raise VerifyError(
        f"signature over {what} does not verify: {detail}",
        where=f"{what}.sig against {allowed_signers}",
        next="do not install this release; fetch it from the publisher again",
    )


def _find_principals(exe: str, sig: Path, allowed_signers: Path) -> list[str]:
    proc = runner.run(
        runner.Command(
            (exe, "-Y", "find-principals", "-s", str(sig.absolute()))
            + ("-f", str(allowed_signers.absolute())),
            what="ssh-keygen -Y find-principals",
            check=False,
        )
    )
    return [line.strip() for line in proc.text.splitlines() if line.strip()]


# --------------------------------------------------------------------------- a first key


@dataclass(frozen=True)
class NewKey:
    key: Path  # the private key (0600), its .pub beside it
    allowed_signers: Path  # the file the key's line was added to
    line: str  # `PRINCIPAL namespaces="pinwheel,pinwheel-attestation" ssh-ed25519 AAAA...`


def signers_line(principal: str, public_key: str) -> str:
    """The allowed_signers line for a release key: both namespaces it signs in."""
    kind, blob = public_key.split()[:2]
    return f'{principal} namespaces="{NAMESPACE},{ATTESTATION_NAMESPACE}" {kind} {blob}'


def new_key(key: Path, allowed_signers: Path, principal: str) -> NewKey:
    """Make an Ed25519 release key at ``key`` (no passphrase: the CI secret holds it) with
    ``ssh-keygen``, and add its line to ``allowed_signers`` (made when missing). Refuses a
    key path that exists: a key is never overwritten."""
    check_principal(principal, where="--principal / [release] principal")
    for path in (key, key.with_name(key.name + ".pub")):
        if path.exists() or path.is_symlink():
            raise PinwheelError(
                f"{path} exists: a release key is never overwritten",
                where="pinwheel keygen --key",
                next="pass --key NEW_PATH, or sign with this key: "
                f"`{shown_cmd('pinwheel', 'release', '--key', key)}`",
            )
    key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    runner.run(
        runner.Command(
            (_ssh_keygen(), "-q", "-t", "ed25519", "-N", "", "-C", principal, "-f",
             str(key.absolute())),
            what="ssh-keygen -t ed25519",
            next="check that the folder of --key is writable",
        )
    )  # fmt: skip
    line = signers_line(principal, key.with_name(key.name + ".pub").read_text())
    before = ""
    if allowed_signers.exists():
        data = untrusted.read_bytes(allowed_signers, SIGNERS)
        before = untrusted.text(data, SIGNERS, str(allowed_signers))
        if before and not before.endswith("\n"):
            before += "\n"
    allowed_signers.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(allowed_signers, before + line + "\n")
    return NewKey(key, allowed_signers, line)

"""A secret the runner holds, and the signatures (HMAC-SHA256) made with it.

What pinwheel writes for a later run to trust (an object store entry, a replay stamp) is
signed with a key whoever can only write the bytes does not hold: their entry or stamp
is then no entry and no stamp. The key is either given (an environment variable, for
runners that share a store) or made once in the cache: ``<cache>/keys/<name>.key``,
32 random bytes as hex, created ``O_EXCL`` with mode 0600 through folders opened
``O_NOFOLLOW`` (:mod:`pinwheel.confine`), and read back only when it is a regular file
of this user's that nobody else may read or write. A key file that is anything else (a
link, a FIFO, another user's, readable by others, not 64 hex digits) is no key: what it
would have signed is then not written and not trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from pinwheel import cachelayout, confine
from pinwheel.errors import PinwheelError

FOLDER = cachelayout.bucket(Path(), "keys").name  # <cache>/keys
MIN_GIVEN = 32  # a default: the shortest key text a variable may give (characters)
_LEN = 64  # hex digits of a made key
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class NoKey(PinwheelError):
    """No key can be read or made: nothing is signed, nothing trusted."""


def _bad(path: str, why: str) -> NoKey:
    return NoKey(
        f"the key file is not usable: {why}",
        where=path,
        next=f"remove {path} (pinwheel makes a new one; entries it signed stop matching)",
    )


def _read(fd: int, name: str, where: str) -> bytes:
    f = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    try:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            raise _bad(where, "not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise _bad(where, "another user's, or others may read or write it (mode 0600)")
        data = os.read(f, _LEN + 2).strip()
    finally:
        os.close(f)
    if len(data) != _LEN or any(c not in b"0123456789abcdef" for c in data):
        raise _bad(where, f"not {_LEN} hex digits")
    return data


def cache_key(cache: Path, name: str) -> bytes:
    """The key ``<cache>/keys/<name>.key``, made on first use. :class:`NoKey` when the
    file is not one this user made for this (see the module's docstring)."""
    rel = f"{FOLDER}/{name}.key"
    where = str(Path(cache) / rel)
    try:
        confine.mkdir_beneath(cache, FOLDER)
        with confine.folder_beneath(cache, FOLDER) as fd:
            try:
                return _read(fd, f"{name}.key", where)
            except FileNotFoundError:
                pass
            text = secrets.token_hex(_LEN // 2).encode()
            tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
            f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=fd)
            try:
                os.write(f, text + b"\n")
                os.fsync(f)
            finally:
                os.close(f)
            try:  # a link, not a rename: a key another run made meanwhile wins
                os.link(tmp, f"{name}.key", src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=fd)
            return _read(fd, f"{name}.key", where)
    except confine.Escape as exc:
        raise _bad(where, exc.what) from None
    except OSError as exc:
        raise _bad(where, exc.strerror or str(exc)) from None


def given_key(text: str, variable: str) -> bytes:
    """A key given as text (an environment variable): at least :data:`MIN_GIVEN` characters."""
    if len(text) < MIN_GIVEN:
        raise NoKey(
            f"{variable} is {len(text)} characters; a key needs at least {MIN_GIVEN}",
            where=f"environment variable {variable}",
            next=f"export {variable}=$(python3 -c 'import secrets; print(secrets.token_hex(32))')",
        )
    return text.encode()


def sign(key: bytes, purpose: str, payload: bytes) -> str:
    """HMAC-SHA256 of ``payload`` for ``purpose`` (a signature for one use is no other's)."""
    return hmac.new(key, purpose.encode() + b"\0" + payload, hashlib.sha256).hexdigest()


def signed(key: bytes, purpose: str, payload: bytes, signature: object) -> bool:
    """Whether ``signature`` is :func:`sign`'s for ``payload`` (compared in constant time)."""
    return isinstance(signature, str) and hmac.compare_digest(
        sign(key, purpose, payload), signature
    )


__all__ = ["NoKey", "cache_key", "given_key", "sign", "signed"]

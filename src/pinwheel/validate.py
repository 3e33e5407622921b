"""One validator per value kind, applied where a value is loaded or first met.

Every pattern here is applied with ``fullmatch``: ``re.match`` with ``$`` lets a
trailing newline through (``$`` matches before a final ``\\n``), and ``int()``
accepts ``" 8_0\\n"``. Each validator returns the value in its canonical form or
raises ``ValueError`` with the reason; callers turn that into the project's
error naming the key or flag it came from.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

# --------------------------------------------------------------------------- numbers

_DIGITS = re.compile(r"[0-9]{1,19}")
MAX_PORT = 65535


def port(value: object) -> int:
    """A TCP port, 1-65535, from an int or from digits only (no sign, space or ``_``)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a port number")
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise ValueError(f"{value!r} is not a port number (digits only)")
        value = int(value)
    if not isinstance(value, int) or not 1 <= value <= MAX_PORT:
        raise ValueError(f"{value!r} is not a port number (1-{MAX_PORT})")
    return value


def count(value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    """A whole number in [minimum, maximum], from an int or from digits only."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a whole number")
    if isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise ValueError(f"{value!r} is not a whole number (digits only)")
        value = int(value)
    if not isinstance(value, int):
        raise ValueError(f"{value!r} is not a whole number")
    if value < minimum or (maximum is not None and value > maximum):
        top = f"-{maximum}" if maximum is not None else " or more"
        raise ValueError(f"{value} is out of range ({minimum}{top})")
    return value


def content_length(value: str) -> int:
    """An HTTP Content-Length header: digits only (RFC 9110), no sign, no list."""
    if not _DIGITS.fullmatch(value.strip(" \t")):
        raise ValueError(f"{value!r} is not a byte count")
    return int(value.strip(" \t"))


_SIZE = re.compile(r"(?P<n>[0-9]{1,15})(?P<unit>[KMGT]?)")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def size(value: str) -> int:
    """A byte size as sccache reads SCCACHE_CACHE_SIZE: digits and an optional K, M, G or T
    (powers of 1024), nothing else: not ``10G\\n``, not ``-1G``, not ``1.5G``."""
    m = _SIZE.fullmatch(value)
    if not m:
        raise ValueError(f"{value!r} is not a size (digits and an optional K, M, G or T)")
    n = int(m.group("n")) * _UNITS[m.group("unit")]
    if n == 0:
        raise ValueError(f"{value!r} is a size of zero")
    return n


# --------------------------------------------------------------------------- hosts and URLs

_HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?",
    re.S,
)


def host(value: str) -> str:
    """A host name, an IPv4 address, or an IPv6 literal (bare or in brackets). Returns it in
    the form a URL needs (IPv6 in brackets)."""
    inner = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    if ":" in inner:
        try:
            addr = ipaddress.IPv6Address(inner.split("%", 1)[0])
        except ValueError:
            raise ValueError(f"{value!r} is not an IPv6 address") from None
        zone = inner[len(inner.split("%", 1)[0]) :]
        if zone and not re.fullmatch(r"%[A-Za-z0-9_.-]{1,32}", zone):
            raise ValueError(f"{value!r} has a bad IPv6 zone")
        return f"[{addr.compressed}{zone}]"
    if inner != value:
        raise ValueError(f"{value!r}: brackets hold an IPv6 address only")
    if not _HOSTNAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a host name or address")
    return value


def http_url(value: str, *, schemes: tuple[str, ...] = ("https", "http")) -> str:
    """An absolute URL of one of ``schemes`` with a valid host and port, no whitespace or
    control characters anywhere (a trailing newline included), no credentials."""
    if not isinstance(value, str) or not value:
        raise ValueError("an empty URL")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{value!r} has whitespace or control characters")
    try:
        parts = urllib.parse.urlsplit(value)
        p = parts.port  # ValueError when not a number or out of 0-65535
    except ValueError as exc:
        raise ValueError(f"{value!r}: {exc}") from None
    if parts.scheme.lower() not in schemes:
        raise ValueError(f"{value!r} is not a {' or '.join(schemes)} URL")
    if not parts.hostname:
        raise ValueError(f"{value!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{value!r} carries credentials (user@host): put them elsewhere")
    netloc_host = parts.netloc.rsplit("@", 1)[-1]
    bracketed = netloc_host.startswith("[")
    host(f"[{parts.hostname}]" if bracketed else parts.hostname)
    if p == 0:
        raise ValueError(f"{value!r} has port 0")
    return value


def https_url(value: str) -> str:
    """``http_url`` for https only (package indexes: torch_index)."""
    return http_url(value, schemes=("https",))

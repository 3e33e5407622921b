"""One validator per value kind, applied where a value is loaded or first met.

Every pattern here is applied with ``fullmatch``: ``re.match`` with ``$`` lets a
trailing newline through (``$`` matches before a final ``\\n``), and ``int()``
accepts ``" 8_0\\n"``. Each validator returns the value in its canonical form or
raises ``ValueError`` with the reason; callers turn that into the project's
error naming the key or flag it came from.

Problem-style validators (``*_problem`` returns why a value is refused, or None;
``check`` turns that into :class:`Invalid`), one per kind of value that reaches git,
a shell, pip or a file system:

- :func:`git_url_problem`: a repository URL. Protocol allowlist: ``https``,
  ``ssh``, ``git``, ``file`` (mirrors), ``http`` only for a loopback host;
  scp-style ``user@host:path`` and absolute paths. Never a remote helper
  (``ext::``, ``fd::``, ``<transport>::``), never option-shaped (``-...``),
  never control characters or whitespace.
- :func:`index_url_problem`: a package index (``https``, ``http`` only on loopback).
- :func:`ref_problem` / :func:`tag_problem`: git ref names by ``check-ref-format``
  rules, never starting with ``-``.
- :func:`identifier_problem`: names that become file names, shell words or CLI values.
- :func:`env_key_problem`: environment variable names.
- :func:`version_problem`: PEP 440 versions (with a local label).
- :func:`python_minor_problem` / :func:`python_platform_problem`: the ``3.12`` and the
  ``x86_64-manylinux_2_28`` a resolver (uv) is asked to resolve for.
- :func:`rel_path_problem`: relative paths that stay inside their root.
- :func:`line_problem`: free text that must stay one printable line.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from typing import TypeGuard

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


MAX_GPUS = 1024  # a default: far above any one host's GPU count


def gpu_indices(value: str) -> tuple[int, ...]:
    """``"0,1,2"`` -> ``(0, 1, 2)``: ASCII digits, unique, at most MAX_GPUS of them; not
    ``-1``, ``1_0``, ``٣``, ``0,0``, an empty list, spaces or a trailing comma."""
    if not isinstance(value, str) or not value:
        raise ValueError("no GPU indices")
    parts = value.split(",")
    if len(parts) > MAX_GPUS:
        raise ValueError(f"more than {MAX_GPUS} GPU indices")
    out: list[int] = []
    for part in parts:
        if not re.fullmatch(r"[0-9]{1,4}", part, re.ASCII):
            raise ValueError(f"{part[:20]!r} is not a GPU index (ASCII digits only, like 0 or 3)")
        index = int(part)
        if index in out:
            raise ValueError(f"GPU {index} is named twice")
        out.append(index)
    return tuple(out)


# --------------------------------------------------------------------------- container values

_DEVICE = re.compile(r"[0-9]{1,3}|(?:GPU|MIG)-[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}")


def devices(value: str) -> str:
    """``CUDA_VISIBLE_DEVICES`` as it reaches a child or a container runtime
    (``--gpus device=...``, ``--device nvidia.com/gpu=...``): GPU indices or GPU/MIG UUIDs,
    comma-separated, nothing else (no quote, space or option can ride along)."""
    parts = value.split(",")
    if not value or not all(_DEVICE.fullmatch(p) for p in parts):
        raise ValueError(f"{value[:100]!r} is not a list of GPU indices or GPU UUIDs like 0,1")
    return value


_SYSTEM_DIRS = frozenset(
    {"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run", "/sbin",
     "/sys", "/usr", "/var"}
)  # fmt: skip


def mount_point(value: str) -> str:
    """A path inside a container where pinwheel mounts something read-only: absolute,
    plain characters, no ``..``, and not ``/`` or a system directory it would hide."""
    if not re.fullmatch(r"/[A-Za-z0-9._/-]{0,255}", value) or ".." in value.split("/"):
        raise ValueError(f"{value[:100]!r} is not an absolute path like /model")
    norm = "/" + "/".join(p for p in value.split("/") if p not in ("", "."))
    if norm in _SYSTEM_DIRS:
        raise ValueError(f"{value!r} would hide the container's own {norm}")
    return norm


def host_path(value: str) -> str:
    """A host directory handed to a container runtime's ``-v SRC:DST``: absolute (a bare
    name is a named volume to docker and podman), no ``:`` or ``,`` (they split the
    option), no control character."""
    if not value.startswith("/"):
        raise ValueError(f"{value[:100]!r} is not absolute (docker takes it for a volume name)")
    if re.search(r"[:,\x00-\x1f\x7f]", value):
        raise ValueError(f"{value[:100]!r} holds ':', ',' or a control character")
    return value


def prefix_map_path(value: str) -> str:
    """A directory a build's compilers see under a canonical name (``-ffile-prefix-map=OLD=NEW``,
    as asked of the build's Python): absolute, no ``..``, no ``=`` (it splits the option's
    OLD from NEW), no control character (the flags are shell-split lines)."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"{str(value)[:100]!r} is not an absolute path")
    if "=" in value or re.search(r"[\x00-\x1f\x7f]", value) or ".." in value.split("/"):
        raise ValueError(f"{value[:100]!r} holds '=', '..' or a control character")
    return value


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


# ---------------------------------------------------------------- problem-style validators


# Transports git may use for a manifest's repositories (GIT_ALLOW_PROTOCOL uses the same list).
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SCHEME_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>[^\s]*)")
# [user@]host:path: no scheme, no slash before the colon, no second colon (remote helper).
_SCP = re.compile(
    r"(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9._~+\-]*)@)?(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*)"
    r":(?!:)(?!//)(?P<path>[^\s]+)"
)
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")


class Invalid(ValueError):
    """A value of ``kind`` refused, with the reason."""

    def __init__(self, kind: str, value: object, problem: str):
        super().__init__(f"{kind} {value!r}: {problem}")
        self.kind = kind
        self.value = value
        self.problem = problem


def _basic(value: object) -> str | None:
    if not isinstance(value, str):
        return "not a string"
    if not value:
        return "empty"
    if _CONTROL.search(value):
        return "it contains control characters (a newline, tab or escape)"
    if value.startswith("-"):
        return "it starts with '-' (a program would read it as an option)"
    return None


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_parts(url: str) -> tuple[str, str, str] | None:
    """(scheme, host, userinfo) of a scheme://host/... URL, or None when unparsable."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return None
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    return parts.scheme.lower(), host, userinfo


def git_url_problem(url: object, *, schemes: tuple[str, ...] = GIT_SCHEMES) -> str | None:
    """Why ``url`` is not an acceptable repository URL, or None when it is."""
    basic = _basic(url)
    if basic:
        return basic
    assert isinstance(url, str)
    if "::" in url.split("/")[0]:
        return "a remote-helper address ('<transport>::...'; git would run a helper program)"
    if url != url.strip() or any(c.isspace() for c in url):
        return "it contains whitespace"
    m = _SCHEME_URL.fullmatch(url)
    if m:
        scheme = m.group("scheme").lower()
        if scheme not in schemes:
            return f"scheme '{m.group('scheme')}' (allowed: {', '.join(schemes)})"
        if scheme == "file":
            path = urllib.parse.unquote(m.group("rest"))
            if not path.startswith("/"):
                return "a file:// URL needs an absolute path (file:///path)"
            return None
        rest = m.group("rest")
        if not rest or rest.startswith(("-", "/")):
            return "a URL whose host is missing or starts with '-'"
        parts = _url_parts(url)
        if parts is None:
            return "a URL that cannot be parsed"
        _, host, userinfo = parts
        if not host or not _HOST.fullmatch(host if ":" not in host else f"[{host}]"):
            return f"a URL with an invalid host {host!r}"
        if userinfo.startswith("-"):
            return "a URL whose user name starts with '-'"
        if scheme == "http" and not is_loopback(host):
            return "plain http:// is only accepted for a loopback host (use https://)"
        return None
    if "://" in url:
        return "a URL with a scheme git does not fetch from here"
    if url.startswith("/"):
        return None  # an absolute local path (a mirror or a test repository)
    if _SCP.fullmatch(url):
        return None
    return "a URL (https://, ssh://, git://, file://, user@host:path or /abs/path)"


def index_url_problem(url: object) -> str | None:
    """A PEP 503 package index / upload URL: https (http on loopback), no credentials shown."""
    basic = _basic(url)
    if basic:
        return basic
    assert isinstance(url, str)
    if any(c.isspace() for c in url):
        return "it contains whitespace"
    parts = _url_parts(url)
    if parts is None or parts[0] not in ("https", "http") or not parts[1]:
        return "an https:// URL with a host"
    if parts[0] == "http" and not is_loopback(parts[1]):
        return "plain http:// is only accepted for a loopback host (use https://)"
    return None


def http_url_problem(url: object) -> str | None:
    """A server or download URL: http or https with a host (see :func:`http_url`)."""
    if not isinstance(url, str):
        return "not a string"
    try:
        http_url(url)
    except ValueError as exc:
        return str(exc)
    return None


def base_url_problem(url: object) -> str | None:
    """The URL a folder is served at (``pinwheel index --base-url``): http or https with a
    host (:func:`http_url`: no credentials, no whitespace), no query or fragment, ending
    with ``/`` (a file's URL is the base and a relative path)."""
    problem = http_url_problem(url)
    if problem is not None:
        return problem
    assert isinstance(url, str)
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return "it has a query or fragment (?... or #...): a base URL is a folder"
    if not url.endswith("/"):
        return "it does not end with '/' (the folder OUT is served at, e.g. https://host/idx/)"
    return None


def ref_problem(name: object) -> str | None:
    """Why ``name`` is not a git ref name (``git check-ref-format --allow-onelevel``)."""
    if not isinstance(name, str):
        return "not a string"
    if not name:
        return "an empty name"
    if name.startswith("-"):
        return "it starts with '-'"
    if name == "@":
        return "it is '@'"
    bad = sorted({c for c in name if ord(c) < 32 or ord(c) == 127 or c in " ~^:?*[\\"})
    if bad:
        return "it contains " + " ".join(repr(c) for c in bad)
    if ".." in name:
        return "it contains '..'"
    if "@{" in name:
        return "it contains '@{'"
    if name.startswith("/") or name.endswith("/") or "//" in name:
        return "it starts or ends with '/' or contains '//'"
    if name.endswith("."):
        return "it ends with '.'"
    for part in name.split("/"):
        if part.startswith("."):
            return f"component {part!r} starts with '.'"
        if part.endswith(".lock"):
            return f"component {part!r} ends with '.lock'"
    return None


def tag_problem(name: object) -> str | None:
    """A release tag: a ref name (never an option) that is one path component for hosts."""
    problem = ref_problem(name)
    if problem:
        return problem
    assert isinstance(name, str)
    if name.startswith("refs/"):
        return "a tag name, not a full ref"
    return None


_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,127}")


def identifier_problem(name: object) -> str | None:
    """Names that become file names, shell words, case labels: [A-Za-z0-9][A-Za-z0-9._-]*."""
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        return "letters, digits, '.', '_' and '-' only, starting with a letter or digit"
    return None


_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def env_key_problem(name: object) -> str | None:
    if not isinstance(name, str) or not _ENV_KEY.fullmatch(name):
        return "an environment variable name (letters, digits, '_'; not starting with a digit)"
    return None


MAX_VERSION = 128  # characters: the longest real local label is far shorter


def version_problem(value: object) -> str | None:
    """A PEP 440 version (``packaging.version``, what pip accepts after ``==``), written
    without the surrounding whitespace ``packaging`` would forgive."""
    from packaging.version import InvalidVersion, Version  # imported when a version is met

    why = "a PEP 440 version like 2.9.1 or 2.9.1+cu128"
    if not isinstance(value, str) or value != value.strip() or _CONTROL.search(value):
        return why
    if len(value) > MAX_VERSION:  # before int(): a 5000-digit part is ValueError, not Invalid
        return f"{why} (at most {MAX_VERSION} characters)"
    try:
        Version(value)
    except (InvalidVersion, ValueError):
        return why
    return None


_PYTHON_MINOR = re.compile(r"3\.[0-9]{1,2}")
# uv's --python-platform targets: a machine, then an optional libc/OS tag
# (x86_64-manylinux_2_28, aarch64-manylinux_2_28, x86_64-unknown-linux-gnu, linux).
_PYTHON_PLATFORM = re.compile(r"[a-z0-9_]{1,32}(?:-[a-z0-9_.]{1,32}){0,3}")


def python_minor_problem(value: object) -> str | None:
    """A Python minor version as a resolver takes it: ``3.12`` (no patch, no spaces)."""
    if not isinstance(value, str) or not _PYTHON_MINOR.fullmatch(value):
        return 'a Python minor version like "3.12"'
    return None


def python_platform_problem(value: object) -> str | None:
    """A platform a resolver targets, like ``x86_64-manylinux_2_28``: lowercase letters,
    digits, ``_`` and ``.`` in at most four ``-``-joined parts, never option-shaped."""
    if not isinstance(value, str) or not _PYTHON_PLATFORM.fullmatch(value):
        return "a platform like x86_64-manylinux_2_28 (letters, digits, _ . and -, no leading -)"
    return None


# Hex digests, spelled once: a git commit (SHA-1) and a sha256, lowercase as pinwheel and git
# write them; the patterns compose into others (``--hash=sha256:`` + SHA256_HEX).
GIT_SHA_HEX = "[0-9a-f]{40}"
SHA256_HEX = "[0-9a-f]{64}"
SHA256_HEX_ANY_CASE = "[0-9a-fA-F]{64}"  # sha256sum -c and in-toto accept upper case too
GIT_SHA = re.compile(GIT_SHA_HEX)
SHA256 = re.compile(SHA256_HEX)
_SHA256_ANY_CASE = re.compile(SHA256_HEX_ANY_CASE)


def is_git_sha(value: object) -> TypeGuard[str]:
    """A full git commit id: 40 lowercase ASCII hex digits, nothing else."""
    return isinstance(value, str) and GIT_SHA.fullmatch(value) is not None


def is_git_object_id(value: object) -> TypeGuard[str]:
    """A git object id of either hash: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits."""
    return is_git_sha(value) or is_sha256(value)


def sha_problem(value: object) -> str | None:
    if not is_git_sha(value):
        return "a full 40-hex lowercase git object id"
    return None


def is_sha256(value: object, *, any_case: bool = False) -> TypeGuard[str]:
    """A sha256 as pinwheel writes one: 64 lowercase ASCII hex digits, nothing else
    (``any_case``: upper-case digits too, as sha256sum and in-toto take them)."""
    pattern = _SHA256_ANY_CASE if any_case else SHA256
    return isinstance(value, str) and pattern.fullmatch(value) is not None


_DRIVE = re.compile(r"[A-Za-z]:")


def member_problem(name: str) -> str | None:
    """Why ``name``, joined to a folder, could reach outside it, else None: the one name rule
    for archive members, SHA256SUMS entries, receipts' and model packs' file names."""
    norm = name.replace("\\", "/")
    if not norm:
        return "empty name"
    if norm.startswith("/") or _DRIVE.match(norm):
        return "absolute path"
    if ".." in norm.split("/"):
        return "'..' component escapes the target directory"
    if "\0" in name:
        return "NUL byte in name"
    if _CONTROL.search(name):
        return "control character in name"
    return None


def rel_path_problem(value: object) -> str | None:
    """A relative POSIX path that stays inside its root: no '/', no '..', no '-', no controls."""
    basic = _basic(value)
    if basic:
        return basic
    assert isinstance(value, str)
    if "\\" in value or member_problem(value) == "absolute path":
        return "an absolute path (a relative path inside its folder is expected)"
    if member_problem(value):
        return "a path that climbs out with '..'"
    parts = value.split("/")
    if any(p == "" for p in parts[:-1]):
        return "a path with an empty component ('//')"
    return None


_WHEEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+!-]*\.whl")


def wheel_name_problem(value: object) -> str | None:
    if not isinstance(value, str) or not _WHEEL.fullmatch(value) or ".." in value:
        return "a wheel file name (PEP 427)"
    return None


def line_problem(value: object) -> str | None:
    """Free text (a title, a reason) that must stay one line."""
    if not isinstance(value, str):
        return "not a string"
    if _CONTROL.search(value):
        return "it contains control characters (a newline, tab or escape)"
    return None


def check(kind: str, value: object, problem: str | None) -> str:
    """``value`` when ``problem`` is None, else :class:`Invalid`."""
    if problem is not None:
        raise Invalid(kind, value, problem)
    assert isinstance(value, str)
    return value

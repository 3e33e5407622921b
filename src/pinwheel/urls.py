"""Repository URLs from manifests, flags and the environment: validated, and redacted when shown.

A URL read from a manifest reaches ``git`` as an argument, so one that starts
with ``-`` would be an option (``--upload-pack=CMD`` runs CMD). :func:`url_problem`
admits only the forms git documents for a remote: ``https``, ``http``, ``ssh``,
``git`` and ``file`` URLs, scp-style ``user@host:path`` and absolute local
paths. :func:`redact` hides credentials (``https://user:token@host``) in every
message and log line that shows a URL; :func:`redact_text` does the same for
free text such as git's stderr.
"""

from __future__ import annotations

import re

SCHEMES = ("https", "http", "ssh", "git", "file")

_SCHEME_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>\S+)")
# [user@]host:path, where the host names no scheme ("://") and no slash before the colon.
# "host::x" is not scp-style: git reads "<transport>::<address>" as a remote helper
# (ext::, fd::), so a second colon right after the host is refused.
_SCP = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._~+\-]*@)?[A-Za-z0-9][A-Za-z0-9.\-]*:(?!:)(?!//)\S+")
# Anything "scheme://userinfo@" in free text: keep the user name, drop the secret.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s]+)@")


def _hide(match: re.Match[str]) -> str:
    user, sep, _secret = match.group("userinfo").partition(":")
    return f"{match.group('scheme')}{user}:***@" if sep else f"{match.group('scheme')}***@"


def redact(url: str) -> str:
    """``url`` with any password or token replaced by ``***`` (user names kept)."""
    return _USERINFO.sub(_hide, url)


def redact_text(text: str) -> str:
    """Every URL inside ``text`` (an error message, git's stderr) redacted."""
    return _USERINFO.sub(_hide, text)


def url_problem(url: str) -> str | None:
    """Why ``url`` is not an acceptable git remote, or None when it is."""
    if not url or url != url.strip():
        return "an empty URL or one with leading/trailing whitespace"
    if url.startswith("-"):
        return "a URL that starts with '-' (git would read it as an option)"
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return "a URL with control characters"
    if "::" in url.split("/")[0]:
        return "a remote-helper address ('<transport>::...'; git would run a helper program)"
    m = _SCHEME_URL.fullmatch(url)
    if m:
        if m.group("scheme").lower() not in SCHEMES:
            return f"scheme '{m.group('scheme')}' (allowed: {', '.join(SCHEMES)})"
        if m.group("scheme").lower() != "file" and m.group("rest").startswith(("-", "/")):
            return "a URL whose host is missing or starts with '-'"
        return None
    if "://" in url:
        return "a URL with a scheme git does not fetch from here"
    if url.startswith("/"):
        return None  # an absolute local path (a mirror or a test repository)
    if _SCP.fullmatch(url):
        return None
    return "a URL (https://, http://, ssh://, git://, file://, user@host:path or /abs/path)"

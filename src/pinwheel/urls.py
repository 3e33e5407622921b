"""Repository URLs from manifests, flags and the environment: validated, and redacted when shown.

A URL read from a manifest reaches ``git`` as an argument, so one that starts
with ``-`` would be an option (``--upload-pack=CMD`` runs CMD):
:func:`pinwheel.validate.git_url_problem` admits only the forms git documents for
a remote. :func:`redact` hides credentials (``https://user:token@host``) in every
message and log line that shows a URL, and in free text such as git's stderr.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

# Anything "scheme://userinfo@" in free text: keep the user name, drop the secret. The
# user info ends at the LAST '@' before the host, as urllib (``netloc.rpartition('@')``)
# and git read it: ``https://bot:p@SECRET@host`` is user ``bot``, password ``p@SECRET``.
# The authority ends at the first '/', '?' or '#' (or a space in free text).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#\s]+)@")
# Query or fragment parameters that carry a secret (?access_token=..., &sig=..., #token=...).
_SECRET_PARAM = re.compile(
    r"(?P<lead>[?&#;][A-Za-z0-9_.\-]*(?:token|secret|password|passwd|pwd|auth|key|"
    r"credential|credentials|signature|sig|session)=)(?P<value>[^&#\s\"'<>]+)",
    re.IGNORECASE,
)

MIN_SECRET = 4  # characters: a configured secret shorter than this is not searched for


def _hide(match: re.Match[str]) -> str:
    user, sep, _secret = match.group("userinfo").partition(":")
    return f"{match.group('scheme')}{user}:***@" if sep else f"{match.group('scheme')}***@"


def redact(url: str, secrets: Iterable[str | None] = ()) -> str:
    """``url`` (or any text) with any password, token or secret query parameter replaced
    by ``***``, and every one of ``secrets`` (the values a client was configured with: a
    password, a secret key, a session token) wherever it appears, as it is or
    percent-encoded: a server's error that echoes a password prints ``***``. A value
    shorter than :data:`MIN_SECRET` characters is not searched for (it would hide every
    such letter of the message).

    User names are kept (``https://user:***@host``); ``?access_token=***``.
    """
    text = _SECRET_PARAM.sub(lambda m: f"{m.group('lead')}***", _USERINFO.sub(_hide, url))
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_SECRET}, key=len, reverse=True):
        for form in {secret, urllib.parse.quote(secret, safe="")}:
            text = text.replace(form, "***")
    return text


def redact_tree(value: Any) -> Any:
    """A JSON-like value with every string redacted (receipts, --json documents)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v) for v in value]
    return value

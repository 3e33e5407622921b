"""Repository URLs from manifests, flags and the environment: validated, and redacted when shown.

A URL read from a manifest reaches ``git`` as an argument, so one that starts
with ``-`` would be an option (``--upload-pack=CMD`` runs CMD):
:func:`pinwheel.validate.git_url_problem` admits only the forms git documents for
a remote. :func:`redact` hides credentials (``https://user:token@host``) in every
message and log line that shows a URL, and in free text such as git's stderr.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Anything "scheme://userinfo@" in free text: keep the user name, drop the secret.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s]+)@")
# Query or fragment parameters that carry a secret (?access_token=..., &sig=..., #token=...).
_SECRET_PARAM = re.compile(
    r"(?P<lead>[?&#;][A-Za-z0-9_.\-]*(?:token|secret|password|passwd|pwd|auth|key|"
    r"credential|credentials|signature|sig|session)=)(?P<value>[^&#\s\"'<>]+)",
    re.IGNORECASE,
)


def _hide(match: re.Match[str]) -> str:
    user, sep, _secret = match.group("userinfo").partition(":")
    return f"{match.group('scheme')}{user}:***@" if sep else f"{match.group('scheme')}***@"


def redact(url: str) -> str:
    """``url`` with any password, token or secret query parameter replaced by ``***``.

    User names are kept (``https://user:***@host``); ``?access_token=***``.
    """
    return _SECRET_PARAM.sub(lambda m: f"{m.group('lead')}***", _USERINFO.sub(_hide, url))


def redact_tree(value: Any) -> Any:
    """A JSON-like value with every string redacted (receipts, --json documents)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v) for v in value]
    return value

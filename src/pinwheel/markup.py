"""Untrusted text in Markdown (and the HTML it renders to): escaped, one line, secrets redacted.

Step titles, server answers (model ids, versions), receipt values and error
text reach ``RELEASE_NOTES.md`` and ``report.md``. Written raw, a newline and
``#`` make a heading, a ``|`` splits a table cell, ``<script>`` is HTML and a
URL may carry a token. :func:`text` makes any value safe as inline Markdown
(also inside a table cell); :func:`code` makes it safe inside backticks.
"""

from __future__ import annotations

import re

from pinwheel.urls import redact

# C0, DEL, C1, line/paragraph separators, and the bidi overrides, embeddings, isolates
# and marks (U+202E would show a name reversed in a rendered page).
_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]+"
)
# What could change structure inside a line in CommonMark/GFM: code spans, links and
# images, table cells, raw HTML, entities and the escape itself. Line-start markers
# (#, -, >) cannot act: the text is one line placed after other content. Emphasis
# characters (_ *) are left alone: they change looks, not structure.
_SPECIAL = re.compile(r"([\\`\[\]|<>&])")


def _one_line(value: object, limit: int) -> str:
    out = redact(_CONTROL.sub(" ", str(value))).strip()
    return out if len(out) <= limit else out[: limit - 1] + "…"


def text(value: object, limit: int = 300) -> str:
    """``value`` as inline Markdown text: one line, markup characters and ``< > &``
    backslash-escaped (so no raw HTML or entity reaches a renderer)."""
    return _SPECIAL.sub(r"\\\1", _one_line(value, limit))


def code(value: object, limit: int = 300) -> str:
    """``value`` inside a code span (the caller writes the backticks): one line, no backtick,
    no ``|`` (a GFM table splits on it even inside a code span)."""
    return _one_line(value, limit).replace("`", "'").replace("|", "¦")

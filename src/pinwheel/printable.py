"""The one sanitiser for everything pinwheel prints on a terminal or in a log.

Text pinwheel did not write (manifest keys in errors, tags, directory names,
``known_issues``, ELF symbol and library names, a server's HTTP error body, worker
errors, tensor names, commit subjects and authors, conflicting file names) may hold
ESC and OSC sequences (recolour, retitle, hyperlink, clear the screen), other C0 or C1
control characters, or bidirectional overrides (U+202E makes ``txt.exe`` read as
``exe.txt``). :func:`shown` makes each visible as an escape (``\\x1b``, ``\\u202e``)
instead of acting. Newlines and tabs stay: pinwheel's own messages span lines.

``--json`` output is not passed through here: its strings stay exact, and JSON
escapes every control character itself (``json.dumps`` with ``ensure_ascii``).
Markdown and HTML have their own escaper (:mod:`pinwheel.markup`).
"""

from __future__ import annotations

import re
import shlex

from pinwheel.urls import redact

# C0 (but \t and \n), DEL, C1, the bidi embeddings/overrides/isolates and marks, the
# line/paragraph separators (a terminal or an editor may break or reorder on them).
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object) -> str:
    """``text`` safe to print: credentials redacted (:func:`pinwheel.urls.redact`),
    control characters and bidi overrides made visible."""
    return _UNSAFE.sub(_escape, redact(str(text)))


def shown_cmd(*argv: object) -> str:
    """A command line for a person to copy: each word ``shlex.quote``d, so a path with a
    space or a quote (``/tmp/a b/key``) stays one word when the line is pasted into a shell;
    a plain word (``--key``, ``/tmp/key``) is left as it is. Not for running: pinwheel runs
    argv lists, never a shell line."""
    return " ".join(shlex.quote(str(a)) for a in argv)

"""Boundary: receipts written into Markdown (docs/SECURITY.md, "receipts").

RELEASE_NOTES.md copies values from provenance.json: the glibc-floor table (symbol and
member names come from the wheel's own ELF objects) and the substitution headline. Each
goes through the one Markdown escaper (:mod:`pinwheel.markup`). The real `pinwheel
release` on a real wheel and receipt.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_hostile_release import _build, _release
from test_hostile_trust import _forged_headings, _raw

HOSTILE = "x\n## Forged heading <img src=x onerror=alert(1)> | cell [a](javascript:y) \u202e"


def test_release_notes_escape_the_floor_table_and_the_substitution_headline(tmp_path: Path):
    """Issue 34: the glibc-floor table and the substitution headline copied receipt values
    raw into RELEASE_NOTES.md. The floor's symbol comes from the wheel itself: a real
    shared object from gcc whose versioned symbol name is rewritten in place."""
    from test_glibc_floor import NEW_C, compile_so, needs_glibc_234, wheel_of

    if needs_glibc_234.args[0]:
        pytest.skip("needs a glibc >= 2.34 build host")
    so = compile_so(tmp_path, "new", NEW_C)
    hostile = b"|<i>[a](j:y)`#"  # a cell split, raw HTML, a link, a code span: 14 bytes
    assert len(hostile) == len(b"pthread_create")
    so.write_bytes(so.read_bytes().replace(b"pthread_create", hostile))
    built = wheel_of(tmp_path, "newer", {"new.so": so})
    build = _build(tmp_path, [built])
    prov = json.loads((build / "provenance.json").read_text())
    wheel = next(p.name for p in build.glob("*.whl"))
    prov["components"] = [{
        "name": "demo", "kind": "kernel", "wheel": wheel, "sha256": "0" * 64,
        "floor": {"GLIBC": {"version": "2.34" + HOSTILE, "symbol": "sym" + HOSTILE,
                            "member": "m`" + HOSTILE, "library": "libc.so.6"}},
        "platform_tag": {"platform": "linux_x86_64|" + HOSTILE, "reason": HOSTILE},
    }]  # fmt: skip
    prov["substitutions"] = [{"key": "cuda", "pinned": "12.8", "used": "12.4" + HOSTILE,
                              "source": "--substitute", "reason": HOSTILE}]  # fmt: skip
    (build / "provenance.json").write_text(json.dumps(prov))
    assert _release(tmp_path, build, "--allow-unverified") == 0
    notes = (tmp_path / "rel" / "RELEASE_NOTES.md").read_text()
    assert not _forged_headings(notes), _forged_headings(notes)
    # inside a code span (the platform tag) markup is literal text: judged outside it
    span = re.search(r"`linux_x86_64¦[^`\n]*`", notes)
    assert span is not None, notes
    outside = notes.replace(span.group(), "``")
    assert not _raw(outside, "<img", "<i>", "](javascript", "[a]"), outside
    assert "\u202e" not in notes
    floor_rows = [ln for ln in notes.splitlines() if ln.startswith("| ") and "GLIBC" in ln]
    assert len(floor_rows) == 1, notes
    row = floor_rows[0].replace("\\|", "")  # escaped pipes are text, not cell borders
    assert row.count(" | ") == 3 - 1, floor_rows
    assert "\\|\\<i\\>\\[a\\](j:y)\\`#" in floor_rows[0]  # the wheel's symbol, escaped
    first = notes.splitlines()[0]
    assert "SUBSTITUTED TOOLCHAIN" in first and "Forged heading" in first
    assert not _raw(first, "<img", "[a]")

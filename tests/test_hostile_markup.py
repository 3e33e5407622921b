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

from test_hostile_release import _build, _release, good_wheel
from test_hostile_trust import _forged_headings, _raw

HOSTILE = "x\n## Forged heading <img src=x onerror=alert(1)> | cell [a](javascript:y) \u202e"


def test_release_notes_escape_the_floor_table_and_the_substitution_headline(tmp_path: Path):
    """Issue 34: the glibc-floor table and the substitution headline copied receipt values
    raw into RELEASE_NOTES.md."""
    build = _build(tmp_path, [good_wheel(tmp_path / "w")])
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
    # inside a code span (the platform tag) markup is literal text: judged outside them
    span = re.search(r"`linux_x86_64¦[^`\n]*`", notes)
    assert span is not None, notes
    outside = notes.replace(span.group(), "``")
    assert not _raw(outside, "<img", "](javascript", "[a]"), outside
    assert "\u202e" not in notes
    rows = [ln for ln in notes.splitlines() if ln.startswith(f"| {wheel[:10]}")]
    floor_rows = [r for r in rows if "GLIBC" in r]
    assert len(floor_rows) == 1 and floor_rows[0].count(" | ") == 3 - 1, floor_rows
    first = notes.splitlines()[0]
    assert "SUBSTITUTED TOOLCHAIN" in first and "Forged heading" in first

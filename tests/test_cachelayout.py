"""The cache layout has one owner: every folder pinwheel writes under the cache is a row of
``pinwheel.cachelayout.BUCKETS``, and ``cache clean`` keeps exactly what the table says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pinwheel import cachelayout
from pinwheel.compile import listing
from pinwheel.compile.toolchain import probememo
from pinwheel.source import cache, cachetool

SRC = Path(__file__).resolve().parents[1] / "src" / "pinwheel"
# `<something named cache>/ "folder"`: a top-level cache folder spelled by hand
BY_HAND = re.compile(r"\b\w*cache\w*\)?\s*/\s*(?:Path\()?\"([\w.-]+)\"")
BUCKET_CALL = re.compile(r"cachelayout\.bucket\([^,]+,\s*\"([\w.-]+)\"\)")


def test_no_module_spells_a_cache_folder_by_hand() -> None:
    found = [
        f"{p.relative_to(SRC)}:{n}: {m.group(0)}"
        for p in sorted(SRC.rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if (m := BY_HAND.search(line))
    ]
    assert not found, "cache folders not taken from cachelayout.bucket():\n" + "\n".join(found)


def test_every_bucket_a_module_names_is_in_the_table() -> None:
    named = {m for p in SRC.rglob("*.py") for m in BUCKET_CALL.findall(p.read_text())}
    assert named, "no module takes its folder from cachelayout.bucket()"
    assert named <= {b.name for b in cachelayout.BUCKETS}
    # prefixes kept as constants elsewhere start with a bucket too
    for prefix in (listing.HOOK_DIR, probememo.SUBDIR):
        assert cachelayout.known(Path(prefix).parts[0]) is not None, prefix
    assert cachelayout.known(cache.TAG) is not None


def test_an_unknown_bucket_is_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="not a cache bucket"):
        cachelayout.bucket(tmp_path, "elsewhere")


def test_cache_clean_keeps_what_the_table_keeps(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cache.mark(root)
    for b in cachelayout.BUCKETS:
        if b.name != cache.TAG:
            (root / b.name).mkdir(parents=True, exist_ok=True)
            (root / b.name / "x").write_text("x")
    (root / "stray").mkdir()
    cachetool.clean(root, apply=True)
    left = sorted(p.name for p in root.iterdir())
    assert left == sorted(cachelayout.kept_by_clean())

"""The card tables keep the cards' own words, and the margins on the cards' figures are guarded.

Every double-quoted phrase in a comment of tests/cards/*.toml is a quotation: it must
stand in the card's text (``...`` elides, the parts in order; whitespace, table pipes,
``**`` and backticks are ignored because the cards are copied from rendered pages).
The cards are read from $PINWHEEL_CARDS_DIR, else from ``../shared/seeds`` beside the
repository; without them the check skips and says so. Every ``tolerance`` of a
manifest must equal its entry in the card table's ``[defaults]`` (0.9 no longer slips
past), and the GB10 pack's ``local_dir`` ends in the Hub basename (the card's rule).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

from cardfacts import comment, labelled

ROOT = Path(__file__).resolve().parent.parent
CARDS = {"v100": "000", "gb10": "002", "sm120": "004"}


def _cards_dir() -> Path | None:
    env = os.environ.get("PINWHEEL_CARDS_DIR")
    d = Path(env) if env else ROOT.parent / "shared" / "seeds"
    return d if d.is_dir() else None


def _squash(text: str) -> str:
    return re.sub(r"[\s|*`]+", "", text.replace("\u2019", "'"))


def quotes(table_text: str) -> list[tuple[int, str]]:
    """(line, phrase) for every double-quoted phrase in the table's comments."""
    out = []
    for n, line in enumerate(table_text.splitlines(), start=1):
        note = comment(line)
        out += [(n, q) for q in re.findall(r'"([^"]+)"', note or "")]
    return out


def missing(phrases: list[tuple[int, str]], card: str) -> list[str]:
    text = _squash(card)
    bad = []
    for n, q in phrases:
        at = 0
        for part in (p for p in (_squash(x) for x in q.split("...")) if p):
            at = text.find(part, at)
            if at < 0:
                bad.append(f"line {n}: {q!r}")
                break
            at += len(part)
    return bad


@pytest.mark.parametrize("name", sorted(CARDS))
def test_every_quoted_phrase_stands_in_the_card(name):
    d = _cards_dir()
    if d is None:
        pytest.skip("no card texts: set PINWHEEL_CARDS_DIR (or keep ../shared/seeds) to check")
    (card,) = d.glob(f"{CARDS[name]}_*")
    phrases = quotes((ROOT / "tests" / "cards" / f"{name}.toml").read_text())
    assert len(phrases) >= 20
    assert missing(phrases, card.read_text()) == []


def test_the_phrase_check_sees_a_paraphrase_and_the_order():
    card = "| Time per forward pass | 32.4 ms |\nAccepted tokens per pass 2.79"
    ok = [(1, "Time per forward pass 32.4 ms"), (2, "Time per ... 2.79")]
    assert missing(ok, card) == []
    assert missing([(3, "Forward pass time 32.4 ms")], card) == [
        "line 3: 'Forward pass time 32.4 ms'"
    ]
    assert missing([(4, "2.79 ... Time per forward")], card) != []  # parts out of order


@pytest.mark.parametrize("name", sorted(CARDS))
def test_every_tolerance_equals_its_guarded_default(name):
    table = tomllib.loads((ROOT / "tests" / "cards" / f"{name}.toml").read_text())
    text = (ROOT / table["manifest"]).read_text()
    guarded = table["defaults"] | table["facts"]
    seen = {e.path: e.value for e in labelled(text) if e.path.split(".")[-1] == "tolerance"}
    for path, value in seen.items():
        assert path in guarded, f"{path} = {value} is not in tests/cards/{name}.toml [defaults]"
        assert value == guarded[path], (path, value, guarded[path])
    assert set(table["defaults"]) <= set(seen), "a guarded default left the manifest"


def test_a_changed_tolerance_fails_the_guard():
    table = tomllib.loads((ROOT / "tests" / "cards" / "v100.toml").read_text())
    text = (ROOT / table["manifest"]).read_text().replace("tolerance = 0.05", "tolerance = 0.9", 1)
    seen = {e.path: e.value for e in labelled(text) if e.path.endswith(".tolerance")}
    assert any(v != table["defaults"][p] for p, v in seen.items())


def test_the_gb10_local_dir_ends_in_the_hub_basename():
    data = tomllib.loads((ROOT / "recipes" / "gb10-k2" / "manifest.toml").read_text())
    model = data["model"]
    assert Path(model["local_dir"]).name == model["repo"].split("/")[-1]

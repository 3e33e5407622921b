"""The card tables and manifests keep the cards' own words; the defaults gates hang on are guarded.

Every double-quoted phrase in a comment of tests/cards/*.toml, and in a ``# card:`` or
``# facts:`` comment of the three manifests, is a quotation: it must stand in its source
(the card, or for ``facts:`` and a card table's ``[linked]`` the card's linked-runtime
facts file beside it; ``...`` elides, the parts in order; whitespace, table pipes, ``**``
and backticks are ignored because the cards are copied from rendered pages). The cards
are read from $PINWHEEL_CARDS_DIR, else from ``../shared/seeds`` beside the repository;
without them those checks skip and say so. Every ``# default:`` value a gate's outcome
depends on (a margin, an informational figure, a smoke answer, a protocol, a count)
equals its entry in the card table's ``[defaults]`` and none may vanish; a smoke prompt
that is a product expects the product; the GB10 pack's ``local_dir`` ends in the Hub
basename (the card's rule).
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
LINKED = {"sm120": "004-linked-runtime-facts.md"}  # the card's linked-repository facts


def _cards_dir() -> Path | None:
    env = os.environ.get("PINWHEEL_CARDS_DIR")
    d = Path(env) if env else ROOT.parent / "shared" / "seeds"
    return d if d.is_dir() else None


def _squash(text: str) -> str:
    return re.sub(r"[\s|*`]+", "", text.replace("\u2019", "'"))


def quotes(table_text: str, section: str | None = None) -> list[tuple[int, str]]:
    """(line, phrase) for every double-quoted phrase in the table's comments (of one
    ``[section]`` only, when given; ``"facts"`` also covers the lines before any header)."""
    out = []
    current = "facts"
    for n, line in enumerate(table_text.splitlines(), start=1):
        header = re.match(r"^\[([A-Za-z]+)\]", line)
        if header:
            current = header.group(1)
        if section is not None and current != section:
            continue
        note = comment(line)
        out += [(n, q) for q in re.findall(r'"([^"]+)"', note or "")]
    return out


def label_quotes(manifest_text: str, kind: str) -> list[tuple[int, str]]:
    """(line, phrase) for every double-quoted phrase in the manifest's ``# kind:`` comments,
    array element lines included (each engine flag quotes its source on its own line)."""
    out = []
    for n, line in enumerate(manifest_text.splitlines(), start=1):
        if line.lstrip().startswith("#"):
            continue
        note = comment(line)
        if note and note.startswith(kind + ":"):
            out += [(n, q) for q in re.findall(r'"([^"]+)"', note)]
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


def _texts(name: str) -> tuple[str, str | None]:
    d = _cards_dir()
    if d is None:
        pytest.skip("no card texts: set PINWHEEL_CARDS_DIR (or keep ../shared/seeds) to check")
    (card,) = d.glob(f"{CARDS[name]}_*")
    linked = (d / LINKED[name]).read_text() if name in LINKED else None
    return card.read_text(), linked


@pytest.mark.parametrize("name", sorted(CARDS))
def test_every_quoted_phrase_stands_in_the_card(name):
    card, linked = _texts(name)
    table = (ROOT / "tests" / "cards" / f"{name}.toml").read_text()
    phrases = quotes(table, "facts")
    assert len(phrases) >= 20
    assert missing(phrases, card) == []
    if linked is not None:
        assert len(quotes(table, "linked")) >= 30
        assert missing(quotes(table, "linked"), linked) == []


@pytest.mark.parametrize("name", sorted(CARDS))
def test_every_quoted_label_of_the_manifest_stands_in_its_source(name):
    """A `# card: "..."` label quotes its own card; a `# facts: "..."` label the facts file."""
    card, linked = _texts(name)
    table = tomllib.loads((ROOT / "tests" / "cards" / f"{name}.toml").read_text())
    text = (ROOT / table["manifest"]).read_text()
    assert len(label_quotes(text, "card")) >= 40
    assert missing(label_quotes(text, "card"), card) == []
    facts = label_quotes(text, "facts")
    assert missing(facts, linked or "") == [] and (linked is None) == (facts == [])


def test_a_label_quoting_another_card_fails():
    """The SM120 manifest's kernel URL once cited card 004 for turboderp-org (card 000's)."""
    card, _ = _texts("sm120")
    text = (ROOT / "recipes" / "sm120-tp2" / "manifest.toml").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("url = "))
    edited = text.replace(line, line.split("#")[0] + '# card: "turboderp-org/exllamav3"')
    n = edited.splitlines().index(line.split("#")[0] + '# card: "turboderp-org/exllamav3"') + 1
    assert missing(label_quotes(edited, "card"), card) == [f"line {n}: 'turboderp-org/exllamav3'"]


def test_the_phrase_check_sees_a_paraphrase_and_the_order():
    card = "| Time per forward pass | 32.4 ms |\nAccepted tokens per pass 2.79"
    ok = [(1, "Time per forward pass 32.4 ms"), (2, "Time per ... 2.79")]
    assert missing(ok, card) == []
    assert missing([(3, "Forward pass time 32.4 ms")], card) == [
        "line 3: 'Forward pass time 32.4 ms'"
    ]
    assert missing([(4, "2.79 ... Time per forward")], card) != []  # parts out of order


# `# default:` values a gate's outcome hangs on: guarded in each card table's [defaults].
_GUARDED = {"tolerance", "informational", "expect", "protocol", "cold_start_protocol",
            "cold_starts", "strict", "thinking", "repeats", "warmup", "max_tokens",
            "concurrency", "needle_depths", "needle_max_tokens"}  # fmt: skip


def _gate_shaping(path: str) -> bool:
    last = path.split(".")[-1]
    return path.startswith("qualify.") and (last in _GUARDED or last.startswith(("min_", "max_")))


def unguarded(name: str, text: str) -> list[str]:
    """Every way the manifest's gate-shaping values and the card table disagree."""
    table = tomllib.loads((ROOT / "tests" / "cards" / f"{name}.toml").read_text())
    guarded = table["defaults"] | table["facts"]
    seen = {e.path: e.value for e in labelled(text) if _gate_shaping(e.path)}
    bad = [f"{p} = {v!r} is not in tests/cards/{name}.toml" for p, v in seen.items()
           if p not in guarded]  # fmt: skip
    bad += [f"{p} = {v!r}, the table says {guarded[p]!r}" for p, v in seen.items()
            if p in guarded and v != guarded[p]]  # fmt: skip
    bad += [f"{p} left the manifest" for p in table["defaults"] if p not in seen]
    return bad


def _manifest_text(name: str) -> str:
    table = tomllib.loads((ROOT / "tests" / "cards" / f"{name}.toml").read_text())
    return (ROOT / table["manifest"]).read_text()


@pytest.mark.parametrize("name", sorted(CARDS))
def test_every_gate_shaping_default_equals_its_guarded_value(name):
    assert unguarded(name, _manifest_text(name)) == []


def test_a_changed_tolerance_fails_the_guard():
    text = _manifest_text("v100").replace("tolerance = 0.05", "tolerance = 0.9", 1)
    assert unguarded("v100", text) == [
        "qualify.profile.card.tolerance = 0.9, the table says 0.05"
    ]


def test_a_deleted_informational_fails_the_guard():
    """GB10 64k's tok/s would become a hard gate without its `informational`."""
    text = _manifest_text("gb10")
    line = next(ln for ln in text.splitlines()[text.splitlines().index("[qualify.profile.64k]"):]
                if ln.startswith("informational = "))  # fmt: skip
    assert unguarded("gb10", text.replace(line + "\n", "")) == [
        "qualify.profile.64k.informational left the manifest"
    ]


def test_a_wrong_smoke_answer_labelled_default_fails():
    text = _manifest_text("v100")
    edited = text.replace('expect = "391"  # default:', 'expect = "392"  # default: a default', 1)
    assert edited != text
    assert unguarded("v100", edited) == [
        "qualify.smoke.0.expect = '392', the table says '391'"
    ]
    assert _smoke_products(edited) == [("What is 17*23?", "392", 391)]


def _smoke_products(text: str) -> list[tuple[str, str, int]]:
    """(prompt, expect, product) for every smoke prompt `A * B` whose answer is wrong."""
    bad = []
    for sm in tomllib.loads(text).get("qualify", {}).get("smoke", []):
        m = re.search(r"(\d+)\s*[*×x]\s*(\d+)", sm["prompt"])
        if m and sm.get("expect") != str(int(m.group(1)) * int(m.group(2))):
            bad.append((sm["prompt"], sm.get("expect"), int(m.group(1)) * int(m.group(2))))
    return bad


@pytest.mark.parametrize("name", sorted(CARDS))
def test_every_smoke_product_expects_the_product(name):
    text = _manifest_text(name)
    assert _smoke_products(text) == []
    if name != "sm120":  # the SM120 card quotes no smoke prompt
        assert tomllib.loads(text)["qualify"]["smoke"]


def test_the_gb10_local_dir_ends_in_the_hub_basename():
    data = tomllib.loads((ROOT / "recipes" / "gb10-k2" / "manifest.toml").read_text())
    model = data["model"]
    assert Path(model["local_dir"]).name == model["repo"].split("/")[-1]

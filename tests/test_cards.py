"""The drift guard: every `# card:` value of the three system manifests equals its card's fact.

tests/cards/*.toml hold each card's facts and figures, keyed by the manifest key that
carries them. A manifest value cited as the card must equal its fact; a fact must be in
the manifest, cited as the card; every key line names its source. Editing a value away
from its card, deleting it or relabelling it fails here.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from cardfacts import drift, labelled, unlabelled
from pinwheel.manifest import model

ROOT = Path(__file__).resolve().parent.parent
CARDS = {name: ROOT / "tests" / "cards" / f"{name}.toml" for name in ("v100", "gb10", "sm120")}


def _card(name: str) -> tuple[Path, str, dict[str, Any]]:
    table = tomllib.loads(CARDS[name].read_text())
    manifest = ROOT / table["manifest"]
    return manifest, manifest.read_text(), table["facts"]


def _linked(name: str) -> dict[str, Any]:
    """The card table's ``[linked]``: values from the card's linked repository."""
    return dict(tomllib.loads(CARDS[name].read_text()).get("linked", {}))


@pytest.mark.parametrize("name", sorted(CARDS))
def test_manifest_values_equal_their_card(name):
    manifest, text, facts = _card(name)
    assert drift(text, facts, manifest.name) == []
    assert drift(text, _linked(name), manifest.name, "facts") == []
    assert len(facts) >= 40  # the card's facts, not a token few
    model.load(manifest)  # and the manifest still parses with its values


def test_a_changed_sm120_container_port_fails():
    """The linked facts: "8012 on both sides by default"; the image's port is no default."""
    manifest, text, _ = _card("sm120")
    edited = text.replace("container_port = 8012", "container_port = 8000", 1)
    assert edited != text
    n = _line(edited, "container_port = 8000")
    assert drift(edited, _linked("sm120"), manifest.name, "facts") == [
        f"{manifest.name}:{n}: serve.engine.container_port = 8000, the facts says 8012"
    ]


@pytest.mark.parametrize("name", sorted(CARDS))
def test_every_value_names_its_source(name):
    _, text, _ = _card(name)
    assert unlabelled(text) == [], "label each line: # card: / # default: / # lock / # FILL IN"


def _other(value: Any) -> Any:
    """A different value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return round(value * 1.01 + 0.001, 6)
    if isinstance(value, str):
        return "x" + value
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    return {**value, "extra": "x"}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{ " + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + " }"


def _single_line_card_entries(text: str):
    for e in labelled(text):
        line = text.splitlines()[e.line - 1]
        if (
            e.label
            and e.label.startswith("card:")
            and not line.split("#")[0].rstrip().endswith("[")
        ):
            yield e, line


@pytest.mark.parametrize("name", sorted(CARDS))
def test_editing_any_card_value_away_fails(name):
    """Each one-line `# card:` value, edited in place, is reported by path and line."""
    manifest, text, facts = _card(name)
    lines = text.splitlines()
    checked = 0
    for e, line in _single_line_card_entries(text):
        key = line.split("=", 1)[0]
        edited = lines.copy()
        edited[e.line - 1] = f"{key}= {_toml(_other(e.value))}  # {e.label}"
        problems = drift("\n".join(edited) + "\n", facts, manifest.name)
        assert any(f":{e.line}: {e.path} = " in p for p in problems), (e.path, problems)
        checked += 1
    assert checked >= 30


def test_a_flag_dropped_from_the_card_command_fails():
    manifest, text, facts = _card("v100")
    edited = text.replace('  "--gpu-memory-utilization", "0.92",\n', "", 1)
    problems = drift(edited, facts, manifest.name)
    assert len(problems) == 1 and "serve.profile.card.args" in problems[0]
    assert "'0.92'" in problems[0]  # the card's value is shown


def test_a_deleted_or_relabelled_card_value_fails():
    manifest, text, facts = _card("sm120")
    line = next(ln for ln in text.splitlines() if ln.startswith("digest = "))
    gone = drift(text.replace(line + "\n", ""), facts, manifest.name)
    assert gone == [
        f"{manifest.name}: serve.engine.digest (the card's "
        f"{facts['serve.engine.digest']!r}) is missing or not cited as card"
    ]
    relabelled = text.replace(line, line.split("#")[0] + "# default: a guess")
    assert drift(relabelled, facts, manifest.name) == gone


def test_a_new_card_citation_needs_a_fact():
    manifest, text, facts = _card("gb10")
    edited = text.replace("port = 8000  # default:", "port = 8000  # card: invented", 1)
    assert drift(edited, facts, manifest.name) == [
        f"{manifest.name}:{_line(edited, 'port = 8000')}: serve.port cites the card but the "
        "card table has no fact"
    ]


def test_the_upstream_commit_is_checked_against_the_cards_short_sha():
    manifest, text, facts = _card("v100")
    assert facts["upstream.commit"] == {"prefix": "ec60883ad"}
    edited = text.replace('commit = "ec60883ad', 'commit = "ec60883ae', 1)
    assert any("upstream.commit" in p for p in drift(edited, facts, manifest.name))


def test_an_unlabelled_value_is_named():
    _, text, _ = _card("v100")
    edited = text.replace("warmup = 1  # default", "warmup = 1", 1)
    assert unlabelled(edited) == [f"line {_line(edited, 'warmup = 1')}: qualify.warmup"]


def _line(text: str, start: str) -> int:
    return next(n for n, ln in enumerate(text.splitlines(), 1) if ln.startswith(start))

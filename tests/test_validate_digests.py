"""Hex digests are spelled once, in pinwheel.validate: a git commit id and a sha256, each a
pattern other patterns compose and a predicate call sites use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pinwheel import validate

SRC = Path(__file__).resolve().parents[1] / "src" / "pinwheel"
_SPELLED = re.compile(r"\[0-9a-f(?:A-F)?\]\{(?:40|64)\}")


def test_no_module_but_validate_spells_a_hex_digest_pattern() -> None:
    found = [
        f"{p.relative_to(SRC)}:{n}"
        for p in sorted(SRC.rglob("*.py"))
        if p.name != "validate.py" and "workers" not in p.parts
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if _SPELLED.search(line)
    ]
    assert not found, "use validate.GIT_SHA_HEX / SHA256_HEX / is_sha256 / is_git_sha: " + str(
        found
    )


def test_the_spelling_check_sees_a_planted_pattern() -> None:
    assert _SPELLED.search('X = re.compile(r"[0-9a-f]{64}")')
    assert _SPELLED.search("re.fullmatch(r'[0-9a-fA-F]{64}', d)")
    assert _SPELLED.search('SHA = re.compile(r"[0-9a-f]{40}")')


@pytest.mark.parametrize(
    ("value", "git", "sha256", "any_case", "object_id"),
    [
        ("a" * 40, True, False, False, True),
        ("0123456789abcdef" * 4, False, True, True, True),
        ("A" * 64, False, False, True, False),
        ("a" * 39, False, False, False, False),
        ("a" * 40 + "\n", False, False, False, False),  # fullmatch: no trailing newline
        ("g" * 64, False, False, False, False),
        ("٠" * 64, False, False, False, False),  # Arabic-Indic digits are not hex
        (None, False, False, False, False),
        (b"a" * 64, False, False, False, False),
    ],
)
def test_digest_predicates(value, git, sha256, any_case, object_id) -> None:
    assert validate.is_git_sha(value) is git
    assert validate.is_sha256(value) is sha256
    assert validate.is_sha256(value, any_case=True) is any_case
    assert validate.is_git_object_id(value) is object_id
    assert (validate.sha_problem(value) is None) is git

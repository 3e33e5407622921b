"""Needle-in-a-haystack prompts of an exact token length, and honest scoring.

Prompts are built as token ids with the server's own tokenizer (``/tokenize``),
so a "101K" prompt is 101,000 tokens of the model being qualified, not an
estimate. The chat template is kept: its prefix and suffix are cut from the
tokenized template around a sentinel. The server's ``usage.prompt_tokens``
confirms the length on every run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pinwheel.errors import PinwheelError

SENTINEL = "Zqxj"  # a word whose tokens appear nowhere in a chat template
INTRO = "Read the following text carefully. Somewhere in it is a secret passphrase.\n\n"
QUESTION = (
    "\n\nWhat is the secret passphrase mentioned in the text above? Reply with the passphrase only."
)
# Plain, repetitive filler: easy to skip, so only the needle carries information.
FILLER = (
    "The river ran slowly past the old mill on the edge of the village.",
    "Farmers brought their grain there every autumn after the harvest.",
    "The miller kept careful records of every sack in a leather ledger.",
    "In winter the wheel froze and the village waited for the spring thaw.",
    "Children played by the water while their parents talked about the weather.",
    "A stone bridge crossed the river a little further downstream.",
    "Travellers often stopped at the inn beside the bridge for a warm meal.",
    "The innkeeper served bread baked from flour ground at the mill.",
    "Every market day the square filled with stalls of cheese and apples.",
    "The church bell rang at noon and again at six in the evening.",
)
WORDS = ("amber", "cobalt", "falcon", "granite", "harbor", "juniper", "lantern", "meadow")
MIN_HAYSTACK = 64  # tokens of filler, at least
_REPEAT = re.compile(r"(.)\1{19,}", re.S)


class NeedleError(PinwheelError):
    pass


@dataclass(frozen=True)
class Layout:
    """Token pieces a needle prompt is made of, tokenized once per server."""

    prefix: tuple[int, ...]  # chat template before the user's text
    suffix: tuple[int, ...]  # chat template after it (the assistant turn)
    intro: tuple[int, ...]
    question: tuple[int, ...]
    filler: tuple[int, ...]  # one paragraph, repeated as needed
    boundaries: tuple[int, ...]  # sentence starts inside the paragraph

    @property
    def fixed(self) -> int:
        return len(self.prefix) + len(self.suffix) + len(self.intro) + len(self.question)


Tokenize = Callable[..., list[int]]  # tokenize(prompt=...) / tokenize(messages=...)


def layout(tokenize: Tokenize) -> Layout:
    templated = tokenize(messages=[{"role": "user", "content": SENTINEL}])
    marker = tokenize(prompt=SENTINEL)
    at = _find(templated, marker)
    if at < 0:
        raise NeedleError(
            "could not find the user's text inside the tokenized chat template",
            where="/tokenize",
            next="check the model's chat template (the needle needs one user turn)",
        )
    pieces: list[int] = []
    starts: list[int] = []
    for sentence in FILLER:
        starts.append(len(pieces))
        pieces += tokenize(prompt=" " + sentence)
    return Layout(
        prefix=tuple(templated[:at]),
        suffix=tuple(templated[at + len(marker) :]),
        intro=tuple(tokenize(prompt=INTRO)),
        question=tuple(tokenize(prompt=QUESTION)),
        filler=tuple(pieces),
        boundaries=tuple(starts),
    )


def _find(haystack: Sequence[int], needle: Sequence[int]) -> int:
    n = len(needle)
    for i in range(len(haystack) - n + 1):
        if list(haystack[i : i + n]) == list(needle):
            return i
    return -1


def needle_value(length: int, depth: float) -> str:
    """A passphrase unique to the case, so one case's answer cannot pass another."""
    word = WORDS[(length // 7 + int(depth * 100)) % len(WORDS)]
    return f"{word}-{(length * 31 + int(depth * 1000) * 17) % 9000 + 1000}"


def build(lay: Layout, needle: Sequence[int], length: int, depth: float) -> list[int]:
    """Token ids of exactly ``length``: template, intro, filler with the needle at ``depth``."""
    room = length - lay.fixed - len(needle)
    if room < MIN_HAYSTACK:
        raise NeedleError(
            f"a {length}-token prompt leaves no room for the haystack "
            f"(template, question and needle take {lay.fixed + len(needle)})",
            where="[qualify] needle_lengths",
            next="use needle lengths of at least a few hundred tokens",
        )
    reps = room // len(lay.filler) + 1
    body = list(lay.filler) * reps
    body = body[:room]
    # Put the needle at a sentence start near the requested depth.
    target = int(depth * room)
    para = len(lay.filler)
    starts = [r * para + b for r in range(reps) for b in lay.boundaries if r * para + b <= room]
    at = min(starts, key=lambda s: abs(s - target))
    ids = list(lay.prefix) + list(lay.intro) + body[:at] + list(needle) + body[at:]
    ids += list(lay.question) + list(lay.suffix)
    assert len(ids) == length, (len(ids), length)
    return ids


@dataclass(frozen=True)
class Score:
    status: str  # pass | miss | garbage
    reason: str  # why, in a few words
    answer: str


def score(text: str, value: str, finish_reason: str | None) -> Score:
    """Exact match of the passphrase in the answer, ignoring letter case (a model that
    writes "Amber-7932" for "amber-7932" found it); garbage is named, never a miss."""
    answer = text.rsplit("</think>", 1)[-1].strip()
    found = value.lower() in answer.lower()
    if not answer:
        return Score("garbage", "empty answer", answer)
    if _REPEAT.search(answer):
        return Score("garbage", "a run of one character", answer[:200])
    if finish_reason == "length" and not found:
        return Score("garbage", "hit the length cap without answering", answer[:200])
    if found:
        return Score("pass", "exact passphrase in the answer", answer[:200])
    return Score("miss", "passphrase not in the answer", answer[:200])

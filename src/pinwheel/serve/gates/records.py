"""Gates judged on what the server answered, recorded in the receipt: the needle,
the served model name, the card's smoke prompts and the start-up log markers.
verify-receipt re-derives each from the receipt's own records (``needles``,
``smoke``, ``markers``) or from the gate's measured and needed text."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pinwheel.serve.gates.base import Measured, Reading
from pinwheel.serve.receipt import Gate


class Needle:
    """Every depth of the profile's ``needle_required`` length answers the needle."""

    key = "needle_required"
    informational = False

    def judge(self, m: Measured) -> Iterable[Gate]:
        if m.prof is None or m.prof.needle_required is None:
            return ()
        at = [n for n in m.needles if n.length == m.prof.needle_required]
        bad = [n for n in at if n.status != "pass"]
        return (
            Gate(
                f"needle at {m.prof.needle_required} tokens",
                "PASS" if at and not bad else "FAIL",
                f"{len(at) - len(bad)}/{len(m.prof.needle_depths)} depths pass",
                "every depth",
                "; ".join(f"depth {n.depth}: {n.status} ({n.reason})" for n in bad),
            ),
        )

    def owns(self, name: str) -> bool:
        return re.fullmatch(r"needle at (\d{1,9}) tokens", name) is not None

    def derive(self, r: Reading, g: Mapping[str, Any], field: str) -> str:
        length = int(str(g.get("name"))[len("needle at ") :].split(" ")[0])
        at = [n for n in r.records("needles")
              if isinstance(n, Mapping) and n.get("length") == length]  # fmt: skip
        return "PASS" if at and all(n.get("status") == "pass" for n in at) else "FAIL"


class ServedName:
    """/v1/models lists the name clients send (``[serve] served_model_name``)."""

    key = "[serve] served_model_name"
    informational = False
    name = "served model name"

    def judge(self, m: Measured) -> Iterable[Gate]:
        want, got = m.served
        if want is None:
            return ()
        return (
            Gate(self.name, "PASS" if got == want else "FAIL",
                 repr(got) if got is not None else "not measured", repr(want),
                 "/v1/models lists the name clients send ([serve] served_model_name)"),
        )  # fmt: skip

    def owns(self, name: str) -> bool:
        return name == self.name

    def derive(self, r: Reading, g: Mapping[str, Any], field: str) -> str:
        measured, threshold = g.get("measured"), g.get("threshold")
        return "PASS" if measured == threshold and measured != "not measured" else "FAIL"


class Smoke:
    """Each of the card's smoke prompts, sent greedy, got a reply (holding ``expect``)."""

    key = "[[qualify.smoke]]"
    informational = False

    def judge(self, m: Measured) -> Iterable[Gate]:
        return tuple(
            Gate(f"smoke prompt {sm.prompt!r}", "PASS" if sm.status == "pass" else "FAIL",
                 repr(sm.reply[:60]), f"reply contains {sm.expect!r}" if sm.expect else "a reply",
                 f"finish_reason {sm.finish_reason}")  # fmt: skip
            for sm in m.smoke
        )

    def owns(self, name: str) -> bool:
        return name.startswith("smoke prompt ")

    def derive(self, r: Reading, g: Mapping[str, Any], field: str) -> str:
        name = g.get("name")
        hits = [s for s in r.records("smoke")
                if isinstance(s, Mapping) and name == f"smoke prompt {s.get('prompt')!r}"]
        return "PASS" if hits and all(s.get("status") == "pass" for s in hits) else "FAIL"


class Marker:
    """Each start-up log marker (``markers``) found in the server's log; SKIP unchecked."""

    key = "markers"
    informational = False

    def judge(self, m: Measured) -> Iterable[Gate]:
        out = []
        for mk in m.markers:
            status = {"found": "PASS", "missing": "FAIL"}.get(mk.status, "SKIP")
            unchecked = "no log to check: pass --log" if status == "SKIP" else ""
            out.append(Gate(f"start-up marker /{mk.pattern}/", status, mk.status, "found",
                            mk.line or unchecked))  # fmt: skip
        return out

    def owns(self, name: str) -> bool:
        return name.startswith("start-up marker /") and name.endswith("/")

    def derive(self, r: Reading, g: Mapping[str, Any], field: str) -> str:
        pattern = str(g.get("name"))[len("start-up marker /") : -1]
        found = [x.get("status") for x in r.records("markers")
                 if isinstance(x, Mapping) and x.get("pattern") == pattern]  # fmt: skip
        if not found:
            return "FAIL"
        return {"found": "PASS", "missing": "FAIL"}.get(str(found[0]), "SKIP")


NEEDLE = Needle()
SERVED_NAME = ServedName()
SMOKE = Smoke()
MARKER = Marker()

"""Adding a gate is one module and one row (issue 48): a throwaway row, declared here
and put in the table for one test, is judged by a real `pinwheel qualify` run against a
stand-in server over HTTP, counted in the verdict and exit code, rendered in report.md,
and re-derived by `qualify verify-receipt` from the receipt's records; no other module
knows it (without its row, verify-receipt refuses the gate)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from pinwheel.cli import main
from pinwheel.errors import PinwheelError
from pinwheel.serve import verify
from pinwheel.serve.gates import table
from pinwheel.serve.gates.base import GateRule, Measured, Reading
from pinwheel.serve.receipt import Gate
from test_card_gates import _qualify, _StandIn


@dataclass(frozen=True)
class FirstToken:
    """The throwaway gate: every single-stream sample's time to first token under a limit."""

    limit: float
    key: str = "max_ttft_s"  # the manifest key a real row would read its limit from
    informational: bool = False
    name: str = "first token in time (every sample)"

    def judge(self, m: Measured) -> Iterable[Gate]:
        worst = max((d.ttft_s for d in m.decode), default=None)
        ok = worst is not None and worst <= self.limit
        return (Gate(self.name, "PASS" if ok else "FAIL", f"{worst!r} s", f"<= {self.limit} s",
                     f"worst of {len(m.decode)} samples"),)  # fmt: skip

    def owns(self, name: str) -> bool:
        return name == self.name

    def derive(self, r: Reading, g: Mapping[str, Any], field: str) -> str:
        ttfts = [d.get("ttft_s") for d in r.records("decode") if isinstance(d, Mapping)]
        ok = bool(ttfts) and all(isinstance(t, float) and t <= self.limit for t in ttfts)
        return "PASS" if ok else "FAIL"


def _run(tmp_path, monkeypatch, row: GateRule):
    monkeypatch.setattr(table, "GATES", (*table.GATES, row))
    return _qualify(tmp_path, type("H", (_StandIn,), {"passes": 0}))


def _checks(path) -> dict[str, str]:
    return {c.name: c.status for c in verify.verify(verify.VerifyRequest(path)).checks}


def test_a_new_row_is_judged_rendered_and_re_derived(tmp_path, monkeypatch, capsys):
    row = FirstToken(limit=60.0)
    code, gates, receipt = _run(tmp_path, monkeypatch, row)
    assert code == 0 and receipt["verdict"] == "PASS"
    assert gates[row.name]["status"] == "PASS" and gates[row.name]["threshold"] == "<= 60.0 s"
    assert receipt["gates"][-1]["name"] == row.name  # its place: the table's last row
    report = (tmp_path / "report.md").read_text()
    measured = gates[row.name]["measured"]  # markup escapes "<" in the table
    assert f"| {row.name} | PASS | {measured} | \\<= 60.0 s | worst of 2 samples |" in report

    path = tmp_path / "receipt.json"
    checks = _checks(path)
    label = next(n for n in checks if row.name in n)
    assert checks[label] == "match" and all(s != "mismatch" for s in checks.values())
    assert main(["qualify", "verify-receipt", str(path)]) == 0

    # The row's own derive reads the receipt's records: a slower sample written in
    # afterwards makes the stored PASS a mismatch, and the re-derived verdict FAIL.
    data = json.loads(path.read_text())
    data["decode"][0]["ttft_s"] = 61.0
    path.write_text(json.dumps(data))
    checks = _checks(path)
    assert checks[label] == "mismatch" and checks["verdict (from the gates)"] == "mismatch"
    assert main(["qualify", "verify-receipt", str(path)]) != 0

    # No other module knows the gate: without its row, verify-receipt refuses it.
    monkeypatch.setattr(table, "GATES", tuple(r for r in table.GATES if r is not row))
    with pytest.raises(PinwheelError, match="a gate verify-receipt cannot re-derive"):
        verify.verify(verify.VerifyRequest(path))


def test_a_failing_new_row_fails_the_run(tmp_path, monkeypatch, capsys):
    row = FirstToken(limit=0.0)
    code, gates, receipt = _run(tmp_path, monkeypatch, row)
    assert gates[row.name]["status"] == "FAIL"
    assert code == 7 and receipt["verdict"] == "FAIL"
    assert "**FAIL**" in (tmp_path / "report.md").read_text()
    checks = _checks(tmp_path / "receipt.json")
    assert checks[next(n for n in checks if row.name in n)] == "match"


def test_every_row_meets_the_protocol_and_names_its_manifest_key():
    names = [type(r).__name__ for r in table.GATES]
    assert len(table.GATES) == 12, names
    for row in table.GATES:
        assert isinstance(row.key, str) and row.key, row
        assert isinstance(row.informational, bool)
        assert callable(row.judge) and callable(row.owns) and callable(row.derive)
    # A measurement with no manifest key set gives no gate at all.
    assert table.judge(Measured()) == ()

"""Gates that measure what the cards measured: mean acceptance length (1 + accepted/drafts),
acceptance rate, the card's figure with a labelled margin, informational figures that never
fail, the served model name and the cards' smoke prompts.

The end-to-end test runs `pinwheel qualify` against a real HTTP server on localhost that
stands in for vLLM's OpenAI endpoints (a real vLLM server is in test_qualify_cpu.py): it
answers chat streams and exposes spec-decode counters that grow like MTP k=3's.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pinwheel.cli import main
from pinwheel.errors import ManifestError
from pinwheel.manifest import model as manifest
from pinwheel.serve.gates.base import Measured
from pinwheel.serve.gates.table import judge
from pinwheel.serve.receipt import Acceptance, SmokeResult, Spread
from test_qualify_fast import _profile as qualify_profile


def _profile(**kw):
    """test_qualify_fast's profile, with no needle lengths unless a test asks."""
    return qualify_profile(**({"needle_lengths": ()} | kw))


def test_acceptance_length_counts_the_bonus_token_as_the_card_does():
    # The V100 card: 32.4 ms per pass at 2.79 tokens per pass is 86 tok/s: 2.79 is
    # 1 + accepted/drafts. 179 accepted over 100 verify passes of 3 drafts each.
    acc = Acceptance(drafts=100, draft_tokens=300, accepted=179)
    assert acc.mean_length == pytest.approx(2.79) and acc.rate == pytest.approx(179 / 300)
    (gate,) = judge(Measured(_profile(min_acceptance_length=2.79), acceptance=acc))
    assert gate.status == "PASS" and gate.measured == "2.79"
    low = Acceptance(drafts=100, draft_tokens=300, accepted=178)
    (gate,) = judge(Measured(_profile(min_acceptance_length=2.79), acceptance=low))
    assert gate.status == "FAIL" and gate.measured == "2.78"  # accepted/drafts alone: 1.78


def test_acceptance_rate_is_accepted_per_drafted_token():
    # The SM120 card: 629 accepted of 1,044 drafted tokens over 348 steps = 60.25%.
    acc = Acceptance(drafts=348, draft_tokens=1044, accepted=629)
    assert round(acc.rate * 100, 2) == 60.25
    (gate,) = judge(Measured(_profile(min_acceptance_rate=0.6024), acceptance=acc))
    assert gate.status == "PASS"
    (gate,) = judge(Measured(_profile(min_acceptance_rate=0.61), acceptance=acc))
    assert gate.status == "FAIL"


def test_no_spec_decode_counters_fail_an_acceptance_gate_with_the_reason():
    (gate,) = judge(Measured(_profile(min_acceptance_length=2.0)))
    assert gate.status == "FAIL" and "spec_decode" in gate.detail


def test_tolerance_widens_the_cards_figure_and_says_so():
    prof = _profile(min_tok_s=91.4, max_ms_per_pass=32.4, tolerance=0.05)
    gates = judge(Measured(prof, single=Spread(86.9, 86.0, 88.0, 3), ms_pass=Spread(34.0, 33.9, 34.1, 3)))
    tok, ms = gates
    assert tok.status == "PASS" and tok.threshold == ">= 86.83 (card 91.4, 5% margin)"
    assert ms.status == "PASS" and ms.threshold == "<= 34.02 (card 32.4, 5% margin)"
    gates = judge(Measured(prof, single=Spread(86.82, 86.0, 88.0, 3), ms_pass=Spread(34.03, 33.9, 34.1, 3)))
    assert [g.status for g in gates] == ["FAIL", "FAIL"]


def test_an_informational_figure_is_compared_but_never_fails():
    why = "the card's prompts are not given"
    prof = _profile(min_tok_s=147.79, informational=(("tok_s", why),))
    (gate,) = judge(Measured(prof, single=Spread(20.0, 19.0, 21.0, 3)))
    assert gate.status == "INFO" and why in gate.detail and "outside" in gate.detail
    (gate,) = judge(Measured(prof))
    assert gate.status == "INFO" and gate.measured == "not measured"


def test_served_name_and_smoke_gates():
    smoke = (
        SmokeResult("What is 17*23?", "391", "pass", "17*23 = 391", "stop"),
        SmokeResult("17 * 6", "102", "fail", "I think 104", "stop"),
    )
    gates = judge(Measured(_profile(), smoke=smoke, served=("a", "b")))
    assert [(g.name, g.status) for g in gates] == [
        ("served model name", "FAIL"),
        ("smoke prompt 'What is 17*23?'", "PASS"),
        ("smoke prompt '17 * 6'", "FAIL"),
    ]


@pytest.mark.parametrize(
    "line",
    [
        "min_acceptance_length = 0.5",
        "min_acceptance_rate = 1.5",
        "tolerance = nan",
        "min_tok_s = inf",
        "max_ms_per_pass = nan",
        'informational = { speed = "x" }',
        "markers = ['(']",
    ],
)
def test_bad_gate_keys_are_refused_with_file_and_line(tmp_path, line):
    path = tmp_path / "m.toml"
    path.write_text(_MANIFEST.format(extra=line, smoke=""))
    with pytest.raises(ManifestError) as err:
        manifest.load(path)
    n = 1 + _MANIFEST.format(extra=line, smoke="").splitlines().index(line)
    assert f"m.toml:{n}" in str(err.value)


# --------------------------------------------------------------------------- end to end

_MANIFEST = """\
[manifest]
name = "gates"

[upstream]
url = "https://example.invalid/x.git"
commit = "ec60883ad7187dc8aa29b3c30cae5a69e1cfa5cd"

[serve]
recipe = "r.sh"
served_model_name = "glm-5.3-flash"

[serve.profile.card]
gpus = 0
max_model_len = 4096
max_num_seqs = 1

[qualify]
warmup = 0
repeats = 2
max_tokens = 8
idle_timeout_s = 5
prompts = ["What is 17*23?"]
{smoke}
[qualify.profile.card]
{extra}
"""
_GATES = "min_acceptance_length = 2.79\nmin_tok_s = 1.0"

_SMOKE = """
[[qualify.smoke]]
prompt = "What is 17*23?"
max_tokens = 64
expect = "391"
"""


class _StandIn(BaseHTTPRequestHandler):
    """vLLM's endpoints, scaled down: MTP k=3 counters that grow 3 drafts / 2 accepted per pass."""

    protocol_version = "HTTP/1.1"
    served = "glm-5.3-flash"
    reply = "17*23 = 391."
    passes = 0
    lock = threading.Lock()
    bodies: list[dict] | None = None  # when a list: every POST body, as sent

    def _send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": self.served, "max_model_len": 4096}]}).encode())
        elif self.path == "/metrics":
            n = type(self).passes
            text = (
                f"vllm:num_requests_running 0\nvllm:iteration_tokens_total_count {n + 1}\n"
                f"vllm:spec_decode_num_drafts_total {n}\n"
                f"vllm:spec_decode_num_draft_tokens_total {3 * n}\n"
                f"vllm:spec_decode_num_accepted_tokens_total {2 * n}\n"
            )
            self._send(text.encode(), "text/plain")
        elif self.path == "/version":
            self._send(b'{"version": "stand-in"}')
        else:
            self._send(b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.bodies is not None:
            self.bodies.append(body)
        greedy = body.get("temperature") == 0.0
        words = self.reply.split() if greedy else ["?"]
        chunks = []
        for w in words:
            with self.lock:
                type(self).passes += 1
            delta = {"choices": [{"delta": {"content": w + " "}, "finish_reason": None}]}
            chunks.append(f"data: {json.dumps(delta)}\n\n")
        end = {"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {
            "completion_tokens": 3 * len(words), "prompt_tokens": 5}}  # fmt: skip
        chunks.append(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n")
        self._send("".join(chunks).encode(), "text/event-stream")

    def log_message(self, *a):
        pass


def _qualify(tmp_path, handler, smoke=_SMOKE):
    path = tmp_path / "m.toml"
    path.write_text(_MANIFEST.format(extra=_GATES, smoke=smoke))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        code = main(["qualify", "--manifest", str(path), "--url", url, "--out", str(tmp_path)])
    finally:
        httpd.shutdown()
        httpd.server_close()
    receipt = json.loads((tmp_path / "receipt.json").read_text())
    return code, {g["name"]: g for g in receipt["gates"]}, receipt


def test_qualify_judges_acceptance_length_smoke_and_served_name(tmp_path):
    code, gates, receipt = _qualify(tmp_path, type("H", (_StandIn,), {"passes": 0}))
    # 2 accepted per 1 draft pass of 3: mean acceptance length 3.0 >= 2.79
    acc = gates["mean acceptance length (1 + accepted/drafts)"]
    assert (acc["status"], acc["measured"]) == ("PASS", "3.0")
    assert gates["served model name"]["status"] == "PASS"
    assert gates["smoke prompt 'What is 17*23?'"]["status"] == "PASS"
    assert receipt["smoke"][0]["reply"].startswith("17*23 = 391")
    assert code == 0 and receipt["verdict"] == "PASS"
    assert "## Smoke prompts" in (tmp_path / "report.md").read_text()


def test_a_wrong_served_name_and_a_wrong_smoke_reply_fail_the_run(tmp_path, capsys):
    handler = type("H", (_StandIn,), {"passes": 0, "served": "other", "reply": "It is 401."})
    code, gates, receipt = _qualify(tmp_path, handler)
    assert code == 7 and receipt["verdict"] == "FAIL"
    assert gates["served model name"]["status"] == "FAIL"
    assert gates["smoke prompt 'What is 17*23?'"]["status"] == "FAIL"
    err = " ".join(capsys.readouterr().err.split())
    assert "served model name 'other' (needs 'glm-5.3-flash')" in err


def test_qualify_returns_a_failing_outcome_and_json_still_prints_it(tmp_path, capsys):
    """The stage returns its receipt (verdict FAIL) instead of raising; the CLI prints the
    one JSON document and then exits 7."""
    from pinwheel.manifest import load
    from pinwheel.serve.qualify import Target, gate_failure, qualify

    path = tmp_path / "m.toml"
    path.write_text(_MANIFEST.format(extra=_GATES, smoke=_SMOKE))
    handler = type("H", (_StandIn,), {"passes": 0, "served": "other"})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        m = load(path)
        profile = m.require("qualify").profiles[0].name
        receipt = qualify(m, profile, Target(url=url, log=None), tmp_path / "api")
        assert receipt.verdict == "FAIL"
        failure = gate_failure(receipt, tmp_path / "api")
        assert failure is not None and failure.exit_code == 7
        capsys.readouterr()
        code = main(["qualify", "--manifest", str(path), "--url", url, "--out",
                     str(tmp_path / "cli"), "--json"])  # fmt: skip
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert code == 7
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "FAIL"


def test_thinking_off_reaches_every_qualify_request(tmp_path):
    """The GB10 card's bench ran "thinking off": `[qualify] thinking = false` sends the
    chat template's switch with every chat request (smoke, warm-up, decode)."""
    seen: list[dict] = []

    def run(extra: str) -> list[dict]:
        seen.clear()
        path = tmp_path / "m.toml"
        text = _MANIFEST.format(extra=_GATES, smoke=_SMOKE).replace(
            "prompts = [", extra + "prompts = [", 1
        )
        path.write_text(text)
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_StandIn,), {"passes": 0, "bodies": seen}))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        try:
            main(["qualify", "--manifest", str(path), "--url", url, "--out", str(tmp_path)])
        finally:
            httpd.shutdown()
            httpd.server_close()
        return [b for b in seen if "messages" in b]

    off = run("thinking = false\n")
    assert len(off) >= 3  # smoke + 2 repeats
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in off)
    assert all("chat_template_kwargs" not in b for b in run(""))

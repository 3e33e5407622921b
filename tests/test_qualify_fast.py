"""Qualification logic against real local HTTP servers (a small stand-in for vLLM's
OpenAI endpoints, since a real vLLM server takes a minute to start: the real one is
in test_qualify_cpu.py). Covers gates, needle building, scoring and failure paths."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.errors import ManifestError
from pinwheel.manifest import model as manifest
from pinwheel.manifest.serve import QualifyProfile
from pinwheel.serve import needle
from pinwheel.serve.client import metric_by_label, metric_total, parse_prometheus
from pinwheel.serve.gates.base import Measured
from pinwheel.serve.gates.table import judge
from pinwheel.serve.receipt import (
    Acceptance,
    ConcurrencyResult,
    MarkerResult,
    NeedleResult,
    Spread,
    shown,
)

FIXTURE = Path(__file__).parent / "fixtures" / "qualify-cpu.toml"


def _flat(text: str) -> str:
    """The console wraps long lines; compare words, not line breaks."""
    return " ".join(text.split())


def _profile(**kw):
    base = dict(
        name="p",
        concurrency=(1,),
        needle_lengths=(1000,),
        needle_depths=(0.5,),
        needle_max_tokens=8,
        min_tok_s=None,
        max_ms_per_pass=None,
        min_aggregate_tok_s=None,
        needle_required=None,
        reference=(),
    )
    return QualifyProfile(**(base | kw))


def test_a_near_miss_is_a_fail_and_never_prints_as_the_threshold():
    gates = judge(Measured(_profile(min_tok_s=91.0), single=Spread(90.996, 90.9, 91.2, 5)))
    assert gates[0].status == "FAIL"
    assert gates[0].measured == "90.996" and gates[0].measured != "91.0"
    assert shown(91.4, 91.0) == "91.4"


def test_ms_per_pass_is_an_upper_bound():
    ok = judge(Measured(_profile(max_ms_per_pass=33.0), ms_pass=Spread(32.4, 32.1, 32.9, 3)))
    bad = judge(Measured(_profile(max_ms_per_pass=33.0), ms_pass=Spread(33.0004, 33.0, 33.1, 3)))
    assert ok[0].status == "PASS" and bad[0].status == "FAIL" and bad[0].measured == "33.0004"


def test_a_nan_card_figure_fails_its_gate_either_way_the_bound_points():
    """Issue 50: a gate with a NaN measurement FAILs. NaN compares false both ways, so
    a check written as "not over the bound" would PASS it: an upper bound (ms/pass) and
    lower bounds (tok/s, acceptance length) alike."""
    nan = float("nan")
    for tolerance in (0.0, 0.05):
        gates = judge(Measured(
            _profile(min_tok_s=1.0, max_ms_per_pass=33.0, min_acceptance_length=1.5,
                     tolerance=tolerance),
            single=Spread(nan, nan, nan, 3), ms_pass=Spread(nan, nan, nan, 3),
            acceptance=Acceptance(drafts=10.0, draft_tokens=30.0, accepted=nan),
        ))  # fmt: skip
        assert [(g.name, g.status, g.measured) for g in gates] == [
            ("single-stream tok/s", "FAIL", "NaN"),
            ("ms per forward pass", "FAIL", "NaN"),
            ("mean acceptance length (1 + accepted/drafts)", "FAIL", "NaN"),
        ]
        assert all(g.value is None for g in gates)  # never a number in the receipt


def test_unmeasured_gates_fail_and_unchecked_markers_are_skip_not_pass():
    gates = judge(Measured(_profile(min_tok_s=1.0, min_aggregate_tok_s=1.0), concurrency=(ConcurrencyResult(1, 10, 1.0, 10.0, (10.0,)),), markers=(MarkerResult("x", "unchecked", None), MarkerResult("y", "missing", None))))
    assert [g.status for g in gates] == ["FAIL", "FAIL", "SKIP", "FAIL"]


def test_needle_gate_needs_every_depth():
    res = [
        NeedleResult(101000, d, 101000, "v", s, "r", "", 1.0)
        for d, s in ((0.1, "pass"), (0.9, "garbage"))
    ]
    gate = judge(Measured(_profile(needle_required=101000, needle_depths=(0.1, 0.9)), needles=res))[0]
    assert gate.status == "FAIL" and "depth 0.9: garbage" in gate.detail


def test_scoring_names_garbage():
    assert needle.score("amber-1234", "amber-1234", "stop").status == "pass"
    assert needle.score("<think>hmm</think> Amber-1234.", "amber-1234", "stop").status == "pass"
    assert needle.score("   ", "amber-1234", "stop").reason == "empty answer"
    assert needle.score("a" + "!" * 30, "amber-1234", "stop").reason == "a run of one character"
    assert needle.score("the passphrase is", "amber-1234", "length").status == "garbage"
    assert needle.score("cobalt-1234", "amber-1234", "stop").status == "miss"


def _toy_tokenize(prompt=None, messages=None):
    """Characters as tokens, with a chat template around the user's text: exercises the
    exact-length arithmetic; the model's real tokenizer is used in test_qualify_cpu.py."""
    if messages is not None:
        return [1, 2, 3] + [ord(c) for c in messages[0]["content"]] + [4, 5]
    return [ord(c) for c in prompt]


@pytest.mark.parametrize("length", [700, 1000, 4097])
@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_needle_prompts_have_the_exact_length_and_the_needle_near_its_depth(length, depth):
    lay = needle.layout(_toy_tokenize)
    assert lay.prefix == (1, 2, 3) and lay.suffix == (4, 5)
    value = needle.needle_value(length, depth)
    pin = _toy_tokenize(prompt=f" The secret passphrase is {value}.")
    ids = needle.build(lay, pin, length, depth)
    assert len(ids) == length
    text = "".join(chr(i) for i in ids if i > 5)
    at = text.index(value) / len(text)
    assert abs(at - depth) < 0.2
    assert ids[:3] == [1, 2, 3] and ids[-2:] == [4, 5]


def test_prometheus_parsing():
    text = (
        "# HELP vllm:spec_decode_num_drafts_total x\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 4.0\n'
        'vllm:iteration_tokens_total_count{engine="0"} 40.0\n'
    )
    m = parse_prometheus(text)
    assert metric_total(m, "vllm:spec_decode_num_drafts_total") == 12.0
    assert metric_total(m, "vllm:nothing") is None
    assert metric_by_label(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") == {
        "0": 9.0,
        "1": 4.0,
    }


# --------------------------------------------------------------------------- failure paths


class _Server:
    """A real HTTP server on localhost whose behaviour each test sets."""

    def __init__(self, handler):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _cpu_manifest(tmp_path, **edits):
    text = FIXTURE.read_text()
    for old, new in edits.items():
        text = text.replace(old, new)
    path = tmp_path / "qualify-cpu.toml"
    path.write_text(text)
    return path


def test_a_server_that_never_becomes_healthy_times_out_with_advice(tmp_path, capsys):
    class Unhealthy(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = _Server(Unhealthy)
    try:
        m = _cpu_manifest(tmp_path, **{"health_timeout_s = 300": "health_timeout_s = 2"})
        code = main(
            ["qualify", "--manifest", str(m), "--url", srv.url, "--out", str(tmp_path / "out")]
        )
    finally:
        srv.close()
    assert code == 1
    err = _flat(capsys.readouterr().err)
    assert "not healthy after 2 s" in err and "health_timeout_s" in err
    receipt = json.loads((tmp_path / "out" / "receipt.json").read_text())
    assert receipt["verdict"] == "ERROR" and receipt["decode"] == []


def test_a_stream_cut_mid_reply_is_reported_as_the_server_going_away(tmp_path, capsys):
    class CutsStreams(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, body, ctype="application/json"):
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/v1/models":
                self._send(json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode())
            elif self.path == "/metrics":
                self._send(b"vllm:num_requests_running 0\n", "text/plain")
            else:
                self._send(b"{}")

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunk = {"choices": [{"delta": {"content": "tok"}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode() * 3)
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)  # dies mid-reply: no [DONE]

        def log_message(self, *a):
            pass

    srv = _Server(CutsStreams)
    try:
        m = _cpu_manifest(tmp_path)
        code = main(
            ["qualify", "--manifest", str(m), "--url", srv.url, "--out", str(tmp_path / "out")]
        )
    finally:
        srv.close()
    assert code == 1
    err = _flat(capsys.readouterr().err)
    assert "stopped answering" in err and "before [DONE]" in err
    assert json.loads((tmp_path / "out" / "receipt.json").read_text())["verdict"] == "ERROR"


def test_qualify_table_errors_name_the_key(tmp_path):
    m = _cpu_manifest(tmp_path, **{"needle_required = 3072": "needle_required = 5000"})
    with pytest.raises(ManifestError, match="needle_required"):
        manifest.load(m)
    assert (
        main(
            [
                "qualify",
                "--manifest",
                str(m),
                "--url",
                "http://127.0.0.1:9",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )


def test_a_refused_port_fails_in_seconds_with_the_reason(tmp_path, capsys):
    import time

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = _cpu_manifest(tmp_path)  # health_timeout_s = 300
    start = time.monotonic()
    code = main(
        [
            "qualify",
            "--manifest",
            str(m),
            "--url",
            f"http://127.0.0.1:{port}",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    took = time.monotonic() - start
    assert code == 1
    assert took < 30, f"waited {took:.0f} s for a port that refuses connections"
    err = _flat(capsys.readouterr().err)
    assert f"nothing is listening at 127.0.0.1:{port} (connection refused" in err
    assert "next: start the server first" in err


def test_a_busy_server_is_not_measured(tmp_path, capsys):
    class Busy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            if self.path == "/v1/models":
                body = json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode()
            elif self.path == "/metrics":
                body = (
                    b'vllm:num_requests_running{engine="0"} 1.0\n'
                    b'vllm:num_requests_waiting{engine="0"} 2.0\n'
                )
            else:
                body = b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = _Server(Busy)
    try:
        m = _cpu_manifest(tmp_path, **{"idle_timeout_s = 10": "idle_timeout_s = 1"})
        code = main(
            ["qualify", "--manifest", str(m), "--url", srv.url, "--out", str(tmp_path / "out")]
        )
    finally:
        srv.close()
    assert code == 1
    assert "not idle: 3 requests running or waiting" in _flat(capsys.readouterr().err)

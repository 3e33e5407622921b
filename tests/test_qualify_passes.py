"""ms per forward pass from the engine's step counter, and counters that are not numbers.

A real HTTP server on 127.0.0.1 stands in for vLLM's chat stream and /metrics (a real
vLLM takes a minute to start: test_qualify_cpu.py). Its step counter counts as vLLM's
``vllm:iteration_tokens_total_count`` does: one prefill step, then one step per further
token. A decode of N tokens is N - 1 passes after the first token; counting the prefill
step would report ms per pass too low (and pass an upper-bound gate falsely).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from localhttp import LocalHTTP
from pinwheel.errors import PinwheelError
from pinwheel.serve import qualify
from pinwheel.serve.client import Client
from pinwheel.serve.gates.base import Measured
from pinwheel.serve.gates.table import judge
from test_qualify_fast import _profile

TOKENS = 12


class Engine(LocalHTTP):
    url_suffix = ""

    def __init__(self, drafts: str = "0") -> None:
        state = {"steps": 0}
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, body: bytes, ctype: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                with lock:
                    steps = state["steps"]
                text = (f'vllm:iteration_tokens_total_count{{engine="0"}} {steps}.0\n'
                        f"vllm:spec_decode_num_drafts_total {drafts}\n")  # fmt: skip
                self._send(text.encode(), "text/plain")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                events = []
                for i in range(TOKENS):
                    delta = {"choices": [{"index": 0, "delta": {"content": f"t{i} "},
                             "finish_reason": "length" if i == TOKENS - 1 else None}]}  # fmt: skip
                    events.append(delta)
                events.append({"choices": [], "usage": {"prompt_tokens": 5,
                               "completion_tokens": TOKENS}})  # fmt: skip
                body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                with lock:
                    state["steps"] += TOKENS  # 1 prefill step + TOKENS - 1 decode steps
                self._send(body.encode(), "text/event-stream")

            def log_message(self, *a: object) -> None:
                pass

        self._serve(Handler)


def test_ms_per_pass_counts_the_passes_after_the_first_token():
    with Engine() as srv:
        client = Client(srv.url)
        try:
            s = qualify.decode_sample(client, "m", "hi", TOKENS, 0, 0)
        finally:
            client.close()
    assert s.tokens == TOKENS
    assert s.passes == TOKENS - 1 and s.passes_from == "engine steps - 1"
    assert s.ms_per_pass == s.decode_s * 1000 / (TOKENS - 1)


def _sample(drafts: str) -> qualify.DecodeSample:
    with Engine(drafts=drafts) as srv:
        client = Client(srv.url)
        try:
            return qualify.decode_sample(client, "m", "hi", TOKENS, 0, 0)
        finally:
            client.close()


@pytest.mark.parametrize("value", ["NaN", "nan"])
def test_nan_drafts_are_never_a_figure_and_never_pass_an_acceptance_gate(value):
    """A NaN drafts counter is no observation (untrusted.parse_metrics drops NaN samples):
    the sample holds no drafts and no acceptance length, never NaN, and a profile that gates
    on acceptance FAILs "not measured" (qualify exits 7), never PASSes."""
    s = _sample(value)
    assert s.drafts is None and s.acceptance_length is None and s.passes == TOKENS - 1
    acc = qualify._acceptance([s])
    gates = judge(Measured(_profile(min_acceptance_length=1.5, min_acceptance_rate=0.1), acceptance=acc))  # fmt: skip
    assert [g.status for g in gates] == ["FAIL", "FAIL"]
    assert all(g.measured == "not measured" for g in gates)


@pytest.mark.parametrize("value", ["+Inf", "-Inf"])
def test_an_infinite_drafts_counter_stops_the_run(value):
    with pytest.raises(PinwheelError, match="not a finite count"):
        _sample(value)

"""A small real engine for the attribution tests: an upstream whose package serves an
OpenAI-compatible HTTP API (stdlib ``http.server``) with vLLM's Prometheus counters.

It is the engine under test, not a mock of pinwheel: its code lives in a real git
upstream, is replayed, built into a wheel (a C shared object compiled by gcc, with a
stand-in ``.nv_fatbin`` section as in tinyproject.py, since CI has no CUDA), installed
into a venv and started with the ``[serve]`` launch command
(``python -m vllm.entrypoints.openai.api_server --model ...``).

Its cost per forward pass is a sleep: ``csrc/cost.c`` (compiled) gives the base cost in
microseconds, ``vllm/sampler.py`` adds Python-side seconds and shapes the text, and
``vllm/spec.py`` says how many drafted tokens a pass accepts when ``--speculative-config``
is given. Counters: ``vllm:iteration_tokens_total_count`` (one per pass, the prefill
pass included), ``vllm:num_requests_running/waiting`` and the spec-decode totals.

The PR steps (see :func:`make_serving_upstream`):

- PR 11 (compiled): the pass cost 20000 -> 10000 us: about -10 ms/pass;
- PR 12 (Python): one more accepted draft per pass: acceptance length 2 -> 3;
- PR 13 (Python): 10 ms more per pass and another greedy text: about +10 ms/pass;
- PR 14 (Python): a comment: no effect;
- PR 15 (Python, branched from PR 13): edits PR 13's line, so it cannot stay without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gitfixture import Upstream
from tinyproject import STANDIN_SETUP

SETUP = (
    STANDIN_SETUP.replace(
        'pkg = os.path.join(self.build_lib, "tiny")', 'pkg = os.path.join(self.build_lib, "vllm")'
    )
    .replace('"csrc/probe.c"', '"csrc/cost.c"')
    .replace(
        'setup(name="tiny", version=os.environ["SETUPTOOLS_SCM_PRETEND_VERSION"], '
        'packages=["tiny"],',
        'setup(name="tinyserve", version=os.environ["SETUPTOOLS_SCM_PRETEND_VERSION"], '
        'packages=["vllm", "vllm.entrypoints", "vllm.entrypoints.openai"],',
    )
)
assert '"vllm.entrypoints.openai"' in SETUP and "csrc/cost.c" in SETUP and '"vllm")' in SETUP

COST_C = "int tiny_pass_cost_us(void) { return %d; }\n"

SPEC_PY = '''"""How many drafted tokens one pass accepts (with --speculative-config)."""

ACCEPTED_PER_PASS = %d
'''

SAMPLER_PY = '''"""The sampler: Python-side work per pass and the greedy text."""

EXTRA_S = %s


def token(words, i):
    return %s
'''

INIT_PY = '"""tinyserve: an OpenAI-compatible test engine."""\n'

SERVER_PY = r'''"""An OpenAI-compatible server with vLLM's counters (the test engine)."""

import argparse
import ctypes
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm import sampler, spec

LIB = ctypes.CDLL(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "_C.so"))
PASS_S = LIB.tiny_pass_cost_us() / 1e6
LOCK = threading.Lock()
COUNTS = {"passes": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0, "running": 0}


def options():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--speculative-config", default=None)
    args, _ = ap.parse_known_args()
    return args


ARGS = options()
NAME = ARGS.served_model_name or ARGS.model
SPEC_K = json.loads(ARGS.speculative_config)["num_speculative_tokens"] if ARGS.speculative_config else 0


def one_pass():
    time.sleep(PASS_S + sampler.EXTRA_S)
    with LOCK:
        COUNTS["passes"] += 1


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": NAME, "object": "model", "max_model_len": ARGS.max_model_len}]})
        elif self.path == "/version":
            self._json(200, {"version": "tinyserve"})
        elif self.path == "/metrics":
            with LOCK:
                c = dict(COUNTS)
            label = '{model_name="%s"}' % NAME
            lines = [
                "# TYPE vllm:iteration_tokens_total histogram",
                f"vllm:iteration_tokens_total_count{label} {c['passes']}",
                f"vllm:num_requests_running{label} {c['running']}",
                f"vllm:num_requests_waiting{label} 0",
            ]
            if SPEC_K:
                lines += [
                    f"vllm:spec_decode_num_drafts_total{label} {c['drafts']}",
                    f"vllm:spec_decode_num_draft_tokens_total{label} {c['draft_tokens']}",
                    f"vllm:spec_decode_num_accepted_tokens_total{label} {c['accepted']}",
                ]
            data = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": "not found"})
            return
        words = " ".join(m["content"] for m in body["messages"]).split() or ["x"]
        want = int(body["max_tokens"])
        with LOCK:
            COUNTS["running"] += 1
        try:
            self._stream(words, want)
        finally:
            with LOCK:
                COUNTS["running"] -= 1

    def _event(self, obj):
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def _stream(self, words, want):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self._event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        accept = min(spec.ACCEPTED_PER_PASS, SPEC_K)
        made = 0
        while made < want:
            first = made == 0
            one_pass()
            n = 1 if first else min(1 + accept, want - made)
            if SPEC_K and not first:
                with LOCK:
                    COUNTS["drafts"] += 1
                    COUNTS["draft_tokens"] += SPEC_K
                    COUNTS["accepted"] += n - 1
            text = "".join(" " + sampler.token(words, made + j) for j in range(n))
            made += n
            self._event({"choices": [{"index": 0, "delta": {"content": text},
                                      "finish_reason": "length" if made >= want else None}]})
        self._event({"choices": [], "usage": {"prompt_tokens": len(words),
                                              "completion_tokens": made}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def main():
    server = ThreadingHTTPServer((ARGS.host, ARGS.port), Handler)
    print(f"Starting vLLM API server on {ARGS.host}:{ARGS.port}", file=sys.stderr, flush=True)
    print("Application startup complete.", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
'''

BUILD_TABLE = """
[build]
python = "{python}"
cuda = "12.4"
arches = ["7.0"]
ptx = false
label = "attr"
version = "0.1.0"
required_members = ["vllm/_C*.so", "vllm/entrypoints/openai/api_server.py"]
env = {{ MAX_JOBS = "2" }}

[serve]
recipe = "serve.sh"
env_prefix = "TINY"
default = "cpu"
model_disk_gib = 0

[serve.engine]
module = "vllm"

[serve.profile.cpu]
gpus = 0
max_model_len = 2048
max_num_seqs = 1
speculative = {{ method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 4 }}

[qualify]
warmup = 1
repeats = 1
max_tokens = {max_tokens}
health_timeout_s = 60
idle_timeout_s = 10
prompts = ["alpha beta gamma delta", "one two three four five"]

[qualify.profile.cpu]
concurrency = [1]
"""


@dataclass
class Serving:
    up: Upstream
    tmp: Path
    base: str
    heads: dict[int, str]  # PR -> head
    commits: dict[int, list[str]]  # PR -> its own commits


def make_serving_upstream(tmp: Path) -> Serving:
    up = Upstream(tmp / "gh")
    base = up.commit(
        {
            "setup.py": SETUP,
            "csrc/cost.c": COST_C % 20000,
            "vllm/__init__.py": INIT_PY,
            "vllm/spec.py": SPEC_PY % 1,
            "vllm/sampler.py": SAMPLER_PY % ("0.0", "words[i % len(words)]"),
            "vllm/entrypoints/__init__.py": "",
            "vllm/entrypoints/openai/__init__.py": "",
            "vllm/entrypoints/openai/api_server.py": SERVER_PY,
        },
        "tinyserve: initial",
    )
    heads: dict[int, str] = {}
    commits: dict[int, list[str]] = {}
    edits = {
        11: ({"csrc/cost.c": COST_C % 10000}, "kernel: halve the pass cost"),
        12: ({"vllm/spec.py": SPEC_PY % 2}, "spec: accept one more draft per pass"),
        13: (
            {"vllm/sampler.py": SAMPLER_PY % ("0.010", "words[i % len(words)].upper()")},
            "sampler: upper-case text, 10 ms more per pass",
        ),
        14: ({"vllm/__init__.py": INIT_PY + "# a comment, nothing else\n"}, "docs: a comment"),
    }
    for pr, (files, message) in edits.items():
        up.checkout("main")
        up.checkout("main", f"pr{pr}")
        heads[pr] = up.commit(files, message, author="Pat Ch <pat@example.org>")
        commits[pr] = [heads[pr]]
    up.checkout("pr13")
    up.checkout("pr13", "pr15")
    heads[15] = up.commit(
        {"vllm/sampler.py": SAMPLER_PY % ("0.005", "words[i % len(words)].upper()")},
        "sampler: 5 ms is enough",
    )
    commits[15] = [heads[15]]
    up.checkout("main")
    up.publish({pr: f"pr{pr}" for pr in heads})
    return Serving(up, tmp, base, heads, commits)

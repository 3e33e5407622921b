"""The qualification client's own cost per streamed token, against the card's 11 ms/token.

A local server streams N OpenAI chat chunks (vLLM's shape, chunked transfer
encoding) as fast as it can. In the same run we time:

  baseline  -- a bare http.client read of the same stream (no parsing, no timing)
  harness   -- pinwheel's Client.stream (SSE parsing, JSON per chunk, clocks)

harness - baseline is what the harness adds per token; it is printed as a
fraction of 11 ms (one token at 91 tok/s on the card). Target: < 1%.

    python bench/harness_overhead.py [--tokens 4000] [--repeats 7] [--max-fraction 0.01]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pinwheel.serve.client import Client

CARD_MS_PER_TOKEN = 11.0


def build_stream(tokens: int) -> bytes:
    """The whole chunked response body, built once so the server costs almost nothing."""
    parts = []
    for i in range(tokens):
        event = {
            "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": f" tok{i % 97}"}, "logprobs": None,
                         "finish_reason": None if i < tokens - 1 else "length"}],
        }  # fmt: skip
        parts.append(b"data: " + json.dumps(event).encode() + b"\n\n")
    usage = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": tokens}}
    parts.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def serve(body: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def baseline(port: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    t0 = time.perf_counter()
    conn.request(
        "POST", "/v1/chat/completions", body=b"{}", headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    while resp.readline():
        pass
    took = time.perf_counter() - t0
    conn.close()
    return took


def harness(port: int, tokens: int) -> float:
    client = Client(f"http://127.0.0.1:{port}")
    t0 = time.perf_counter()
    s = client.stream("/v1/chat/completions", {"model": "m", "stream": True})
    took = time.perf_counter() - t0
    client.close()
    if s.completion_tokens != tokens or s.chunks != tokens:
        raise SystemExit(f"harness miscounted: {s.completion_tokens} tokens, {s.chunks} chunks")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--max-fraction", type=float, default=0.01)
    args = ap.parse_args()
    httpd = serve(build_stream(args.tokens))
    port = httpd.server_address[1]
    base, mine = [], []
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits both alike
        base.append(baseline(port))
        mine.append(harness(port, args.tokens))
    httpd.shutdown()
    b = statistics.median(base) / args.tokens * 1e6
    h = statistics.median(mine) / args.tokens * 1e6
    extra = max(h - b, 0.0)
    fraction = extra / (CARD_MS_PER_TOKEN * 1000)
    upper = h / (CARD_MS_PER_TOKEN * 1000)
    print(f"tokens per stream       {args.tokens} x {args.repeats} runs (median)")
    print(f"baseline (bare read)    {b:8.2f} us/token")
    print(f"harness (Client.stream) {h:8.2f} us/token   ratio {h / b:.2f}x baseline")
    share = f"{fraction * 100:.3f}% of {CARD_MS_PER_TOKEN} ms"
    print(f"harness's own cost      {extra:8.2f} us/token = {share}")
    print(f"whole client incl. I/O  {upper * 100:.3f}% of {CARD_MS_PER_TOKEN} ms (upper bound)")
    ok = fraction < args.max_fraction
    print(f"{'PASS' if ok else 'FAIL'}: target < {args.max_fraction * 100:.1f}%")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

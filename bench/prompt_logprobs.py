"""What raising vLLM's ``prompt_logprobs`` costs per scored position, on a real server.

A real vLLM server (``--max-logprobs -1``) scores the same window with
``prompt_logprobs`` = K for several K, the largest being the full vocabulary
(-1). In the same run, the baseline is K = 20 (vLLM's default ``--max-logprobs``
cap). Printed per K: seconds per request and per position (median of repeats),
response bytes per position, and both as a ratio to the baseline. It also
reports how far each full-vocabulary row's probabilities sum from 1 (the engine's
float32 normalizer error, which bounds ``kld.NORMALIZER_MARGIN``).

    python bench/prompt_logprobs.py --url http://127.0.0.1:8000 [--window 64] [--repeats 3]
    python bench/prompt_logprobs.py --python VENV_PY --model DIR   # starts the server itself
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from pinwheel.serve.client import Client


def one(client: Client, model: str, ids: list[int], k: int) -> tuple[float, int, list]:
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": k}  # fmt: skip
    t0 = time.perf_counter()
    resp = client._send("POST", "/v1/completions", body)
    raw = resp.read()
    secs = time.perf_counter() - t0
    if resp.status != 200:
        raise SystemExit(f"K={k}: HTTP {resp.status}: {raw[:300]!r}")
    return secs, len(raw), json.loads(raw)["choices"][0]["prompt_logprobs"]


def measure(url: str, window: int, repeats: int, ks: list[int]) -> int:
    client = Client(url)
    model = str(client.models()[0]["id"])
    text = Path(__file__).resolve().parent.parent.joinpath("docs", "qualify.md").read_text()
    ids = client.tokenize(model, prompt=text)[:window]
    positions = len(ids) - 1
    one(client, model, ids, 20)  # warm-up
    rows = {}
    sums: list[float] = []
    for k in ks:
        runs = [one(client, model, ids, k) for _ in range(repeats)]
        secs = statistics.median(r[0] for r in runs)
        rows[k] = (secs, runs[0][1])
        if k == -1:
            for entry in runs[0][2][1:]:
                lse = math.log(math.fsum(math.exp(v["logprob"]) for v in entry.values()))
                sums.append(lse)
    base_s, base_b = rows[20]
    print(f"window {len(ids)} tokens ({positions} scored positions), {repeats} repeats, {url}")
    print(f"{'K':>7} {'s/request':>10} {'ms/position':>12} {'KB/position':>12} "
          f"{'time x':>8} {'bytes x':>8}")  # fmt: skip
    for k, (secs, nbytes) in rows.items():
        per_ms, per_kb = secs * 1000 / positions, nbytes / 1024 / positions
        print(f"{k:>7} {secs:>10.3f} {per_ms:>12.2f} {per_kb:>12.1f} "
              f"{secs / base_s:>8.2f} {nbytes / base_b:>8.2f}")  # fmt: skip
    if sums:
        print(f"full rows: max |log sum p| = {max(abs(x) for x in sums):.3e} nats over "
              f"{len(sums)} positions (the normalizer error)")  # fmt: skip
    client.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url")
    ap.add_argument("--python")
    ap.add_argument("--model")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, nargs="*", default=[20, 128, 1024, 8192, -1])
    args = ap.parse_args()
    ks = sorted(set(args.k) | {20}, key=lambda k: math.inf if k == -1 else k)
    if args.url:
        return measure(args.url, args.window, args.repeats, ks)
    if not (args.python and args.model):
        ap.error("pass --url, or --python and --model to start a server")
    from pinwheel.manifest import model as manifest
    from pinwheel.serve.client import Client as _C
    from pinwheel.serve.qualify import wait_healthy
    from pinwheel.serve.recipe import launch
    from pinwheel.serve.supervise import free_port, started_server

    fixture = Path(__file__).resolve().parent.parent / "tests/fixtures/qualify-fidelity-cpu.toml"
    m = manifest.load(fixture)
    port = free_port()
    serve = m.require("serve")
    run = launch(serve, serve.profile("fp32"), model=args.model, python=args.python,
                 host="127.0.0.1", port=port)  # fmt: skip
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"pinwheel-bench-logprobs-{port}"
    url = f"http://127.0.0.1:{port}"
    with started_server(run, out, environ=os.environ, url=url) as target:
        probe = _C(url)
        try:
            wait_healthy(probe, target, timeout_s=900)
        finally:
            probe.close()
        return measure(url, args.window, args.repeats, ks)


if __name__ == "__main__":
    sys.exit(main())

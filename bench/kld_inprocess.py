"""Exact KLD scored in the engine vs the full-row JSON path, on one real vLLM server.

Starts a CPU vLLM server (tests/fixtures/qualify-fidelity-cpu.toml, fp32 profile) with
pinwheel's worker extension, captures a full-row teacher with transformers (fp32) on a
panel of ``--windows`` x ``--window`` tokens cut from the repo's docs, and scores:

1. in-process: every position of the panel, in the engine (13-byte records out);
2. the reference, full rows as JSON (``prompt_logprobs = -1``), on the first
   ``--reference-tokens`` tokens of the first window only (a full row is ~1 MB of JSON at
   SmolLM2's 49,152 tokens), in the same run, scored by the same code in pinwheel.

Printed: positions, wall seconds, ms per position and bytes per position across the
process boundary for both paths and their ratios; the largest per-position difference
between the two on the shared positions (and whether the bits agree).

    python bench/kld_inprocess.py --python VENV_PY --model DIR [--windows 20 --window 513]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pinwheel import options
from pinwheel.manifest import model as manifest
from pinwheel.serve import fidelity, inprocess
from pinwheel.serve.client import Client
from pinwheel.serve.qualify import wait_healthy
from pinwheel.serve.recipe import launch
from pinwheel.serve.supervise import free_port, started_server
from pinwheel.serve.workers import detkl, kld_ext

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "qualify-fidelity-cpu.toml"


def rows_path(client: Client, model: str, windows: list, t: fidelity.Teacher) -> tuple:
    """The reference: full rows as JSON, scored in pinwheel; (records, seconds, bytes)."""
    t0 = time.perf_counter()
    nbytes = 0
    student: list[tuple[Any, Any, int]] = []
    for w in windows:
        body = {
            "model": model,
            "prompt": list(w),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": -1,
        }
        resp = client._send("POST", "/v1/completions", body)
        raw = resp.read()
        nbytes += len(raw)
        entries = json.loads(raw)["choices"][0]["prompt_logprobs"]
        student.extend(fidelity.parse_position(e) for e in entries[1:])
    kld, agree, exact, _ties = fidelity.score_positions(t, student)
    assert exact
    return kld, agree, time.perf_counter() - t0, nbytes, student


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--window", type=int, default=513)
    ap.add_argument(
        "--reference-tokens", type=int, default=33, help="tokens of window 0 the JSON path scores"
    )
    ap.add_argument("--work", default=None, help="directory for the panel and teacher")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="pinwheel-bench-kld-"))
    work.mkdir(parents=True, exist_ok=True)
    m = manifest.load(FIXTURE)
    port = free_port()
    serve = m.require("serve")
    run = launch(
        serve,
        serve.profile("perturbed"),
        model=args.model,
        python=args.python,
        host="127.0.0.1",
        port=port,
    )
    pythonpath = options.host(os.environ).pythonpath  # kept after the extension's package
    flags, env = inprocess.server_additions(inprocess.engine_package(work / "ext"), pythonpath)
    run = type(run)(argv=run.argv + flags + ("--max-logprobs", "-1"), env={**run.env, **env})
    url = f"http://127.0.0.1:{port}"
    with started_server(run, work / "server", environ=os.environ, url=url) as target:
        client = Client(url)
        wait_healthy(client, target, timeout_s=900)
        model = str(client.models()[0]["id"])
        text = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
        ids = client.tokenize(model, prompt=text)
        n = args.window
        while len(ids) < n * args.windows:
            ids = ids + ids
        windows = [ids[i * n : (i + 1) * n] for i in range(args.windows)]
        panel_path = work / "panel.json"
        fidelity.write_panel(panel_path, windows)
        panel = fidelity.read_panel(panel_path, None)
        teacher_path = work / "teacher.npz"
        if not teacher_path.exists():
            t0 = time.perf_counter()
            fidelity.capture_teacher(
                fidelity.TeacherRequest(
                    out=teacher_path, panel=panel, top_k=-1, python=args.python, model=args.model
                )
            )
            print(
                f"teacher: {panel.positions} positions captured in "
                f"{time.perf_counter() - t0:.1f} s, {teacher_path.stat().st_size} bytes"
            )
        index = fidelity.read_index(teacher_path, None)
        got = inprocess.score_in_engine(client, model, panel.windows, index)
        positions = index.positions
        boundary = got.rpc_bytes + got.request_bytes
        # the reference on the first tokens of the first window (a prompt's prefix has the
        # same rows: causal), same server, same run
        ref_windows = [list(panel.windows[0][: args.reference_tokens])]
        ref_positions = len(ref_windows[0]) - 1
        store = kld_ext.TeacherStore(str(teacher_path), index.sha256)  # memory-mapped
        full = np.array(store.full[:ref_positions])
        t = fidelity.Teacher(
            meta={},
            offsets=np.array([0, ref_positions]),
            target=index.target[:ref_positions],
            target_logprob=None,
            top_ids=None,
            top_logprobs=None,
            full=full,
            sha256="",
            source=str(teacher_path),
        )
        kld, agree, ref_s, ref_bytes, _ = rows_path(client, model, ref_windows, t)
        client.close()
    ours = got.records["kl"][:ref_positions]
    diff = float(np.max(np.abs(ours - kld)))
    same_bits = bool(np.array_equal(ours.view(np.uint64), kld.view(np.uint64)))
    ours_agree = (got.records["flags"][:ref_positions] & detkl.AGREE) > 0
    ms_in = got.wall_seconds * 1000 / positions
    ms_ref = ref_s * 1000 / ref_positions
    bpp_in = boundary / positions
    bpp_ref = ref_bytes / ref_positions
    print(f"server {url}, model {model}, cpus {os.cpu_count()}")
    print(
        f"in-process: {positions} positions ({len(panel.windows)} x {n - 1}) in "
        f"{got.wall_seconds:.1f} s wall ({ms_in:.2f} ms/position; the engine's scoring "
        f"{got.engine_seconds:.1f} s), {boundary} bytes across the boundary = "
        f"{bpp_in:.2f} bytes/position (records {got.rpc_bytes}, completion answers "
        f"{got.request_bytes})"
    )
    print(
        f"full-row JSON (reference): {ref_positions} positions in {ref_s:.1f} s "
        f"({ms_ref:.2f} ms/position), {ref_bytes} bytes = {bpp_ref:.0f} bytes/position"
    )
    print(
        f"ratio reference/in-process: time per position {ms_ref / ms_in:.2f}x, "
        f"bytes per position {bpp_ref / bpp_in:.0f}x"
    )
    print(
        f"agreement on {ref_positions} shared positions: max |diff| {diff:.3e}, "
        f"bit-identical {same_bits}, top-1 flags equal {bool((ours_agree == agree).all())}"
    )
    print(
        f"mean KLD in-process {float(got.records['kl'].mean())!r} over {positions}; "
        f"kld_f64_sha256 {detkl.f64_sha256(got.records['kl'])}"
    )
    return 0 if diff <= 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())

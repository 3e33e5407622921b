"""Preflight's GPU self-test, in the engine's Python: P2P copies checked between every
pair of GPUs and a GEMM per GPU, through ``pinwheel_selftest`` (the kernel wheel) when
installed, else torch. Argument: NBYTES. Prints one JSON object.
"""

from __future__ import annotations

import json
import sys
from typing import Any

out: dict[str, Any] = {"via": None, "pairs": [], "gemm": [], "devices": 0}
nbytes = int(sys.argv[1])
try:
    import pinwheel_selftest as st
except ImportError:
    st = None
if st is not None:
    # The kernel wheel: driver API only, SM70 mma.sync GEMM checked exactly on the host.
    out["via"] = "pinwheel_selftest"
    n = out["devices"] = len(st.devices())
    for a in range(n):
        for b in range(n):
            if a != b:
                r = st.p2p_check(a, b, nbytes).as_dict()
                out["pairs"].append({"src": a, "dst": b, "peer": r["peer_access"], "ok": r["ok"]})
    for d in range(n):
        g = st.gemm_selftest(d).as_dict()
        out["gemm"].append(
            {
                "device": d,
                "err": g["max_abs_err"],
                "err_kind": "max abs err",
                "ok": g["ok"],
                "jit": g["jit"],
            }
        )
else:
    import torch

    n = out["devices"] = torch.cuda.device_count()
    out["via"] = "torch"
    elems = nbytes // 4

    def pattern(dev, seed):
        i = torch.arange(elems, device=dev, dtype=torch.int64)
        return ((i * 2654435761 + seed) % 2147483647).to(torch.int32)

    def checksum(t):
        w = torch.arange(1, t.numel() + 1, device=t.device, dtype=torch.int64)
        return int(((t.to(torch.int64) * w) % 1000000007).sum().item())

    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            src = pattern(f"cuda:{a}", 7919 * a + b)
            dst = torch.empty_like(src, device=f"cuda:{b}")
            dst.copy_(src)
            torch.cuda.synchronize(b)
            peer = torch.cuda.can_device_access_peer(a, b)
            out["pairs"].append(
                {"src": a, "dst": b, "peer": peer, "ok": checksum(src) == checksum(dst)}
            )
    for d in range(n):
        g = torch.Generator(device=f"cuda:{d}").manual_seed(0)
        x = torch.randn(1024, 1024, device=f"cuda:{d}", generator=g)
        y = torch.randn(1024, 1024, device=f"cuda:{d}", generator=g)
        ref = x @ y
        got = (x.half() @ y.half()).float()
        err = float(((got - ref).abs().max() / ref.abs().max()).item())
        out["gemm"].append(
            {"device": d, "err": err, "err_kind": "max rel err", "ok": err < 1e-2, "jit": None}
        )
print(json.dumps(out))

"""The timing program `pinwheel attribute --kernel exllamav3 --timing` runs in each variant:
exllamav3's `hgemm` (fp16 output, PR 246's change) and EXL3 GEMM (`exl3_gemm`, K3) on a few
shapes, each timed `--samples` times with CUDA events over `--iters` calls after 3 warm-up
calls; hgemm's largest |difference| from an fp32 matmul of the same inputs as `error`.
Prints one line: RESULT {"times": {case: [ms per call, ...]}, "error": {case: x}}.

`pinwheel attribute` runs it with the variant's wheel directory as PYTHONPATH and the Python of
--python (torch with CUDA); by hand:

    PYTHONPATH=SITE python bench/kernel_times_exllamav3.py --samples 3 --iters 50
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    import torch  # first: it loads libc10 and the CUDA libraries the extension links against

    # isort: split
    import exllamav3_ext as ext  # the variant's wheel, on PYTHONPATH

    dev = args.device
    torch.manual_seed(0)

    def timed(fn: Any) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(args.iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        return float(s.elapsed_time(e)) / args.iters

    out: dict[str, dict[str, Any]] = {"times": {}, "error": {}}
    cases: list[tuple[str, Any]] = []
    for m, k, n in [(16, 4096, 4096), (256, 4096, 14336), (2048, 4096, 4096)]:
        a = torch.randn(m, k, dtype=torch.half, device=dev)
        b = torch.randn(k, n, dtype=torch.half, device=dev) / k**0.5
        c = torch.empty(m, n, dtype=torch.half, device=dev)
        ext.hgemm(a, b, c)
        ref = a.float() @ b.float()
        name = f"hgemm fp16 {m}x{k}x{n}"
        out["error"][name] = float((c.float() - ref).abs().max())
        cases.append((name, lambda a=a, b=b, c=c: ext.hgemm(a, b, c)))
    for m, k, n in [(1, 4096, 14336), (4, 4096, 4096), (16, 8192, 8192)]:
        a = torch.randn(m, k, dtype=torch.half, device=dev)
        b = torch.zeros(k // 16, n // 16, 16 * 3, dtype=torch.short, device=dev)
        c = torch.zeros(m, n, dtype=torch.half, device=dev)
        suh = torch.randn(k, dtype=torch.half, device=dev)
        svh = torch.randn(n, dtype=torch.half, device=dev)
        ah = torch.empty_like(a)
        cases.append((
            f"exl3_gemm K3 {m}x{k}x{n}",
            lambda a=a, b=b, c=c, suh=suh, ah=ah, svh=svh: ext.exl3_gemm(
                a, b, c, suh, ah, svh, -1, False, False, 0),
        ))  # fmt: skip
    for name, fn in cases:
        out["times"][name] = [timed(fn) for _ in range(args.samples)]
    print("RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

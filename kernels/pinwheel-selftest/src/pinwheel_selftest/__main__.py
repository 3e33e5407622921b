"""``python -m pinwheel_selftest``: every self-test on every GPU; exit 1 if any fails."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional

from . import SelftestError, devices, gemm_selftest, p2p_check


def run(nbytes: int) -> Dict[str, Any]:
    gpus = devices()
    report: Dict[str, Any] = {"devices": [d.as_dict() for d in gpus], "gemm": [], "p2p": []}
    for d in gpus:
        report["gemm"].append(gemm_selftest(d.index).as_dict())
    pairs = [(s.index, t.index) for s in gpus for t in gpus if s.index != t.index]
    for src, dst in pairs or [(0, 0)] * bool(gpus):
        report["p2p"].append(p2p_check(src, dst, nbytes).as_dict())
    report["ok"] = bool(gpus) and all(r["ok"] for r in report["gemm"] + report["p2p"])
    return report


def _print(report: Dict[str, Any]) -> None:
    for d in report["devices"]:
        print(f"GPU {d['index']}: {d['name']} (sm_{d['capability'].replace('.', '')}, driver {d['driver']})")
    for g in report["gemm"]:
        how = f"JIT from compute_{g['ptx_version']} PTX" if g["jit"] else f"sm_{g['binary_version']} SASS"
        verdict = "PASS" if g["ok"] else f"FAIL (first wrong row {g['first_wrong_row']})"
        print(
            f"gemm  GPU {g['device']} {g['shape'][0]}x{g['shape'][1]}x{g['shape'][2]} mma.m8n8k4 "
            f"({how}): max_abs_err={g['max_abs_err']:g} wrong_rows={g['wrong_rows']} {verdict}"
        )
    for p in report["p2p"]:
        kernel = "n/a (no peer access)" if p["dst_kernel_sum"] is None else f"{p['dst_kernel_sum']:016x}"
        print(
            f"p2p   GPU {p['src']} -> GPU {p['dst']} {p['nbytes'] >> 20} MiB: expected={p['expected']:016x} "
            f"src={p['src_sum']:016x} memcpy={p['dst_memcpy_sum']:016x} kernel={kernel} "
            f"{'PASS' if p['ok'] else 'FAIL'}"
        )
    print("all self-tests passed" if report["ok"] else "SELF-TEST FAILED")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pinwheel-selftest", description=__doc__)
    parser.add_argument("--json", action="store_true", help="JSON on stdout")
    parser.add_argument("--p2p-mib", type=int, default=64, help="bytes per P2P copy, in MiB")
    args = parser.parse_args(argv)
    try:
        report = run(args.p2p_mib << 20)
    except (SelftestError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""One rank of the preflight all-reduce: right sum on every element, then bus bandwidth.

Run by pinwheel.serve.ranks (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
PINWHEEL_RANK_BACKEND set). Arguments: BYTES ITERS WARMUP.

Correctness: rank r holds x[i] = (i mod 1021) + 1024 * r in float32 (integers
below 2**24, so every sum is exact in any order); after the sum every element
must equal world * (i mod 1021) + 1024 * world * (world - 1) / 2.
Bandwidth as nccl-tests reports it: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    nbytes, iters, warmup = (int(a) for a in sys.argv[1:4])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = os.environ.get("PINWHEEL_RANK_BACKEND", "nccl")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    n = max(nbytes // 4, 1)
    i = torch.arange(n, device=device, dtype=torch.int64) % 1021
    x = (i + 1024 * rank).to(torch.float32)
    dist.all_reduce(x)
    sync()
    expected = (world * i + 1024 * world * (world - 1) // 2).to(torch.float32)
    wrong = (x != expected).nonzero().flatten()
    first = int(wrong[0]) if wrong.numel() else None

    y = torch.ones(n, device=device, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(y)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(y)
    sync()
    seconds = (time.perf_counter() - start) / max(iters, 1)
    # the slowest rank sets the figure
    t = torch.tensor([seconds], device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    seconds = float(t.item())
    algbw = n * 4 / seconds / 1e9
    out = {
        "rank": rank,
        "world": world,
        "backend": backend,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "bytes": n * 4,
        "sum_ok": first is None,
        "wrong": int(wrong.numel()),
        "first_wrong": None
        if first is None
        else {"index": first, "got": float(x[first]), "want": float(expected[first])},
        "iters": iters,
        "seconds": seconds,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * 2 * (world - 1) / world,
        "env": {
            k: os.environ.get(k)
            for k in (
                "NCCL_NVLS_ENABLE",
                "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                "NVSHMEM_DISABLE_NVLS",
                "CUDA_VISIBLE_DEVICES",
            )
        },
    }
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

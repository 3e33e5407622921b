"""One rank of the exllamav3 process-group check: every pg_* result against torch.distributed.

Run by pinwheel.serve.ranks, one process per GPU (RANK = local device ordinal).
Argument: the directory holding the built ``exllamav3_ext`` module (after ``--``).

Set-up as exllamav3's own native TP backend does it (exllamav3/model/model_tp_backend.py
at v0.0.43, TPBackendNative): rank 0 creates five POSIX shared-memory regions, G (128 KiB,
the PGContext), B (16 MiB, the bulk buffer), R (8.5 MiB, the CPU reduction's staging),
S (16 KiB, small gathers) and LL (16 KiB, low-latency broadcasts); every rank pins them
with cudaHostRegister(PORTABLE); rank 0 calls pg_init_context(G). Then, for each case,
the primitive runs on a copy of the input and torch.distributed (NCCL) on another,
and the results are compared bit for bit (two ranks: the float32 sums a + b are
exact in either order).

The primitives that backend calls at that commit are checked, and the one it no longer
calls: ``all_reduce`` is ``pg_all_reduce_cpu`` (``pg_all_reduce`` is commented out there,
kept here as it was), ``broadcast`` is ``pg_broadcast_ll`` up to 2,048 bytes and
``pg_broadcast`` above, ``gather`` is ``pg_gather`` and the sampler's argmax gather is
``pg_gather_small``. ``pg_all_reduce_cpu`` needs the CPU reducer exllamav3 runs in a
process of its own (``run_cpu_reduce_jobs`` over G and R until rank 0's
``end_cpu_reduce_jobs``): rank 0 starts it here, around those cases only. Its sums are
not float32 sums: each contribution is truncated to bfloat16, added in float32 and
truncated to bfloat16 again per addition (``all_reduce_cpu.cu``, ``all_reduce_cpu_avx2.cpp``:
"round-toward-zero"); torch.distributed's reference is the same arithmetic on NCCL's
float32 sum of the truncated inputs, exact for two contributors in either order.

Gather sizes: slices of unequal width (the destination offset of a rank's own
columns is then not 0 on the last rank, the offset PR 234 "Fix TP gather
self-copy offset" adds), gathered to each rank in turn, batches that fit the
per-rank share of B and one that streams through it in stages. The output is
filled with NaN first, so columns never written show as such.
"""

import json
import os
import sys
import time
import traceback
from multiprocessing import shared_memory

import torch
import torch.distributed as dist

GLOBALS_SIZE = 128 * 1024  # exllamav3 model_tp_backend.py
SHBUF_SIZE = 16 * 1024**2
SHBUF_SIZE_R = 17 * 4 * 128 * 1024
SHBUF_SIZE_S = 16 * 1024
SHBUF_SIZE_LL = 16 * 1024
LL_LIMIT = 2048  # TPBackendNative.broadcast: pg_broadcast_ll at or below this many bytes
CUDA_HOST_REGISTER_PORTABLE = 1
BARRIER_DELAY_S = 0.3

ALL_REDUCE_NUMEL = (4, 1000, 262144, 3_000_000)  # float32: 16 B .. 12 MB (> B / 2 per rank)
BROADCAST_NUMEL = (1025, 500_001, 12_000_000)  # float16: 2050 B (> the LL limit) .. 24 MB (> B)
# pg_all_reduce_cpu: numel * 2 must be a multiple of 16 (its TORCH_CHECK); 3M > R's slot
ALL_REDUCE_CPU_NUMEL = (8, 1000, 262144, 3_000_000)
# pg_broadcast_ll, float16: 2 B .. the 2,048-byte limit; (numel, offset): offset 1 puts the
# tensor at a 2-byte (not 4-byte) address, the kernel's uint16 path
BROADCAST_LL = ((1, 0), (32, 0), (511, 1), (1024, 0))
# pg_gather_small (argmax values and indices: one column per rank, or none): batch x
# sum(ldims) x element size must fit S (16 KiB)
GATHER_SMALL_BATCH = (1, 7, 256)


# float16 columns per rank (x 2 B % 128 == 0): even, and uneven both ways, for any world
def gather_ldims(world):
    if world < 2:
        return ()
    uneven = (192, 320) + (256,) * (world - 2)
    return ((256,) * world, uneven, tuple(reversed(uneven)))


GATHER_LDIMS = gather_ldims(2)  # ((256, 256), (192, 320), (320, 192))
FLOAT32_U = 2.0**-24  # unit roundoff of float32 (round to nearest)
GATHER_BATCH = (1, 37, 16384)  # 16384 x 640 B = 10 MiB: more than a rank's share of B


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--"]
    ext_dir = args[0]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    sys.path.insert(0, ext_dir)
    import exllamav3_ext as ext  # after torch: it links libtorch

    out = {"rank": rank, "world": world, "device": torch.cuda.get_device_name(dev),
           "ext": ext.__file__, "cases": [], "aborted": None}  # fmt: skip
    port = os.environ.get("MASTER_PORT", "0")
    pg = Pg(ext, rank, world, dev, f"pinwheel_pg_{port}", ext_dir)
    try:
        out["init"] = pg.init_fields()
        run_cases(pg, out)
        out["sync_timeout_after"] = pg.field(0)
    except Exception:  # reported, not raised: the other rank must not wait forever
        out["error"] = traceback.format_exc(limit=4)
    finally:
        pg.close()
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    print(json.dumps(out), flush=True)
    return 0


class Pg:
    """The shared, pinned G and B regions, and the abort flag, as exllamav3 sets them up."""

    def __init__(self, ext, rank, world, dev, name, ext_dir):
        self.ext, self.rank, self.world, self.dev = ext, rank, world, dev
        self.ext_dir = ext_dir  # where the CPU reducer imports the module from
        self.devices = list(range(world))
        self.master = rank == 0
        self.name = name
        self.shm = {}
        if self.master:
            for key, size in REGIONS.items():
                self.shm[key] = shared_memory.SharedMemory(create=True, size=size,
                                                           name=f"{name}_{key}")  # fmt: skip
        dist.barrier()
        if not self.master:
            for key in REGIONS:
                self.shm[key] = shared_memory.SharedMemory(name=f"{name}_{key}")
        self.views = {k: torch.frombuffer(m.buf, dtype=torch.uint8) for k, m in self.shm.items()}
        if self.master:
            for view in self.views.values():
                view.zero_()
        self.ptr = {k: v.data_ptr() for k, v in self.views.items()}
        self.registered = []
        for key, size in REGIONS.items():
            host_register(self.ptr[key], size)
            self.registered.append(self.ptr[key])
        self.g = self.views["g"]
        self.ptr_g, self.ptr_b = self.ptr["g"], self.ptr["b"]
        if self.master:
            ext.pg_init_context(self.ptr_g)
        self.abort = torch.zeros((1,), device=dev, dtype=torch.int)
        self.reducer = None
        self.lockstep()

    def start_cpu_reducer(self, ext_dir):
        """Rank 0: the CPU reduction process exllamav3 runs beside the GPU workers."""
        if self.master:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            self.reducer = ctx.Process(target=cpu_reducer, args=(ext_dir, self.name), daemon=True)
            self.reducer.start()
        self.lockstep()

    def stop_cpu_reducer(self):
        """Rank 0 queues the end marker; the reducer returns. Its exit code, or why not."""
        self.lockstep()
        if not self.master or self.reducer is None:
            return None
        self.ext.end_cpu_reduce_jobs(self.ptr_g)
        self.reducer.join(timeout=30)
        if self.reducer.is_alive():
            self.reducer.terminate()
            return "the CPU reducer did not return after end_cpu_reduce_jobs (terminated)"
        code = self.reducer.exitcode
        return None if code == 0 else f"the CPU reducer exited with {code}"

    def lockstep(self):
        torch.cuda.synchronize(self.dev)
        dist.barrier()

    def field(self, index):
        """The index-th uint32 of the PGContext (0: sync_timeout, 1: barrier_epoch)."""
        return int(self.g[:64].view(torch.int32)[index].item())

    def init_fields(self):
        return {"sync_timeout": self.field(0), "barrier_epoch": self.field(1),
                "globals_bytes": GLOBALS_SIZE, "shbuf_bytes": SHBUF_SIZE}  # fmt: skip

    def aborted(self):
        torch.cuda.synchronize(self.dev)
        return int(self.abort.item()) != 0 or self.field(0) != 0

    def close(self):
        torch.cuda.synchronize(self.dev)
        reducer = getattr(self, "reducer", None)
        if reducer is not None and reducer.is_alive():
            reducer.terminate()
        for ptr in getattr(self, "registered", ()):
            host_unregister(ptr)
        self.g = None
        self.views = {}
        try:
            dist.barrier()
        except Exception:
            pass
        for shm in getattr(self, "shm", {}).values():
            try:
                shm.close()
            except BufferError:  # a view is still alive; the process exits anyway
                pass
            if self.master:
                shm.unlink()


REGIONS = {"g": GLOBALS_SIZE, "b": SHBUF_SIZE, "r": SHBUF_SIZE_R, "s": SHBUF_SIZE_S,
           "ll": SHBUF_SIZE_LL}  # fmt: skip


def cpu_reducer(ext_dir, name):
    """exllamav3's CPU reduce process (model_tp_fn.mp_cpu_reduce): no GPU, G and R mapped,
    ``run_cpu_reduce_jobs`` until the end marker rank 0 queues."""
    sys.path.insert(0, ext_dir)
    import exllamav3_ext as ext

    g = shared_memory.SharedMemory(name=f"{name}_g")
    r = shared_memory.SharedMemory(name=f"{name}_r")
    tg = torch.frombuffer(g.buf, dtype=torch.uint8)
    tr = torch.frombuffer(r.buf, dtype=torch.uint8)
    ext.run_cpu_reduce_jobs(tg.data_ptr(), tr.data_ptr(), SHBUF_SIZE_R)
    del tg, tr
    g.close()
    r.close()


def _cudart_ctypes():
    """libcudart through ctypes (as exllamav3's model_tp_cuda.py), for a torch without the binding;
    torch has loaded it already, so its soname resolves."""
    import ctypes

    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("libcudart not found")


def host_register(ptr, size):
    rt = torch.cuda.cudart()
    if hasattr(rt, "cudaHostRegister"):
        rc = int(rt.cudaHostRegister(ptr, size, CUDA_HOST_REGISTER_PORTABLE))
    else:
        import ctypes

        fn = _cudart_ctypes().cudaHostRegister
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        rc = int(fn(ptr, size, CUDA_HOST_REGISTER_PORTABLE))
    if rc != 0:
        raise RuntimeError(f"cudaHostRegister failed: error {rc}")


def host_unregister(ptr):
    rt = torch.cuda.cudart()
    if hasattr(rt, "cudaHostUnregister"):
        rt.cudaHostUnregister(ptr)
    else:
        import ctypes

        fn = _cudart_ctypes().cudaHostUnregister
        fn.argtypes = [ctypes.c_void_p]
        fn(ptr)


def sum_bound(parts):
    """Per element, how far two sums of ``parts`` (float32, one per rank) taken in any two
    orders may differ: each order is a recursive sum of n terms, within
    gamma(n-1) * sum|x_r| of the exact sum (Higham, Accuracy and Stability of Numerical
    Algorithms, 2nd ed., eq. 4.4; gamma(k) = k u / (1 - k u), u = 2^-24), so two orders
    are within twice that. n = 2 is one addition, commutative: exact (bound 0)."""
    n = len(parts)
    if n <= 2:
        return None
    k = n - 1
    gamma = k * FLOAT32_U / (1 - k * FLOAT32_U)
    total = torch.zeros_like(parts[0], dtype=torch.float64)
    for p in parts:
        total += p.to(torch.float64).abs()
    return 2 * gamma * total


def bf16_trunc(x):
    """float32 ``x`` truncated to bfloat16 (the top 16 bits kept: round toward zero), as
    float32: what pg_all_reduce_cpu sends and what its CPU sum keeps per addition."""
    return (x.view(torch.int32) & -65536).view(torch.float32)


def cpu_sum_reference(summed):
    """pg_all_reduce_cpu's result from NCCL's float32 sum of the truncated contributions:
    truncated once more. Exact for two contributors (a + b, one addition, either order);
    with more, the CPU truncates after every addition, so see :func:`cpu_sum_bound`."""
    return bf16_trunc(summed)


def cpu_sum_bound(parts):
    """Per element, how far pg_all_reduce_cpu's sum (contributions added in the order they
    arrive, each addition rounded to float32 and truncated to bfloat16) may lie from the
    reference for more than two contributors: n - 1 additions, each off by less than one
    bfloat16 ulp (2^-7 relative, truncation) plus half a float32 ulp, of a partial sum at
    most sum|t_r|; two such sums are within twice that. Two or fewer: exact (None)."""
    n = len(parts)
    if n <= 2:
        return None
    total = torch.zeros_like(parts[0], dtype=torch.float64)
    for p in parts:
        total += bf16_trunc(p.float()).to(torch.float64).abs()
    return 2 * (n - 1) * (2.0**-7 + FLOAT32_U) * total


def compare(got, want, bound=None):
    """Bit for bit; with ``bound`` (per element, float64), an element that differs in its
    bits but by no more than its bound still matches (a sum in another order). Says how
    many elements are bit-identical ("exact") and, with a bound, the largest |diff|/bound."""
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    if got.shape != want.shape:
        return {"match": False, "exact": False,
                "detail": f"shape {tuple(got.shape)} != {tuple(want.shape)}"}  # fmt: skip
    diff = got.view(bits) != want.view(bits)
    exact = not bool(diff.any().item()) if want.numel() else True
    ratio = None
    if bound is not None and not exact:
        delta = (got.to(torch.float64) - want.to(torch.float64)).abs()
        ok = torch.isfinite(delta) & (delta <= bound)
        diff = diff & ~ok
        within = ~diff & (bound > 0)
        ratio = float((delta[within] / bound[within]).max().item()) if within.any() else 0.0
    wrong = int(diff.sum().item())
    finite = torch.isfinite(got) & torch.isfinite(want)
    max_abs = (
        float((got.float() - want.float()).abs()[finite].max().item()) if finite.any() else 0.0
    )
    first = int(diff.flatten().nonzero()[0].item()) if wrong else None
    return {"match": wrong == 0, "exact": exact, "wrong": wrong, "elements": want.numel(),
            "unwritten": int(torch.isnan(got).sum().item()), "max_abs_diff": max_abs,
            "first_wrong": first,
            "tolerance": None if bound is None else {
                "rule": "2 gamma(world-1) sum|x_r|, float32", "max_ratio": ratio}}  # fmt: skip


def gen(seed, shape, dtype, dev):
    g = torch.Generator(device=dev).manual_seed(seed)
    return torch.randn(shape, generator=g, device=dev, dtype=torch.float32).to(dtype)


def run_cases(pg, out):
    rank = pg.rank
    cases = out["cases"]

    def record(op, case, nbytes, result):
        result.update(op=op, case=case, bytes=nbytes, rank=rank)
        cases.append(result)

    def guarded(op, case, nbytes, fn):
        try:
            record(op, case, nbytes, fn())
        except Exception as exc:
            record(op, case, nbytes, {"match": False, "error": f"{type(exc).__name__}: {exc}"})
        if pg.aborted():
            out["aborted"] = f"{op} {case}"
            raise RuntimeError(f"exllamav3 sync timeout during {op} {case}")
        pg.lockstep()

    run_barriers(pg, guarded)
    run_all_reduce(pg, guarded)
    run_broadcast(pg, guarded)
    run_cpu_all_reduce(pg, guarded)
    run_broadcast_ll(pg, guarded)
    run_gather_small(pg, guarded)
    run_gather(pg, guarded, out)


def run_barriers(pg, guarded):
    """pg_barrier back to back, then with the last rank arriving late, beside dist.barrier."""
    ext, rank, world, dev = pg.ext, pg.rank, pg.world, pg.dev

    def barriers():
        for _ in range(100):
            ext.pg_barrier(pg.ptr_g, pg.devices, rank, pg.abort)
        torch.cuda.synchronize(dev)
        return {"match": True, "detail": "100 barriers in a row"}

    guarded("pg_barrier", "100 in a row", 0, barriers)

    def late(fn):
        pg.lockstep()
        if rank == world - 1 and world > 1:
            time.sleep(BARRIER_DELAY_S)
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(dev)
        return time.perf_counter() - start

    def skew():
        waited_pg = late(lambda: ext.pg_barrier(pg.ptr_g, pg.devices, rank, pg.abort))
        waited_dist = late(dist.barrier)
        held = waited_pg >= 0.8 * BARRIER_DELAY_S and waited_dist >= 0.8 * BARRIER_DELAY_S
        return {"match": held if rank == 0 and world > 1 else True,
                "waited_s": round(waited_pg, 4), "torch_waited_s": round(waited_dist, 4),
                "detail": f"last rank {BARRIER_DELAY_S} s late"}  # fmt: skip

    guarded("pg_barrier", f"last rank {BARRIER_DELAY_S} s late", 0, skew)



def run_all_reduce(pg, guarded):
    """pg_all_reduce of float32 vectors against dist.all_reduce, within the sum's bound."""
    ext, rank, world, dev = pg.ext, pg.rank, pg.world, pg.dev
    for i, n in enumerate(ALL_REDUCE_NUMEL):

        def all_reduce(n=n, i=i):
            x = gen(100 + 10 * i + rank, (n,), torch.float32, dev)
            got, want = x.clone(), x.clone()
            ext.pg_all_reduce(pg.ptr_g, pg.devices, rank, pg.devices[0], got, pg.ptr_b,
                              SHBUF_SIZE, pg.abort)  # fmt: skip
            dist.all_reduce(want)
            torch.cuda.synchronize(dev)
            # every rank's input is generated here from its seed: the bound needs them all
            parts = [gen(100 + 10 * i + r, (n,), torch.float32, dev) for r in range(world)]
            return compare(got, want, sum_bound(parts))

        guarded("pg_all_reduce", f"{n} float32", n * 4, all_reduce)


def run_broadcast(pg, guarded):
    """pg_broadcast of float16 vectors from every rank against dist.broadcast."""
    ext, rank, world, dev = pg.ext, pg.rank, pg.world, pg.dev
    for i, n in enumerate(BROADCAST_NUMEL):
        for src in range(world):

            def broadcast(n=n, i=i, src=src):
                x = gen(200 + 10 * i, (n,), torch.float16, dev)
                got = x.clone() if rank == src else torch.full_like(x, float("nan"))
                want = got.clone()
                ext.pg_broadcast(pg.ptr_g, pg.devices, rank, src, got, pg.ptr_b, SHBUF_SIZE,
                                 pg.abort)  # fmt: skip
                dist.broadcast(want, src)
                torch.cuda.synchronize(dev)
                return compare(got, want)

            guarded("pg_broadcast", f"{n} float16 from rank {src}", n * 2, broadcast)


def run_gather(pg, guarded, out):
    """pg_gather of uneven column slices to every rank against dist.all_gather (two ranks
    or more: one rank gathers nothing)."""
    ext, rank, world, dev = pg.ext, pg.rank, pg.world, pg.dev
    if world < 2:
        out["gather_skipped"] = (
            "one rank: exllamav3 gathers across ranks only "
            "(pg_gather_kernel returns at once when num_ranks <= 1)"
        )
        return
    for ldims in gather_ldims(world):
        for batch in GATHER_BATCH:
            for dst in range(world):

                def gather(ldims=ldims, batch=batch, dst=dst):
                    mine = gen(300 + batch + 7 * rank, (batch, ldims[rank]), torch.float16, dev)
                    total = sum(ldims)
                    got = torch.full((batch, total), float("nan"), device=dev,
                                     dtype=torch.float16) if rank == dst else None  # fmt: skip
                    ext.pg_gather(pg.ptr_g, pg.devices, rank, dst, mine, got, list(ldims),
                                  pg.ptr_b, SHBUF_SIZE, pg.abort)  # fmt: skip
                    # torch.distributed: all_gather of slices padded to the widest, then cut
                    wide = max(ldims)
                    pad = torch.zeros((batch, wide), device=dev, dtype=torch.float16)
                    pad[:, : ldims[rank]] = mine
                    allp = torch.empty((world, batch, wide), device=dev, dtype=torch.float16)
                    dist.all_gather_into_tensor(allp, pad)
                    want = torch.cat([allp[r, :, : ldims[r]] for r in range(world)], dim=-1)
                    torch.cuda.synchronize(dev)
                    if rank != dst:
                        return {"match": True, "detail": "sender"}
                    assert got is not None  # the destination rank allocated it
                    res = compare(got, want)
                    cols, start = [], 0
                    for r, w in enumerate(ldims):
                        part = compare(got[:, start : start + w].contiguous(),
                                       want[:, start : start + w].contiguous())  # fmt: skip
                        cols.append({"rank": r, "columns": [start, start + w],
                                     "wrong": part.get("wrong"),
                                     "unwritten": part.get("unwritten")})  # fmt: skip
                        start += w
                    res["by_source"] = cols
                    return res

                guarded("pg_gather", f"ldims {list(ldims)} batch {batch} to rank {dst}",
                        batch * sum(ldims) * 2, gather)  # fmt: skip


def run_cpu_all_reduce(pg, guarded):
    """pg_all_reduce_cpu, the all-reduce TPBackendNative runs at the pinned commit: every
    rank contributing, then (two ranks or more) the last one not contributing, in each
    dtype the kernel takes; the CPU reducer runs only around these cases."""
    ext, rank, world, dev = pg.ext, pg.rank, pg.world, pg.dev
    pg.start_cpu_reducer(pg.ext_dir)
    try:
        patterns = [tuple(True for _ in range(world))]
        if world > 1:
            patterns.append(tuple(r != world - 1 for r in range(world)))
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for i, n in enumerate(ALL_REDUCE_CPU_NUMEL):
                for contrib in patterns:

                    def all_reduce_cpu(n=n, i=i, dtype=dtype, contrib=contrib):
                        seed = 400 + 10 * i
                        x = gen(seed + rank, (n,), dtype, dev)
                        got = x.clone()
                        ext.pg_all_reduce_cpu(pg.ptr_g, pg.devices, rank, pg.devices[0], got,
                                              contrib[rank], pg.ptr["r"], SHBUF_SIZE_R,
                                              pg.master, pg.abort)  # fmt: skip
                        mine = bf16_trunc(x.float()) if contrib[rank] else torch.zeros(
                            (n,), device=dev, dtype=torch.float32)  # fmt: skip
                        dist.all_reduce(mine)
                        want = cpu_sum_reference(mine).to(dtype)
                        torch.cuda.synchronize(dev)
                        parts = [gen(seed + r, (n,), dtype, dev)
                                 for r in range(world) if contrib[r]]  # fmt: skip
                        bound = cpu_sum_bound(parts)
                        return compare(got, want, bound)

                    who = "all ranks" if all(contrib) else f"rank {world - 1} not contributing"
                    name = str(dtype).removeprefix("torch.")
                    size = n * torch.tensor([], dtype=dtype).element_size()
                    guarded("pg_all_reduce_cpu", f"{n} {name}, {who}", size, all_reduce_cpu)
    finally:
        why = pg.stop_cpu_reducer()
    if why:
        raise RuntimeError(why)


def run_broadcast_ll(pg, guarded):
    """pg_broadcast_ll, TPBackendNative's broadcast up to 2,048 bytes, from every rank."""
    ext, rank, world, dev = pg.ext, pg.rank, pg.world, pg.dev
    for i, (n, offset) in enumerate(BROADCAST_LL):
        for src in range(world):

            def broadcast_ll(n=n, i=i, src=src, offset=offset):
                x = gen(500 + 10 * i, (n + offset,), torch.float16, dev)
                base = x.clone() if rank == src else torch.full_like(x, float("nan"))
                got = base[offset:]
                want = base.clone()[offset:]
                ext.pg_broadcast_ll(pg.ptr_g, pg.devices, rank, src, got, pg.ptr["ll"],
                                    SHBUF_SIZE_LL, pg.abort)  # fmt: skip
                dist.broadcast(want, src)
                torch.cuda.synchronize(dev)
                return compare(got, want)

            where = ", 2-byte aligned" if offset else ""
            guarded("pg_broadcast_ll", f"{n} float16 from rank {src}{where}", n * 2,
                    broadcast_ll)  # fmt: skip


def run_gather_small(pg, guarded):
    """pg_gather_small as exllamav3's argmax sampler uses it: per rank one column of values
    (float16) and one of indices (int64), or no column (a rank without a slice), gathered to
    each rank in turn. Runs on one rank too (the rank gathers its own column)."""
    ext, rank, world, dev = pg.ext, pg.rank, pg.world, pg.dev
    shapes = [tuple(1 for _ in range(world))]
    if world > 1:
        shapes.append(tuple(0 if r == 0 else 1 for r in range(world)))
    for ldims in shapes:
        for dtype in (torch.float16, torch.int64):
            for batch in GATHER_SMALL_BATCH:
                for dst in range(world):

                    def gather_small(ldims=ldims, dtype=dtype, batch=batch, dst=dst):
                        seed = 600 + batch + 7 * rank
                        if dtype == torch.int64:
                            g = torch.Generator(device=dev).manual_seed(seed)
                            mine = torch.randint(0, 1 << 40, (batch, ldims[rank]), generator=g,
                                                 device=dev, dtype=dtype)  # fmt: skip
                        else:
                            mine = gen(seed, (batch, ldims[rank]), dtype, dev)
                        total = sum(ldims)
                        got = torch.full((batch, total), -1, device=dev, dtype=dtype) \
                            if rank == dst else None  # fmt: skip
                        ext.pg_gather_small(pg.ptr_g, pg.devices, rank, dst, mine, got,
                                            list(ldims), pg.ptr["s"], SHBUF_SIZE_S,
                                            pg.abort)  # fmt: skip
                        pad = torch.zeros((batch, 1), device=dev, dtype=dtype)
                        pad[:, : ldims[rank]] = mine
                        allp = torch.empty((world, batch, 1), device=dev, dtype=dtype)
                        dist.all_gather_into_tensor(allp, pad)
                        want = torch.cat([allp[r, :, : ldims[r]] for r in range(world)], dim=-1)
                        torch.cuda.synchronize(dev)
                        if rank != dst:
                            return {"match": True, "detail": "sender"}
                        return compare(got, want)

                    name = str(dtype).removeprefix("torch.")
                    size = torch.tensor([], dtype=dtype).element_size()
                    guarded("pg_gather_small",
                            f"ldims {list(ldims)} {name} batch {batch} to rank {dst}",
                            batch * sum(ldims) * size, gather_small)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

"""Two GPUs: the preflight all-reduce, exllamav3's pg_* primitives, one process per rank.

What runs here (no GPU, 2 cores): the rank launcher with real processes (the
environment each rank gets, a failed rank stopping the others, the timeout),
the checks and gates as functions of measured outcomes, wheel unpacking, the CLI
errors, and, where a torch is at hand (``PINWHEEL_TORCH_PYTHON``, or the
qualify-cpu vLLM venv under ``-m "slow and qualify"``), the all-reduce worker
itself over gloo on two CPU processes.

What needs GPUs skips here with that reason: the NCCL all-reduce and the
pg_* check on two GPUs (and on one). Their real results, captured on 2 x H200
by ``bench/pr_ab.py``, are the fixtures under tests/fixtures/tp that the
outcome tests read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.errors import ManifestError, PinwheelError
from pinwheel.serve.allreduce import AllReduceOutcome, AllReduceRequest, measure, outcome_of
from pinwheel.serve.preflight import FAIL, OK, SKIP, allreduce_check
from pinwheel.serve.ranks import NVLS_OFF, RankRequest, RankResult, child_env, run_ranks
from pinwheel.serve.tpcheck import (
    TpOutcome,
    TpRequest,
    extract_extension,
    run_tpcheck,
    table,
)
from pinwheel.serve.tpcheck import outcome_of as tp_outcome_of

FIXTURES = Path(__file__).parent / "fixtures" / "tp"


# --------------------------------------------------------------------------- ranks


def test_every_rank_gets_the_rendezvous_its_gpus_and_nvls_forced_off():
    caller = {"PATH": "/bin", "NCCL_NVLS_ENABLE": "1", "NVSHMEM_DISABLE_NVLS": "0", "KEEP": "x"}
    env = child_env(caller, rank=1, world=2, port=29555, devices=(2, 3))
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "1"
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29555"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert {k: env[k] for k, _ in NVLS_OFF} == dict(NVLS_OFF)  # the caller's "1" does not win
    assert env["KEEP"] == "x" and caller["NCCL_NVLS_ENABLE"] == "1"  # caller's dict untouched
    cpu = child_env({}, rank=0, world=2, port=1, devices=())
    assert "CUDA_VISIBLE_DEVICES" not in cpu and cpu["PINWHEEL_RANK_BACKEND"] == "gloo"


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_ranks_are_real_processes_with_their_own_environment(tmp_path):
    script = _script(
        tmp_path,
        """\
        import json, os, sys
        keys = ("RANK", "WORLD_SIZE", "MASTER_PORT", "NCCL_NVLS_ENABLE",
                "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
        print("noise before the result")
        print(json.dumps({"argv": sys.argv[1:], "pid": os.getpid(),
                          **{k: os.environ.get(k) for k in keys}}))
        """,
    )
    results = run_ranks(
        RankRequest(
            python=sys.executable,
            script=script,
            args=("--", "-x"),
            devices=(),
            world=3,
            environ={**os.environ, "NCCL_NVLS_ENABLE": "1"},
        )
    )
    assert [r.rank for r in results] == [0, 1, 2] and all(r.ok for r in results)
    payloads = [r.payload for r in results]
    assert [p["RANK"] for p in payloads] == ["0", "1", "2"]
    assert {p["WORLD_SIZE"] for p in payloads} == {"3"}
    assert len({p["MASTER_PORT"] for p in payloads}) == 1  # one rendezvous
    assert len({p["pid"] for p in payloads}) == 3
    assert {p["NCCL_NVLS_ENABLE"] for p in payloads} == {"0"}
    assert payloads[0]["argv"] == ["--", "-x"]


def test_a_failed_rank_stops_the_others_and_says_why(tmp_path):
    script = _script(
        tmp_path,
        """\
        import os, sys, time
        if os.environ["RANK"] == "1":
            print("NCCL error: unhandled system error", file=sys.stderr)
            sys.exit(3)
        time.sleep(120)  # would wait in a collective for the missing rank
        """,
    )
    results = run_ranks(
        RankRequest(python=sys.executable, script=script, args=(), devices=(), world=2, grace_s=0.5)
    )
    assert results[1].returncode == 3 and not results[1].ok
    assert results[1].why() == "rank 1: exit 3 (NCCL error: unhandled system error)"
    assert results[0].returncode is None and results[0].why().startswith("rank 0: stopped")


def test_ranks_past_the_timeout_are_stopped(tmp_path):
    script = _script(tmp_path, "import time\ntime.sleep(120)\n")
    results = run_ranks(
        RankRequest(
            python=sys.executable, script=script, args=(), devices=(), world=2, timeout_s=0.5
        )
    )
    assert [r.returncode for r in results] == [None, None]


def test_a_missing_interpreter_names_the_flag(tmp_path):
    with pytest.raises(PinwheelError) as err:
        run_ranks(
            RankRequest(
                python=str(tmp_path / "no-python"),
                script=tmp_path / "w.py",
                args=(),
                devices=(),
                world=2,
            )
        )
    assert "--python" in (err.value.next or "")


def test_devices_and_world_must_agree(tmp_path):
    with pytest.raises(PinwheelError, match="3 ranks but 2 GPUs"):
        run_ranks(
            RankRequest(python=sys.executable, script=tmp_path, args=(), devices=(0, 1), world=3)
        )


# --------------------------------------------------------------------------- all-reduce gate


def _measured(**kw) -> AllReduceOutcome:
    # the figures of the 2 x H200 run (NV18, NVLS off): 256 MiB in 0.902 ms
    base = dict(
        world=2,
        backend="nccl",
        nbytes=256 << 20,
        sum_ok=True,
        wrong=(),
        failures=(),
        nvls_off=True,
        seconds=0.000902,
        algbw_gbps=297.6,
        busbw_gbps=297.6,
        device="NVIDIA H200",
        nccl="2.28.9",
    )
    return AllReduceOutcome(**{**base, **kw})


def test_bandwidth_is_reported_and_not_gated_without_a_floor():
    c = allreduce_check(_measured(), "tp2", None)
    assert c.status == OK
    assert "bus bandwidth 297.6 GB/s" in c.detail
    assert "not gated ([serve.profile.tp2] min_allreduce_gbps unset)" in c.detail


def test_bandwidth_under_the_profile_floor_fails_and_names_the_key():
    c = allreduce_check(_measured(busbw_gbps=41.0), "tp4", 150.0)
    assert c.status == FAIL and "below the gate 150 GB/s" in c.detail
    assert "[serve.profile.tp4] min_allreduce_gbps" in c.detail
    assert "nvidia-smi topo -m" in (c.next or "")
    assert allreduce_check(_measured(), "tp4", 150.0).status == OK


def test_a_wrong_sum_fails_whatever_the_bandwidth():
    bad = _measured(sum_ok=False, wrong=("rank 1: 12 wrong, first at 40 (got 3.0, want 2.0)",))
    c = allreduce_check(bad, "tp2", 1.0)
    assert c.status == FAIL and "rank 1: 12 wrong, first at 40" in c.detail
    assert "NCCL_P2P_LEVEL=NVL" in (c.next or "")


def test_nvls_on_in_a_rank_fails():
    assert allreduce_check(_measured(nvls_off=False), "tp2", None).status == FAIL


def test_one_gpu_is_not_gated():
    c = allreduce_check(_measured(world=1, busbw_gbps=0.0), "one", 150.0)
    assert c.status == OK and "gate not applied" in c.detail


def test_ranks_become_one_outcome():
    env = dict(NVLS_OFF)
    good = {"rank": 0, "bytes": 1024, "sum_ok": True, "seconds": 0.5, "busbw_gbps": 1.0,
            "algbw_gbps": 1.0, "device": "cpu", "env": env}  # fmt: skip
    wrong = {**good, "rank": 1, "sum_ok": False, "wrong": 2,
             "first_wrong": {"index": 7, "got": 1.0, "want": 2.0}}  # fmt: skip
    o = outcome_of((RankResult(0, 0, 0, good, ""), RankResult(1, 1, 0, wrong, "")), 1024, "nccl")
    assert not o.sum_ok and o.wrong == ("rank 1: 2 wrong, first at 7 (got 1.0, want 2.0)",)
    crashed = outcome_of(
        (RankResult(0, 0, 0, good, ""), RankResult(1, 1, 1, None, "RuntimeError: NCCL")),
        1024,
        "nccl",
    )
    assert not crashed.sum_ok and crashed.busbw_gbps is None
    assert crashed.failures == ("rank 1: exit 1 (RuntimeError: NCCL)",)
    assert allreduce_check(crashed, "tp2", None).status == FAIL


# --------------------------------------------------------------------------- manifest key


def _load_profile(tmp_path: Path, value: str):
    from pinwheel.manifest import load

    text = (Path(__file__).parent.parent / "recipes" / "sm120-tp2" / "manifest.toml").read_text()
    head = "[serve.profile.daily]\n"
    assert head in text
    text = text.replace(head, f"{head}{value}\n", 1)
    (tmp_path / "manifest.toml").write_text(text)
    for lock in (Path(__file__).parent.parent / "recipes" / "sm120-tp2").glob("torch-*.txt"):
        (tmp_path / lock.name).write_bytes(lock.read_bytes())  # its [build.torch_lock]
    return load(tmp_path / "manifest.toml").require("serve").profile("daily")


def test_min_allreduce_gbps_is_read_from_the_profile(tmp_path):
    assert _load_profile(tmp_path, "min_allreduce_gbps = 150").min_allreduce_gbps == 150.0
    assert _load_profile(tmp_path, "").min_allreduce_gbps is None


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", '"fast"', "true"])
def test_min_allreduce_gbps_must_be_a_positive_number(tmp_path, value):
    with pytest.raises(ManifestError, match="min_allreduce_gbps"):
        _load_profile(tmp_path, f"min_allreduce_gbps = {value}")


# --------------------------------------------------------------------------- the worker, for real


def _torch_python(request) -> str:
    """A python with torch: $PINWHEEL_TORCH_PYTHON, else (slow + qualify) the CPU vLLM venv."""
    env = os.environ.get("PINWHEEL_TORCH_PYTHON")
    if env:
        return env
    if request.config.getoption("-m") and "qualify" in request.config.getoption("-m"):
        sys.path.insert(0, str(Path(__file__).parent))
        from cpu_vllm import provision

        return str(provision().python)
    pytest.skip(
        "needs a python with torch: set PINWHEEL_TORCH_PYTHON (or run -m 'slow and qualify')"
    )


def _gpus(python: str) -> int:
    p = subprocess.run(
        [python, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return int(p.stdout.strip() or 0) if p.returncode == 0 else 0


@pytest.mark.slow
@pytest.mark.qualify
def test_allreduce_worker_over_gloo_on_two_cpu_processes(request):
    python = _torch_python(request)
    o = measure(
        AllReduceRequest(
            python=python, devices=(), environ=dict(os.environ), nbytes=1 << 20, iters=3, warmup=1
        )
    )
    assert o.failures == () and o.world == 2 and o.backend == "gloo"
    assert o.sum_ok and o.nvls_off and o.nbytes == 1 << 20
    assert o.busbw_gbps is not None and o.busbw_gbps > 0
    assert allreduce_check(o, "cpu", None).status == OK


@pytest.mark.slow
def test_nccl_allreduce_on_two_gpus(request):
    python = _torch_python(request)
    if _gpus(python) < 2:
        pytest.skip("needs two GPUs (CI has none; see the issue-26 note for the 2 x H200 run)")
    o = measure(AllReduceRequest(python=python, devices=(0, 1), environ=dict(os.environ)))
    assert o.failures == () and o.sum_ok and o.nvls_off and o.backend == "nccl"
    print(allreduce_check(o, "two", None).detail)


def _avx2_sum(parts, order):
    """exllamav3's CPU reduction, written from its source (all_reduce_cpu.cu's kernel and
    all_reduce_cpu_avx2.cpp's ``do16``) in numpy bit operations: each float32 contribution
    sent as its top 16 bits; the first to arrive copied, each next one expanded (<< 16),
    added in float32 and truncated back (>> 16); the result expanded to float32."""
    import numpy as np

    sent = [(p.view(np.uint32) >> 16).astype(np.uint16) for p in parts]
    acc = sent[order[0]].copy()
    for i in order[1:]:
        a = (acc.astype(np.uint32) << 16).view(np.float32)
        b = (sent[i].astype(np.uint32) << 16).view(np.float32)
        acc = ((a + b).view(np.uint32) >> 16).astype(np.uint16)
    return (acc.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.slow
@pytest.mark.qualify
def test_the_cpu_all_reduce_reference_is_exllamav3s_arithmetic(request, tmp_path):
    """The worker's reference for pg_all_reduce_cpu (torch, on CPU here) against the numpy
    transcription of exllamav3's C++ above: bit for bit with two contributors in either
    arrival order (float16 inputs through the same float32 path, rounded to half at the
    end as the kernel's __float2half_rn does); from three on, any arrival order stays
    within the worker's cpu_sum_bound, and a sum that lost one contribution does not, so
    the bound is not loose enough to hide a wrong reduction."""
    np = pytest.importorskip("numpy")
    python = _torch_python(request)
    rng = np.random.default_rng(7)
    n = 4096
    parts = [rng.standard_normal(n).astype(np.float32) for _ in range(8)]
    np.save(tmp_path / "parts.npy", np.stack(parts))
    worker = Path(__file__).parent.parent / "src/pinwheel/serve/workers/pg_primitives.py"
    script = textwrap.dedent(
        f"""
        import importlib.util, numpy as np, torch
        spec = importlib.util.spec_from_file_location("w", {str(worker)!r})
        w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
        parts = torch.from_numpy(np.load({str(tmp_path / "parts.npy")!r}))
        out = {{}}
        for k in range(1, 9):
            mine = [w.bf16_trunc(parts[r].float()) for r in range(k)]
            summed = torch.stack(mine).sum(0) if k <= 2 else sum(mine[1:], mine[0])
            out[f"ref{{k}}"] = w.cpu_sum_reference(summed).numpy()
            bound = w.cpu_sum_bound([parts[r] for r in range(k)])
            out[f"bound{{k}}"] = (np.zeros(parts.shape[1]) if bound is None else bound.numpy())
        half = parts[:2].to(torch.float16)
        summed = w.bf16_trunc(half[0].float()) + w.bf16_trunc(half[1].float())
        out["half2"] = w.cpu_sum_reference(summed).to(torch.float16).numpy()
        np.savez({str(tmp_path / "out.npz")!r}, **out)
        """
    )
    p = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = np.load(tmp_path / "out.npz")
    for order in ([0, 1], [1, 0]):
        assert (got["ref2"].view(np.uint32) == _avx2_sum(parts, order).view(np.uint32)).all()
    assert (got["ref1"] == _avx2_sum(parts, [0])).all()
    halves = [p.astype(np.float16).astype(np.float32) for p in parts[:2]]
    assert (got["half2"] == _avx2_sum(halves, [1, 0]).astype(np.float16)).all()
    worst = 0.0
    for k in range(3, 9):
        ref, bound = got[f"ref{k}"].astype(np.float64), got[f"bound{k}"]
        for seed in range(5):
            order = list(np.random.default_rng(seed).permutation(k))
            delta = np.abs(_avx2_sum(parts[:k], order).astype(np.float64) - ref)
            assert (delta <= bound).all(), (k, order)
            worst = max(worst, float((delta / np.where(bound > 0, bound, 1)).max()))
        lost = np.abs(_avx2_sum(parts[: k - 1], list(range(k - 1))).astype(np.float64) - ref)
        assert (lost > bound).any(), f"{k} ranks: a sum missing a contribution passes"
    print(f"largest |delta| / bound over 3..8 contributors: {worst:.3f}")


def _wheel_env() -> Path:
    wheel = os.environ.get("PINWHEEL_EXLLAMAV3_WHEEL")
    if not wheel:
        pytest.skip("needs an exllamav3 wheel from `pinwheel kernels` (PINWHEEL_EXLLAMAV3_WHEEL)")
    return Path(wheel)


@pytest.mark.slow
def test_pg_primitives_on_two_gpus_equal_torch_distributed(request):
    wheel = _wheel_env()
    python = _torch_python(request)
    if _gpus(python) < 2:
        pytest.skip("needs two GPUs (CI has none; see the issue-26 note for the 2 x H200 run)")
    o = run_tpcheck(TpRequest(python=python, wheel=wheel, devices=(0, 1), environ=os.environ))
    assert o.ok, [c for c in o.checks() if c.status != OK]
    assert {c.op for c in o.cases} == set(OLD_WORKER + NATIVE_BACKEND)


@pytest.mark.slow
def test_pg_primitives_on_one_gpu_are_the_degenerate_cases(request):
    wheel = _wheel_env()
    python = _torch_python(request)
    if _gpus(python) < 1:
        pytest.skip("needs a GPU (CI has none)")
    o = run_tpcheck(TpRequest(python=python, wheel=wheel, devices=(0,), environ=os.environ))
    checks = {c.name: c for c in o.checks()}
    assert checks["pg_gather"].status == SKIP
    others = [n for n in OLD_WORKER + NATIVE_BACKEND if n != "pg_gather"]
    assert all(checks[n].status == OK for n in others), [checks[n] for n in others]


# --------------------------------------------------------------------------- outcomes


def _fixture(name: str) -> TpOutcome:
    return TpOutcome.from_json(json.loads((FIXTURES / f"{name}.json").read_text())["outcome"])


OLD_WORKER = ("pg_barrier", "pg_all_reduce", "pg_broadcast", "pg_gather")
NATIVE_BACKEND = ("pg_all_reduce_cpu", "pg_broadcast_ll", "pg_gather_small")


def test_pinned_stack_passes_what_the_older_worker_compared_on_two_gpus():
    """A capture from the worker before it ran the native backend's primitives: every
    primitive it compared passes, and the outcome is no pass, since what exllamav3 calls
    at the pinned commit (pg_all_reduce_cpu, pg_broadcast_ll, pg_gather_small) was never
    compared ("not run" is a FAIL, never a silent pass)."""
    o = _fixture("pinned-2gpu")
    checks = {c.name: c for c in o.checks()}
    assert all(checks[n].status == OK for n in ("pg_init_context", *OLD_WORKER))
    for name in NATIVE_BACKEND:
        assert checks[name].status == FAIL and "not run" in checks[name].detail, name
    assert not o.ok


def test_the_native_backends_primitives_pass_on_one_h200():
    """A real capture on one H200 of the worker running what exllamav3's native backend
    calls at the pinned commit: pg_all_reduce_cpu (with its CPU reducer process) in float32,
    float16 and bfloat16, pg_broadcast_ll (a 2-byte-aligned tensor included) and
    pg_gather_small (float16 values, int64 indices) equal torch.distributed's results bit
    for bit; pg_gather alone is skipped, with its reason, on one rank."""
    o = _fixture("pinned-1gpu-native")
    checks = {c.name: c for c in o.checks()}
    assert o.ok and o.world == 1
    assert checks["pg_gather"].status == SKIP
    assert {n: checks[n].status for n in checks if n != "pg_gather"} == {
        n: OK for n in checks if n != "pg_gather"}  # fmt: skip
    counts = {op: sum(1 for c in o.cases if c.op == op) for op in NATIVE_BACKEND}
    assert counts == {"pg_all_reduce_cpu": 12, "pg_broadcast_ll": 4, "pg_gather_small": 6}
    assert all(c.exact for c in o.cases if c.op in NATIVE_BACKEND)


def test_without_pr_234_only_gathers_to_the_last_rank_fail():
    o = _fixture("without-pr234-2gpu")
    checks = {c.name: c for c in o.checks()}
    assert checks["pg_gather"].status == FAIL and "9 of 18 cases" in checks["pg_gather"].detail
    assert all(checks[n].status == OK for n in ("pg_barrier", "pg_all_reduce", "pg_broadcast"))
    failing = [c.case for c in o.cases if not c.match]
    assert len(failing) == 9 and all(c.endswith("to rank 1") for c in failing)


def test_ab_table_marks_exactly_the_cases_the_pr_changes():
    rows = table({"pinned": _fixture("pinned-2gpu"), "without": _fixture("without-pr234-2gpu")})
    assert rows[0] == "| primitive | case | pinned | without |"
    differs = [r for r in rows[2:] if "DIFFERS" in r]
    assert len(rows) == 2 + 30 and len(differs) == 9
    assert all("| = torch.distributed | DIFFERS" in r for r in differs)


def test_one_gpu_skips_gather_with_the_reason():
    checks = {c.name: c for c in _fixture("pinned-1gpu").checks()}
    assert checks["pg_gather"].status == SKIP and "num_ranks <= 1" in checks["pg_gather"].detail


def _payload(rank: int, **cases) -> dict:
    return {
        "rank": rank,
        "world": 2,
        "device": "GPU",
        "init": {"sync_timeout": 0, "barrier_epoch": 1},
        "cases": [
            {"op": op, "case": "c", "bytes": 4, "rank": rank, **v} for op, v in cases.items()
        ],
        "aborted": None,
    }


def test_a_case_fails_when_any_rank_saw_a_difference():
    wrong = {"match": False, "wrong": 256, "elements": 512, "unwritten": 256,
             "by_source": [{"rank": 0, "columns": [0, 256], "wrong": 0},
                           {"rank": 1, "columns": [256, 512], "wrong": 256, "unwritten": 256}]}  # fmt: skip
    results = (
        RankResult(0, 0, 0, _payload(0, pg_gather={"match": True}), ""),
        RankResult(1, 1, 0, _payload(1, pg_gather=wrong), ""),
    )
    o = tp_outcome_of(results)
    (case,) = o.cases
    assert not case.match
    assert case.detail == (
        "rank 1: 256 of 512 elements differ, 256 never written; "
        "rank 1's columns 256-512: 256 wrong (256 never written)"
    )


def test_a_crashed_rank_and_a_bad_context_fail():
    p0 = _payload(0, pg_all_reduce={"match": True})
    p0["init"] = {"sync_timeout": 1, "barrier_epoch": 1}
    o = tp_outcome_of((RankResult(0, 0, 0, p0, ""), RankResult(1, 1, None, None, "")))
    checks = {c.name: c for c in o.checks()}
    assert checks["pg_init_context"].status == FAIL
    assert checks["ranks"].status == FAIL and "rank 1: stopped" in checks["ranks"].detail
    assert checks["pg_gather"].status == FAIL  # not run because a rank died, not skipped


def test_a_worker_error_is_reported_with_its_last_line():
    p1 = _payload(1)
    p1["error"] = "Traceback ...\nRuntimeError: Synchronization timeout"
    o = tp_outcome_of((RankResult(0, 0, 0, _payload(0), ""), RankResult(1, 1, 0, p1, "")))
    assert o.failures == ("rank 1: RuntimeError: Synchronization timeout",)


# --------------------------------------------------------------------------- the wheel


def _wheel(tmp_path: Path, members: dict[str, bytes], name: str = "exllamav3-0.0.43.whl") -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
    return path


SO = "exllamav3_ext.cpython-312-x86_64-linux-gnu.so"


def test_only_the_extension_module_is_unpacked(tmp_path):
    wheel = _wheel(
        tmp_path,
        {
            SO: b"\x7fELF module",
            "exllamav3/__init__.py": b"import flash_attn\n",
            "exllamav3-0.0.43.dist-info/RECORD": b"",
        },
    )
    got = extract_extension(wheel, tmp_path / "x")
    assert got == tmp_path / "x" / SO and got.read_bytes() == b"\x7fELF module"
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == [SO]


def test_a_wheel_without_the_extension_says_which_wheel_to_pass(tmp_path):
    wheel = _wheel(tmp_path, {"other_ext.cpython-312-x86_64-linux-gnu.so": b"x"})
    with pytest.raises(PinwheelError, match="found: other_ext") as err:
        extract_extension(wheel, tmp_path / "x")
    assert "pinwheel kernels --name exllamav3" in (err.value.next or "")
    assert not (tmp_path / "x").exists()


def test_a_wheel_escaping_its_directory_is_refused(tmp_path):
    wheel = _wheel(tmp_path, {SO: b"x", "../evil.so": b"x"})
    with pytest.raises(PinwheelError, match="unsafe wheel"):
        extract_extension(wheel, tmp_path / "x" / "y")
    assert not (tmp_path / "x" / "evil.so").exists()


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        ([], 2, "no wheel to check"),
        (["--wheel", "W", "--devices", "a,b"], 2, "not a list of GPU indices"),
        (["--wheel", "W", "--devices", "0"], 1, "not a readable wheel"),
    ],
)
def test_qualify_tp_errors_name_the_fix(tmp_path, capsys, monkeypatch, argv, code, says):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "W").write_text("not a zip")
    monkeypatch.chdir(tmp_path)
    assert main(["qualify", "tp", *argv, "--out", str(tmp_path / "out")]) == code
    err = capsys.readouterr().err
    assert says in err and "next:" in err

"""Hostile answers from the GPU side and from servers, and gates that must not pass on nothing.

What the engine's Python prints to preflight's probes, what nvidia-smi prints, what
the all-reduce and tp workers print, what a server's /metrics, streams and
prompt_logprobs hold: each is read through the typed, bounded reader
(:mod:`pinwheel.untrusted`), so a malformed answer is a failed check or a
PinwheelError with what/where/next, never a traceback. Gates: a NaN or infinite
bandwidth, zero tp cases, a gather that was never run, a reply with no choices:
each fails (or counts as failed) with the reason. Real parts: stand-in executables
for the engine's Python and nvidia-smi (no GPU here; their output is what the real
ones print, malformed), the real probe and rank machinery, a real HTTP server.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile_server import Server, answer
from pinwheel import documents, untrusted, validate
from pinwheel.cli import main
from pinwheel.errors import PinwheelError
from pinwheel.serve import stats, tpcheck
from pinwheel.serve.allreduce import AllReduceRequest, measure, outcome_of
from pinwheel.serve.client import Client, Stream, metric_total, parse_prometheus
from pinwheel.serve.preflight import (
    FAIL,
    OK,
    SKIP,
    allreduce_check,
    device_indices,
    parse_gpu_csv,
    parse_topo,
    preflight,
    run_selftest,
)
from pinwheel.serve.ranks import RankResult
from test_preflight import TOPO, _by_name, _opts

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _printer(tmp_path: Path, name: str, text: str) -> Path:
    """An executable standing in for an interpreter: whatever it is asked, it prints
    ``text`` (the probe or worker answer under test) and exits 0."""
    (tmp_path / f"{name}.out").write_text(text)
    exe = tmp_path / name
    exe.write_text(f"#!/bin/sh\ncat {tmp_path / f'{name}.out'}\n")
    exe.chmod(0o755)
    return exe


# --------------------------------------------------------------------------- nvidia-smi

GOOD_ROW = "0, NVIDIA H200, 9.0, 143771, 00000000:19:00.0"
# case -> the --query-gpu answer
BAD_SMI = {
    "superscript index": GOOD_ROW.replace("0,", "²,", 1),
    "Arabic-Indic index": GOOD_ROW.replace("0,", "٣,", 1),
    "missing field": "0, NVIDIA H200, 9.0, 143771",
    "extra field": GOOD_ROW + ", x",
    "negative index": GOOD_ROW.replace("0,", "-1,", 1),
    "index of 5 digits": GOOD_ROW.replace("0,", "12345,", 1),
    "an error line": "NVIDIA-SMI has failed because it couldn't communicate with the driver",
}


@pytest.mark.parametrize("case", sorted(BAD_SMI))
def test_a_malformed_nvidia_smi_line_fails_the_gpu_check_not_preflight(case, tmp_path):
    checks = _by_name(preflight(_opts(tmp_path, csv=BAD_SMI[case] + "\n")))
    gpus = [c for n, c in checks.items() if n.startswith("gpu")]
    assert any(c.status == FAIL and "nvidia-smi" in c.detail for c in gpus), checks


@pytest.mark.parametrize("case", sorted(BAD_SMI))
def test_parse_gpu_csv_refuses_each_malformed_line_by_name(case):
    with pytest.raises(PinwheelError) as err:
        parse_gpu_csv(BAD_SMI[case])
    assert "nvidia-smi" in str(err.value) and err.value.next


def test_topology_labels_take_ascii_digits_only():
    text = (TOPO / "dgx1-v100.txt").read_text().replace("GPU0", "GPU٠")
    topo = parse_topo(text)
    assert 0 not in topo.gpus and all(isinstance(g, int) for g in topo.gpus)


@FUZZ
@given(line=st.text(max_size=80))
def test_fuzz_parse_gpu_csv_reads_or_refuses(line):
    try:
        gpus = parse_gpu_csv(line)
    except PinwheelError as exc:
        assert exc.next
        return
    for g in gpus:
        assert 0 <= g.index <= 9999


# --------------------------------------------------------------------------- the engine probe

# case -> what the engine's Python prints to the probe
BAD_PROBE = {
    "not JSON": "Segmentation fault\n",
    "python a string": '{"python": "3.12", "path": null, "version": null}\n',
    "python too short": '{"python": [3], "path": null, "version": null}\n',
    "python of strings": '{"python": ["3", "12"], "path": null}\n',
    "path a number": '{"python": [3, 12, 1], "path": 5}\n',
    "a list": "[3, 12]\n",
    "NaN": '{"python": [3, NaN]}\n',
    "nested 100 deep": "[" * 100 + "]" * 100 + "\n",
    "nothing": "\n",
}


@pytest.mark.parametrize("case", sorted(BAD_PROBE))
def test_a_malformed_engine_probe_answer_fails_the_python_check(case, tmp_path):
    python = _printer(tmp_path, "python", BAD_PROBE[case])
    checks = _by_name(preflight(_opts(tmp_path, python=python)))
    assert checks["python"].status == FAIL, checks["python"]
    assert "malformed" in checks["python"].detail and checks["python"].next
    assert checks["engine"].status == FAIL


def test_preflight_json_stays_one_document_on_a_malformed_probe(tmp_path, capsys):
    python = _printer(tmp_path, "python", BAD_PROBE["python a string"])
    smi = tmp_path / "smi"
    smi.write_text(f"#!/bin/sh\necho '{BAD_SMI['superscript index']}'\n")
    smi.chmod(0o755)
    from test_preflight import ROOT

    rc = main(["preflight", "--manifest", str(ROOT / "manifest.toml"), "--nvidia-smi", str(smi),
               "--python", str(python), "--json"])  # fmt: skip
    out = capsys.readouterr()
    assert rc == 1 and "Traceback" not in out.err
    doc = json.loads(out.out)
    assert "malformed" in json.dumps(doc)


# --------------------------------------------------------------------------- the self-test

GOOD_SELFTEST: dict[str, Any] = {
    "via": "torch",
    "devices": 2,
    "pairs": [
        {"src": 0, "dst": 1, "peer": True, "ok": True},
        {"src": 1, "dst": 0, "peer": True, "ok": True},
    ],
    "gemm": [
        {"device": 0, "err": 1e-4, "err_kind": "max rel err", "ok": True, "jit": None},
        {"device": 1, "err": 1e-4, "err_kind": "max rel err", "ok": True, "jit": None},
    ],
}


def _edit(**change: Any) -> str:
    doc = json.loads(json.dumps(GOOD_SELFTEST))
    for key, value in change.items():
        doc[key] = value
    return json.dumps(doc)


# case -> the self-test's last line
BAD_SELFTEST = {
    "no devices": json.dumps({k: v for k, v in GOOD_SELFTEST.items() if k != "devices"}),
    "devices a string": _edit(devices="2"),
    "pairs a string": _edit(pairs="all ok"),
    "pair past the GPUs": _edit(pairs=[{"src": 0, "dst": 7, "ok": True}]),
    "pair without ok": _edit(pairs=[{"src": 0, "dst": 1}]),
    "gemm err NaN": _edit(gemm=[{"device": 0, "err": "nan", "ok": True}]),
    "gemm err Infinity": json.dumps(GOOD_SELFTEST).replace('"err": 0.0001', '"err": Infinity', 1),
    "gemm err huge": json.dumps(GOOD_SELFTEST).replace('"err": 0.0001', '"err": 1e999', 1),
    "not JSON": "Traceback (most recent call last):",
}


@pytest.mark.parametrize("case", sorted(BAD_SELFTEST))
def test_a_malformed_selftest_answer_is_a_failed_check(case, tmp_path):
    python = _printer(tmp_path, "selftest", BAD_SELFTEST[case] + "\n")
    (p2p, *rest) = run_selftest(_opts(tmp_path, python=python))
    assert p2p.status == FAIL and "malformed answer" in p2p.detail and p2p.next, p2p
    assert rest == []


def test_selftest_with_fewer_pairs_than_the_gpus_is_no_pass(tmp_path):
    python = _printer(tmp_path, "selftest", _edit(pairs=GOOD_SELFTEST["pairs"][:1]) + "\n")
    p2p, _ = run_selftest(_opts(tmp_path, python=python))
    assert p2p.status == FAIL and "2 expected" in p2p.detail


def test_a_good_selftest_passes(tmp_path):
    python = _printer(tmp_path, "selftest", json.dumps(GOOD_SELFTEST) + "\n")
    p2p, gemm = run_selftest(_opts(tmp_path, python=python))
    assert p2p.status == OK and gemm.status == OK


@FUZZ
@given(doc=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                        | st.text(max_size=5),
                        lambda c: st.lists(c, max_size=3) | st.dictionaries(
                            st.sampled_from(["devices", "pairs", "gemm", "src", "dst", "ok",
                                             "err", "device", "via"]), c, max_size=4),
                        max_leaves=12))  # fmt: skip
def test_fuzz_selftest_answer_decodes_or_is_the_kinds_error(doc):
    try:
        ans = untrusted.answer_line(json.dumps(doc), documents.SelftestAnswer, untrusted.WORKER,
                                    "t")  # fmt: skip
    except PinwheelError as exc:
        assert exc.next
        return
    assert isinstance(ans.devices, int) and all(0 <= g.device < ans.devices for g in ans.gemm)


# --------------------------------------------------------------------------- the all-reduce

RANK_SCRIPT = """#!/bin/sh
# stands in for the engine's Python running serve/workers/allreduce.py: rank $RANK's line
cat {dir}/rank$RANK.json
"""


def _rank_line(rank: int, **change: Any) -> dict[str, Any]:
    line = {"rank": rank, "world": 2, "backend": "gloo", "device": "cpu", "nccl": None,
            "bytes": 1 << 20, "sum_ok": True, "wrong": 0, "first_wrong": None, "iters": 3,
            "seconds": 0.001, "algbw_gbps": 1.0, "busbw_gbps": 1.0,
            "env": {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1", "CUDA_VISIBLE_DEVICES": None}}  # fmt: skip
    line.update(change)
    return line


def _measure(tmp_path: Path, lines: list[str]) -> Any:
    for rank, text in enumerate(lines):
        (tmp_path / f"rank{rank}.json").write_text(text + "\n")
    py = tmp_path / "ranks-python"
    py.write_text(RANK_SCRIPT.format(dir=tmp_path))
    py.chmod(0o755)
    return measure(AllReduceRequest(python=str(py), devices=(), nbytes=1 << 20, timeout_s=60))


# case -> rank 1's line (rank 0's is good)
BAD_RANK = {
    "bytes a string": json.dumps(_rank_line(1, bytes="1M")),
    "env a list": json.dumps(_rank_line(1, env=["NCCL_NVLS_ENABLE=0"])),
    "first_wrong a number": json.dumps(_rank_line(1, sum_ok=False, first_wrong=3)),
    "busbw negative": json.dumps(_rank_line(1, busbw_gbps=-1.0)),
    "busbw NaN": json.dumps(_rank_line(1)).replace('"busbw_gbps": 1.0', '"busbw_gbps": NaN'),
    "rank missing": json.dumps({k: v for k, v in _rank_line(1).items() if k != "rank"}),
    "sum_ok a string": json.dumps(_rank_line(1, sum_ok="yes")),
}


@pytest.mark.parametrize("case", sorted(BAD_RANK))
def test_a_malformed_rank_line_is_that_ranks_failure(case, tmp_path):
    outcome = _measure(tmp_path, [json.dumps(_rank_line(0)), BAD_RANK[case]])
    check = allreduce_check(outcome, "two", 1.0)
    assert check.status == FAIL and "rank 1" in check.detail, check


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, None])
def test_a_bandwidth_that_is_not_a_finite_number_fails_the_gate(value, tmp_path):
    good = _measure(tmp_path, [json.dumps(_rank_line(0)), json.dumps(_rank_line(1))])
    assert allreduce_check(good, "two", 0.5).status == OK
    import dataclasses

    bad = dataclasses.replace(good, busbw_gbps=value)
    check = allreduce_check(bad, "two", 0.5)
    assert check.status == FAIL and "min_allreduce_gbps" in check.detail, check


def test_outcome_of_a_rank_with_a_wrong_shape_never_raises():
    results = (
        RankResult(0, None, 0, _rank_line(0), ""),
        RankResult(1, None, 0, {"rank": 1, "sum_ok": True, "env": "x"}, ""),
    )
    o = outcome_of(results, 1 << 20, "gloo")
    assert not o.sum_ok and any("malformed" in f for f in o.failures)


# --------------------------------------------------------------------------- --devices

BAD_DEVICES = ["-1", "1_0", "٣", "0,0", "0,", ",0", " 0", "0 ,1", "+1", "0x1", "", "1,2,1"]


@pytest.mark.parametrize("text", BAD_DEVICES)
def test_devices_take_unique_ascii_indices_only(text, tmp_path):
    from pinwheel.manifest import model as manifest
    from test_preflight import ROOT

    profile = manifest.load(ROOT / "manifest.toml").serve.profile("card")
    if text == "":  # empty: the profile's own
        assert device_indices(profile, text) == tuple(range(profile.gpus))
        return
    with pytest.raises(PinwheelError, match="GPU indices") as err:
        device_indices(profile, text)
    assert err.value.next


@pytest.mark.parametrize("text", ["-1", "1_0", "٣", "0,0"])
def test_qualify_tp_devices_refused_before_anything_runs(text, tmp_path, capsys):
    rc = main(["qualify", "tp", "--wheel", str(tmp_path / "x.whl"), "--devices", text,
               "--out", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "--devices" in err and "next:" in err, err
    assert not (tmp_path / "out").exists()


@FUZZ
@given(text=st.text(alphabet="0123456789,_-+ ٣²x", max_size=12))
def test_fuzz_gpu_indices(text):
    try:
        got = validate.gpu_indices(text)
    except ValueError:
        return
    assert len(set(got)) == len(got) and all(0 <= i <= 9999 for i in got)
    assert set(text) <= set("0123456789,") and [int(p) for p in text.split(",")] == list(got)


# --------------------------------------------------------------------------- qualify tp


def _tp_result(rank: int, payload: Any) -> RankResult:
    return RankResult(rank, rank, 0, payload, "")


def _case(op: str, case: str, rank: int, **kw: Any) -> dict[str, Any]:
    return {"op": op, "case": case, "rank": rank, "bytes": 16, "match": True, "exact": True} | kw


ALL_OPS = list(tpcheck.PRIMITIVES[1:])  # pg_init_context is the context, not a case
BUT_GATHER = [op for op in ALL_OPS if op != "pg_gather"]
INIT = {"sync_timeout": 0, "barrier_epoch": 1}


def _payload(rank: int, ops=ALL_OPS, **case_kw: Any) -> dict[str, Any]:
    return {"rank": rank, "device": "H200", "init": INIT if rank == 0 else None,
            "cases": [_case(op, "c", rank, **case_kw) for op in ops]}  # fmt: skip


# case -> rank 1's report (rank 0's is good)
BAD_TP = {
    "cases a dict": {"rank": 1, "cases": {"op": "pg_barrier"}},
    "case without op": {"rank": 1, "cases": [{"case": "c", "match": True}]},
    "match a string": {"rank": 1, "cases": [_case("pg_barrier", "c", 1, match="yes")]},
    "bytes a string": {"rank": 1, "cases": [_case("pg_barrier", "c", 1, bytes="16")]},
    "by_source columns of 3": {
        "rank": 1,
        "cases": [
            _case(
                "pg_gather",
                "c",
                1,
                match=False,
                by_source=[{"rank": 0, "columns": [0, 1, 2], "wrong": 1}],
            )
        ],
    },  # fmt: skip
    "init a list": {"rank": 1, "init": [0, 1], "cases": []},
    "a list": [1, 2, 3],
}


@pytest.mark.parametrize("case", sorted(BAD_TP))
def test_tp_worker_report_of_the_wrong_shape_is_a_rank_failure(case):
    results = (_tp_result(0, _payload(0)), _tp_result(1, BAD_TP[case]))
    if not isinstance(BAD_TP[case], dict):
        results = (_tp_result(0, _payload(0)), RankResult(1, 1, 0, None, "[1, 2, 3]"))
    outcome = tpcheck.outcome_of(results)
    assert not outcome.ok
    assert any(c.status == FAIL for c in outcome.checks())


def test_tp_with_zero_cases_compared_fails():
    results = (_tp_result(0, _payload(0, ops=[])), _tp_result(1, _payload(1, ops=[])))
    outcome = tpcheck.outcome_of(results)
    checks = {c.name: c for c in outcome.checks()}
    assert not outcome.ok
    for op in ALL_OPS:
        assert checks[op].status == FAIL and "no case compared" in checks[op].detail


def test_tp_on_two_ranks_without_gather_fails_and_one_rank_may_skip_it():
    two = tpcheck.outcome_of(
        (_tp_result(0, _payload(0, ops=BUT_GATHER)), _tp_result(1, _payload(1, ops=BUT_GATHER)))
    )
    assert not two.ok and {c.name: c for c in two.checks()}["pg_gather"].status == FAIL
    one_payload = _payload(0, ops=BUT_GATHER) | {"gather_skipped": "one rank: not defined"}
    one = tpcheck.outcome_of((_tp_result(0, one_payload),))
    assert one.ok and {c.name: c for c in one.checks()}["pg_gather"].status == SKIP


def test_tp_says_bit_for_bit_only_when_every_rank_was_exact():
    exact = tpcheck.outcome_of((_tp_result(0, _payload(0)), _tp_result(1, _payload(1))))
    assert exact.ok
    assert "bit for bit" in {c.name: c for c in exact.checks()}["pg_all_reduce"].detail
    within = _payload(1)
    within["cases"][1] |= {"exact": False, "tolerance": {"rule": "x", "max_ratio": 0.3}}
    loose = tpcheck.outcome_of((_tp_result(0, _payload(0)), _tp_result(1, within)))
    detail = {c.name: c for c in loose.checks()}["pg_all_reduce"].detail
    assert loose.ok and "0 bit for bit, 1 within the bound" in detail, detail


# --------------------------------------------------------------------------- the bound, measured


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_the_order_aware_bound_holds_where_rtol_1e_6_did_not(world):
    """float32 sums of ``world`` ranks' tensors in two orders (rank order, and the ring
    order NCCL uses for another chunk): never further apart than 2 gamma(world-1) sum|x|
    (serve/workers/pg_primitives.py's sum_bound); the old isclose(rtol=1e-6, atol=0)
    fails some of them from 3 ranks on. numpy float32 adds as the GPUs do (IEEE)."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(world)
    parts = [rng.standard_normal(300_000).astype(np.float32) for _ in range(world)]
    one = np.zeros_like(parts[0])
    for p in parts:
        one = one + p
    other = np.zeros_like(parts[0])
    for p in parts[1:] + parts[:1]:
        other = other + p
    u = 2.0**-24
    k = world - 1
    bound = 2 * (k * u / (1 - k * u)) * np.sum([np.abs(p.astype(np.float64)) for p in parts], 0)
    delta = np.abs(one.astype(np.float64) - other.astype(np.float64))
    assert (delta <= bound).all()
    old_fails = int((~np.isclose(one, other, rtol=1e-6, atol=0.0)).sum())
    if world == 2:
        assert (one == other).all()  # one addition: commutative, bit for bit
    else:
        assert old_fails > 0, "the old rule would have passed: the case shows nothing"


# --------------------------------------------------------------------------- streams and statistics


def _stream(choices: int, started: float = 0.0) -> Stream:
    times = tuple(started + 0.1 * (i + 1) for i in range(choices))
    return Stream(started, times[0] if times else started, times[-1] if times else started,
                  choices, "x" * choices, choices, 5, "stop" if choices else None,
                  times, times)  # fmt: skip


def test_a_reply_with_no_choices_is_a_failed_request_not_a_fast_one():
    from pinwheel.manifest.serve import Slo

    ok = [_stream(4, 0.0), _stream(4, 1.0)]
    slo = Slo(ttft_ms=150.0, tpot_ms=None, e2el_ms=None)
    before = stats.serving_stats(ok, 10.0, slo)
    after = stats.serving_stats([*ok, _stream(0, 2.0)], 10.0, slo)
    assert after["failed"] == 1 and after["completed"] == 2 and before["failed"] == 0
    for key in ("mean_ttft_ms", "mean_e2el_ms", "request_goodput", "request_throughput"):
        assert after[key] == before[key], key
    assert after["good_requests"] == 2 and len(after["ttfts"]) == 2


@FUZZ
@given(sizes=st.lists(st.integers(0, 5), max_size=10))
def test_fuzz_completed_and_failed_add_up(sizes):
    out = stats.serving_stats([_stream(n, float(i)) for i, n in enumerate(sizes)], 20.0)
    assert out["completed"] + out["failed"] == len(sizes)
    assert out["failed"] == sizes.count(0)
    assert all(t > 0 for t in out["ttfts"])


def test_a_server_error_before_the_first_token_is_a_failed_stream(tmp_path):
    body = b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n'
    with Server({"/v1/chat/completions": answer(body, ctype="text/event-stream")}) as srv:
        client = Client(srv.url)
        try:
            s = client.stream_chat("m", "hi", 4)
        finally:
            client.close()
    assert not stats.succeeded(s)
    assert stats.serving_stats([s], 1.0)["failed"] == 1


# --------------------------------------------------------------------------- /metrics


@pytest.mark.parametrize("value", ["+Inf", "-Inf", "Inf"])
def test_an_infinite_counter_is_the_servers_error_not_int_inf(value):
    samples = parse_prometheus(f"vllm:num_spec_tokens_total {value}\nvllm:other 1\n")
    with pytest.raises(untrusted.ServerAnswerError, match="not a finite count") as err:
        metric_total(samples, "vllm:num_spec_tokens_total")
    assert err.value.next
    assert metric_total(samples, "vllm:other") == 1.0  # the rest still reads


@FUZZ
@given(text=st.text(max_size=200))
def test_fuzz_metrics_parse_or_refuse(text):
    try:
        samples = untrusted.parse_metrics(text.encode(), "/metrics")
    except PinwheelError:
        return
    for key in samples:
        try:
            total = metric_total(samples, key.split("{")[0])
        except untrusted.ServerAnswerError:
            continue
        assert total is None or math.isfinite(total)


# --------------------------------------------------------------------------- the teacher from a server


def _logprobs_server(entries: list[dict[str, Any] | None]):
    doc = {"choices": [{"text": "", "prompt_logprobs": entries}]}
    return Server({"/v1/completions": answer(json.dumps(doc).encode())})


def _entry(ids_lps: dict[int, float]) -> dict[str, Any]:
    return {str(k): {"logprob": v, "rank": 1} for k, v in ids_lps.items()}


# case -> (prompt_logprobs of a 3-token window [5, 6, 7], top_k, what the error says)
BAD_TEACHER = {
    "target token missing": ([None, _entry({1: -0.1, 2: -2.5}), _entry({7: -0.1, 1: -3.0})],
                             2, "lacks the prompt token 6"),
    "id beyond int32": ([None, _entry({6: -0.1, 2**31: -2.5}), _entry({7: -0.1, 1: -3.0})],
                        2, "outside 0..2^31-1"),
    "full row missing ids": ([None, _entry({0: -1.0, 6: -0.5}), _entry({0: -1.0, 1: -2.0, 7: -0.1})],
                             -1, "a full row has every id"),
    "full row id past the vocabulary": ([None, _entry({0: -1.0, 1: -1.0, 6: -0.5}),
                                         _entry({0: -1.0, 1: -2.0, 7: -0.1})],
                                        -1, "a full row has every id"),
    "fewer than top_k": ([None, _entry({6: -0.1}), _entry({7: -0.1, 1: -3.0})],
                         2, "1 entries, top_k = 2"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_TEACHER))
def test_teacher_capture_refuses_a_row_that_is_not_whole(case):
    pytest.importorskip("numpy")
    from pinwheel.serve.fidelity import Panel, capture_from_server

    entries, top_k, gist = BAD_TEACHER[case]
    panel = Panel(((5, 6, 7),), "a" * 64, "panel.json")
    with _logprobs_server(entries) as srv, pytest.raises(PinwheelError) as err:
        client = Client(srv.url)
        try:
            capture_from_server(client, "m", panel, top_k)
        finally:
            client.close()
    assert gist in err.value.what and err.value.next, err.value.what


def test_teacher_capture_of_whole_rows_still_works():
    np = pytest.importorskip("numpy")
    from pinwheel.serve.fidelity import Panel, capture_from_server, load_teacher

    full = [None, _entry({0: -1.0, 1: -2.0, 2: -0.5, 3: -3.0}),
            _entry({0: -1.0, 1: -2.0, 2: -0.5, 3: -0.1})]  # fmt: skip
    panel = Panel(((1, 2, 3),), "a" * 64, "panel.json")
    with _logprobs_server(full) as srv:
        client = Client(srv.url)
        try:
            data = capture_from_server(client, "m", panel, -1)
        finally:
            client.close()
    teacher = load_teacher(data, "t")
    assert teacher.full is not None and np.isfinite(teacher.full).all()
    assert teacher.full.shape == (2, 4)


@pytest.mark.parametrize("token", [2**31, 2**40])
def test_a_panel_token_id_of_2_31_or_more_is_refused(token, tmp_path):
    pytest.importorskip("numpy")
    from pinwheel.errors import UsageError
    from pinwheel.serve.fidelity import read_panel

    path = tmp_path / "panel.json"
    path.write_text(json.dumps({"schema": "pinwheel.panel/1", "windows": [[1, token]]}))
    with pytest.raises(UsageError, match="2\\^31") as err:
        read_panel(path, None)
    assert err.value.next


# --------------------------------------------------------------------------- fuzz: the other readers

_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3)
    | st.dictionaries(
        st.sampled_from(["python", "path", "version", "rank", "sum_ok", "bytes", "busbw_gbps",
                         "env", "first_wrong", "cases", "op", "case", "match", "exact", "init",
                         "by_source", "columns", "wrong", "error", "aborted"]),
        c, max_size=5),
    max_leaves=15,
)  # fmt: skip


@FUZZ
@given(doc=_JSONISH)
def test_fuzz_engine_probe_decodes_or_is_the_kinds_error(doc):
    try:
        probe = untrusted.answer_line(json.dumps(doc), documents.EngineProbe, untrusted.WORKER, "t")
    except PinwheelError as exc:
        assert exc.next
        return
    assert len(probe.python) >= 2 and all(0 <= v < 1000 for v in probe.python)


@FUZZ
@given(docs=st.lists(_JSONISH, min_size=1, max_size=3))
def test_fuzz_allreduce_outcome_of_any_rank_lines_never_raises(docs):
    results = tuple(RankResult(i, None, 0, d if isinstance(d, dict) else None, "")
                    for i, d in enumerate(docs))  # fmt: skip
    o = outcome_of(results, 1 << 20, "gloo")
    check = allreduce_check(o, "p", 1.0)
    if check.status == OK:  # a pass only on finite figures from every rank
        assert o.busbw_gbps is not None and math.isfinite(o.busbw_gbps) and o.busbw_gbps >= 1.0


@FUZZ
@given(docs=st.lists(_JSONISH, min_size=1, max_size=3))
def test_fuzz_tp_outcome_of_any_reports_never_raises_and_never_passes_on_nothing(docs):
    results = tuple(RankResult(i, i, 0, d if isinstance(d, dict) else None, "")
                    for i, d in enumerate(docs))  # fmt: skip
    o = tpcheck.outcome_of(results)
    if o.ok:
        ops = {c.op for c in o.cases}
        assert {"pg_barrier", "pg_all_reduce", "pg_broadcast"} <= ops


@FUZZ
@given(
    rows=st.lists(
        st.dictionaries(st.integers(-2, 2**31 + 2), st.floats(max_value=0.0), min_size=0,
                        max_size=5),
        min_size=1, max_size=3),
    top_k=st.sampled_from([-1, 1, 2, 4]),
)  # fmt: skip
def test_fuzz_teacher_rows_are_whole_or_refused(rows, top_k):
    np = pytest.importorskip("numpy")
    from pinwheel.serve.fidelity import _check_rows

    parsed = [(np.array(list(r), np.int64), np.array(list(r.values()), np.float64), 0)
              for r in rows]  # fmt: skip
    targets = [min(r) if r else 0 for r in rows]

    class _C:
        url = "http://teacher"

    try:
        _check_rows(_C(), parsed, targets, top_k)
    except PinwheelError as exc:
        assert exc.next
        return
    for (ids, lps, _), t in zip(parsed, targets, strict=True):
        assert (ids == t).any() and ids.min() >= 0 and ids.max() < 2**31
        assert np.isfinite(lps).all() and (len(ids) >= top_k if top_k > 0 else True)
        if top_k == -1:
            assert sorted(ids.tolist()) == list(range(len(parsed[0][0])))


def test_scoring_refuses_a_served_token_id_beyond_the_teachers_vocabulary():
    np = pytest.importorskip("numpy")
    from pinwheel.errors import VerifyError
    from pinwheel.serve.fidelity import Teacher, score_positions

    full = np.log(np.full((1, 4), 0.25, np.float32))
    teacher = Teacher(meta={}, offsets=np.array([0, 1]), target=np.array([2], np.int32),
                      target_logprob=np.array([-1.386], np.float32), top_ids=None,
                      top_logprobs=None, full=full, sha256="a" * 64, source="teacher.npz")  # fmt: skip
    student = [(np.array([0, 1, 2, 9], np.int64), np.log(np.full(4, 0.25)), 0)]
    with pytest.raises(VerifyError, match="beyond the teacher's 4-token vocabulary") as err:
        score_positions(teacher, student)
    assert err.value.next

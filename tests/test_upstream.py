"""Acceptance on the real 1Cat-vLLM upstream (recipes/examples/1cat-*.toml).

Needs a local mirror of https://github.com/1CatAI/1Cat-vLLM.git (bare, with
refs/pull/N/head and refs/pull/N/merge), named through PINWHEEL_MIRRORS
(``URL=PATH``); without it every test here skips. The mirror is only read: the
engine attaches it as an alternate of its own cache, and the oracles below run
read-only git commands on it.

Oracles, all independent of pinwheel: the git CLI (cherry-pick and merge in a
sparse clone, bench/gitcli.py), GitHub's own test merges (refs/pull/N/merge),
and ``git rev-list`` for the merge hazard.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel.cli import parse_mirrors
from pinwheel.manifest import load
from pinwheel.source.cache import resolve_source
from pinwheel.source.replay import replay_manifest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "recipes" / "examples"
UPSTREAM_URL = "https://github.com/1CatAI/1Cat-vLLM.git"

sys.path.insert(0, str(ROOT / "bench"))
from gitcli import CliConflict, absent_paths, replay_with_git_cli, sealed_env  # noqa: E402

pytestmark = pytest.mark.upstream


def _mirror_path() -> Path | None:
    try:
        mirrors = parse_mirrors([], os.environ.get("PINWHEEL_MIRRORS"))
        source = resolve_source(UPSTREAM_URL, mirrors)
    except Exception:  # noqa: BLE001 - a bad mapping is a skip reason here, not a failure
        return None
    return Path(source.location) if source.local else None


MIRROR = _mirror_path()
needs_mirror = pytest.mark.skipif(
    MIRROR is None,
    reason=f"PINWHEEL_MIRRORS does not map {UPSTREAM_URL} to a local mirror "
    f"(set PINWHEEL_MIRRORS='{UPSTREAM_URL}=/path/to/1Cat-vLLM.git', a bare "
    "clone with refs/pull/*)",
)


def mirror_git(*args: str) -> str:
    """Read-only git on the mirror (it may have no config file; nothing is written)."""
    assert MIRROR is not None
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    proc = subprocess.run(
        ["git", "--git-dir", str(MIRROR), *args], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout.strip()


def pinwheel(
    manifest: Path, command: str, cache: Path, env: dict[str, str] | None = None
) -> tuple[int, dict, str]:
    """``pinwheel --json COMMAND`` in a subprocess: (exit code, JSON on stdout, stderr)."""
    argv = [
        sys.executable,
        "-m",
        "pinwheel",
        "--manifest",
        str(manifest),
        "--cache",
        str(cache),
        "--mirror",
        f"{UPSTREAM_URL}={MIRROR}",
        "--json",
        command,
    ]
    base_env = {k: v for k, v in os.environ.items() if k != "PINWHEEL_MIRRORS"}
    proc = subprocess.run(argv, capture_output=True, text=True, env={**base_env, **(env or {})})
    payload = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, payload, proc.stderr


def _step_shas(payload: dict) -> list[tuple[int, str, str, list[str]]]:
    return [
        (s["number"], s["result"], s["tree"], [c["replayed"] for c in s["commits"]])
        for s in payload["steps"]
    ]


def _hostile_home(home: Path) -> dict[str, str]:
    """A user whose git config would change commits if the engine read it."""
    hooks = home / "hooks"
    hooks.mkdir(parents=True)
    hook = hooks / "prepare-commit-msg"
    hook.write_text("#!/bin/sh\necho 'hooked' >> \"$1\"\n")
    hook.chmod(0o755)
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Mallory\n\temail = mallory@example.org\n"
        "[commit]\n\tgpgSign = true\n\tcleanup = strip\n"
        f"[core]\n\thooksPath = {hooks}\n"
        "[i18n]\n\tcommitEncoding = ISO-8859-1\n"
    )
    return {"HOME": str(home), "TZ": "America/St_Johns", "LC_ALL": "C.UTF-8"}


# --------------------------------------------------------------------------- the stack


@needs_mirror
def test_stack_replays_identically_in_two_caches(tmp_path):
    manifest = EXAMPLES / "1cat-stack.toml"
    rc_a, a, err_a = pinwheel(manifest, "run", tmp_path / "cache-a")
    rc_b, b, err_b = pinwheel(
        manifest, "run", tmp_path / "cache-b", env=_hostile_home(tmp_path / "home")
    )
    assert rc_a == 0, err_a
    assert rc_b == 0, err_b

    assert (a["head"], a["tree"]) == (b["head"], b["tree"])
    assert _step_shas(a) == _step_shas(b)
    assert a["tree"] == load(manifest).result.tree
    assert a["tree_verified"] is True
    assert [len(s["commits"]) for s in a["steps"]] == [1, 1, 1, 1, 5, 1]

    # The tag really sits on the head in each cache.
    for cache in ("cache-a", "cache-b"):
        (repo,) = (tmp_path / cache / "repos").glob("*.git")
        tag = subprocess.run(
            ["git", "--git-dir", str(repo), "rev-parse", "refs/tags/1cat-stack-20260823"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert tag == a["head"]


@needs_mirror
def test_stack_agrees_with_git_cherry_pick_and_merge(tmp_path):
    """Per step, the same trees as the git CLI; picked commits even get the same SHAs."""
    manifest = load(EXAMPLES / "1cat-stack.toml")
    assert MIRROR is not None
    env = sealed_env(tmp_path / "home", manifest)
    cli = replay_with_git_cli(
        manifest, MIRROR, tmp_path / "cli", absent_paths(MIRROR, manifest.upstream.commit, env)
    )
    engine = replay_manifest(
        manifest, cache=tmp_path / "cache", mirrors={UPSTREAM_URL: str(MIRROR)}, write_refs=False
    )

    assert [s.tree for s in engine.steps] == [s.tree for s in cli.steps]
    for mine, theirs in zip(engine.steps, cli.steps, strict=True):
        if mine.step.action == "pick":
            assert [c.original for c in mine.commits] == list(theirs.originals)
            assert mine.head == theirs.head  # same parent, author, committer and message bytes
    assert engine.tree == cli.tree == manifest.result.tree


@needs_mirror
def test_stack_plan_lists_commits_and_no_hazard(tmp_path):
    rc, plan, err = pinwheel(EXAMPLES / "1cat-stack.toml", "plan", tmp_path / "cache")
    assert rc == 0, err
    assert [(s["action"], s["pr"], len(s["commits"])) for s in plan["steps"]] == [
        ("pick", 256, 1),
        ("pick", 258, 1),
        ("pick", 260, 1),
        ("pick", 261, 1),
        ("pick", 252, 5),
        ("merge", 236, 1),
    ]
    assert [s["hazard_count"] for s in plan["steps"]] == [0] * 6
    assert all(s["problem"] is None for s in plan["steps"])


# --------------------------------------------------------------------------- GitHub's test merges


@needs_mirror
def test_merge_oracle_example_reproduces_github_test_merge(tmp_path):
    manifest = EXAMPLES / "1cat-merge-oracle.toml"
    rc, result, err = pinwheel(manifest, "run", tmp_path / "cache")
    assert rc == 0, err
    assert result["upstream"]["base"] == mirror_git("rev-parse", "refs/pull/241/merge^1")
    assert result["steps"][0]["head"] == mirror_git("rev-parse", "refs/pull/241/merge^2")
    assert result["tree"] == mirror_git("rev-parse", "refs/pull/241/merge^{tree}")


def _open_prs() -> list[int]:
    if MIRROR is None:
        return []
    refs = mirror_git("for-each-ref", "--format=%(refname)", "refs/pull/*/merge").split()
    return sorted(int(r.split("/")[2]) for r in refs)


@needs_mirror
def test_merge_step_reproduces_every_open_pr_test_merge(tmp_path):
    """For each open PR: one merge step on the test merge's first parent gives GitHub's tree."""
    prs = _open_prs()
    assert prs, "the mirror holds no refs/pull/N/merge"
    wrong = {}
    for pr in prs:
        base, head, tree = (
            mirror_git("rev-parse", f"refs/pull/{pr}/merge{suffix}")
            for suffix in ("^1", "^2", "^{tree}")
        )
        path = tmp_path / f"pr{pr}.toml"
        path.write_text(
            f'[upstream]\nurl = "{UPSTREAM_URL}"\ncommit = "{base}"\nbranch = "main"\n\n'
            f'[[step]]\naction = "merge"\npr = {pr}\nhead = "{head}"\n\n'
            f'[result]\ntree = "{tree}"\n'
        )
        result = replay_manifest(
            load(path),
            cache=tmp_path / "cache",
            mirrors={UPSTREAM_URL: str(MIRROR)},
            check_tree=False,
            write_refs=False,
        )
        if result.tree != tree:
            wrong[pr] = (result.tree, tree)
    assert not wrong, f"merge trees differ from GitHub's (pinwheel, github): {wrong}"


# --------------------------------------------------------------------------- merge hazard


def _rev_list_hazard(base: str, head: str) -> list[str]:
    """The oracle: ``git rev-list ^BASE $(git merge-base --all main HEAD)``."""
    bases = mirror_git("merge-base", "--all", "refs/heads/main", head).split()
    return mirror_git("rev-list", f"^{base}", *bases).split()


@needs_mirror
@pytest.mark.parametrize(("pr", "imports"), [(172, 15), (182, 65)])
def test_plan_reports_mainline_imports(tmp_path, pr, imports):
    manifest = EXAMPLES / f"1cat-hazard-pr{pr}.toml"
    rc, plan, err = pinwheel(manifest, "plan", tmp_path / "cache")
    assert rc == 0, err
    (step,) = plan["steps"]
    expected = _rev_list_hazard(plan["base"], step["head"])
    assert step["hazard_count"] == len(expected) == imports
    assert {c["sha"] for c in step["hazard"]} == set(expected)

    rc, result, err = pinwheel(manifest, "run", tmp_path / "cache")
    assert rc == 0, err
    assert result["tree"] == load(manifest).result.tree
    # The imported mainline commits really are in the merged history.
    assert mirror_git("merge-base", "--is-ancestor", expected[0], step["head"]) == ""


@needs_mirror
def test_pick_of_pr172_is_refused_because_it_merged_main(tmp_path):
    manifest = tmp_path / "pick172.toml"
    text = (EXAMPLES / "1cat-hazard-pr172.toml").read_text()
    manifest.write_text(text.replace('action = "merge"', 'action = "pick"'))
    rc, _, err = pinwheel(manifest, "run", tmp_path / "cache")
    assert rc == 2  # the manifest asks for the impossible: an edit fixes it
    assert "PR #172 contains merge commit 7ca9f191a4aa" in err
    assert 'action = "merge"' in err


@needs_mirror
def test_pick_of_pr182_on_old_base_conflicts_like_git(tmp_path):
    """Its own commits build on the 65 mainline commits: the pick stops where git stops."""
    manifest = tmp_path / "pick182.toml"
    text = (EXAMPLES / "1cat-hazard-pr182.toml").read_text()
    manifest.write_text(text.replace('action = "merge"', 'action = "pick"'))
    rc, _, err = pinwheel(manifest, "run", tmp_path / "cache")
    assert rc == 4, err
    assert "commit 6878b1488a01 '[Kernel] Group SM70 MXFP4 prefill dispatch'" in err
    assert "csrc/sm70_turbomind/ops/awq_sm70_gemm.cu" in err
    assert "vllm/envs.py" in err
    (repo,) = (tmp_path / "cache" / "repos").glob("*.git")
    refs = subprocess.run(
        ["git", "--git-dir", str(repo), "for-each-ref", "--format=%(refname)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not [r for r in refs if r.startswith(("refs/tags/", "refs/pinwheel/stack/"))]

    assert MIRROR is not None
    m = load(manifest)
    env = sealed_env(tmp_path / "home", m)
    with pytest.raises(CliConflict, match="6878b1488a01e0033257e9dc4f509fd88c195d9a") as git_said:
        absent = absent_paths(MIRROR, m.upstream.commit, env)
        replay_with_git_cli(m, MIRROR, tmp_path / "cli", absent)
    assert "awq_sm70_gemm.cu" in str(git_said.value) and "vllm/envs.py" in str(git_said.value)


# --------------------------------------------------------------------------- the engine build


@needs_mirror
def test_build_example_plans_the_engines_own_downloads(tmp_path):
    """1cat-build.toml: the replayed tree's CMake is read for arch 7.0. What the build uses is
    pinned (or omitted on purpose); the sm90+/CPU-only sources are judged not used."""
    rc, plan, err = pinwheel(EXAMPLES / "1cat-build.toml", "plan", tmp_path / "cache")
    assert rc == 0, err
    found = plan["build_sources"]
    assert found["arches"] == ["7.0"]
    assert found["tree"] == load(EXAMPLES / "1cat-build.toml").result.tree
    rows = {s["name"]: s for s in found["sources"]}
    assert {n for n, s in rows.items() if s["used"] == "no"} == {
        "deepgemm", "flashmla", "onednn", "qutlass"
    }  # fmt: skip
    cutlass = rows["cutlass"]
    assert (cutlass["ref"], cutlass["pinned"], cutlass["used"]) == ("v4.4.2", False, "yes")
    assert cutlass["status"] == "pinned da5e086dab31"  # the moving tag, pinned by the manifest
    assert rows["vllm-flash-attn"]["submodules"] == ["csrc/cutlass"]
    assert rows["vllm-flash-attn"]["status"].startswith("pinned c2eda5e6115b")
    assert rows["triton_kernels"]["status"].startswith("omitted (")


@needs_mirror
def test_pyonly_example_changes_one_python_file_of_the_build_example(tmp_path):
    """The --reuse-from example differs from 1cat-build by vllm/logger.py alone."""
    rc_a, a, err_a = pinwheel(EXAMPLES / "1cat-build.toml", "run", tmp_path / "cache")
    rc_b, b, err_b = pinwheel(EXAMPLES / "1cat-build-pyonly.toml", "run", tmp_path / "cache")
    assert rc_a == 0 and rc_b == 0, err_a + err_b
    assert b["tree"] == load(EXAMPLES / "1cat-build-pyonly.toml").result.tree
    assert b["tree_verified"] is True
    (repo,) = (tmp_path / "cache" / "repos").glob("*.git")
    changed = subprocess.run(
        ["git", "--git-dir", str(repo), "diff-tree", "-r", "--name-only", a["tree"], b["tree"]],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert changed == ["vllm/logger.py"]

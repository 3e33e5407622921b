"""Components: an out-of-tree [[kernel]] with its own stack ([[kernel.step]]) replays, plans,
locks, drifts and resolves like the engine, on real git repositories (tests/conftest.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gitfixture import UPSTREAM_URL, manifest_text
from pinwheel.cli import main
from pinwheel.compile.kernels import BuildOptions, stage_out_of_tree
from pinwheel.errors import ManifestError
from pinwheel.manifest import load, loads
from pinwheel.manifest.component import component_manifest, stacks
from pinwheel.options import host as host_of

KERNEL_URL = "https://example.invalid/acme/kernel.git"


def component(base: str, steps: list[dict[str, object]], *, tree: str | None = None) -> str:
    lines = [
        "",
        "# the kernel component: its own upstream and stack",
        "[[kernel]]",
        'name = "kern"',
        'builder = "torch-extension"',
        f'url = "{KERNEL_URL}"',
        f'commit = "{base}"',
        'branch = "main"',
    ]
    if tree:
        lines.append(f'tree = "{tree}"')
    for step in steps:
        lines += ["", "[[kernel.step]]"]
        for key, value in step.items():
            lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value}")
    return "\n".join(lines) + "\n"


def cli(stack, manifest: Path, *args: str, capsys, cache: Path | None = None):
    argv = [
        "--manifest", str(manifest), "--cache", str(cache or stack.tmp / "cache"),
        "--mirror", stack.mirror, "--mirror", f"{KERNEL_URL}={stack.up.bare}", "--json", *args,
    ]  # fmt: skip
    rc = main(argv)
    out = capsys.readouterr().out
    try:
        return rc, json.loads(out)
    except json.JSONDecodeError:
        return rc, out


def write(stack, engine_steps, kernel_steps, *, base: str | None = None, **kw) -> Path:
    path = stack.tmp / "manifest.toml"
    text = manifest_text(stack.base, engine_steps, tag=None)
    path.write_text(text + component(base or stack.base, kernel_steps, **kw))
    return path


def with_heads(stack, steps):
    return [{**s, "head": stack.pr[s["pr"]]} for s in steps]


def test_component_replays_with_the_engine_and_matches_an_engine_of_the_same_stack(stack, capsys):
    m = write(stack, with_heads(stack, [{"action": "pick", "pr": 2}]),
              with_heads(stack, [{"action": "pick", "pr": 1}]))  # fmt: skip
    assert [s.name for s in stacks(load(m))] == ["engine", "kern"]
    rc, out = cli(stack, m, "run", capsys=capsys)
    assert rc == 0, out
    kern = out["components"]["kern"]
    assert out["steps"][0]["pr"] == 2 and kern["steps"][0]["pr"] == 1
    assert [c["original"] for c in kern["steps"][0]["commits"]] == [
        stack.commits[k] for k in ("p1a", "p1b", "p1c")
    ]
    # The same stack as an engine gives the same tree: one replay engine.
    solo = stack.write(with_heads(stack, [{"action": "pick", "pr": 1}]), name="solo.toml")
    rc, engine = cli(stack, solo, "run", capsys=capsys)
    assert rc == 0 and engine["tree"] == kern["tree"]
    # --component selects one stack.
    rc, only = cli(stack, m, "run", "--component", "kern", capsys=capsys)
    assert rc == 0 and "steps" not in only and only["components"]["kern"]["tree"] == kern["tree"]


def test_plan_shows_every_component(stack, capsys):
    m = write(stack, [], [{"action": "pick", "pr": 3, "head": stack.pr[3]}])
    rc, out = cli(stack, m, "plan", capsys=capsys)
    assert rc == 0, out
    step = out["components"]["kern"]["steps"][0]
    assert step["pr"] == 3 and step["hazard_count"] == 1  # PR 3 merged newer main
    main(["--manifest", str(m), "--cache", str(stack.tmp / "cache"), "--mirror",
          f"{KERNEL_URL}={stack.up.bare}", "--mirror", stack.mirror, "plan"])  # fmt: skip
    human = capsys.readouterr().out
    assert "== engine" in human and "== component kern" in human and "merge hazard" in human


def test_lock_pins_component_commit_heads_commits_and_tree_keeping_comments(stack, capsys):
    m = write(stack, [], [{"action": "pick", "pr": 1}, {"action": "pick", "pr": 2}],
              base=stack.base[:10])  # fmt: skip
    assert cli(stack, m, "run", capsys=capsys)[0] == 2  # short commit refused outside lock
    rc, out = cli(stack, m, "lock", capsys=capsys)
    assert rc == 0, out
    text = m.read_text()
    assert "# the kernel component: its own upstream and stack" in text
    spec = load(m).kernels[0]
    assert spec.commit == stack.base
    assert [s.head for s in spec.steps] == [stack.pr[1], stack.pr[2]]
    assert spec.steps[0].commits == tuple(stack.commits[k] for k in ("p1a", "p1b", "p1c"))
    locked = {s["name"]: s["tree"] for s in out["stacks"]}
    assert spec.tree == locked["kern"] and load(m).result.tree == locked["engine"]
    rc, run = cli(stack, m, "run", capsys=capsys)
    assert rc == 0 and run["components"]["kern"]["tree_verified"] is True


def test_lock_pins_the_branch_tip_of_an_unpinned_component(stack, capsys):
    path = stack.tmp / "components.toml"
    text = component(stack.base, [{"action": "pick", "pr": 2, "head": stack.pr[2]}])
    text = text.replace(f'commit = "{stack.base}"\n', "# FILL IN: lock pins main's tip\n")
    path.write_text(text)  # no [upstream]: a manifest of components only
    manifest = load(path)
    assert not manifest.has_engine and manifest.kernels[0].commit is None
    with pytest.raises(ManifestError, match="not pinned"):
        component_manifest(manifest.kernels[0])
    assert cli(stack, path, "run", capsys=capsys)[0] == 2
    rc, out = cli(stack, path, "lock", capsys=capsys)
    assert rc == 0, out
    assert load(path).kernels[0].commit == stack.up.rev("main")
    assert [s["name"] for s in out["stacks"]] == ["kern"]


def test_drift_reports_component_heads_and_merged_prs(stack, capsys):
    m = write(
        stack, [], with_heads(stack, [{"action": "pick", "pr": 1}, {"action": "pick", "pr": 2}])
    )
    stack.up.checkout("pr1")
    stack.up.commit({"a.txt": "alpha v3\n"}, "a: v3")
    stack.up.checkout("main")
    stack.up.merge("pr2", "Merge pull request #2")
    stack.up.publish({1: "pr1"})
    rc, out = cli(stack, m, "drift", capsys=capsys)
    assert rc == 0, out
    prs = {p["pr"]: p for p in out["components"]["kern"]["prs"]}
    assert prs[1]["moved"] is True
    assert "head is in main" in prs[2]["merged_upstream"]


def test_pick_of_a_pr_merged_upstream_with_its_own_shas_still_picks_its_commits(stack, capsys):
    """A fast-forwarded PR head is on the branch; its commits are base..head, not nothing."""
    stack.up.checkout("main")
    main_before = stack.up.rev("main")
    stack.up.checkout(main_before, "pr9")
    own = stack.up.commit({"e.txt": "pr9\n"}, "pr9: own work")
    stack.up.checkout("main")
    from gitfixture import git

    git(stack.up.work, "merge", "-q", "--ff-only", "pr9")
    stack.up.publish({9: "pr9"})
    m = write(stack, [], [{"action": "pick", "pr": 9}], base=main_before)
    rc, out = cli(stack, m, "lock", capsys=capsys)
    assert rc == 0, out
    assert load(m).kernels[0].steps[0].commits == (own,)


def test_resolve_records_a_component_fix_in_its_own_steps(stack, capsys, tmp_path):
    m = write(
        stack, [], with_heads(stack, [{"action": "pick", "pr": 1}, {"action": "pick", "pr": 4}])
    )
    work = tmp_path / "fixit"
    rc, out = cli(stack, m, "resolve", "start", str(work), capsys=capsys)
    assert rc == 0, out
    assert out["files"] == ["a.txt"] and out["commit"] == stack.commits["p4a"]
    (work / "a.txt").write_text("alpha v2 + rival\n")
    rc, out = cli(stack, m, "resolve", "finish", str(work), capsys=capsys)
    assert rc == 0, out
    text = m.read_text()
    assert "[[kernel.step.resolve]]" in text and "[[step.resolve]]" not in text
    assert Path(out["patch"]).name.startswith("kern-4-")
    rc, out = cli(stack, m, "run", capsys=capsys, cache=tmp_path / "other")
    assert rc == 0, out


def test_component_stack_is_what_the_kernel_build_stages(stack, tmp_path):
    m = write(stack, [], with_heads(stack, [{"action": "pick", "pr": 1}]))
    (spec,) = load(m).kernels
    opts = BuildOptions(cache=tmp_path / "cache", host=host_of({}),
                        mirrors={KERNEL_URL: str(stack.up.bare), UPSTREAM_URL: str(stack.up.bare)})  # fmt: skip
    staged = stage_out_of_tree(spec, opts)
    assert (staged.directory / "new" / "file.txt").read_text() == "hello\n"
    assert (staged.directory / "a.txt").read_text() == "alpha v2\n"
    assert "+ 1 step(s)" in staged.origin


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ('[[kernel.patch]]\npath = "patches/x.patch"\nsha256 = "' + "0" * 64 + '"\n', "not both"),
        ('[[kernel.step]]\naction = "pick"\npr = 5\nhead = "' + "a" * 40 + '"\n', "twice"),
        ('[[kernel.step]]\naction = "pick"\n', "a PR number"),
    ],
)
def test_component_step_errors(tmp_path: Path, extra: str, needle: str) -> None:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "x.patch").write_text("")
    text = component("a" * 40, [{"action": "pick", "pr": 5, "head": "b" * 40}]) + extra
    with pytest.raises(ManifestError, match=needle):
        loads(text.encode(), tmp_path / "manifest.toml")


def test_upstream_may_be_left_out_only_by_a_manifest_of_components(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="only a manifest of out-of-tree"):
        loads(b'[manifest]\nname = "x"\n', tmp_path / "manifest.toml")


EXL3_URL = "https://github.com/turboderp-org/exllamav3.git"


def _exl3_mirror() -> str | None:
    for item in os.environ.get("PINWHEEL_MIRRORS", "").split():
        url, _, path = item.partition("=")
        if url == EXL3_URL and Path(path).is_dir():
            return path
    return None


@pytest.mark.upstream
@pytest.mark.skipif(
    _exl3_mirror() is None,
    reason=f"PINWHEEL_MIRRORS does not map {EXL3_URL} to a local mirror with refs/pull/*",
)
def test_sm120_component_replays_its_locked_tree_on_the_real_exllamav3(tmp_path, capsys):
    """The real upstream: c5d9c657 + PR 246 + PR 234 (merged upstream later) as pinned."""
    path = Path(__file__).resolve().parents[1] / "recipes" / "sm120-tp2" / "manifest.toml"
    argv = ["--manifest", str(path), "--cache", str(tmp_path), "--json"]
    assert main([*argv, "run"]) == 0
    run = json.loads(capsys.readouterr().out)["components"]["exllamav3"]
    assert run["tree_verified"] and run["tree"] == load(path).kernels[0].tree
    assert main([*argv, "drift"]) == 0
    drift = json.loads(capsys.readouterr().out)["components"]["exllamav3"]
    prs = {p["pr"]: p for p in drift["prs"]}
    assert "head is in master" in prs[234]["merged_upstream"] and not prs[246]["merged_upstream"]


# ------------------------------------------------- errors name the kernel and manifest:line


def line_of(path: Path, needle: str, nth: int = 0) -> int:
    """The 1-based line of the ``nth`` line of ``path`` that starts with ``needle``."""
    hits = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(needle)]
    return hits[nth]


def test_a_missing_component_commit_names_the_kernel_and_its_line(stack, capsys):
    """Not the engine's [upstream] and not a cache directory: the [[kernel]] and manifest:line."""
    gone = "c" * 40
    m = write(stack, [], with_heads(stack, [{"action": "pick", "pr": 1}]), base=gone)
    want = f"manifest.toml:{line_of(m, 'commit = ', 1)}: [[kernel]] kern commit"
    for command in ("plan", "run", "lock"):
        rc, doc = cli(stack, m, command, capsys=capsys)
        assert rc == 1, (command, doc)
        err = doc["error"]
        assert err["where"] == want, command
        assert f"{gone}  ({want})" in err["what"] and "[upstream]" not in err["what"], command
        assert "--mirror URL=PATH" in err["next"] and "lock --update-base" in err["next"], command
    rc, doc = cli(stack, m, "drift", capsys=capsys)
    assert rc == 1 and doc["error"]["where"] == want and doc["error"]["next"]


def test_a_missing_component_head_names_the_kernel_step_and_its_line(stack, capsys):
    gone = "e" * 40
    m = write(stack, [], [{"action": "pick", "pr": 1, "head": stack.pr[1]},
                          {"action": "pick", "pr": 2, "head": gone}])  # fmt: skip
    step = line_of(m, "[[kernel.step]]", 1)
    for command in ("plan", "run", "lock"):
        rc, doc = cli(stack, m, command, capsys=capsys)
        assert rc == 1, (command, doc)
        assert doc["error"]["where"] == (
            f"manifest.toml:{step}: [[kernel]] kern step 2 (pick PR #2) head"
        ), command
        assert "pinwheel lock --update-heads" in doc["error"]["next"], command


def test_a_component_replay_error_names_the_kernel_and_the_step_line(stack, capsys):
    """PR 2 pinned to another head (moved upstream): the drift names the kernel's step."""
    m = write(stack, [], [{"action": "pick", "pr": 2, "head": stack.pr[1]}])
    rc, doc = cli(stack, m, "run", capsys=capsys)
    assert rc == 3, doc
    step = line_of(m, "[[kernel.step]]")
    assert doc["error"]["where"] == f"manifest.toml:{step}: [[kernel]] kern step 1 (pick PR #2)"
    assert "pinwheel lock --update-heads" in doc["error"]["next"]


def test_manifest_errors_in_a_kernel_name_it_and_the_line_of_the_key(tmp_path: Path) -> None:
    """Parse errors: the kernel's name, and the line in its own table, also for the steps of
    a second [[kernel]] (their lines are not the first kernel's)."""
    first = component("a" * 40, [{"action": "pick", "pr": 5, "head": "b" * 40}])
    second = first.replace('name = "kern"', 'name = "other"')
    path = tmp_path / "manifest.toml"
    path.write_text(first + second.replace('"pick"', '"rebase"'))
    with pytest.raises(ManifestError) as info:
        load(path)
    action = line_of(path, "action = ", 1)
    assert info.value.where == (
        f"manifest.toml:{action}: [[kernel.step]] #1 (PR 5) of [[kernel]] other key 'action'"
    )
    assert "pinwheel plan" in info.value.next
    path.write_text(first.replace('"torch-extension"', '"bazel"'))
    with pytest.raises(ManifestError) as info:
        load(path)
    builder = line_of(path, "builder = ")
    assert info.value.where == f"manifest.toml:{builder}: [[kernel]] kern key 'builder'"
    path.write_text(first.replace(f'commit = "{"a" * 40}"\n', ""))
    spec = load(path, allow_short=True).kernels[0]
    with pytest.raises(ManifestError) as info:
        component_manifest(spec)
    assert info.value.where == f"manifest.toml:{line_of(path, '[[kernel]]')}: [[kernel]] kern key 'commit'"
    assert "pinwheel lock" in info.value.next

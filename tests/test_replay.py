"""Replay on real git repositories: SHAs, trees, authors, determinism, errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pygit2

from gitfixture import UPSTREAM_URL, git

PICKS = [
    {"action": "pick", "pr": 1},
    {"action": "pick", "pr": 2},
]


def steps_with_heads(stack, steps):
    return [{**s, "head": stack.pr[s["pr"]]} if "pr" in s else s for s in steps]


def replayed_repo(stack, cache="cache") -> pygit2.Repository:
    return pygit2.Repository(str(next((stack.tmp / cache / "repos").glob("*.git"))))


def test_pick_keeps_authors_and_uses_fixed_committer(stack, capsys):
    m = stack.write(steps_with_heads(stack, PICKS))
    rc, out = stack.cli(m, "run", capsys=capsys)
    assert rc == 0
    commits = [c for s in out["steps"] for c in s["commits"]]
    assert [c["original"] for c in commits] == [
        stack.commits[k] for k in ("p1a", "p1b", "p1c", "p2a")
    ]
    repo = replayed_repo(stack)
    for c in commits:
        new, old = repo[c["replayed"]], repo[c["original"]]
        assert (new.author.name, new.author.email, new.author.time, new.author.offset) == (
            old.author.name,
            old.author.email,
            old.author.time,
            old.author.offset,
        )
        assert new.raw_message == old.raw_message
        assert (new.committer.name, new.committer.email) == ("Replay Bot", "replay@example.org")
        assert (new.committer.time, new.committer.offset) == (1791590400, 0)
    # The empty commit is kept as an empty commit.
    empty = repo[commits[1]["replayed"]]
    assert empty.tree_id == empty.parents[0].tree_id
    head = repo[out["head"]]
    assert (head.tree / "a.txt").data == b"alpha v2\n"
    assert (head.tree / "b.txt").data == b"beta v2\n"
    assert (head.tree / "new" / "file.txt").data == b"hello\n"
    assert "c.txt" not in head.tree  # main's newer work is not imported by picks
    assert repo.references["refs/tags/stack-1"].target == head.id


def test_shas_match_plain_git_cherry_pick(stack, capsys, tmp_path):
    """Oracle: git cherry-pick with the same committer identity yields the same commits."""
    m = stack.write(steps_with_heads(stack, PICKS))
    rc, out = stack.cli(m, "run", capsys=capsys)
    assert rc == 0
    work = tmp_path / "oracle"
    git(tmp_path, "clone", "-q", str(stack.up.bare), str(work))
    git(work, "fetch", "-q", "origin", "+refs/pull/*/head:refs/pull/*/head")
    git(work, "checkout", "-q", stack.base)
    env = {
        "GIT_COMMITTER_NAME": "Replay Bot",
        "GIT_COMMITTER_EMAIL": "replay@example.org",
        "GIT_COMMITTER_DATE": "1791590400 +0000",
    }
    for key in ("p1a", "p1b", "p1c", "p2a"):
        git(
            work,
            "cherry-pick",
            "--allow-empty",
            "--keep-redundant-commits",
            stack.commits[key],
            env=env,
        )
    assert git(work, "rev-parse", "HEAD") == out["head"]


def test_same_shas_under_other_tz_locale_and_hostile_git_config(stack, capsys, tmp_path):
    m = stack.write(steps_with_heads(stack, PICKS + [{"action": "merge", "pr": 3}]))
    rc, first = stack.cli(m, "run", capsys=capsys)
    assert rc == 0
    home = tmp_path / "hostile-home"
    hooks = home / "hooks"
    hooks.mkdir(parents=True)
    for hook in ("prepare-commit-msg", "commit-msg", "pre-commit", "post-commit"):
        (hooks / hook).write_text('#!/bin/sh\necho HOOKED >> "$1"\nexit 1\n')
        (hooks / hook).chmod(0o755)
    (home / "template.txt").write_text("TEMPLATE LINE\n")
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Someone Else\n\temail = else@example.org\n"
        f"[core]\n\thooksPath = {hooks}\n\tautocrlf = true\n"
        "[commit]\n\tgpgSign = true\n\ttemplate = ~/template.txt\n\tcleanup = verbatim\n"
        "[gpg]\n\tprogram = /bin/false\n"
        "[merge]\n\tlog = true\n[cherry-pick]\n\t\n[format]\n\tsignOff = true\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        HOME=str(home),
        TZ="Pacific/Chatham",
        LC_ALL="de_DE.UTF-8",
        GIT_COMMITTER_NAME="Env Override",
        GIT_AUTHOR_DATE="1 +0100",
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pinwheel",
            "--manifest",
            str(m),
            "--cache",
            str(tmp_path / "cache2"),
            "--mirror",
            stack.mirror,
            "--json",
            "run",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    import json

    second = json.loads(proc.stdout)
    assert second["head"] == first["head"]
    assert second["tree"] == first["tree"]
    assert [c["replayed"] for s in second["steps"] for c in s["commits"]] == [
        c["replayed"] for s in first["steps"] for c in s["commits"]
    ]


def test_pick_refuses_pr_with_merge_commits(stack, capsys):
    m = stack.write(steps_with_heads(stack, [{"action": "pick", "pr": 3}]))
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 2
    assert "PR #3 contains merge commit" in err and 'action = "merge"' in err


def test_merge_reproduces_github_test_merge_tree(stack, capsys):
    expected_tree = stack.up.github_test_merge(3)
    # GitHub merges onto main's tip; so does this single-step manifest.
    stack.base = stack.up.rev("main")
    m = stack.write(steps_with_heads(stack, [{"action": "merge", "pr": 3}]), tree=expected_tree)
    rc, out = stack.cli(m, "run", capsys=capsys)
    assert rc == 0
    assert out["tree"] == expected_tree and out["tree_verified"] is True
    repo = replayed_repo(stack)
    merge = repo[out["head"]]
    assert [str(p) for p in merge.parent_ids] == [stack.base, stack.pr[3]]
    assert merge.message.startswith("Merge PR #3 into main")


def test_plan_reports_merge_hazard_and_commits(stack, capsys):
    m = stack.write(steps_with_heads(stack, PICKS + [{"action": "merge", "pr": 3}]))
    rc, plan = stack.cli(m, "plan", capsys=capsys)
    assert rc == 0
    by_pr = {s["pr"]: s for s in plan["steps"]}
    assert [c["sha"] for c in by_pr[1]["commits"]] == [
        stack.commits["p1a"],
        stack.commits["p1b"],
        stack.commits["p1c"],
    ]
    assert by_pr[1]["hazard_count"] == 0
    # PR 3 merged newer main: merging it would import main's m1.
    assert by_pr[3]["hazard_count"] == 1
    assert by_pr[3]["hazard"][0]["sha"] == stack.commits["m1"]


def test_conflict_names_step_pr_commit_files_and_leaves_cache_clean(stack, capsys):
    m = stack.write(
        steps_with_heads(stack, [{"action": "pick", "pr": 1}, {"action": "pick", "pr": 4}])
    )
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 4
    assert "step 2 (pick PR #4)" in err
    assert stack.commits["p4a"][:12] in err and "a: rival edit" in err
    assert "a.txt" in err and "pinwheel resolve start" in err
    repo = replayed_repo(stack)
    assert "refs/tags/stack-1" not in repo.references
    assert not any(r.startswith("refs/pinwheel/stack/") for r in repo.references)


def test_force_pushed_head_is_drift_error_unless_allowed(stack, capsys):
    old_head = stack.pr[2]
    m = stack.write(steps_with_heads(stack, PICKS))
    assert stack.cli(m, "run")[0] == 0
    # Force-push PR 2 to a rewritten commit.
    stack.up.checkout("pr2")
    git(stack.up.work, "commit", "-q", "--amend", "-m", "b: v2 (rewritten)")
    stack.up.publish({2: "pr2"})
    capsys.readouterr()
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 3
    assert "PR #2 head moved" in err and old_head[:12] in err and "--allow-drift" in err
    rc, out = stack.cli(m, "run", "--allow-drift", capsys=capsys)
    assert rc == 0
    assert out["steps"][1]["head"] == old_head and out["steps"][1]["drifted"] is True


def test_tree_mismatch_exit_5(stack, capsys):
    m = stack.write(steps_with_heads(stack, PICKS), tree="0" * 40)
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 5 and "differs from the pinned 0000000000" in err


def test_offline_uses_cache_and_fails_clearly_without_it(stack, capsys, tmp_path):
    m = stack.write(steps_with_heads(stack, PICKS))
    rc, online = stack.cli(m, "run", capsys=capsys)
    from pinwheel.cli import main

    rc = main(
        ["--manifest", str(m), "--cache", str(stack.tmp / "cache"), "--offline", "--json", "run"]
    )
    import json

    assert rc == 0 and json.loads(capsys.readouterr().out)["head"] == online["head"]
    rc = main(["--manifest", str(m), "--cache", str(tmp_path / "empty"), "--offline", "run"])
    err = capsys.readouterr().err
    assert rc == 1 and "offline" in err and "without --offline" in err


def make_partial_mirror(stack, tmp_path):
    """A real blobless clone: over file:// with filters allowed on the source.

    (--filter over a plain local path is ignored and copies every blob.)
    """
    partial = tmp_path / "partial.git"
    git(stack.up.bare, "config", "uploadpack.allowFilter", "true")
    git(
        tmp_path,
        "clone",
        "-q",
        "--mirror",
        "--filter=blob:none",
        f"file://{stack.up.bare}",
        str(partial),
    )
    # --missing=print never fetches lazily; every blob must be missing here.
    listing = git(partial, "rev-list", "--objects", "--all", "--missing=print")
    missing = {line[1:] for line in listing.splitlines() if line.startswith("?")}
    blob = git(stack.up.bare, "rev-parse", f"{stack.pr[1]}:a.txt")
    assert blob in missing, "the mirror is not partial: the test would prove nothing"
    assert blob not in pygit2.Repository(str(partial))
    return partial


def test_blobless_partial_mirror_replays_same_shas(stack, capsys, tmp_path):
    m = stack.write(steps_with_heads(stack, PICKS))
    rc, full = stack.cli(m, "run", capsys=capsys)
    partial = make_partial_mirror(stack, tmp_path)
    from pinwheel.cli import main

    rc = main(
        [
            "--manifest",
            str(m),
            "--cache",
            str(tmp_path / "pc"),
            "--mirror",
            f"{UPSTREAM_URL}={partial}",
            "--json",
            "run",
        ]
    )
    import json

    assert rc == 0
    assert json.loads(capsys.readouterr().out)["head"] == full["head"]


def test_missing_pr_ref_names_the_pr(stack, capsys):
    m = stack.write([{"action": "pick", "pr": 77, "head": "1" * 40}])
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 1 and "PR #77 has no refs/pull/77/head" in err


def test_two_runs_share_one_cache_lock(stack, tmp_path):
    """Two concurrent runs on one cache both succeed with the same head (file lock)."""
    m = stack.write(steps_with_heads(stack, PICKS))
    cmd = [
        sys.executable,
        "-m",
        "pinwheel",
        "--manifest",
        str(m),
        "--cache",
        str(tmp_path / "shared"),
        "--mirror",
        stack.mirror,
        "--json",
        "run",
    ]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    import json

    outputs = [p.communicate(timeout=120) for p in procs]  # every one reaped before a check
    done = [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
    for _, _, err in done:
        assert "Traceback" not in err, err
    assert [rc for rc, _, _ in done] == [0, 0, 0], [err for _, _, err in done]
    assert len({json.loads(out)["head"] for _, out, _ in done}) == 1


def test_unreachable_source_is_a_fetch_error_not_blamed_on_a_pr(stack, capsys, tmp_path):
    """No mirror and a host that cannot resolve: the error names the source, not PR #1."""
    from pinwheel.cli import main

    m = stack.write(steps_with_heads(stack, PICKS))
    rc = main(["--manifest", str(m), "--cache", str(tmp_path / "c"), "run"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "fetch failed" in err and "example.invalid" in err
    assert "has no refs/pull" not in err
    assert "--mirror URL=PATH" in err


def test_missing_branch_is_a_fetch_error(stack, capsys):
    m = stack.write(steps_with_heads(stack, PICKS))
    m.write_text(m.read_text().replace('branch = "main"', 'branch = "nope"'))
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 1 and "fetch failed" in err and "nope" in err


def test_the_cache_lock_and_filelock_see_each_other(tmp_path):
    """The cache lock is a plain flock: filelock's FileLock (the lock `cache clean` probes
    with) finds it held, and a FileLock held elsewhere makes the cache wait, then say so."""
    import textwrap

    from filelock import FileLock

    from pinwheel.source.cache import Cache, slug

    url = "https://example.invalid/acme/engine.git"
    root = tmp_path / "cache"
    lock = root / "locks" / f"{slug(url)}.lock"
    probe = textwrap.dedent(f"""
        from filelock import FileLock, Timeout
        try:
            with FileLock({str(lock)!r}, timeout=0):
                print("free")
        except Timeout:
            print("held")
    """)
    with Cache(root, {}).locked(url):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert out.stdout.strip() == "held", out.stderr
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.stdout.strip() == "free", out.stderr
    waiter = textwrap.dedent(f"""
        from pathlib import Path
        from pinwheel.source import cache
        cache.LOCK_TIMEOUT_S = 0.2
        try:
            with cache.Cache(Path({str(root)!r}), {{}}).locked({url!r}):
                print("got it")
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    with FileLock(str(lock), timeout=0):
        out = subprocess.run([sys.executable, "-c", waiter], capture_output=True, text=True)
        assert out.stdout.startswith("LockBusy") and "held the cache lock" in out.stdout
    out = subprocess.run([sys.executable, "-c", waiter], capture_output=True, text=True)
    assert out.stdout.strip() == "got it", out.stdout + out.stderr


def test_the_replay_hides_the_branch_as_its_merge_bases_would(tmp_path):
    """picks.branch_history (the replay's in-process hide list: the branch tip, or nothing
    when the head is on the branch) selects the very commits that hiding every
    ``git merge-base --all`` base selects, on a random history with merges both ways
    (criss-cross merges give several bases): every (branch tip, head) pair of 24 commits."""
    import random

    from pinwheel.source import picks

    repo_dir = tmp_path / "dag.git"
    git(tmp_path, "init", "-q", "--bare", str(repo_dir))
    empty = git(repo_dir, "hash-object", "-t", "tree", "-w", "/dev/null")
    rng = random.Random(20261207)
    commits: list[str] = []
    for i in range(24):
        parents = rng.sample(commits, k=min(len(commits), rng.choice((1, 1, 2)))) if commits else []
        env = {"GIT_AUTHOR_DATE": f"{1_700_000_000 + i} +0000",
               "GIT_COMMITTER_DATE": f"{1_700_000_000 + i} +0000",
               "GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@example.org",
               "GIT_COMMITTER_NAME": "A", "GIT_COMMITTER_EMAIL": "a@example.org"}  # fmt: skip
        args = [a for p in parents for a in ("-p", p)]
        commits.append(git(repo_dir, "commit-tree", *args, "-m", f"c{i}", empty, env=env))
    repo = pygit2.Repository(str(repo_dir))
    several = 0
    for tip in commits:
        for head in commits:
            bases = picks.pr_bases(repo_dir, tip, head)
            several += len(bases) > 1
            want = [c.id for c in picks.commits_between(repo, head, bases)]
            got = [c.id for c in picks.commits_between(repo, head, picks.branch_history(repo, tip, head))]
            assert got == want, (tip, head, bases)
    assert several > 0  # the history has criss-cross merges: the case the theory is about

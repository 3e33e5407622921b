"""Patch steps, conflict resolution, lock, drift and export on real repositories."""

from __future__ import annotations

import hashlib
import json
import tarfile

import pygit2

from gitfixture import git


def heads(stack, steps):
    return [{**s, "head": stack.pr[s["pr"]]} if "pr" in s else s for s in steps]


def make_patch(stack, tmp_path, name="fix.patch", mbox=True):
    """A real format-patch mbox (or plain diff) made against the base."""
    work = tmp_path / "patchwork"
    git(tmp_path, "clone", "-q", str(stack.up.bare), str(work))
    git(work, "checkout", "-q", stack.base)
    (work / "shared.txt").write_text("one\ntwo\nthree\n")
    git(
        work,
        "commit",
        "-qam",
        "shared: add three\n\nBecause three.",
        env={
            "GIT_AUTHOR_NAME": "Pat Cher",
            "GIT_AUTHOR_EMAIL": "pat@example.org",
            "GIT_AUTHOR_DATE": "1700000000 -0700",
        },
    )
    text = git(work, "format-patch", "-1", "--stdout") if mbox else git(work, "diff", "HEAD~1")
    patches = stack.tmp / "patches"
    patches.mkdir(exist_ok=True)
    (patches / name).write_text(text + "\n")
    return f"patches/{name}", hashlib.sha256((text + "\n").encode()).hexdigest()


def test_patch_step_takes_author_from_mbox(stack, capsys, tmp_path):
    path, digest = make_patch(stack, tmp_path)
    m = stack.write(
        heads(
            stack,
            [{"action": "pick", "pr": 2}, {"action": "patch", "path": path, "sha256": digest}],
        )
    )
    rc, out = stack.cli(m, "run", capsys=capsys)
    assert rc == 0, out
    repo = pygit2.Repository(str(next((stack.tmp / "cache" / "repos").glob("*.git"))))
    head = repo[out["head"]]
    assert (head.author.name, head.author.email, head.author.offset) == (
        "Pat Cher",
        "pat@example.org",
        -420,
    )
    assert head.message == "shared: add three\n\nBecause three.\n"
    assert (head.tree / "shared.txt").data == b"one\ntwo\nthree\n"
    assert out["steps"][1]["patch"] == "fix.patch"


def test_plain_diff_patch_uses_identity(stack, capsys, tmp_path):
    path, digest = make_patch(stack, tmp_path, name="plain.diff", mbox=False)
    m = stack.write([{"action": "patch", "path": path, "sha256": digest}])
    rc, out = stack.cli(m, "run", capsys=capsys)
    assert rc == 0
    assert out["steps"][0]["commits"][0]["author"] == "Replay Bot <replay@example.org>"


def test_patch_that_does_not_apply_is_a_conflict(stack, capsys, tmp_path):
    patches = stack.tmp / "patches"
    patches.mkdir()
    bad = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-nothing like this\n+x\n"
    (patches / "bad.patch").write_text(bad)
    m = stack.write(
        [
            {
                "action": "patch",
                "path": "patches/bad.patch",
                "sha256": hashlib.sha256(bad.encode()).hexdigest(),
            }
        ]
    )
    rc = stack.cli(m, "run")[0]
    err = capsys.readouterr().err
    assert rc == 4 and "patch bad.patch does not apply" in err and "a.txt" in err


def test_resolve_records_fix_that_replays_everywhere(stack, capsys, tmp_path):
    m = stack.write(heads(stack, [{"action": "pick", "pr": 1}, {"action": "pick", "pr": 4}]))
    work = tmp_path / "fixit"
    rc, out = stack.cli(m, "resolve", "start", str(work), capsys=capsys)
    assert rc == 0, out
    assert out["files"] == ["a.txt"] and out["commit"] == stack.commits["p4a"]
    assert "<<<<<<<" in (work / "a.txt").read_text()
    # Finishing with markers left is refused, and nothing is recorded.
    rc = stack.cli(m, "resolve", "finish", str(work))[0]
    assert rc == 1 and "conflict markers remain" in capsys.readouterr().err
    assert not (stack.tmp / "patches").exists()
    (work / "a.txt").write_text("alpha v2 + rival\n")
    rc, out = stack.cli(m, "resolve", "finish", str(work), capsys=capsys)
    assert rc == 0
    assert not work.exists()
    text = m.read_text()
    assert "[[step.resolve]]" in text and f'commit = "{stack.commits["p4a"]}"' in text
    # The recorded fix replays in a fresh cache (another machine).
    rc, out = stack.cli(m, "run", cache=tmp_path / "other", capsys=capsys)
    assert rc == 0
    repo = pygit2.Repository(str(next((tmp_path / "other" / "repos").glob("*.git"))))
    head = repo[out["head"]]
    assert (head.tree / "a.txt").data == b"alpha v2 + rival\n"
    assert head.author.name == "Zed"  # still the original author of the conflicting commit


def test_lock_resolves_short_shas_pins_commits_and_tree_keeping_comments(stack, capsys):
    m = stack.write([{"action": "pick", "pr": 1}, {"action": "pick", "pr": 2}])
    text = m.read_text().replace(stack.base, stack.base[:10])
    text = text.replace("[upstream]", "# keep this comment\n[upstream]")
    m.write_text(text)
    assert stack.cli(m, "run")[0] == 2  # short SHA / missing head refused outside lock
    capsys.readouterr()
    rc, out = stack.cli(m, "lock", capsys=capsys)
    assert rc == 0, out
    locked = m.read_text()
    assert "# keep this comment" in locked
    assert f'commit = "{stack.base}"' in locked
    assert f'head = "{stack.pr[1]}"' in locked and stack.commits["p1b"] in locked
    assert f'tree = "{out["tree"]}"' in locked
    rc, run = stack.cli(m, "run", capsys=capsys)
    assert rc == 0 and run["tree_verified"] is True and run["tree"] == out["tree"]


def test_lock_leaves_file_untouched_when_replay_fails(stack, capsys):
    m = stack.write([{"action": "pick", "pr": 1}, {"action": "pick", "pr": 4}])
    before = m.read_bytes()
    rc = stack.cli(m, "lock")[0]
    assert rc == 4 and m.read_bytes() == before


def test_drift_reports_moved_head_new_upstream_and_replayability(stack, capsys):
    m = stack.write(heads(stack, [{"action": "pick", "pr": 1}, {"action": "pick", "pr": 2}]))
    stack.up.checkout("pr2")
    stack.up.commit({"b.txt": "beta v3\n"}, "b: v3")
    stack.up.publish({2: "pr2"})
    rc, out = stack.cli(m, "drift", capsys=capsys)
    assert rc == 0
    prs = {p["pr"]: p for p in out["prs"]}
    assert prs[2]["moved"] is True and prs[1]["moved"] is False
    assert out["new_upstream_commits"] == 1  # main's m1
    assert out["replays_on_tip"] is True


def test_drift_sees_pr_merged_upstream(stack, capsys):
    m = stack.write(heads(stack, [{"action": "pick", "pr": 2}]))
    stack.up.checkout("main")
    stack.up.merge("pr2", "Merge pull request #2")
    stack.up.publish()
    rc, out = stack.cli(m, "drift", capsys=capsys)
    assert rc == 0 and "head is in main" in out["prs"][0]["merged_upstream"]


def test_export_is_deterministic_and_extracts_tree(stack, capsys, tmp_path):
    m = stack.write(heads(stack, [{"action": "pick", "pr": 1}]))
    rc, a = stack.cli(
        m, "export", "--out", str(tmp_path / "a"), "--dir", str(tmp_path / "src"), capsys=capsys
    )
    assert rc == 0
    rc, b = stack.cli(
        m, "export", "--out", str(tmp_path / "b"), cache=tmp_path / "c2", capsys=capsys
    )
    ta, tb = (tmp_path / "a" / "stack-1.tar.gz"), (tmp_path / "b" / "stack-1.tar.gz")
    assert ta.read_bytes() == tb.read_bytes()
    with tarfile.open(ta) as tar:
        assert "stack-1/new/file.txt" in tar.getnames()
    assert (tmp_path / "src" / "new" / "file.txt").read_text() == "hello\n"
    lock = json.loads((tmp_path / "a" / "stack-1.lock.json").read_text())
    assert lock["head"] == a["head"] and len(lock["steps"][0]["commits"]) == 3

"""Replay stamps on real git repositories: a warm replay is recalled from its stamp only
while every input it read still holds; each input changed on its own replays in full."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gitfixture import UPSTREAM_URL, git
from pinwheel.manifest import load
from pinwheel.source import recall as recall_mod
from pinwheel.source import stamp
from pinwheel.source.cache import Cache
from pinwheel.source.recall import recall
from pinwheel.source.replay import replay
from pinwheel.source.result import ReplayRequest, ReplayResult

PICKS = [{"action": "pick", "pr": 1}, {"action": "pick", "pr": 2}]
MERGE = [{"action": "pick", "pr": 1}, {"action": "merge", "pr": 3}]


def _steps(stack, steps):
    return [{**s, "head": stack.pr[s["pr"]]} for s in steps]


def _request(stack, manifest: Path, **kw) -> ReplayRequest:
    return ReplayRequest(
        load(manifest), stack.tmp / "cache", {UPSTREAM_URL: str(stack.up.bare)}, **kw
    )


def _recall(stack, manifest: Path, **kw) -> ReplayResult | None:
    """What a warm run would get from its stamp, after its fetch (None: it replays)."""
    request = _request(stack, manifest, **kw)
    m = request.manifest
    store = Cache(request.cache, request.mirrors)
    with store.locked(m.upstream.url):
        refs = store.fetch_refs(m.upstream.url, m.upstream.branch, m.prs)
        return recall(request, refs)


def _repo(stack) -> Path:
    return next((stack.tmp / "cache" / "repos").glob("*.git"))


@pytest.fixture
def stamped(stack):
    """A stack replayed once (picks and a merge): its manifest and its result."""
    manifest = stack.write(_steps(stack, MERGE))
    return manifest, replay(_request(stack, manifest))


def test_a_warm_replay_is_recalled_whole(stack, stamped):
    manifest, first = stamped
    again = _recall(stack, manifest)
    assert again == first
    assert replay(_request(stack, manifest)) == first


def test_a_recalled_run_prints_what_a_replay_prints_and_never_loads_libgit2(stack, capsys):
    manifest = stack.write(_steps(stack, MERGE))
    rc, cold = stack.cli(manifest, "run", capsys=capsys)
    assert rc == 0
    probe = (
        "import contextlib, io, json, sys\n"
        "from pinwheel.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    rc = main(sys.argv[1:])\n"
        "print(json.dumps([rc, 'pygit2' in sys.modules, json.loads(out.getvalue())]))\n"
    )
    argv = ["--manifest", str(manifest), "--cache", str(stack.tmp / "cache"),
            "--mirror", stack.mirror, "--json", "run"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True
    )
    rc, loaded, warm = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (rc, loaded, warm) == (0, False, cold)


def test_a_changed_manifest_replays(stack, stamped):
    manifest, first = stamped
    text = manifest.read_text().replace('name = "Replay Bot"', 'name = "Other Bot"')
    manifest.write_text(text.replace('tag = "stack-1"', 'tag = "stack-2"'))
    assert _recall(stack, manifest) is None
    again = replay(_request(stack, manifest))
    assert again.tree == first.tree and again.head != first.head  # another committer


def test_a_force_pushed_pr_head_is_drift_not_a_recall(stack, stamped, capsys):
    manifest, _ = stamped
    stack.up.checkout("pr1")
    git(stack.up.work, "commit", "-q", "--amend", "-m", "add new/file.txt (rewritten)")
    stack.up.publish({1: "pr1"})
    assert _recall(stack, manifest) is None
    rc = stack.cli(manifest, "run")[0]
    assert rc == 3 and "PR #1 head moved" in capsys.readouterr().err


def test_a_moved_branch_tip_replays(stack, stamped):
    manifest, first = stamped
    stack.up.checkout("main")
    stack.up.commit({"e.txt": "later\n"}, "main: later work")
    stack.up.publish()
    assert _recall(stack, manifest) is None
    assert replay(_request(stack, manifest)) == first  # picks: the same commits again


def test_a_deleted_tag_is_replayed_and_written_again(stack, stamped):
    manifest, first = stamped
    git(_repo(stack), "tag", "-d", "stack-1")
    assert _recall(stack, manifest) is None
    assert replay(_request(stack, manifest)) == first
    assert _recall(stack, manifest) == first


def test_a_moved_tag_is_never_recalled_and_stays_an_error(stack, stamped, capsys):
    manifest, first = stamped
    git(_repo(stack), "tag", "-f", "stack-1", first.base)
    assert _recall(stack, manifest) is None
    rc = stack.cli(manifest, "run")[0]
    assert rc != 0 and "tag stack-1 already exists" in capsys.readouterr().err


def test_a_moved_stack_ref_replays(stack, stamped):
    manifest, first = stamped
    git(_repo(stack), "update-ref", "refs/pinwheel/stack/manifest", first.base)
    assert _recall(stack, manifest) is None


def test_other_options_or_another_engine_version_replay(stack, stamped, monkeypatch):
    manifest, _ = stamped
    assert _recall(stack, manifest, allow_drift=True) is None
    assert _recall(stack, manifest, write_refs=False) is None
    monkeypatch.setattr(recall_mod, "REPLAY_VERSION", recall_mod.REPLAY_VERSION + 1)
    assert _recall(stack, manifest) is None


def test_a_changed_repository_config_replays(stack, stamped):
    manifest, _ = stamped
    git(_repo(stack), "config", "gc.auto", "0")
    assert _recall(stack, manifest) is None


def _edit_stamp(stack, manifest: Path, edit) -> None:
    where = stamp.path(_repo(stack), load(manifest).name)
    doc = json.loads(where.read_text())
    edit(doc)
    where.write_text(json.dumps(doc))


def test_a_tampered_stamp_is_never_recalled(stack, stamped):
    manifest, first = stamped

    def other_tree(doc):  # a tree the repository has, not the one the head holds
        doc["result"]["tree"] = doc["result"]["steps"][0]["tree"]

    _edit_stamp(stack, manifest, other_tree)
    assert _recall(stack, manifest) is None
    replay(_request(stack, manifest))

    def missing_commit(doc):
        doc["result"]["steps"][0]["commits"][0][1] = "1" * 40

    _edit_stamp(stack, manifest, missing_commit)
    assert _recall(stack, manifest) is None
    replay(_request(stack, manifest))

    def other_key(doc):
        doc["key"]["refs"] = {}

    _edit_stamp(stack, manifest, other_key)
    assert _recall(stack, manifest) is None
    where = stamp.path(_repo(stack), first.manifest.name)
    for junk in (b"", b"not json", b"[1, 2]", b'{"format": "pinwheel.replay-stamp/1"}'):
        where.write_bytes(junk)
        assert _recall(stack, manifest) is None
    assert replay(_request(stack, manifest)) == first
    assert _recall(stack, manifest) == first


def test_a_stamp_that_is_a_fifo_is_never_opened(stack, stamped):
    manifest, first = stamped
    where = stamp.path(_repo(stack), first.manifest.name)
    where.unlink()
    import os

    os.mkfifo(where)
    assert _recall(stack, manifest) is None  # refused by fstat, never waited on


# ---- docs/SECURITY.md "Cache contents": a recalled replay proves it is the replay


def test_a_result_moved_by_someone_who_can_write_the_cache_is_never_recalled(stack):
    """Someone who can write the cache (not read its key) adds a commit on the stack's
    base, moves the stack ref and the tag to it and rewrites the stamp's result to name it,
    every link consistent: the stamp no longer carries this cache's signature, so the run
    replays (and the moved tag stays an error), never reports that tree."""
    manifest = stack.write(_steps(stack, PICKS))
    first = replay(_request(stack, manifest))
    repo = _repo(stack)
    last = first.steps[-1]
    parent = last.commits[-2].replayed if len(last.commits) > 1 else first.steps[-2].head
    other_tree = first.steps[0].tree  # a tree the repository holds, not the replay's
    forged = git(repo, "commit-tree", other_tree, "-p", parent, "-m", "BACKDOOR").strip()
    git(repo, "update-ref", f"refs/pinwheel/stack/{first.manifest.name}", forged)
    git(repo, "update-ref", f"refs/tags/{first.tag}", forged)

    def moved(doc):
        res = doc["result"]
        res["steps"][-1]["commits"][-1][1] = forged
        res["steps"][-1]["head"] = res["head"] = forged
        res["steps"][-1]["tree"] = res["tree"] = other_tree

    _edit_stamp(stack, manifest, moved)
    assert _recall(stack, manifest) is None


def test_subjects_and_authors_are_the_commits_not_the_stamp_s(stack, stamped):
    manifest, first = stamped

    def renamed(doc):
        for row in doc["result"]["steps"][0]["commits"]:
            if len(row) > 2:
                row[2:] = ["\x1b[2Jplanted subject", "Mallory", "m@example.invalid"]
            row.extend([])

    _edit_stamp(stack, manifest, renamed)
    again = _recall(stack, manifest)
    assert again is None or again == first
    assert replay(_request(stack, manifest)) == first
    recalled = _recall(stack, manifest)
    assert recalled == first  # recalled, with the objects' subjects and authors
    shown = [(c.subject, c.author) for s in recalled.steps for c in s.commits]
    assert shown == [(c.subject, c.author) for s in first.steps for c in s.commits]
    assert all(subject for subject, _ in shown)


def test_the_first_export_does_not_change_what_the_next_run_recalls(stack):
    """The export writes ``<cache repo>/info/attributes`` (an input of every replay): the
    replay writes it first, so the first build's stamp is recalled by the second."""
    from pinwheel.source.export import tree_archive

    manifest = stack.write(_steps(stack, MERGE))
    first = replay(_request(stack, manifest))
    tree_archive(first)  # what a build's export does
    assert _recall(stack, manifest) == first


def test_a_stamp_folder_planted_as_a_link_is_never_written_through(stack, stamped, tmp_path):
    manifest, first = stamped
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = _repo(stack) / "pinwheel"
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
    folder.symlink_to(outside)
    assert replay(_request(stack, manifest)) == first
    assert list(outside.iterdir()) == []

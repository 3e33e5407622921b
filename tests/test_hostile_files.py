"""Hostile input, files that are not documents: FIFOs, devices, sparse giants, deep trees.

Every reader of a file pinwheel did not write opens it without blocking, checks with
``fstat`` that it is a regular file and that its size is under the kind's cap, and
only then reads: the manifest, a model pack's config.json (``model check``), a cache
repository's HEAD (``cache verify``), and the compiled inputs a ``--reuse-from``
receipt names. ``cache du`` walks a tree thousands of levels deep (deeper than PATH_MAX)
without recursion, and breaks each folder down without following a link or opening a FIFO.
Each case must end in the project's error with a ``next:`` step: never a hang, a
MemoryError, a RecursionError or a traceback. Real parts: FIFOs, /dev/zero, sparse
files and trees made here, the CLI's own main(), a real bare git repository.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pinwheel import fsutil, untrusted
from pinwheel.cli import main
from pinwheel.compile import reuse
from pinwheel.errors import PinwheelError
from pinwheel.source import cache as cache_marker
from pinwheel.source import cachetool
from releasekit import write_manifest
from test_hostile_documents import _shard, _tensor

pytestmark = pytest.mark.timeout(60)  # a FIFO read the old way hangs: the timeout fails it

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def _device(path: Path) -> Path:
    path.symlink_to("/dev/zero")  # a character device that never ends
    return path


# case -> (make the file at a path, what the message must say)
NOT_A_DOCUMENT = {
    "a FIFO": (_fifo, "a FIFO, not a regular file"),
    "/dev/zero": (_device, "a character device, not a regular file"),
    "a 4 GiB sparse file": (lambda p: _sparse(p, 4 << 30), "4294967296 bytes, more than the"),
}


# --------------------------------------------------------------------------- the reader itself


@pytest.mark.parametrize("case", sorted(NOT_A_DOCUMENT))
def test_read_bytes_refuses_what_is_not_a_regular_file_within_the_cap(case, tmp_path):
    make, gist = NOT_A_DOCUMENT[case]
    path = make(tmp_path / "doc.json")
    with pytest.raises(PinwheelError) as err:
        untrusted.read_json(path, untrusted.MODEL_CONFIG)
    assert gist in err.value.what and err.value.next and str(path) == err.value.where


@FUZZ
@given(data=st.binary(max_size=4096), cap=st.integers(min_value=0, max_value=5000))
def test_fuzz_read_bytes_returns_the_file_or_refuses_it_by_size(tmp_path, data, cap):
    path = tmp_path / "f"
    path.write_bytes(data)
    if len(data) <= cap:
        assert untrusted.read_bytes(path, untrusted.SERVER, cap=cap) == data
    else:
        with pytest.raises(untrusted.ServerAnswerError, match=f"{len(data)} bytes, more than"):
            untrusted.read_bytes(path, untrusted.SERVER, cap=cap)


@FUZZ
@given(kind=st.sampled_from(["fifo", "dir", "missing", "device", "file"]))
def test_fuzz_regular_size_is_the_size_of_a_regular_file_and_an_error_otherwise(tmp_path, kind):
    path = tmp_path / f"p-{kind}"
    if not os.path.lexists(path):
        {
            "fifo": _fifo,
            "dir": Path.mkdir,
            "missing": lambda p: None,
            "device": _device,
            "file": lambda p: p.write_bytes(b"12345"),
        }[kind](path)
    if kind == "file":
        assert untrusted.regular_size(path, untrusted.GIT_FILE) == 5
    else:
        with pytest.raises(PinwheelError):
            untrusted.regular_size(path, untrusted.GIT_FILE)


# --------------------------------------------------------------------------- the manifest


@pytest.mark.parametrize("case", sorted(NOT_A_DOCUMENT))
def test_a_manifest_that_is_not_a_regular_file_is_exit_2(case, tmp_path, capsys):
    make, gist = NOT_A_DOCUMENT[case]
    manifest = make(tmp_path / "manifest.toml")
    rc = main(["--cache", str(tmp_path / "cache"), "--manifest", str(manifest), "plan"])
    err = _flat(capsys.readouterr().err)
    assert rc == 2, err
    assert gist.split(",")[0].split(" more")[0] in err and "next:" in err, err
    assert "Traceback" not in err


def test_a_manifest_failure_under_json_is_one_document(tmp_path, capsys):
    manifest = _fifo(tmp_path / "manifest.toml")
    rc = main(["--json", "--manifest", str(manifest), "plan"])
    out = capsys.readouterr().out
    assert rc == 2
    doc = json.loads(out)  # exactly one document
    assert "FIFO" in json.dumps(doc)


# --------------------------------------------------------------------------- model check


@pytest.mark.parametrize("case", sorted(NOT_A_DOCUMENT))
def test_model_check_refuses_a_config_json_that_is_not_a_regular_file(case, tmp_path, capsys):
    make, gist = NOT_A_DOCUMENT[case]
    pack = tmp_path / "glm"
    pack.mkdir()
    _shard(pack / "model.safetensors", {"w": _tensor()}, b"\0" * 8)
    make(pack / "config.json")
    model = '[model]\nrepo = "org/m"\n[model.config]\nquant_method = "exl3"\n'
    manifest = write_manifest(tmp_path, model=model)
    rc = main(["--manifest", str(manifest), "model", "check", str(pack)])
    err = _flat(capsys.readouterr().err)
    if case == "/dev/zero":  # a symlink to a device: refused as leading out of the pack
        assert rc == 6 and "config.json" in err and "Traceback" not in err, err
        return
    assert rc == 6 and "config.json" in err and gist in err and "Traceback" not in err, err


# --------------------------------------------------------------------------- cache verify


def _bare_cache(tmp_path: Path) -> tuple[Path, Path]:
    cache = tmp_path / "cache"
    repo = cache / "repos" / "demo-00000000.git"
    repo.parent.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    return cache, repo


@pytest.mark.parametrize("name", ["HEAD", "config", "packed-refs"])
@pytest.mark.parametrize("case", ["a FIFO", "a 4 GiB sparse file"])
def test_cache_verify_refuses_a_git_file_that_is_a_fifo_or_a_giant(name, case, tmp_path, capsys):
    cache, repo = _bare_cache(tmp_path)
    target = repo / name
    target.unlink(missing_ok=True)
    if case == "a FIFO":
        _fifo(target)
    else:
        _sparse(target, 4 << 30)
    rc = main(["--cache", str(cache), "cache", "verify"])
    out = capsys.readouterr()
    text = _flat(out.out + out.err)
    assert rc == 1, text
    assert f"BAD {repo}" in text and name in text, text
    assert ("FIFO" if case == "a FIFO" else "more than the") in text, text


def test_cache_verify_passes_an_intact_repository(tmp_path, capsys):
    cache, repo = _bare_cache(tmp_path)
    rc = main(["--cache", str(cache), "cache", "verify"])
    assert rc == 0, capsys.readouterr()


# --------------------------------------------------------------------------- cache du


def _deep(root: Path, levels: int) -> Path:
    """A chain of one-letter folders ``levels`` deep, a 3-byte file at the bottom (made
    with a descriptor per level: the path would pass PATH_MAX)."""
    root.mkdir(parents=True)
    fd = os.open(root, os.O_RDONLY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    leaf = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(leaf, b"abc")
    os.close(leaf)
    os.close(fd)
    return root


@pytest.fixture
def deep_tmp(tmp_path):
    """``tmp_path``, emptied with :func:`fsutil.remove_tree` at teardown: a tree a
    thousand folders deep left there ends pytest's own clean-up of old temporary folders
    (``shutil.rmtree``) in RecursionError, in a later session."""
    yield tmp_path
    fsutil.remove_tree(tmp_path)
    assert not tmp_path.exists()


def test_cache_du_counts_a_tree_1100_levels_deep(deep_tmp, capsys):
    cache = deep_tmp / "cache"
    _deep(cache / "toolchains", 1100)
    rc = main(["--cache", str(cache), "--json", "cache", "du"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    entry = json.loads(out.out)["entries"]["toolchains"]
    assert entry["bytes"] == 3 and entry["files"] == 1


def test_cache_du_counts_a_tree_deeper_than_path_max(deep_tmp, capsys):
    """2100 levels: its deepest path is over 4096 bytes, so a walk that builds paths cannot
    list the bottom (ENAMETOOLONG); one that opens each folder from its parent can."""
    cache = deep_tmp / "cache"
    _deep(cache / "kernels" / "w", 2100)
    (cache / "kernels" / "small").write_bytes(b"12")
    rc = main(["--cache", str(cache), "--json", "cache", "du"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    entry = json.loads(out.out)["entries"]["kernels"]
    assert (entry["bytes"], entry["files"]) == (5, 2)
    assert [(c["name"], c["bytes"]) for c in entry["children"]] == [("w", 3), ("small", 2)]


def test_cache_du_breaks_each_folder_down_largest_first_and_never_follows_or_opens(
    tmp_path, capsys
):
    """Each entry under each top-level folder with its bytes and files, largest first; a
    link (to a 1 MiB file outside) is counted as a link, not followed; a FIFO is counted,
    never opened (opening it would block); a folder that cannot be listed is named."""
    cache = tmp_path / "cache"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * (1 << 20))
    tc = cache / "toolchains"
    (tc / "cuda-12.4.131" / "bin").mkdir(parents=True)
    (tc / "cuda-12.4.131" / "bin" / "nvcc").write_bytes(b"n" * 3000)
    (tc / "downloads").mkdir()
    (tc / "downloads" / "a.deb").write_bytes(b"d" * 5000)
    (tc / "downloads" / "b.whl").write_bytes(b"w" * 1000)
    (tc / "apt").mkdir()
    (tc / "apt" / "out").symlink_to(outside)  # a link out of the cache: never followed
    os.mkfifo(tc / "apt" / "pipe")
    (cache / "repos" / "x.git").mkdir(parents=True)
    (cache / "repos" / "x.git" / "HEAD").write_bytes(b"ref: refs/heads/main\n")
    (cache / "repos" / "shut").mkdir()
    (cache / "repos" / "shut" / "f").write_bytes(b"hidden")
    (cache / "CACHEDIR.TAG").write_bytes(b"Signature: 8a477f597d28d172789f06886806bc55\n")
    (cache / "repos" / "shut").chmod(0)
    try:
        rc = main(["--cache", str(cache), "--json", "cache", "du"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        doc = json.loads(out.out)
        assert doc["largest_first"] == ["toolchains", "CACHEDIR.TAG", "repos"]
        tcs = doc["entries"]["toolchains"]
        link = len(os.readlink(tc / "apt" / "out"))
        assert tcs["bytes"] == 9000 + link and tcs["files"] == 5
        assert tcs["links"] == 1 and tcs["special"] == 1 and tcs["folder"] is True
        assert [(c["name"], c["bytes"], c["files"]) for c in tcs["children"]] == [
            ("downloads", 6000, 2), ("cuda-12.4.131", 3000, 1), ("apt", link, 2)]  # fmt: skip
        repos = doc["entries"]["repos"]
        if os.geteuid() != 0:  # root lists a folder of mode 000 all the same
            assert repos["unreadable"] == 1
            assert [c["name"] for c in repos["children"]] == ["x.git", "shut"]
        assert doc["total"] == sum(e["bytes"] for e in doc["entries"].values())
        # The human listing: the same order, the top N under each folder, the rest summed.
        rc = main(["--cache", str(cache), "cache", "du", "--top", "1"])
        text = capsys.readouterr().out.splitlines()
        assert rc == 0
        assert text[0].endswith("toolchains/  (5 files; 1 link(s), not followed; "
                                "1 FIFO/socket/device(s), not opened)")  # fmt: skip
        assert text[1].endswith("    downloads/  (2 files)")
        assert text[2].endswith("... 2 more (--top 0 lists all)")
        assert text[-1].endswith(f"total in {cache}")
    finally:
        (cache / "repos" / "shut").chmod(0o755)


def test_cache_du_counts_a_hard_linked_file_once_where_it_meets_it_first(tmp_path, capsys):
    """A toolkit's -dev variant hard-links the plain tree's files: on disk once, so counted
    once (in the tree the sorted walk reaches first), the other links as ``shared``; a
    file linked from outside the cache is counted where it is (its other link is not
    there to be met), and a plain copy is counted twice."""
    cache = tmp_path / "cache"
    tc = cache / "toolchains"
    for tree in ("cuda-12.4.131", "cuda-12.4.131-dev"):
        (tc / tree / "bin").mkdir(parents=True)
    (tc / "cuda-12.4.131" / "bin" / "nvcc").write_bytes(b"n" * 7000)
    os.link(tc / "cuda-12.4.131" / "bin" / "nvcc", tc / "cuda-12.4.131-dev" / "bin" / "nvcc")
    (tc / "cuda-12.4.131-dev" / "bin" / "own").write_bytes(b"o" * 500)
    (tc / "cuda-12.4.131-dev" / "bin" / "copy").write_bytes(b"n" * 7000)
    (tmp_path / "outside").write_bytes(b"x" * 300)
    os.link(tmp_path / "outside", tc / "cuda-12.4.131-dev" / "linked-from-outside")
    rc = main(["--cache", str(cache), "--json", "cache", "du"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    tcs = json.loads(out.out)["entries"]["toolchains"]
    assert tcs["bytes"] == 7000 + 500 + 7000 + 300 and tcs["shared"] == 7000
    kids = {c["name"]: c for c in tcs["children"]}
    assert kids["cuda-12.4.131"]["bytes"] == 7000 and "shared" not in kids["cuda-12.4.131"]
    dev = kids["cuda-12.4.131-dev"]
    assert (dev["bytes"], dev["shared"], dev["files"]) == (7800, 7000, 4)
    rc = main(["--cache", str(cache), "cache", "du"])
    text = capsys.readouterr().out.splitlines()
    assert any(line.strip().startswith("7.6 KiB      cuda-12.4.131-dev/") and
               line.endswith("6.8 KiB more in hard links to files counted above)")
               for line in text), text  # fmt: skip


def test_cache_clean_removes_a_tree_1100_levels_deep(deep_tmp, capsys):
    cache = deep_tmp / "cache"
    cache_marker.mark(cache)
    _deep(cache / "toolchains", 1100)
    rc = main(["--cache", str(cache), "cache", "clean", "--yes"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert not (cache / "toolchains").exists()
    assert "removed 1 entr(ies)" in _flat(out.out + out.err)


# --------------------------------------------------------------------------- remove_tree


def test_remove_tree_takes_a_tree_3000_levels_deep(tmp_path):
    """Deeper than the interpreter's recursion limit (1000) and than the descriptors a
    process may hold (1024 is the usual soft limit; the tree goes past a soft limit up to
    4900, not past 20000 or a container's million, which would take minutes to make):
    neither a stack nor a descriptor per level."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    root = _deep(tmp_path / "t", soft + 100 if 2900 <= soft < 4800 else 3000)
    fsutil.remove_tree(root)
    assert not root.exists() and list(tmp_path.iterdir()) == []


def test_remove_tree_does_not_follow_links_or_open_fifos(tmp_path):
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "keep").write_text("kept")
    tree = tmp_path / "tree" / "a" / "b"
    tree.mkdir(parents=True)
    (tree / "to-dir").symlink_to(outside)
    (tree / "to-file").symlink_to(outside / "sub" / "keep")
    (tree / "dangling").symlink_to(tmp_path / "nowhere")
    (tree / "loop").symlink_to("loop")
    os.mkfifo(tree / "fifo")  # opened, it would block: the 60 s timeout fails the test
    (tree / "caf\u00e9 \x1b[31m\n").mkdir()  # non-ASCII and control characters in a name
    fsutil.remove_tree(tmp_path / "tree")
    assert not (tmp_path / "tree").exists()
    assert (outside / "sub" / "keep").read_text() == "kept"


def test_remove_tree_on_a_link_removes_the_link_only(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    fsutil.remove_tree(tmp_path / "link")
    assert not (tmp_path / "link").is_symlink()
    assert (tmp_path / "real" / "f").read_text() == "x"


def test_remove_tree_hoists_past_names_already_taken(tmp_path, monkeypatch):
    """The top folder already holds what the hoisted folders would be renamed to: a file,
    a full folder and an empty one; every one of them goes, and nothing is lost on the
    way (the full folder's content is not swallowed by a rename over it)."""
    top = tmp_path / "top"
    inner = top / "x" / "y" / "z"
    inner.mkdir(parents=True)
    (inner / "f").write_text("z")
    pid = os.getpid()
    (top / f".pinwheel-rm.{pid}.0").write_text("a file")
    (top / f".pinwheel-rm.{pid}.1").mkdir()
    (top / f".pinwheel-rm.{pid}.1" / "g").write_text("full")
    (top / f".pinwheel-rm.{pid}.2").mkdir()
    fsutil.remove_tree(top)
    assert not top.exists()


def test_remove_tree_missing_is_not_an_error_and_a_file_goes(tmp_path):
    fsutil.remove_tree(tmp_path / "missing")
    (tmp_path / "f").write_text("x")
    fsutil.remove_tree(tmp_path / "f")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_remove_tree_reports_what_it_cannot_remove(tmp_path):
    locked = tmp_path / "t" / "locked"
    locked.mkdir(parents=True)
    (locked / "f").write_text("x")
    locked.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            fsutil.remove_tree(tmp_path / "t")
        fsutil.remove_tree(tmp_path / "t", ignore_errors=True)  # no raise
        assert (locked / "f").exists()
    finally:
        locked.chmod(0o700)


@FUZZ
@given(
    shape=st.lists(
        st.tuples(
            st.lists(st.sampled_from(["a", "b", "\u00e9", "\x7f", " "]), max_size=6),
            st.sampled_from(["dir", "file", "link-out", "fifo"]),
        ),
        max_size=15,
    )
)
def test_fuzz_remove_tree_leaves_nothing_and_touches_nothing_outside(tmp_path, shape):
    import uuid

    base = tmp_path / uuid.uuid4().hex
    outside = base / "outside"
    outside.mkdir(parents=True)
    (outside / "keep").write_text("kept")
    root = base / "root"
    root.mkdir()
    for parts, kind in shape:
        where = root.joinpath(*parts) if parts else root
        if where.exists() and not where.is_dir() or where.is_symlink():
            continue
        where.mkdir(parents=True, exist_ok=True)
        name = where / f"n{len(list(where.iterdir()))}"
        if kind == "dir":
            name.mkdir()
        elif kind == "file":
            name.write_bytes(b"x")
        elif kind == "link-out":
            name.symlink_to(outside)
        else:
            os.mkfifo(name)
    fsutil.remove_tree(root)
    assert not root.exists()
    assert (outside / "keep").read_text() == "kept"


@FUZZ
@given(
    shape=st.lists(st.tuples(st.integers(0, 5), st.binary(max_size=64)), min_size=0, max_size=12)
)
def test_fuzz_size_walk_counts_every_file_once(tmp_path, shape):
    """Files at random depths: the walk's totals are the sum of what was written."""
    import uuid

    root = tmp_path / uuid.uuid4().hex
    root.mkdir()
    total = 0
    for i, (depth, data) in enumerate(shape):
        folder = root.joinpath(*(["x"] * depth))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i}").write_bytes(data)
        total += len(data)
    assert cachetool._size(root) == (total, len(shape))


# --------------------------------------------------------------------------- --reuse-from


def _candidate(files: dict[str, str]) -> reuse.Candidate:
    rec = {"complete": True, "identity": {}, "files": files}
    return reuse.Candidate(Path("x.whl"), "0" * 64, {"compiled_inputs": rec}, "release/")


def test_reuse_refuses_a_compiled_input_of_6_gib_by_its_size(tmp_path):
    source = tmp_path / "tree"
    source.mkdir()
    _sparse(source / "big.bin", 6 << 30)
    with pytest.raises(reuse.ReuseError) as err:
        reuse.unchanged(_candidate({"big.bin": "0" * 40}), source, {})
    assert "6442450944 bytes, more than the" in err.value.what and err.value.next


def test_reuse_counts_a_compiled_input_that_is_a_fifo_as_changed(tmp_path):
    source = tmp_path / "tree"
    source.mkdir()
    _fifo(source / "in.h")
    ok, why, _ = reuse.unchanged(_candidate({"in.h": "0" * 40}), source, {})
    assert not ok and "in.h" in why


def test_blob_id_refuses_a_fifo(tmp_path):
    with pytest.raises(reuse.ReuseError, match="FIFO"):
        reuse.blob_id(_fifo(tmp_path / "in.h"))


@pytest.mark.parametrize("name", ["../outside.h", "/etc/hostname", "a//b"])
def test_reuse_refuses_a_compiled_input_outside_the_tree(name, tmp_path):
    source = tmp_path / "tree"
    source.mkdir()
    (tmp_path / "outside.h").write_text("x")
    with pytest.raises(reuse.ReuseError, match="outside the tree"):
        reuse.unchanged(_candidate({name: "0" * 40}), source, {})


@FUZZ
@given(data=st.binary(max_size=3000))
def test_fuzz_blob_id_is_gits(tmp_path, data):
    path = tmp_path / "blob"
    path.write_bytes(data)
    want = (
        subprocess.run(
            ["git", "hash-object", "--no-filters", str(path)], capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )
    assert reuse.blob_id(path) == want

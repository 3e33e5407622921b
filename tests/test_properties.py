"""Property-based tests (Hypothesis) for the parsers and confinement functions at the trust
boundaries of docs/SECURITY.md: manifest values, archive trees with link chains, git
configs, server answers, receipts, and what is printed or written into Markdown.

The oracle for link resolution is the kernel itself: each generated tree is made on
disk and ``os.path.realpath`` says where a link really leads. Example counts are modest
(CI runs on 2 cores) and deadlines off (file system and git timings vary).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pinwheel import archive, confine, documents, markup, untrusted, validate
from pinwheel.errors import PinwheelError
from pinwheel.printable import shown

FAST = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
SLOW = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip

NAMES = st.sampled_from(["a", "b", "c", "up", "d"])
STEPS = st.sampled_from(["a", "b", "c", "up", "d", ".", ".."])
TARGETS = st.lists(STEPS, min_size=1, max_size=5).map("/".join)
# a tree: folders (paths of names) and links (path -> relative target)
TREES = st.tuples(
    st.lists(st.lists(NAMES, min_size=1, max_size=3).map("/".join), max_size=4),
    st.dictionaries(st.lists(NAMES, min_size=1, max_size=2).map("/".join), TARGETS,
                    min_size=1, max_size=4),
)  # fmt: skip


def _make(root: Path, dirs: list[str], links: dict[str, str]) -> dict[str, str]:
    """Make the tree on disk; returns the links that could be made (a link whose folder
    is a link, or that collides with a folder, is dropped, as a tree cannot hold it)."""
    made: dict[str, str] = {}
    for d in dirs:
        try:
            (root / d).mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            pass
    for name, target in sorted(links.items()):
        path = root / name
        try:
            if os.path.islink(path.parent) or os.path.lexists(path):
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if os.path.islink(path.parent) or not path.parent.resolve().is_relative_to(
                root.resolve()
            ):
                continue
            os.symlink(target, path)
            made[name] = target
        except (FileExistsError, NotADirectoryError, OSError):
            continue
    return made


def _inside(root: Path, path: str) -> bool:
    real = os.path.realpath(path)
    base = os.path.realpath(root)
    return real == base or real.startswith(base + os.sep)


@FAST
@given(TREES)
def test_resolve_agrees_with_the_kernel_on_link_chains(tree) -> None:
    """Whatever :func:`confine.resolve` accepts, the kernel resolves inside the root; what
    leads out (chains included) it refuses."""
    dirs, links = tree
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        made = _make(root, dirs, links)
        for name in made:
            try:
                parts = confine.resolve(name, confine.disk_readlink(root), root=root)
            except confine.Escape as exc:
                if "loop" in exc.what:
                    continue
                assert not _inside(root, str(root / name)), (made, name, exc.what)
            else:
                assert _inside(root, str(root / name)), (made, name)
                assert os.path.realpath(root.joinpath(*parts)) == os.path.realpath(root / name)


@FAST
@given(TREES, st.lists(NAMES, min_size=1, max_size=3).map("/".join))
def test_a_tree_archive_never_materialises_outside(tree, file_name) -> None:
    """Any tar of files and links: the one archive reader refuses it or writes only under
    the destination, with every link it made resolving inside."""
    dirs, links = tree
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, target in links.items():
            info = tarfile.TarInfo(f"t/{name}")
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        data = b"payload"
        info = tarfile.TarInfo(f"t/{file_name}")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "dest"
        outside = Path(tmp) / "outside"
        outside.mkdir()
        buf.seek(0)
        try:
            with tarfile.open(fileobj=buf) as tar:
                archive.extract_tar(tar, dest, "prop", inner_links=True)
        except (archive.ArchiveError, confine.Escape):
            pass
        assert list(outside.iterdir()) == []
        for path in dest.rglob("*") if dest.exists() else ():
            if path.is_symlink():
                assert _inside(dest, str(path)), path


ENTRY = st.tuples(
    st.lists(NAMES, min_size=1, max_size=3).map("/".join),
    st.one_of(st.none(), TARGETS, st.just("/victim")),
)


@SLOW
@given(st.lists(st.lists(ENTRY, max_size=5), min_size=1, max_size=3))
def test_workspace_sync_never_touches_outside(rounds) -> None:
    """Successive syncs of arbitrary entries (files and links, absolute ones included):
    refused or confined; a folder beside the workspace is never written or emptied."""
    from pinwheel.compile import workspace

    with tempfile.TemporaryDirectory() as tmp:
        victim = Path(tmp) / "victim"
        (victim / "a").mkdir(parents=True)
        (victim / "a" / "keep").write_text("1")
        dest, listing = Path(tmp) / "ws", Path(tmp) / "listing.json"
        for entries in rounds:
            items = []
            for rel, link in entries:
                target = str(victim) if link == "/victim" else link
                items.append(workspace.Entry(rel, b"x", link=target))
            try:
                workspace.sync(dest, items, listing)
            except (confine.Escape, OSError):
                pass
        assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == ["a", "a/keep"]


# --------------------------------------------------------------------------- manifest values

TEXT = st.text(max_size=40)


@FAST
@given(TEXT)
def test_container_values_are_plain_or_refused(value: str) -> None:
    for check, allowed in (
        (validate.devices, r"[0-9A-Za-z,\-]+"),
        (validate.mount_point, r"/[A-Za-z0-9._/-]+"),
        (validate.host_path, r"/[^:,\x00-\x1f\x7f]*"),
        (validate.host, r"[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.%A-Za-z_\-]+\]"),
    ):
        try:
            out = check(value)
        except ValueError:
            continue
        assert re.fullmatch(allowed, out), (check.__name__, value, out)
        assert not out.startswith("-")


KEYS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)


@FAST
@given(st.dictionaries(KEYS, st.one_of(st.integers(), TEXT, st.booleans()), max_size=4), KEYS)
def test_manifest_loading_never_crashes(extra, table) -> None:
    """Any keys and values (control characters, non-ASCII, huge numbers) in any table:
    the manifest loads or is a PinwheelError, never another exception."""
    from pinwheel.manifest import loads

    lines = ["[upstream]", 'url = "https://example.invalid/x.git"',
             'commit = "0123456789abcdef0123456789abcdef01234567"', 'branch = "main"',
             f"[{json.dumps(table)}]"]  # fmt: skip
    lines += [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in extra.items()]
    try:
        loads("\n".join(lines).encode(), Path("manifest.toml"))
    except PinwheelError:
        pass


# --------------------------------------------------------------------------- git configs

CONFIG_KEYS = st.sampled_from(
    sorted(__import__("pinwheel.source.gitpolicy", fromlist=["x"]).SAFE_REPO_KEYS)
    + ["core.fsmonitor", "core.alternateRefsCommand", "include.path", "filter.x.smudge",
       "remote.origin.uploadpack", "core.sshCommand", "includeIf.gitdir:/.path", "user.name"]
)  # fmt: skip


@SLOW
@given(st.lists(st.tuples(CONFIG_KEYS, st.sampled_from(["config", "config.worktree"])),
                max_size=3))  # fmt: skip
def test_repository_config_is_refused_exactly_when_a_key_is_not_whitelisted(entries) -> None:
    from pinwheel.source import gitpolicy

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "r.git"
        subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
        base = {k.lower() for k in _keys(repo / "config")}
        for key, file in entries:
            subprocess.run(["git", "config", "--file", str(repo / file), key, "1"], check=True)
        keys = {k.lower() for k, _ in entries} | base
        bad = keys - gitpolicy.SAFE_REPO_KEYS
        try:
            gitpolicy.check_repo_config(repo)
        except PinwheelError:
            assert bad, entries
        else:
            assert not bad, entries


def _keys(path: Path) -> list[str]:
    out = subprocess.run(["git", "config", "--file", str(path), "--list", "--name-only"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.split()


# --------------------------------------------------------------------------- answers, receipts

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)
ANSWERS = [documents.ModelsAnswer, documents.CompletionAnswer, documents.TokenizeAnswer,
           documents.VersionAnswer]  # fmt: skip


@FAST
@given(JSON, st.sampled_from(ANSWERS))
def test_server_answers_decode_or_fail_cleanly(value, cls) -> None:
    try:
        untrusted.decode(cls, value, untrusted.SERVER, "prop")
    except PinwheelError:
        pass
    try:
        documents.stream_event(value, "prop")
    except PinwheelError:
        pass
    untrusted.parse_metrics(json.dumps(value).encode(), "prop")


@FAST
@given(st.one_of(JSON, st.dictionaries(st.sampled_from(
    ["schema", "components", "wheels", "tree", "torch", "steps", "source_date_epoch"]),
    JSON, max_size=5)))  # fmt: skip
def test_receipts_decode_or_fail_cleanly(value) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "provenance.json"
        if isinstance(value, dict):
            value = {"schema": "pinwheel.provenance/1", **value}
        path.write_text(json.dumps(value))
        try:
            doc, _ = documents.read_provenance(path, "pinwheel.provenance/1")
        except PinwheelError:
            return
        for c in doc.components:
            assert re.fullmatch(r"[0-9a-f]{64}", c.sha256) and "/" not in c.wheel


# --------------------------------------------------------------------------- what is shown

UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@FAST
@given(st.text(max_size=80))
def test_printed_text_holds_no_control_or_bidi_character(text: str) -> None:
    out = shown(text)
    assert not UNSAFE.search(out)
    if not UNSAFE.search(text) and "://" not in text and "token" not in text.lower():
        assert out == text  # safe text is shown as it is


@FAST
@given(st.text(max_size=80))
def test_markdown_text_is_one_inert_line(text: str) -> None:
    out = markup.text(text)
    assert "\n" not in out and "\r" not in out and not UNSAFE.search(out)
    assert not re.search(r"(?<!\\)[|<>\[\]`]", out.replace("\\\\", "")), out


def test_hypothesis_is_pinned_in_the_test_extra() -> None:
    import hypothesis

    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert f'"hypothesis=={hypothesis.__version__}"' in text


if shutil.which("git") is None:  # pragma: no cover - CI installs git
    pytestmark = pytest.mark.skip(reason="needs git")

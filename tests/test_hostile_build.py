"""Hostile trees and paths on the build side: export exactly the pinned tree, reuse a kept
source only when its content is the recorded one, one build per workspace at a time,
and a cache path with a space kept as one compiler argument.

Real parts: bare git repositories with .gitattributes rules (git archive applies them
unless pinwheel neutralises them), files edited to the same size with their mtime reset,
two processes on one workspace lock, gcc driven by CMake + Ninja with the flags pinwheel
exports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pinwheel.compile import canonical, keptsources, sources, workspace
from pinwheel.compile.sources import Supplied, tree_digest
from pinwheel.compile.workspace import SOURCE_MTIME
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.manifest.build import BuildSource
from pinwheel.source.export import export_tree

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c",
       "init.defaultBranch=main"]  # fmt: skip


def _commit(tmp: Path, files: dict[str, bytes]) -> tuple[Path, str, str]:
    """A bare repository holding one commit of ``files``: (repo, commit, tree)."""
    work = tmp / "work"
    subprocess.run([*GIT, "init", "-q", str(work)], check=True)
    for name, data in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(data)
    # --no-renormalize off: the blobs are the bytes written (no eol conversion on add)
    subprocess.run([*GIT, "-C", str(work), "-c", "core.autocrlf=false", "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(work), "commit", "-qm", "t"], check=True)
    bare = tmp / "repo.git"
    subprocess.run([*GIT, "init", "-q", "--bare", str(bare)], check=True)  # a config as
    subprocess.run([*GIT, "-C", str(work), "push", "-q", str(bare), "HEAD:refs/heads/main"],
                   check=True)  # pinwheel's cache repositories have: no remote  # fmt: skip
    head = subprocess.run([*GIT, "-C", str(bare), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    tree = subprocess.run([*GIT, "-C", str(bare), "rev-parse", "HEAD^{tree}"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    return bare, head, tree


def _blob(repo: Path, commit: str, name: str) -> bytes:
    return subprocess.run([*GIT, "-C", str(repo), "cat-file", "blob", f"{commit}:{name}"],
                          capture_output=True, check=True).stdout  # fmt: skip


@dataclass(frozen=True)
class _Replayed:
    """What export_tree reads of a replay result (the repository, head and tree)."""

    repo_path: Path
    head: str
    tree: str


# --------------------------------------------------------------------------- export


# case -> (.gitattributes line, file, its bytes)
ATTRIBUTES = {
    "export-ignore": ("secret.txt export-ignore", "secret.txt", b"kept\n"),
    "export-subst": ("sub.txt export-subst", "sub.txt", b"id $Format:%H$\n"),
    "ident": ("id.c ident", "id.c", b"/* $Id$ */\n"),
    "eol=crlf": ("crlf.txt text eol=crlf", "crlf.txt", b"a\nb\n"),
    "directory export-ignore": ("docs/ export-ignore", "docs/x.md", b"# x\n"),
    "all export-ignore": ("* export-ignore", "any.txt", b"x\n"),
}


@pytest.mark.parametrize("case", sorted(ATTRIBUTES))
def test_export_is_exactly_the_pinned_trees_blobs(case, tmp_path):
    line, name, data = ATTRIBUTES[case]
    repo, head, tree = _commit(tmp_path, {".gitattributes": (line + "\n").encode(), name: data})
    out = export_tree(_Replayed(repo, head, tree), tmp_path / "out")
    assert (out / name).read_bytes() == _blob(repo, head, name) == data
    assert (out / ".gitattributes").read_bytes() == _blob(repo, head, ".gitattributes")


@pytest.mark.parametrize("case", sorted(ATTRIBUTES))
def test_a_build_source_export_is_exactly_its_blobs(case, tmp_path):
    line, name, data = ATTRIBUTES[case]
    repo, head, _ = _commit(tmp_path, {".gitattributes": (line + "\n").encode(), name: data})
    dest = tmp_path / "dep"
    dest.mkdir()
    sources._archive(repo, head, dest, (), what="[[build.source]] x")
    assert (dest / name).read_bytes() == data


ATTR_WORDS = ["export-ignore", "export-subst", "ident", "text", "eol=crlf", "-text", "binary"]


@FUZZ
@given(
    rules=st.lists(st.tuples(st.sampled_from(["*", "a.txt", "b/*", "*.c"]),
                             st.sampled_from(ATTR_WORDS)), max_size=4),
    body=st.binary(max_size=40).filter(lambda b: b"\r" not in b),
)  # fmt: skip
def test_fuzz_no_attribute_changes_what_is_exported(tmp_path_factory, rules, body):
    tmp = tmp_path_factory.mktemp("fz")
    attributes = "".join(f"{p} {w}\n" for p, w in rules).encode()
    files = {".gitattributes": attributes, "a.txt": body + b"$Format:%H$ $Id$\n",
             "b/x.c": b"int x;\n" + body}  # fmt: skip
    repo, head, tree = _commit(tmp, files)
    out = export_tree(_Replayed(repo, head, tree), tmp / "out")
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert got == {n: _blob(repo, head, n) for n in files}


# --------------------------------------------------------------------------- kept build sources


def _source(name: str = "dep") -> BuildSource:
    return BuildSource(name=name, url="https://example.invalid/dep.git", commit="a" * 40,
                       ref="v1", variables=("DEP_SRC_DIR",), patches=(), submodules=(),
                       exclude=(), omit=False, reason=None, used="yes")  # fmt: skip


def _exported(work: Path, files: dict[str, bytes]) -> Supplied:
    """A source as the export leaves it: its files at the workspace's fixed mtime."""
    final = work / "deps" / "dep"
    for name, data in files.items():
        (final / name).parent.mkdir(parents=True, exist_ok=True)
        (final / name).write_bytes(data)
        os.utime(final / name, (SOURCE_MTIME, SOURCE_MTIME))
    return Supplied(name="dep", path=final, url="https://example.invalid/dep.git",
                    commit="a" * 40, ref="v1", tree="b" * 40, sha256=tree_digest(final),
                    variables=("DEP_SRC_DIR",))  # fmt: skip


def test_a_kept_source_edited_to_the_same_size_with_its_mtime_reset_is_not_reused(tmp_path):
    work, project = tmp_path / "work", tmp_path / "project"
    project.mkdir()
    src = _source()
    supplied = _exported(work, {"kernel.cu": b"int f() { return 1; }\n", "x.h": b"#pragma once\n"})
    keptsources.remember(work, keptsources.key_of(src, project), supplied)
    again = keptsources.kept(work, src, project)
    assert again is not None and again.sha256 == supplied.sha256  # untouched: reused
    edited = work / "deps" / "dep" / "kernel.cu"
    edited.write_bytes(b"int f() { return 2; }\n")  # same size
    os.utime(edited, (SOURCE_MTIME, SOURCE_MTIME))  # and the mtime put back
    assert keptsources.kept(work, src, project) is None


def test_a_kept_source_record_through_a_link_a_fifo_or_for_another_source_is_no_record(
    tmp_path,
):
    work, project = tmp_path / "work", tmp_path / "project"
    project.mkdir()
    src = _source()
    supplied = _exported(work, {"kernel.cu": b"int f;\n"})
    keptsources.remember(work, keptsources.key_of(src, project), supplied)
    record = keptsources.record_path(work, "dep")
    good = record.read_bytes()
    assert keptsources.kept(work, src, project) is not None
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(good)
    record.unlink()
    record.symlink_to(elsewhere)  # the same record, through a link: never followed
    assert keptsources.kept(work, src, project) is None
    record.unlink()
    os.mkfifo(record)  # no writer: opening it to read would block
    assert keptsources.kept(work, src, project) is None
    record.unlink()
    doc = json.loads(good)
    for forged in ({"name": "other"}, {"url": "https://elsewhere.invalid/x.git"},
                   {"sha256": "\x1b[2J" + "0" * 60}, {"sha256": "٣" * 64}):  # fmt: skip
        record.write_text(json.dumps({**doc, "supplied": {**doc["supplied"], **forged}}))
        assert keptsources.kept(work, src, project) is None, forged
    record.write_bytes(good)
    assert keptsources.kept(work, src, project) is not None


@FUZZ
@given(data=st.binary(min_size=1, max_size=64), at=st.integers(0, 63), byte=st.integers(0, 255))
def test_fuzz_a_kept_source_is_reused_only_with_its_recorded_bytes(tmp_path_factory, data, at,
                                                                   byte):  # fmt: skip
    tmp = tmp_path_factory.mktemp("kept")
    work, project = tmp / "work", tmp / "project"
    project.mkdir()
    src = _source()
    supplied = _exported(work, {"f.c": data})
    keptsources.remember(work, keptsources.key_of(src, project), supplied)
    changed = bytearray(data)
    changed[at % len(data)] = byte
    path = work / "deps" / "dep" / "f.c"
    path.write_bytes(bytes(changed))
    os.utime(path, (SOURCE_MTIME, SOURCE_MTIME))
    reused = keptsources.kept(work, src, project)
    # Reused only with the recorded bytes; a rewrite, even of the same bytes, is exported
    # again (its ctime moved: the stamp no longer says the bytes are the recorded ones).
    assert reused is None or bytes(changed) == data


# --------------------------------------------------------------------------- the workspace lock

HOLD = """
import sys, time
from pathlib import Path
from pinwheel.compile import workspace
with workspace.locked(Path(sys.argv[1])):
    Path(sys.argv[2]).write_text("held")
    time.sleep(float(sys.argv[3]))
    Path(sys.argv[2]).write_text("done")  # still holding: whoever gets it next sees this
"""


def _holder(root: Path, flag: Path, seconds: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root), str(flag), str(seconds)],
                            env=env)  # fmt: skip
    deadline = time.monotonic() + 60
    while not flag.exists():  # the other build holds the workspace from here on
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def test_a_second_build_on_a_held_workspace_fails_clearly_after_waiting(tmp_path):
    root = tmp_path / "cache" / "build" / "engine"
    proc = _holder(root, tmp_path / "flag", 30)
    try:
        with pytest.raises(PinwheelError) as err, workspace.locked(root, timeout_s=0.5):
            pass
        assert "another pinwheel build has held the workspace" in err.value.what
        assert err.value.next and "--cache" in err.value.next
    finally:
        proc.kill()
        proc.wait()


def test_a_second_build_waits_and_then_gets_the_workspace(tmp_path):
    root = tmp_path / "cache" / "build" / "engine"
    proc = _holder(root, tmp_path / "flag", 1.0)
    try:
        with workspace.locked(root, timeout_s=60) as held:
            assert (tmp_path / "flag").read_text() == "done"  # only once the first let go
            assert held == root
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- prefix maps


@pytest.mark.parametrize("name", ["cache with space", "it's", 'quo"te', "tab\there"])
def test_prefix_map_keeps_a_path_with_a_space_one_argument(name, tmp_path):
    """A C file under a cache path with a space, compiled by CMake + Ninja with the CFLAGS
    prefix_map_env exports: __FILE__ in the object carries the canonical path, the real
    one nowhere (the map reached gcc as one argument)."""
    if not (shutil.which("cmake") and shutil.which("ninja") and shutil.which("gcc")):
        pytest.skip("needs cmake, ninja and gcc")
    real = tmp_path / name / "src"
    real.mkdir(parents=True)
    (real / "probe.c").write_text("const char *where = __FILE__;\n")
    (real / "CMakeLists.txt").write_text(textwrap.dedent("""\
        cmake_minimum_required(VERSION 3.16)
        project(probe C)
        add_library(probe OBJECT probe.c)
        """))  # fmt: skip
    if '"' in name:  # nvcc's NVCC_APPEND_FLAGS cannot say it: refused, naming the next step
        with pytest.raises(UsageError, match="double quote") as err:
            canonical.prefix_map_env({}, [(str(real), "/canonical/src")])
        assert "--cache" in (err.value.next or "")
        return
    env = {**os.environ, **canonical.prefix_map_env({}, [(str(real), "/canonical/src")])}
    build = tmp_path / "build"
    subprocess.run(["cmake", "-G", "Ninja", "-S", str(real), "-B", str(build)], env=env,
                   check=True, capture_output=True)  # fmt: skip
    done = subprocess.run(["cmake", "--build", str(build)], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (obj,) = list(build.rglob("probe.c.o"))
    blob = obj.read_bytes()
    assert b"/canonical/src/probe.c" in blob and str(real).encode() not in blob


def test_prefix_map_leaves_a_plain_path_as_it_was():
    env = canonical.prefix_map_env({"CFLAGS": "-O2"}, [("/cache/x", "/canonical/x")])
    assert env["CFLAGS"] == "-O2 -ffile-prefix-map=/cache/x=/canonical/x"
    assert env["NVCC_APPEND_FLAGS"] == "-Xcompiler=-ffile-prefix-map=/cache/x=/canonical/x"

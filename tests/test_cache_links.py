"""A kept cache whose folders someone replaced by links (docs/SECURITY.md, "Cache
contents"; issue 49 item 3): every write under the cache goes folder by folder from the
cache root, so a link planted at any folder level leads nothing out.

One real cache is made once: the tiny project's stack replayed by ``pinwheel run`` (the
cache repository, its replay stamp, ``keys/``, ``locks/``) and the engine built from it
into its kept workspace (``build/``, ``memo/``, ``hooks/``, the compiler cache and its
object store, ``build.log``). Each case copies that cache, replaces ONE of its folders by
a link to a copy of that folder outside the cache (the "victim", so the run finds what it
expects through the link and would update it), runs the same replay and two builds again
(a warm one, then a cold ``--no-cache`` one), and checks that nothing in the victim was
created, changed or removed, and that each command either succeeded or stopped with a
PinwheelError (never another exception). Every folder of the made cache is a case:
:data:`LEVELS` names them by pattern, and a test checks that none is left out.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from gitfixture import UPSTREAM_URL
from pinwheel.cli import main
from pinwheel.compile.pipeline import build as run_build
from pinwheel.errors import PinwheelError
from test_build import Tiny, make_tiny, request

pytestmark = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("objcopy")), reason="needs gcc and objcopy"
)

# Every folder the replay and the build leave in the cache, by pattern (``*``: one name;
# a folder is the case of the first pattern it matches). The folders pinwheel's own code
# writes into (each bucket's root, the workspace, memos, stamps, locks, the compiler
# cache's run folder) run in every test session; the folders below them that only the
# builder, git or sccache write (the export's build tree, git's objects and refs, the
# store's entries) are ``slow``. Measured on a 2-core machine shared with other work: the
# whole file 3 min 13 s (1 min 53 s of CPU), without the slow cases 1 min 42 s (1 min 2 s).
FAST = (
    "build",
    "build/.home",
    "build/*",  # the engine's kept workspace (one per manifest): export, build.log, dist/
    "build/*/dist",
    "hooks",
    "hooks/*",
    "keys",
    "locks",
    "memo",
    "memo/*",  # check, tag, stamp and members memos
    "repos",
    "repos/*.git",
    "repos/*.git/pinwheel",  # replay stamps
    "repos/*.git/objects",
    "sccache",
    "sccache-run",
    "sccache-run/*",
)
SLOW = (
    "build/*/src",
    "build/*/src/*",
    "build/*/src/build/*",
    "build/*/src/build/*/*",
    "hooks/*/__pycache__",
    "repos/*.git/*",
    "repos/*.git/objects/*",
    "repos/*.git/refs/*",
    "repos/*.git/refs/pinwheel/*",
    "repos/*.git/refs/pinwheel/pull/*",
    "sccache/*",
    "sccache/*/*",
    "sccache/*/*/*",
    "sccache/*/*/*/*",
)
LEVELS = FAST + SLOW


def _folders(root: Path) -> list[str]:
    found = []
    for here, dirs, _files in os.walk(root):
        for d in dirs:
            found.append(str((Path(here) / d).relative_to(root)))
    return sorted(found)


def _matches(rel: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(rel, pattern) and rel.count("/") == pattern.count("/")


def _cases(root: Path, pattern: str) -> list[str]:
    """The folders whose first matching pattern in :data:`LEVELS` is ``pattern``."""
    return [rel for rel in _folders(root)
            if next((p for p in LEVELS if _matches(rel, p)), None) == pattern]  # fmt: skip


def _snapshot(folder: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``folder``: its kind, mtime (ns) and content digest."""
    seen = {}
    for here, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(here) / name
            st = p.lstat()
            if p.is_symlink():
                seen[str(p.relative_to(folder))] = ("link", st.st_mtime_ns, os.readlink(p))
            elif p.is_dir():
                seen[str(p.relative_to(folder))] = ("dir", st.st_mtime_ns, "")
            else:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                seen[str(p.relative_to(folder))] = ("file", st.st_mtime_ns, digest)
    seen["."] = ("dir", folder.lstat().st_mtime_ns, "")
    return seen


def _replay(tiny: Tiny, manifest: Path, cache: Path) -> int:
    return main(["--manifest", str(manifest), "--cache", str(cache),
                 "--mirror", f"{UPSTREAM_URL}={tiny.up.bare}", "--json", "run"])  # fmt: skip


def _build(tiny: Tiny, manifest: Path, cache: Path, out: Path, *, warm: bool) -> None:
    from pinwheel.manifest import load
    from pinwheel.source.replay import replay_manifest

    result = replay_manifest(load(manifest), cache=cache, mirrors={UPSTREAM_URL: str(tiny.up.bare)})
    req = dataclasses.replace(request(tiny, manifest, out, result), cache=cache,
                              engine_workdir=None, compiler_cache=warm)  # fmt: skip
    run_build(req)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tiny, Path, Path]:
    """The tiny project, its manifest and a cache a replay and a build filled."""
    tmp = tmp_path_factory.mktemp("made")
    tiny = make_tiny(tmp)
    manifest = tiny.manifest()
    cache = tmp / "cache"
    assert _replay(tiny, manifest, cache) == 0
    _build(tiny, manifest, cache, tmp / "wheels", warm=True)
    assert (cache / "build" / "m" / "build.log").is_file()
    return tiny, manifest, cache


def test_every_folder_of_the_made_cache_is_a_case(made: tuple[Tiny, Path, Path]) -> None:
    _tiny, _manifest, cache = made
    covered = {rel for pattern in LEVELS for rel in _cases(cache, pattern)}
    assert set(_folders(cache)) - covered == set()
    assert {"memo", "locks", "keys", "build/m", "hooks"} <= covered
    assert any(rel.endswith(".git/pinwheel") for rel in covered)  # replay stamps


@pytest.mark.parametrize(
    "pattern", [*FAST, *(pytest.param(p, marks=pytest.mark.slow) for p in SLOW)]
)
def test_a_folder_of_a_kept_cache_planted_as_a_link_gets_nothing_written(
    made: tuple[Tiny, Path, Path], tmp_path: Path, pattern: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny, manifest, template = made
    rels = _cases(template, pattern)
    assert rels, f"the made cache has no folder {pattern}"
    problems = []
    for i, rel in enumerate(rels):
        cache = tmp_path / f"cache{i}"
        shutil.copytree(template, cache, symlinks=True)
        victim = tmp_path / f"victim{i}"
        shutil.copytree(cache / rel, victim, symlinks=True)
        shutil.rmtree(cache / rel)
        (cache / rel).symlink_to(victim)
        before = _snapshot(victim)
        outcome = []
        rc = _replay(tiny, manifest, cache)
        out = capsys.readouterr()
        assert "Traceback" not in out.err + out.out, (rel, out.err[-2000:])
        if rc != 0:  # refused: a PinwheelError's document (what, where, next), no traceback
            error = json.loads(out.out)["error"]
            assert error["what"] and error["next"], (rel, error)
            outcome.append(f"run refused: {error['what'][:160]}")
        else:
            outcome.append("run ok")
        for warm in (True, False):
            try:
                _build(tiny, manifest, cache, tmp_path / f"wheels{i}-{warm}", warm=warm)
                outcome.append("build ok")
            except PinwheelError as exc:
                assert exc.what and exc.next, (rel, exc.what)
                outcome.append(f"build refused: {exc.what[:160]}")
        after = _snapshot(victim)
        if after != before:
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            problems.append(f"{rel} -> victim: {changed[:8]} ({'; '.join(outcome)})")
        print(rel, outcome, file=sys.stderr)
        shutil.rmtree(cache)
        shutil.rmtree(victim)
    assert problems == []


# ---- the buckets this build leaves empty (venvs, toolchains, headers): each one's root
# planted as a link is refused before a lock or a file is made in it


def _planted(tmp_path: Path, bucket: str) -> tuple[Path, Path]:
    cache = tmp_path / "cache"
    cache.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (cache / bucket).symlink_to(victim)
    return cache, victim


def test_a_headers_folder_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    from pinwheel.compile import headerview

    cache, victim = _planted(tmp_path, "headers")
    src = tmp_path / "include"
    src.mkdir()
    (src / "a.h").write_text("int a;\n")
    with pytest.raises(PinwheelError, match="symlink") as err:
        headerview.make(src, cache)
    assert "headers" in (err.value.where or "") and err.value.next
    assert list(victim.iterdir()) == []


def test_a_venvs_folder_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    from pinwheel.compile.buildvenv import ensure_build_venv
    from pinwheel.manifest.build import Requirements

    cache, victim = _planted(tmp_path, "venvs")
    reqs = tmp_path / "build.txt"
    reqs.write_text(f"setuptools==70.0.0 --hash=sha256:{'0' * 64}\n")
    digest = hashlib.sha256(reqs.read_bytes()).hexdigest()
    with pytest.raises(PinwheelError, match="symlink") as err:  # not "offline, not made yet"
        ensure_build_venv(Requirements(reqs, digest), cache, environ={}, offline=True)
    assert "venvs" in (err.value.where or "")
    assert list(victim.iterdir()) == []


def test_a_toolchains_folder_planted_as_a_link_is_refused(tmp_path: Path) -> None:
    from pinwheel.compile.toolchain.pins import ToolkitLock
    from pinwheel.compile.toolchain.provision import provision_toolkit

    cache, victim = _planted(tmp_path, "toolchains")
    lock = ToolkitLock(version="12.4.131", suite="trixie", component="non-free", debs=(),
                       wheels=(), dev=())  # fmt: skip
    with pytest.raises(PinwheelError, match="symlink") as err:
        provision_toolkit(lock, cache, {"PATH": os.defpath})
    assert "toolchains" in (err.value.where or "")
    assert list(victim.iterdir()) == []

"""Directory listings in name order inside the build's Python processes.

The hook (pinwheel.compile.listing) runs in a real Python through PYTHONPATH; the
build test builds a real setuptools project (gcc) whose setup.py links its C
files in os.walk's order, from two caches on two filesystems that list one
directory in two different orders (ext4 orders names by a salted hash, tmpfs
newest first). Before the hook the two wheels differed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pinwheel.compile import listing
from pinwheel.compile.pipeline import BuildRequest
from pinwheel.compile.pipeline import build as run_build
from pinwheel.manifest import load
from pinwheel.options import host as host_of
from test_build import PY, make_tiny
from tinyproject import WALK_SETUP, walk_sources

NAMES = [f"n{i:02d}.cu" for i in range(24)]

PROBE = """
import glob, json, os, pathlib, shutil, sys
d = sys.argv[1]
with os.scandir(d) as it:
    scanned = [e.name for e in it]
print(json.dumps({
    "listdir": os.listdir(d),
    "listdir_bytes": [n.decode() for n in os.listdir(os.fsencode(d))],
    "scandir": scanned,
    "walk": next(os.walk(d))[2],
    "glob": [os.path.basename(p) for p in glob.glob(os.path.join(d, "*"))],
    "pathlib": [p.name for p in pathlib.Path(d).iterdir()],
    "chained": os.environ.get("CHAINED_RAN"),
}))
"""


def _fill(directory: Path, names: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text(name)
    return directory


def _listing_order(base: Path) -> list[str]:
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        return os.listdir(_fill(Path(tmp), NAMES))


def _other_filesystem(here: Path) -> Path | None:
    """A writable directory whose filesystem lists a fresh directory in an order other than
    ``here``'s (and other than name order), or None."""
    mine = _listing_order(here)
    for candidate in (Path("/dev/shm"), Path(tempfile.gettempdir()), Path.home()):
        try:
            if not candidate.is_dir() or not os.access(candidate, os.W_OK):
                continue
            theirs = _listing_order(candidate)
        except OSError:
            continue
        if theirs != mine and theirs != sorted(theirs) != mine:
            return candidate
    return None


def _probe(directory: Path, pythonpath: str | None, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update(env)
    if pythonpath is not None:
        environ["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(directory)],
        env=environ, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_the_hook_lists_every_way_in_name_order_and_runs_the_sitecustomize_it_shadows(
    tmp_path: Path,
) -> None:
    hook = listing.install(tmp_path / "cache")
    assert hook == tmp_path / "cache" / listing.HOOK_DIR
    # Reverse creation order: newest-first filesystems (tmpfs) list it reversed, hashed ones
    # (ext4) in their own order; either way not name order without the hook.
    directory = _fill(tmp_path / "d", list(reversed(NAMES)))
    shadowed = tmp_path / "theirs"
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text("import os\nos.environ['CHAINED_RAN'] = 'yes'\n")
    before = _probe(directory, str(shadowed))
    after = _probe(directory, listing.python_path(hook, {"PYTHONPATH": str(shadowed)}))
    for way in ("listdir", "listdir_bytes", "scandir", "walk", "glob", "pathlib"):
        assert sorted(after[way]) == NAMES, way  # type: ignore[arg-type]
        assert after[way] == NAMES, way
    assert after["chained"] == "yes" and before["chained"] == "yes"
    # install() again: same file, not rewritten
    mtime = (hook / "sitecustomize.py").stat().st_mtime_ns
    assert listing.install(tmp_path / "cache") == hook
    assert (hook / "sitecustomize.py").stat().st_mtime_ns == mtime


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.skipif(sys.platform != "linux", reason="filesystem listing orders: Linux only")
def test_engine_bytes_do_not_depend_on_the_filesystems_listing_order(tmp_path: Path) -> None:
    other = _other_filesystem(tmp_path)
    if other is None:
        pytest.skip("no second filesystem here that lists a directory in another order")
    tiny = make_tiny(tmp_path, WALK_SETUP, walk_sources())
    manifest = tiny.manifest()
    replayed = tiny.replay(manifest)
    wheels = []
    with tempfile.TemporaryDirectory(dir=other) as elsewhere:
        for cache in (tmp_path / "cache", Path(elsewhere) / "cache"):
            request = BuildRequest(
                manifest=load(manifest), cache=cache, out_dir=cache.parent / f"out-{len(wheels)}",
                host=host_of(os.environ), replayed=replayed, kernels=(), cuda=False,
            )  # fmt: skip
            outcome = run_build(request)
            wheel = outcome.wheels.built[0]
            src = cache / "build" / load(manifest).name / "src" / "csrc"
            wheels.append((wheel.name, _sha(wheel), os.listdir(src)))
    (name_a, sha_a, order_a), (name_b, sha_b, order_b) = wheels
    assert order_a != order_b  # the two exports list csrc/ in two orders ...
    assert name_a == name_b and f"cp{PY.replace('.', '')}" in name_a
    assert sha_a == sha_b  # ... and the wheel is the same

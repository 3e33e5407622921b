"""The object store: a fresh workspace whose compiler cache is warm compiles nothing.

Real builds of the tiny engine-shaped project (tinyproject.py: a setuptools build that
compiles a C extension with gcc, through the engine path) in two caches that share one
local compiler-cache directory (SCCACHE_DIR), as two CI runners share a cache."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from pinwheel.compile import compcache, objbackends, objstore
from pinwheel.compile.pipeline import build as run_build
from pinwheel.options import host as host_of
from pinwheel.wheels.provenance import component, read_receipt
from redisserver import running_redis
from tcpport import free_port
from test_build import WHEEL, Tiny, request, tiny  # noqa: F401  (fixture)

KEY = "two-ci-runners-that-share-a-store-share-this-key"  # PINWHEEL_STORE_KEY


def _build(project: Tiny, manifest: Path, cache: str, out: str, shared: Path, env=(), **kw):
    env = dict(env)
    result = project.replay(manifest)
    req = request(project, manifest, project.tmp / out, result, **kw)
    environ = {**req.host.child, "SCCACHE_DIR": str(shared), "PINWHEEL_STORE_KEY": KEY, **env}
    return run_build(
        dataclasses.replace(req, cache=project.tmp / cache, engine_workdir=None, host=host_of(environ))
    )


def _phase(outcome, name):
    (row,) = [p for p in outcome.phases if p.name == name]
    return row


def test_a_fresh_workspace_reuses_the_stored_objects_and_gives_the_cold_bytes(
    tiny: Tiny,  # noqa: F811
) -> None:
    manifest = tiny.manifest()
    shared = tiny.tmp / "shared-cache"
    cold = _build(tiny, manifest, "cache-a", "w-a", shared)
    cold_sha = cold.wheels.wheels[WHEEL]
    assert any("stored in the object store" in d for d in _phase(cold, "builder").did)
    assert (shared / objstore.SUBDIR).is_dir()

    fresh = _build(tiny, manifest, "cache-b", "w-b", shared)  # another cache: fresh workspace
    assert fresh.wheels.wheels[WHEEL] == cold_sha  # the cold build's bytes
    (engine,) = fresh.to_json()["components"]
    assert engine["reused"] == ["tiny/_C.so"]  # N = 1 reused compiled member
    cc = engine["compiler_cache"]
    assert cc.get("hits", 0) == 0 and cc.get("misses", 0) == 0  # 0 compiled
    builder = _phase(fresh, "builder")
    assert "the object store holds this build (1 compiled member(s))" in builder.skipped[0]
    assert not (tiny.tmp / "cache-b" / "build" / "tiny" / "src" / "build").exists()
    # The tag travels with the stored wheel: cache B ran no auditwheel analysis or retag.
    assert any("its tag stored in the object store" in d for d in _phase(cold, "check").did)
    check = _phase(fresh, "check")
    assert any("taken with the wheel from the object store" in s for s in check.skipped)
    assert not any(d.startswith("tagged ") for d in check.did)
    # ... and so does its check: the same bytes, rules and tools (by content).
    assert any("the check stored in the object store" in d for d in _phase(cold, "check").did)
    assert any("check of" in s and "taken with the wheels from the object store" in s
               for s in check.skipped)  # fmt: skip
    assert not any(d.startswith("checked ") for d in check.did)
    receipt = component(read_receipt(tiny.tmp / "w-b" / "provenance.json"), "engine")
    assert receipt["reused"]["from"] == "the object store"

    # A cold build of cache B (--no-cache) does not look: it compiles, same bytes again.
    again = _build(tiny, manifest, "cache-c", "w-c", shared, compiler_cache=False)
    assert again.wheels.wheels[WHEEL] == cold_sha
    assert "tiny/_C.so" not in again.to_json()["components"][0]["reused"]


def test_a_changed_compiled_input_is_a_miss_and_compiles(tiny: Tiny) -> None:  # noqa: F811
    manifest = tiny.manifest()
    shared = tiny.tmp / "shared-cache"
    _build(tiny, manifest, "cache-a", "w-a", shared)
    # Another C compiler flag in the environment pinwheel sets: another identity.
    other = tiny.manifest(extra_env=', CFLAGS = "-O1"', name="m2.toml")
    changed = _build(tiny, other, "cache-b", "w-b", shared)
    builder = _phase(changed, "builder")
    assert not builder.skipped and any("object store: miss" in d for d in builder.did)
    assert changed.to_json()["components"][0]["reused"] == []


def test_hostile_store_records_are_misses(tiny: Tiny) -> None:  # noqa: F811
    """A record that is a FIFO, not JSON, too deep, of another identity or tree, or names
    a wheel outside the store; a stored wheel changed after it was written: each a miss
    (nothing blocks, nothing outside is read), and a real build then compiles and gives
    the cold bytes."""
    manifest = tiny.manifest()
    shared = tiny.tmp / "shared-cache"
    cold = _build(tiny, manifest, "cache-a", "w-a", shared)
    root = shared / objstore.SUBDIR
    store = objstore.Store(objbackends.LocalDir(root), KEY.encode())
    (index,) = (root / "v2" / "index").iterdir()
    (path,) = index.iterdir()
    good = json.loads(path.read_text())
    ident, match = good["record"]["identity"], good["match"]
    hit = store.lookup(ident, match)
    assert isinstance(hit, objstore.Hit) and hit.sha256 == good["sha256"]
    miss = objstore.Miss
    assert isinstance(store.lookup(ident, {**match, "tree": "0" * 64}), miss)  # another tree
    assert isinstance(store.lookup({**ident, "builder": "other"}, match), miss)  # another identity

    def with_entry(text: str) -> objstore.Hit | objstore.Miss:
        path.unlink(missing_ok=True)
        path.write_text(text)
        return store.lookup(ident, match)

    assert isinstance(with_entry("{not json"), miss)
    assert isinstance(with_entry("[" * 500 + "]" * 500), miss)
    for name in ("../../../escape.whl", "a/b.whl", "x\n.whl", "w.whl\u0000"):
        assert isinstance(with_entry(json.dumps({**good, "wheel": name})), miss), name
    bad_ident = {**good, "record": {**good["record"], "identity": {}}}
    assert isinstance(with_entry(json.dumps(bad_ident)), miss)
    path.unlink()
    os.mkfifo(path)
    assert isinstance(store.lookup(ident, match), miss)  # not opened for reading: no hang
    path.unlink()
    path.write_text(json.dumps(good))
    hit = store.lookup(ident, match)
    assert isinstance(hit, objstore.Hit)
    with zipfile.ZipFile(root / hit.blob, "a") as zf:  # the stored wheel changed after it was written
        zf.writestr("tiny/planted.py", "PLANTED = 1\n")
    taken = store.take(hit, tiny.tmp / "dist-check")
    assert isinstance(taken, miss) and "entry changed" in taken.why
    assert not list((tiny.tmp / "dist-check").iterdir())  # nothing left behind
    fresh = _build(tiny, manifest, "cache-b", "w-b", shared)
    assert fresh.to_json()["components"][0]["reused"] == []  # compiled, not reused
    assert fresh.wheels.wheels == cold.wheels.wheels
    with zipfile.ZipFile(tiny.tmp / "w-b" / WHEEL) as zf:
        assert "tiny/planted.py" not in zf.namelist()


@pytest.mark.slow
@pytest.mark.kernels
def test_the_selftest_kernel_from_a_fresh_cache_is_the_stored_build(tmp_path: Path) -> None:
    """The in-tree selftest kernel (CMake + nvcc 12.4, provisioned like the kernels tests):
    cold in cache A, then cache B sharing A's compiler-cache directory: nothing compiles
    (no sccache hit or miss: the builder never ran), and the wheel is the cold sha256."""
    from pinwheel.cli import default_cache
    from pinwheel.compile.pipeline import BuildRequest
    from pinwheel.compile.toolchain import ToolkitRequest, resolve_toolkit
    from pinwheel.manifest import load

    repo = Path(__file__).resolve().parent.parent
    checkout = tmp_path / "repo"
    shutil.copytree(repo / "kernels" / "pinwheel-selftest",
                    checkout / "kernels" / "pinwheel-selftest")  # fmt: skip
    text = (repo / "recipes" / "examples" / "selftest-cuda124.toml").read_text()
    (checkout / "manifest.toml").write_text(text)
    m = load(checkout / "manifest.toml")
    m = dataclasses.replace(m, build=dataclasses.replace(m.require("build"), required_members=()))
    request = ToolkitRequest(m.require("build"), default_cache(), host_of(os.environ))
    toolkit = resolve_toolkit(request)
    shared = tmp_path / "shared"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_")}
    env["SCCACHE_DIR"] = str(shared)
    env["PINWHEEL_STORE_KEY"] = KEY

    def once(cache: str):
        return run_build(BuildRequest(
            manifest=m, cache=tmp_path / cache, out_dir=tmp_path / f"w-{cache}", host=host_of(env),
            kernels=("pinwheel-selftest",), toolkit=toolkit, source_date_epoch=1700000000,
        ))  # fmt: skip

    cold = once("a")
    fresh = once("b")
    assert fresh.wheels.wheels == cold.wheels.wheels
    (kernel,) = fresh.to_json()["components"]
    assert kernel["reused"] and kernel["compiler_cache"].get("hits", 0) == 0
    assert kernel["compiler_cache"].get("misses", 0) == 0
    (builder,) = [p for p in fresh.phases if p.name.startswith("builder")]
    assert "the object store holds this build" in builder.skipped[0]


def test_the_store_follows_the_compiler_cache_backend(tmp_path: Path) -> None:
    """Local directory: the store beside sccache's objects; gha, or a redis store nothing
    answers at: no store, said; a cold build or [build.cache] enabled = false: none either."""
    from pinwheel.manifest.build import CacheConfig

    env = {"PATH": "", "SCCACHE_DIR": str(tmp_path / "shared")}
    plan = compcache.plan(CacheConfig(), tmp_path, host_of(env))
    store, why = objstore.for_plan(plan, cold=False)
    assert store is not None
    assert store.backend == objbackends.LocalDir(tmp_path / "shared" / objstore.SUBDIR)
    assert objstore.for_plan(plan, cold=True)[0] is None
    off, why = objstore.for_plan(plan, cold=False, turned_off=True)
    assert off is None and "enabled = false" in why
    closed = free_port()  # a port nothing listens on
    dead = {"PATH": "", "SCCACHE_REDIS": f"redis://127.0.0.1:{closed}"}
    none, why = objstore.for_plan(compcache.plan(CacheConfig(), tmp_path, host_of(dead)), cold=False)
    assert none is None and "redis store is unreachable" in why and str(closed) in why


def test_a_fresh_cache_hits_through_a_shared_redis(tiny: Tiny) -> None:  # noqa: F811
    """``[build.cache] backend = "redis"``, a real redis-server on 127.0.0.1, two caches
    that share nothing local (two ephemeral runners): the cold build stores, the fresh one
    compiles nothing and gives the cold sha256."""
    with running_redis() as port:
        manifest = tiny.manifest(name="redis.toml")
        manifest.write_text(manifest.read_text() + '\n[build.cache]\nbackend = "redis"\n'
                            f'endpoint = "redis://127.0.0.1:{port}"\nprefix = "ci"\n')  # fmt: skip
        result = tiny.replay(manifest)

        def once(cache: str, out: str):
            req = request(tiny, manifest, tiny.tmp / out, result)
            child = {k: v for k, v in req.host.child.items() if not k.startswith("SCCACHE_")}
            child["PINWHEEL_STORE_KEY"] = KEY
            return run_build(dataclasses.replace(
                req, cache=tiny.tmp / cache, engine_workdir=None, host=host_of(child)
            ))  # fmt: skip

        cold = once("cache-a", "w-a")
        cache_row = _phase(cold, "compiler cache")
        assert any(d.startswith("object store: redis (ci/pinwheel-objects/") for d in cache_row.did)
        assert any("stored in the object store" in d for d in _phase(cold, "builder").did)
        fresh = once("cache-b", "w-b")
    assert fresh.wheels.wheels[WHEEL] == cold.wheels.wheels[WHEEL]
    (engine,) = fresh.to_json()["components"]
    assert engine["reused"] == ["tiny/_C.so"]
    assert "the object store holds this build (1 compiled member(s))" in (
        _phase(fresh, "builder").skipped[0]
    )
    assert not (tiny.tmp / "cache-a" / "sccache" / objstore.SUBDIR).exists()  # nothing local

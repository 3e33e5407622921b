"""Release targets are a table: a new `publish --to` target is one module and one row.

The throwaway target here is a real module file, imported, and one row added to
``pinwheel.release.targets.TARGETS``; nothing else changes, and the CLI offers it,
lists its flag, verifies the release and hands it over.
"""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from pinwheel.checksums import SUMS, sha256_file
from pinwheel.cli import main
from pinwheel.errors import EXIT_VERIFY
from pinwheel.release import targets
from releasekit import make_key, make_wheel, write_manifest, write_provenance

SRC = Path(__file__).resolve().parents[1] / "src" / "pinwheel"

FOLDER_TARGET = '''
"""A throwaway release target: copy every file SHA256SUMS lists into a folder."""

import shutil
from pathlib import Path

from pinwheel.checksums import SUMS
from pinwheel.release.targets.contract import Published, PublishRequest, TargetFlag


class Folder:
    name = "folder"
    summary = "a local folder (test only)"
    flags = (TargetFlag("--folder-dest", "the folder the release is copied into"),)

    def publish(self, request: PublishRequest) -> Published:
        dest = Path(request.flag("--folder-dest") or "published")
        dest.mkdir(parents=True)
        names = sorted(request.release.sums) + [SUMS]
        for name in names:
            shutil.copy2(request.release.dir / name, dest / name)
        return Published({"dest": str(dest), "copied": names},
                         f"copied {len(names)} files to {dest}")


TARGET = Folder()
'''


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, Path]:
    build = tmp_path / "wheels"
    made = make_wheel(build, "pwtgt", "1.0", payload=4_000, seed=5)
    write_provenance(build, {made.name: sha256_file(made)})
    key, _signers = make_key(tmp_path / "keys")
    manifest = write_manifest(
        tmp_path, release='\n[release]\nallowed_signers = "keys/allowed_signers"\n'
    )
    assert main(["--manifest", str(manifest), "release", "--key", str(key)]) == 0
    return manifest, tmp_path / "release"


@pytest.fixture
def folder_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two steps of adding a target: its module, and its row in the table."""
    import importlib

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "folder_target.py").write_text(textwrap.dedent(FOLDER_TARGET))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    module = importlib.import_module("folder_target")
    monkeypatch.setattr(targets, "TARGETS", (*targets.TARGETS, module.TARGET))


def test_a_new_target_is_offered_without_its_row_refused(
    release: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest, _ = release
    capsys.readouterr()
    rc = main(["--manifest", str(manifest), "publish", "--to", "folder",
               "--folder-dest", str(tmp_path / "out")])  # fmt: skip
    assert rc == 2
    assert "invalid choice: 'folder'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_one_module_and_one_row_make_a_target(
    release: tuple[Path, Path], folder_row: None, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    manifest, release_dir = release
    capsys.readouterr()
    assert main(["publish", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "folder: a local folder (test only)" in help_text and "--folder-dest" in help_text

    out = tmp_path / "out"
    rc = main(["--manifest", str(manifest), "--json", "publish", "--to", "folder",
               "--folder-dest", str(out)])  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dest"] == str(out) and SUMS in doc["copied"]
    wheels = [n for n in doc["copied"] if n.endswith(".whl")]
    assert wheels == [p.name for p in release_dir.glob("*.whl")]
    for name in doc["copied"]:
        assert sha256_file(out / name) == sha256_file(release_dir / name)


def test_a_target_gets_only_a_release_that_verifies(
    release: tuple[Path, Path], folder_row: None, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    manifest, release_dir = release
    wheel = next(release_dir.glob("*.whl"))
    data = bytearray(wheel.read_bytes())
    data[3] ^= 1
    wheel.write_bytes(bytes(data))
    rc = main(["--manifest", str(manifest), "publish", "--to", "folder",
               "--folder-dest", str(tmp_path / "out")])  # fmt: skip
    assert rc == EXIT_VERIFY
    assert "sha256 mismatch" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_every_target_module_has_one_row_and_names_are_unique() -> None:
    modules = sorted(p.stem for p in (SRC / "release" / "targets").glob("*.py")
                     if p.stem not in ("__init__", "contract"))  # fmt: skip
    rows = {t.__class__.__module__.rsplit(".", 1)[-1] for t in targets.TARGETS}
    assert modules == sorted(rows) and len(modules) >= 3
    names = [t.name for t in targets.TARGETS]
    flags = [f.flag for t in targets.TARGETS for f in t.flags]
    assert len(set(names)) == len(names) and len(set(flags)) == len(flags)
    assert targets.named("index") is targets.TARGETS[0]


def test_the_cli_dispatches_on_no_target_name() -> None:
    """No `if args.to == ...`: the CLI compares nothing with a target's name."""
    tree = ast.parse((SRC / "cli" / "release_cmds.py").read_text())
    names = {t.name for t in targets.TARGETS}
    found = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)
             and any(isinstance(c, ast.Constant) and c.value in names
                     for c in [n.left, *n.comparators])]  # fmt: skip
    assert not found, f"the CLI chooses a target by name: {found}"

"""Hostile input, class "a write, rename or delete leaves its scope": a symlink planted in
the cache, a receipt path that climbs out, an archive member named ``../x``, a downloaded
name with ``/``, a ``.part`` symlink, a ``file://`` link on a remote page, a recipe in a
symlinked folder, a model pack whose names or shards lead outside.

Each case puts a file OUTSIDE the scope and asserts it is unchanged (or was never made),
with a message that names what was refused. Real parts: real files, symlinks, zip and
tar archives, a real .deb (ar + tar), a real http.server on loopback, the CLI's main().
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import pytest
from filelock import FileLock

from localhttp import LocalHTTP
from pinwheel.cli import main
from pinwheel.errors import PinwheelError, VerifyError

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the scope that nothing may touch."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "keep.txt").write_text("precious\n")
    return out


class Files(LocalHTTP):
    """A real http.server on loopback serving ``files`` {path: bytes}."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                body = outer.files.get(self.path.lstrip("/"))
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._serve(Handler, daemon_threads=False)


# --------------------------------------------------------------------------- cache prune


def _stale_repo(where: Path, name: str = "stale-00000000.git") -> Path:
    repo = where / name
    (repo / "objects").mkdir(parents=True)
    (repo / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / "keep.txt").write_text("someone else's repository\n")
    return repo


def test_prune_never_follows_a_repos_symlink_out_of_the_cache(tmp_path, outside, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    victim = _stale_repo(outside)
    (cache / "repos").symlink_to(outside, target_is_directory=True)
    rc = main(["--cache", str(cache), "cache", "prune", "--older-than", "0", "--apply"])
    err = capsys.readouterr().err
    assert victim.is_dir() and (victim / "keep.txt").is_file(), "prune deleted outside the cache"
    assert rc != 0 and "symlink" in err and "next:" in err


def test_prune_keeps_a_repository_whose_cache_lock_another_run_holds(tmp_path, capsys):
    cache = tmp_path / "cache"
    busy = _stale_repo(cache / "repos", "busy-11111111.git")
    idle = _stale_repo(cache / "repos", "idle-22222222.git")
    (cache / "locks").mkdir()
    with FileLock(str(cache / "locks" / "busy-11111111.lock")):
        rc = main(["--cache", str(cache), "--json", "cache", "prune", "--older-than", "0",
                   "--apply"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert busy.is_dir(), "prune removed a repository a run was using"
    assert not idle.exists()
    assert [Path(p).name for p in out["busy"]] == ["busy-11111111.git"]


# --------------------------------------------------------------------------- verify-build


@pytest.mark.parametrize("tree", ["../../..", "../../../../tmp/x", "/abs/elsewhere"])
def test_verify_build_refuses_a_receipt_tree_that_is_not_a_tree_id(tmp_path, tree):
    """A receipt's engine tree used to name the rebuild folder under the cache."""
    from pinwheel.compile.verify import _check_recorded

    engine = {"name": "engine", "source": {"tree": tree}}
    with pytest.raises(VerifyError) as err:
        _check_recorded({"components": [engine]}, engine, set(), tmp_path / "provenance.json")
    assert "tree" in err.value.what and err.value.next


def test_verify_build_refuses_a_receipt_wheel_name_with_a_path(tmp_path):
    from pinwheel.compile.verify import compare_builds

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    receipt = {
        "schema": "pinwheel.provenance/1",
        "built": ["../../x.whl"],
        "wheels": {"../../x.whl": "0" * 64},
        "components": [
            {"name": "engine", "kind": "engine", "wheel": "../../x.whl", "sha256": "0" * 64}
        ],
    }
    (wheels / "provenance.json").write_text(json.dumps(receipt))
    with pytest.raises(VerifyError, match="wheel file name"):
        compare_builds(wheels, tmp_path / "rebuilt")


# --------------------------------------------------------------------------- --reuse-from


def _zip(path: Path, members: dict[str, bytes], *, links: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = 0o120777 << 16
            zf.writestr(info, target)
    return path


BAD_MEMBERS = {
    "zip-slip": lambda out: {"../../../evil.txt": b"x"},
    "absolute": lambda out: {str(out / "evil.txt"): b"x"},
}


@pytest.mark.parametrize("case", sorted(BAD_MEMBERS))
def test_reuse_transplant_never_writes_a_member_outside(case, tmp_path, outside):
    from pinwheel.archive import ArchiveError
    from pinwheel.compile.reuse import transplant

    old = _zip(tmp_path / "demo-1.0-py3-none-any.whl", {
        "demo/__init__.py": b"", **BAD_MEMBERS[case](outside),
        "demo-1.0.dist-info/RECORD": b"",
    })  # fmt: skip
    source = tmp_path / "src"
    source.mkdir()
    with pytest.raises(ArchiveError):
        transplant(old, {"from_tree": [], "compiled_members": {}}, source, tmp_path / "dist",
                   python="python3", env=dict(os.environ))  # fmt: skip
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert not list(tmp_path.rglob("evil.txt"))


def test_reuse_transplant_refuses_a_symlink_member(tmp_path, outside):
    """A symlink member used to reach the new wheel as a regular file."""
    from pinwheel.archive import ArchiveError
    from pinwheel.compile.reuse import transplant

    old = _zip(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": b""},
               links={"demo/leak": str(outside / "keep.txt")})  # fmt: skip
    source = tmp_path / "src"
    source.mkdir()
    with pytest.raises(ArchiveError, match="symlink"):
        transplant(old, {"from_tree": [], "compiled_members": {}}, source, tmp_path / "dist",
                   python="python3", env=dict(os.environ))  # fmt: skip
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def _release(directory: Path, wheel: Path, component: dict) -> None:
    from pinwheel.checksums import format_sums

    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (directory / "SHA256SUMS").write_text(format_sums({wheel.name: digest}))
    receipt = {"schema": "pinwheel.provenance/1", "components": [component]}
    (directory / "provenance.json").write_text(json.dumps(receipt))


def test_reuse_download_never_writes_a_provenance_name_outside(tmp_path, outside):
    """A remote receipt naming ``../../x.whl`` (with no sha256) used to be downloaded there."""
    from pinwheel.compile.reuse import candidates

    site = tmp_path / "site"
    site.mkdir()
    wheel = _zip(site / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": b""})
    name = "../../../outside/evil.whl"
    _release(site, wheel, {"name": "demo", "kind": "kernel", "wheel": name, "sha256": "0" * 64})
    files = {p.name: p.read_bytes() for p in site.iterdir()}
    files[name] = b"not a wheel"
    files["outside/evil.whl"] = b"not a wheel"
    with Files(files) as srv, pytest.raises(VerifyError, match="wheel file name"):
        candidates(srv.url, tmp_path / "cache")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def test_reuse_refuses_a_compiled_member_provenance_does_not_vouch_for(tmp_path):
    from pinwheel.compile.reuse import candidates
    from wheelfactory import host_so, make_wheel

    rel = tmp_path / "rel"
    elf = host_so(tmp_path / "so", "_C").read_bytes()  # a real shared object (gcc)
    wheel = make_wheel(rel, {"demo/_C.so": elf}, tag="py3-none-any")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    claimed = hashlib.sha256(b"\x7fELF another build").hexdigest()
    component = {
        "name": "demo", "kind": "kernel", "wheel": wheel.name, "sha256": digest,
        "compiled_inputs": {"complete": True, "compiled_members": {"demo/_C.so": claimed}},
    }  # fmt: skip
    _release(rel, wheel, component)
    with pytest.raises(VerifyError, match="compiled member 'demo/_C.so'"):
        candidates(str(rel), tmp_path / "cache")


def test_reuse_archive_checks_the_earlier_wheel(tmp_path):
    from pinwheel.compile.reuse import candidates

    rel = tmp_path / "rel"
    rel.mkdir()
    wheel = _zip(rel / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": b""},
                 links={"demo/leak": "/etc/passwd"})  # fmt: skip
    component = {"name": "demo", "kind": "kernel", "wheel": wheel.name,
                 "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}  # fmt: skip
    _release(rel, wheel, component)
    with pytest.raises(VerifyError, match="symlink"):
        candidates(str(rel), tmp_path / "cache")


# --------------------------------------------------------------------------- fetch


def _wheel_release(tmp: Path) -> tuple[str, bytes, str]:
    from wheelfactory import make_wheel

    wheel = make_wheel(tmp / "w", {"demo/__init__.py": b"x = 1\n" * 50}, tag="py3-none-any")
    data = wheel.read_bytes()
    sums = f"{hashlib.sha256(data).hexdigest()}  {wheel.name}\n"
    return wheel.name, data, sums


def test_fetch_never_writes_through_a_part_symlink(tmp_path, outside):
    from pinwheel.release.download import FetchOptions, fetch_release, resolve_source

    name, data, sums = _wheel_release(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    target = outside / "empty.log"  # empty: a plain append (no resume) would write into it
    target.write_bytes(b"")
    (dest / f".{name}.part").symlink_to(target)
    with Files({"SHA256SUMS": sums.encode(), name: data}) as srv:
        result = fetch_release(resolve_source(srv.url), dest, FetchOptions(retries=0, allow_unsigned=True))
    assert target.read_bytes() == b"", "fetch wrote through the .part symlink"
    assert (dest / name).read_bytes() == data and not (dest / name).is_symlink()
    assert [f.name for f in result.files] == [name]


def test_fetch_never_follows_a_file_url_on_a_remote_page(tmp_path, outside):
    """An index page linking file:///... used to make fetch read a local file into --dest."""
    from pinwheel.release.download import FetchOptions, fetch_release, resolve_source

    secret = outside / "secret.whl"
    secret.write_bytes(b"local secret bytes\n")
    name = secret.name
    sums = f"{hashlib.sha256(secret.read_bytes()).hexdigest()}  {name}\n"
    page = f'<html><a href="file://{secret}">{name}</a></html>'.encode()
    dest = tmp_path / "dest"
    with Files({"SHA256SUMS": sums.encode(), "": page}) as srv:
        with pytest.raises(PinwheelError):
            fetch_release(resolve_source(srv.url), dest, FetchOptions(retries=0, allow_unsigned=True))
    assert not (dest / name).exists(), "a local file was copied in from a file:// link"


def test_fetch_never_opens_a_non_http_url(tmp_path):
    from pinwheel.release.download import FetchOptions, get_small

    local = tmp_path / "local.txt"
    local.write_text("local\n")
    with pytest.raises(PinwheelError, match="non-http"):
        get_small(f"file://{local}", FetchOptions(retries=0), "a listing")


# --------------------------------------------------------------------------- serve --write-recipe

SERVE = """
[serve]
recipe = "scripts/serve.sh"
env_prefix = "M"
[serve.profile.cpu]
gpus = 0
max_model_len = 64
max_num_seqs = 2
"""


def test_write_recipe_never_replaces_a_file_through_a_symlinked_folder(tmp_path, outside, capsys):
    from gitfixture import UPSTREAM_URL

    root = tmp_path / "repo"
    root.mkdir()
    (root / "scripts").symlink_to(outside, target_is_directory=True)
    (outside / "serve.sh").write_text("#!/bin/sh\necho mine\n")
    manifest = root / "manifest.toml"
    manifest.write_text(f'[upstream]\nurl = "{UPSTREAM_URL}"\ncommit = "{SHA}"\n' + SERVE)
    rc = main(["--manifest", str(manifest), "serve", "--write-recipe"])
    err = capsys.readouterr().err
    assert (outside / "serve.sh").read_text() == "#!/bin/sh\necho mine\n"
    assert rc != 0 and "symlink" in err and "next:" in err


# --------------------------------------------------------------------------- model check


def test_model_check_never_hashes_a_pinned_name_outside_the_pack(tmp_path, outside):
    from pinwheel.release.modelpack import ModelConfig, check_model
    from test_modelpack import make_pack

    pack_dir = tmp_path / "pack"
    make_pack(pack_dir)
    secret = outside / "keep.txt"
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    wrong = "f" * 64
    pack = ModelConfig(repo=None, revision=None, shards=None, total_bytes=None, config={},
                       sha256={"../outside/keep.txt": wrong, str(secret): wrong},
                       local_dir=None)  # fmt: skip
    with pytest.raises(VerifyError) as err:
        check_model(pack_dir, pack)
    assert "not a path inside the pack" in err.value.what
    assert digest not in err.value.what, "a file outside the pack was hashed"


def test_model_check_refuses_a_shard_symlinked_outside_the_pack(tmp_path, outside):
    from pinwheel.release.modelpack import ModelConfig, check_model
    from test_modelpack import make_pack

    pack_dir = tmp_path / "pack"
    make_pack(pack_dir)
    shard = pack_dir / "model-00002-of-00003.safetensors"
    moved = outside / shard.name
    shard.rename(moved)
    shard.symlink_to(moved)
    pack = ModelConfig(repo=None, revision=None, shards=3, total_bytes=None, config={},
                       sha256={}, local_dir=None)  # fmt: skip
    with pytest.raises(VerifyError, match="symlink out of the pack"):
        check_model(pack_dir, pack)


def test_model_check_refuses_index_entries_that_climb_out(tmp_path, outside):
    from pinwheel.release.modelpack import ModelConfig, check_model
    from test_modelpack import make_pack

    pack_dir = tmp_path / "pack"
    make_pack(pack_dir)
    index = pack_dir / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["evil"] = "../outside/keep.txt"
    index.write_text(json.dumps(data))
    pack = ModelConfig(repo=None, revision=None, shards=None, total_bytes=None, config={},
                       sha256={}, local_dir=None)  # fmt: skip
    with pytest.raises(VerifyError, match="not a (path|file) in(side)? the pack"):
        check_model(pack_dir, pack)


# --------------------------------------------------------------------------- archives


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    return info


def _deb(path: Path, data_tar: bytes) -> Path:
    """A Debian package: an ar archive of debian-binary, control.tar, data.tar."""

    def entry(name: str, body: bytes) -> bytes:
        head = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(body):<10}`\n".encode()
        return head + body + (b"\n" if len(body) % 2 else b"")

    control = _tar([(_member("./control"), b"Package: demo\n")])
    path.write_bytes(
        b"!<arch>\n"
        + entry("debian-binary", b"2.0\n")
        + entry("control.tar", control)
        + entry("data.tar", data_tar)
    )
    return path


def test_deb_unpack_never_writes_a_member_outside_the_toolkit(tmp_path, outside):
    from pinwheel.archive import ArchiveError
    from pinwheel.compile.toolchain.pins import DebPin
    from pinwheel.compile.toolchain.unpack import unpack_deb

    climb = os.path.relpath(outside / "evil", tmp_path / "tree" / "bin" / "crt")
    data = _tar([
        (_member("./usr/lib/demo/bin/crt/link.stub"), b"stub"),
        (_member(f"./usr/lib/demo/bin/crt/{climb}"), b"evil"),
    ])  # fmt: skip
    deb = _deb(tmp_path / "demo.deb", data)
    pin = DebPin("demo", "1.0", "0" * 64, (("usr/lib/demo/bin/crt", "bin/crt"),))
    with pytest.raises(ArchiveError, match="'..'"):
        unpack_deb(deb, pin, tmp_path / "tree")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


HOSTILE_TAR = {
    "dotdot": [(_member("a/../../evil"), b"x")],
    "absolute": [(_member("/tmp/evil-abs"), b"x")],
    "symlink-out": [(_member("a/link", tarfile.SYMTYPE, "/etc/passwd"), b"")],
    "hardlink-out": [(_member("a/hard", tarfile.LNKTYPE, "/etc/passwd"), b"")],
    "device": [(_member("a/dev", tarfile.CHRTYPE), b"")],
    "fifo": [(_member("a/fifo", tarfile.FIFOTYPE), b"")],
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TAR))
def test_archive_reader_refuses_hostile_tar_members(case, tmp_path):
    from pinwheel.archive import ArchiveError, extract_tar

    raw = _tar(HOSTILE_TAR[case])
    dest = tmp_path / "dest"
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar, pytest.raises(ArchiveError) as err:
        extract_tar(tar, dest, f"{case}.tar")
    assert err.value.next and err.value.where == f"{case}.tar"
    assert not list(dest.rglob("*")) and not Path("/tmp/evil-abs").exists()


def test_archive_reader_refuses_a_zip_bomb_and_too_many_members(tmp_path):
    from pinwheel.archive import ArchiveError, Limits, zip_members

    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros", b"\0" * (40 * 1024 * 1024))
    with zipfile.ZipFile(bomb) as zf, pytest.raises(ArchiveError, match="ratio"):
        zip_members(zf, "bomb.zip")
    many = _zip(tmp_path / "many.zip", {f"f{i}": b"" for i in range(20)})
    with zipfile.ZipFile(many) as zf, pytest.raises(ArchiveError, match="member limit"):
        zip_members(zf, "many.zip", Limits(members=10))


def test_archive_writes_never_follow_a_symlink_planted_in_the_destination(tmp_path, outside):
    from pinwheel.archive import extract_zip

    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "pkg").symlink_to(outside, target_is_directory=True)
    whl = _zip(tmp_path / "x.zip", {"pkg/keep.txt": b"overwritten\n"})
    with zipfile.ZipFile(whl) as zf, pytest.raises(PinwheelError, match="symlink"):
        extract_zip(zf, dest, "x.zip")
    assert (outside / "keep.txt").read_text() == "precious\n"


def test_export_reader_keeps_links_inside_the_tree_and_refuses_links_out(tmp_path):
    """Exports (git archive of a replayed tree) go through the same reader: a symlink that
    stays in the tree is kept, one that leads out is refused by name."""
    from pinwheel.archive import ArchiveError, extract_tar

    inside = _tar([
        (_member("src/b.txt"), b"b\n"),
        (_member("src/dir/a.txt", tarfile.SYMTYPE, "../b.txt"), b""),
    ])  # fmt: skip
    dest = tmp_path / "ok"
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(inside)) as tar:
        extract_tar(tar, dest, "tree", inner_links=True)
    link = dest / "src/dir/a.txt"
    assert link.is_symlink() and link.read_text() == "b\n"
    out = _tar([(_member("src/leak", tarfile.SYMTYPE, "../../../../etc/passwd"), b"")])
    bad = tmp_path / "bad"
    bad.mkdir()
    with tarfile.open(fileobj=io.BytesIO(out)) as tar, pytest.raises(ArchiveError, match="out"):
        extract_tar(tar, bad, "tree", inner_links=True)
    assert not list(bad.rglob("*"))


@pytest.mark.parametrize(
    "change",
    [
        {"compiled_inputs": "a string where an object belongs"},
        {"compiled_inputs": {"complete": True, "identity": "not an object"}},
        {"compiled_inputs": {"compiled_members": ["a", "list"]}},
        {"compiled_inputs": {"compiled_members": {"../../x.so": "cd" * 32}}},
    ],
)
def test_reuse_refuses_a_provenance_entry_of_the_wrong_shape_without_a_traceback(
    tmp_path, change
):
    """``--reuse-from`` provenance with a string where an object belongs used to end in an
    AttributeError; each wrong shape is a VerifyError naming the field."""
    from pinwheel.compile.reuse import candidates, unchanged
    from wheelfactory import make_wheel

    rel = tmp_path / "rel"
    wheel = make_wheel(rel, {"demo/__init__.py": b""}, tag="py3-none-any")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    component = {"name": "demo", "kind": "kernel", "wheel": wheel.name, "sha256": digest, **change}
    _release(rel, wheel, component)
    source = tmp_path / "src"
    source.mkdir()
    with pytest.raises(VerifyError, match="not one pinwheel writes"):
        for found in candidates(str(rel), tmp_path / "cache").values():
            unchanged(found, source, {"builder": "kernel"})  # where it broke (AttributeError)

"""A shared build store (docs/SECURITY.md, "Shared build stores"): someone who can write
the store's bytes but does not hold the runner's key gets a miss; a hit's wheel must be
the one this build makes and its record's facts are checked before provenance takes
them; the local store never writes through a link a co-user planted.

Real files and a real local store (``objbackends.LocalDir``); the wheels are real zip
files with their METADATA and WHEEL."""

from __future__ import annotations

import json
import os
import platform
import zipfile
from pathlib import Path

import pytest

from pinwheel.compile import compcache, objbackends, objstore
from pinwheel.manifest.build import CacheConfig
from pinwheel.options import host as host_of

TAG = f"cp311-cp311-linux_{platform.machine()}"
IDENT = {"builder": "engine", "nvcc": "12.4", "python": "3.11.7"}
MATCH = {"tree": "ab" * 32, "version": "1.0", "source_date_epoch": 1700000000, "flags": {}}
RECORD = {"identity": IDENT, "tree": "ab" * 20, "digest": "ef" * 32,
          "compiled_members": {"tiny/_C.so": "cd" * 32}}  # fmt: skip
KEY = b"this-runner-s-key-of-at-least-32-characters"
EXPECT = objstore.Expect(name="tiny", version="1.0", tree="ab" * 20)


def _wheel(tmp: Path, name: str = "tiny", version: str = "1.0", tag: str = TAG,
           meta_name: str | None = None, payload: bytes = b"\x7fELF") -> Path:  # fmt: skip
    path = tmp / "built" / f"{name}-{version}-{tag}.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("tiny/_C.so", payload)
        zf.writestr(f"{name}-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {meta_name or name}\nVersion: {version}\n")
        zf.writestr(f"{name}-{version}.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {tag}\n")
    return path  # fmt: skip


def _store(tmp: Path, key: bytes = KEY) -> objstore.Store:
    return objstore.Store(objbackends.LocalDir(tmp / "shared" / objstore.SUBDIR), key)


def _taken(store: objstore.Store, tmp: Path, expect: objstore.Expect = EXPECT):
    hit = store.lookup(IDENT, MATCH, expect=expect)
    if isinstance(hit, objstore.Miss):
        return hit
    return store.take(hit, tmp / "dist")


def test_an_entry_not_signed_with_this_runner_s_key_is_a_miss(tmp_path: Path) -> None:
    """A co-user who can write the store's bytes, but holds another key (or none), stores a
    rebuilt wheel (a BACKDOOR line) under this build's identity and match: a miss."""
    wheel = _wheel(tmp_path, payload=b"\x7fELF BACKDOOR")
    assert _store(tmp_path, b"a-co-user-s-key-not-the-runner-s-key!!").put(wheel, RECORD, MATCH)[0]
    miss = _taken(_store(tmp_path), tmp_path)
    assert miss == objstore.Miss("miss: an entry this runner's key did not sign")
    # The same entry with its signature taken off, or changed: still a miss.
    root = tmp_path / "shared" / objstore.SUBDIR
    (index,) = root.glob("v2/index/*/*.json")
    doc = json.loads(index.read_text())
    index.write_text(json.dumps({k: v for k, v in doc.items() if k != "signature"}))
    assert isinstance(_taken(_store(tmp_path), tmp_path), objstore.Miss)
    index.write_text(json.dumps({**doc, "signature": "0" * 64}))
    assert isinstance(_taken(_store(tmp_path), tmp_path), objstore.Miss)
    # The writer's own key hits (the entry itself is sound).
    index.write_text(json.dumps(doc))
    got = _taken(_store(tmp_path, b"a-co-user-s-key-not-the-runner-s-key!!"), tmp_path)
    assert isinstance(got, Path)


@pytest.mark.parametrize(
    ("made", "said"),
    [
        ({"name": "tiny", "version": "9.9.9"}, "version '9.9.9' is not this build's '1.0'"),
        ({"name": "other"}, "name 'other' is not this build's 'tiny'"),
        ({"tag": "cp27-cp27mu-linux_x86_64"}, "tags ['cp27-cp27mu-linux_x86_64']"),
        ({"tag": "cp311-cp311-win_amd64"}, "tags ['cp311-cp311-win_amd64']"),
        ({"meta_name": "evil"}, "METADATA Name 'evil' is not the file name's 'tiny'"),
    ],
)
def test_a_signed_wheel_that_is_not_the_build_this_one_makes_is_a_miss(
    tmp_path: Path, made: dict[str, str], said: str
) -> None:
    """Even signed (a runner of the same key that was tricked, a key that leaked), a stored
    wheel of another name, version (``tiny-9.9.9`` while the build stamps 1.0), tags this
    Python does not install, or a METADATA that disagrees with its file name is a miss,
    and nothing is left in dist."""
    store = _store(tmp_path)
    assert store.put(_wheel(tmp_path, **made), RECORD, MATCH)[0]
    miss = _taken(store, tmp_path)
    assert isinstance(miss, objstore.Miss) and "not this build's" in miss.why, miss
    assert said in miss.why
    assert not list((tmp_path / "dist").iterdir())


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"tree": "0" * 40}, "tree 000000000000 is not this build's abababababab"),
        ({"tree": "not a tree\x1b[2J"}, "tree is not a git id"),
        ({"compiled_members": {"tiny/\x1b]8;;http://x\x07_C.so": "cd" * 32}}, "member name"),
        ({"compiled_members": {"../../_C.so": "cd" * 32}}, "member name"),
        ({"compiled_members": {"tiny/_C.so": "nothex"}}, "has no digest"),
        ({"methods": ["gcc\x1b[31m"]}, "control character"),
        ({"why": "planted"}, "are not a record's"),
        ({"digest": 7}, "digest is not a sha256"),
    ],
)
def test_a_record_s_facts_are_checked_before_provenance_takes_them(
    tmp_path: Path, change: dict[str, object], said: str
) -> None:
    store = _store(tmp_path)
    assert store.put(_wheel(tmp_path), {**RECORD, **change}, MATCH)[0]
    miss = store.lookup(IDENT, MATCH, expect=EXPECT)
    assert isinstance(miss, objstore.Miss) and said in miss.why, miss


def test_a_sound_signed_hit_gives_checked_facts_to_provenance(tmp_path: Path) -> None:
    store = _store(tmp_path)
    wheel = _wheel(tmp_path)
    assert store.put(wheel, RECORD, MATCH)[0]
    hit = store.lookup(IDENT, MATCH, expect=EXPECT)
    assert isinstance(hit, objstore.Hit)
    assert store.take(hit, tmp_path / "dist") == tmp_path / "dist" / wheel.name
    reused = hit.reused()
    assert reused["tree"] == "ab" * 20 and reused["members"] == {"tiny/_C.so": "cd" * 32}
    assert "key signed" in reused["why"] and "verify-build" in reused["why"]


def test_the_local_store_never_writes_through_a_link_a_co_user_planted(tmp_path: Path) -> None:
    """``v2/wheels/SHA/.wheel.<pid>.tmp -> /victim/file`` (the temporary name the store used
    to write), the entry itself a link, and a folder of the store a link to an outside
    folder: nothing outside changes; a link on the way means not stored, said."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "file").write_text("victim's\n")
    wheel = _wheel(tmp_path)
    from pinwheel.checksums import sha256_file

    sha = sha256_file(wheel)
    root = tmp_path / "shared" / objstore.SUBDIR
    blob = root / "v2" / "wheels" / sha
    blob.mkdir(parents=True)
    (blob / f".wheel.{os.getpid()}.tmp").symlink_to(victim / "file")
    (blob / "wheel").symlink_to(victim / "file")
    store = _store(tmp_path)
    assert store.put(wheel, RECORD, MATCH) == (True, "stored in the object store")
    assert (victim / "file").read_text() == "victim's\n"
    assert not (blob / "wheel").is_symlink() and sha256_file(blob / "wheel") == sha
    # A folder on the way replaced by a link out: nothing written there, not stored.
    outside = tmp_path / "outside"
    outside.mkdir()
    index_root = root / "v2" / "index"
    for child in index_root.iterdir():
        for f in child.iterdir():
            f.unlink()
        child.rmdir()
    index_root.rmdir()
    index_root.symlink_to(outside)
    stored, line = store.put(wheel, RECORD, MATCH)
    assert not stored and "symlink" in line
    assert list(outside.iterdir()) == [] and (victim / "file").read_text() == "victim's\n"


def test_a_key_file_that_is_a_link_or_that_others_may_read_is_no_store(tmp_path: Path) -> None:
    env = {"PATH": "", "SCCACHE_DIR": str(tmp_path / "shared")}
    cache = tmp_path / "cache"
    plan = compcache.plan(CacheConfig(), cache, host_of(env))
    store, _ = objstore.for_plan(plan, cold=False)
    assert store is not None
    key_file = cache / "keys" / "object-store.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    again, _ = objstore.for_plan(plan, cold=False)
    assert again is not None and again.key == store.key  # made once, read back
    key_file.chmod(0o644)
    none, why = objstore.for_plan(plan, cold=False)
    assert none is None and "no key to sign entries with" in why and "0600" in why
    key_file.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (cache / "keys").rmdir()
    (cache / "keys").symlink_to(elsewhere)
    none, why = objstore.for_plan(plan, cold=False)
    assert none is None and "symlink" in why and list(elsewhere.iterdir()) == []
    short = compcache.plan(CacheConfig(), cache, host_of({**env, "PINWHEEL_STORE_KEY": "short"}))
    none, why = objstore.for_plan(short, cold=False)
    assert none is None and "at least 32" in why


# ---------------------------------------------------------------- a tag travels with a wheel

MANY = f"cp311-cp311-manylinux_2_34_{platform.machine()}"
DECISION = {"platform": f"manylinux_2_34_{platform.machine()}", "reason": "policy held"}


def _tagged_pair(tmp: Path, version: str = "1.0") -> tuple[Path, Path]:
    built = _wheel(tmp)
    tagged = _wheel(tmp / "tagged", version=version, tag=MANY)
    return built, tagged


def _put_tag(store: objstore.Store, built: Path, tagged: Path, **decision: str) -> str:
    from pinwheel.checksums import sha256_file

    rec = {"wheel": built.name, **DECISION, **decision}
    return store.put_tag(built, sha256_file(built), rec, tagged, sha256_file(tagged))


def _fresh_runner_copy(tmp: Path, built: Path) -> Path:
    """The builder's wheel as a fresh runner has it: alone in its own dist folder."""
    dist = tmp / "fresh" / "dist"
    dist.mkdir(parents=True)
    copy = dist / built.name
    copy.write_bytes(built.read_bytes())
    return copy


def test_a_stored_tag_is_taken_with_its_checked_copy(tmp_path: Path) -> None:
    from pinwheel.checksums import sha256_file

    built, tagged = _tagged_pair(tmp_path)
    assert _put_tag(_store(tmp_path), built, tagged) == "its tag stored in the object store"
    mine = _fresh_runner_copy(tmp_path, built)
    got = _store(tmp_path).take_tag(mine, sha256_file(mine))
    assert not isinstance(got, objstore.Miss), got
    out, decision = got
    assert out == mine.parent / tagged.name and out.read_bytes() == tagged.read_bytes()
    assert decision["platform"] == DECISION["platform"]


WHY = {
    "another key": "did not sign",
    "another version": "is not tiny-1.0",
    "another platform": "no platform tag",
    "a tampered copy": "sha256 is not the entry's",
    "a path name": "no valid wheel name",
}


@pytest.mark.parametrize("forge", sorted(WHY))
def test_a_stored_tag_that_is_not_this_wheel_s_is_a_miss_and_leaves_nothing(
    tmp_path: Path, forge: str
) -> None:
    """A co-user without the key, or a writer with it naming other bytes: the fresh
    runner tags the wheel itself (a miss), and no copy is left beside it."""
    from pinwheel.checksums import sha256_file

    built, tagged = _tagged_pair(tmp_path, "2.0" if forge == "another version" else "1.0")
    store = _store(tmp_path, b"a-co-user-s-key-not-the-runner-s-key!!") \
        if forge == "another key" else _store(tmp_path)  # fmt: skip
    extra = {"platform": "win_amd64"} if forge == "another platform" else {}
    _put_tag(store, built, tagged, **extra)
    if forge == "a tampered copy":
        blob = next((tmp_path / "shared").rglob("wheel"))
        for path in (tmp_path / "shared").rglob("wheel"):
            if path.read_bytes() == tagged.read_bytes():
                blob = path
        blob.write_bytes(blob.read_bytes() + b"BACKDOOR")
    if forge == "a path name":
        key = next((tmp_path / "shared").rglob("tags/*.json"))
        raw = json.loads(key.read_text())
        raw["wheel"] = f"../../{tagged.name}"
        rel = key.relative_to(tmp_path / "shared" / objstore.SUBDIR).as_posix()
        key.write_text(json.dumps(objstore.signed_entry(KEY, rel, raw)))
    mine = _fresh_runner_copy(tmp_path, built)
    got = _store(tmp_path).take_tag(mine, sha256_file(mine))
    assert isinstance(got, objstore.Miss), got
    assert WHY[forge] in got.why
    assert sorted(p.name for p in mine.parent.iterdir()) == [mine.name]
    assert not (tmp_path / "fresh" / tagged.name).exists()


def test_a_stored_check_is_taken_only_when_signed_and_plain_text(tmp_path: Path) -> None:
    """A passing check report travels under its cross-runner key: signed with this
    runner's key and holding no escape sequence (a tool's newlines are kept), else a miss."""
    key = "ab" * 32
    report = {"ok": True, "wheels": [{"wheel": "w.whl", "auditwheel": "line one\nline two"}]}
    assert _store(tmp_path).put_check(key, report) == "the check stored in the object store"
    assert _store(tmp_path).take_check(key) == report
    assert "did not sign" in _store(tmp_path, b"a-co-user-s-key-not-the-runner-s-key!!") \
        .take_check(key).why  # fmt: skip
    stored = next((tmp_path / "shared").rglob(f"checks/{key}.json"))
    kept = stored.read_bytes()
    stored.write_bytes(kept.replace(b"line two", b"line 2!!"))  # one claim edited, no key
    assert "did not sign" in _store(tmp_path).take_check(key).why
    stored.write_bytes(kept)
    hostile = {"ok": True, "wheels": [{"wheel": "w.whl", "auditwheel": "\x1b]8;;evil\x07"}]}
    _store(tmp_path).put_check("cd" * 32, hostile)
    assert "wrong shape" in _store(tmp_path).take_check("cd" * 32).why
    assert _store(tmp_path).take_check("../../etc/passwd").why == "miss: no key"
    assert _store(tmp_path).put_check("not-a-digest", report) == "the check not stored: no key"

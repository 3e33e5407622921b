"""The fidelity teacher file: written byte-reproducibly, read and checked, indexed.

Teacher file (``.npz``, byte-reproducible: fixed zip timestamps, stored): ``meta``
(JSON bytes), ``offsets`` (int64 [W+1], positions per window), ``target``
(int32 [P], token j), ``target_logprob`` (float32 [P]); then either ``full``
(float32 [P, V], every log-probability) or ``top_ids`` (int32 [P, K], by
descending log-probability) and ``top_logprobs`` (float32 [P, K]). Every member's
header is checked against its bytes before numpy allocates anything.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import documents
from pinwheel.checksums import sha256_file
from pinwheel.errors import UsageError, VerifyError
from pinwheel.serve.panel import Panel

TEACHER_SCHEMA = "pinwheel.teacher/1"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _np() -> Any:
    try:
        import numpy
    except ImportError:
        raise UsageError(
            "fidelity needs numpy",
            where="[qualify.fidelity]",
            next="install the qualify extra: pip install -e '.[qualify]'",
        ) from None
    return numpy


@dataclass(frozen=True, eq=False)
class Teacher:
    meta: Mapping[str, Any]
    offsets: Any  # int64 [W+1]
    target: Any  # int32 [P]
    target_logprob: Any  # float32 [P]
    top_ids: Any  # int32 [P, K], or None
    top_logprobs: Any  # float32 [P, K], or None
    full: Any  # float32 [P, V], or None
    sha256: str
    source: str

    @property
    def positions(self) -> int:
        return int(len(self.target))


def teacher_bytes(arrays: Mapping[str, Any], meta: Mapping[str, Any]) -> bytes:
    """An .npz numpy can load, byte for byte the same for the same arrays."""
    np = _np()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        items = {"meta": np.frombuffer(json.dumps(meta, sort_keys=True).encode(), np.uint8)}
        items |= dict(arrays)
        for name in sorted(items):
            one = io.BytesIO()
            np.lib.format.write_array(one, np.ascontiguousarray(items[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=ZIP_TIME)
            info.external_attr = 0o644 << 16
            zf.writestr(info, one.getvalue())
    return buf.getvalue()


MAX_TEACHER = 8 * 1024**3  # bytes a teacher file's arrays may hold in memory, all together
TEACHER_ARRAYS = {
    "meta": ("u1", 1),
    "offsets": ("i8", 1),
    "target": ("i4", 1),
    "target_logprob": ("f4", 1),
    "top_ids": ("i4", 2),
    "top_logprobs": ("f4", 2),
    "full": ("f4", 2),
}


def _teacher_error(what: str, source: str) -> UsageError:
    return UsageError(
        f"not a usable teacher file: {what}",
        where=source,
        next="recapture it: `pinwheel qualify teacher --out FILE`, then pin its sha256",
    )


def write_teacher_file(
    path: Path, arrays: Mapping[str, Any], meta: Mapping[str, Any], full_npy: Path
) -> None:
    """The file :func:`teacher_bytes` would hold, its ``full`` member streamed from an .npy
    file (never whole in memory); written beside ``path``, then renamed over it."""
    import os
    import shutil

    np = _np()
    items: dict[str, Any] = {
        "meta": np.frombuffer(json.dumps(meta, sort_keys=True).encode(), np.uint8)
    }
    items |= dict(arrays)
    names = sorted([*items, "full"])
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED) as zf:
                for name in names:
                    info = zipfile.ZipInfo(name + ".npy", date_time=ZIP_TIME)
                    info.external_attr = 0o644 << 16
                    if name == "full":
                        info.file_size = full_npy.stat().st_size  # as writestr sets it
                        with zf.open(info, "w") as dst, open(full_npy, "rb") as src:
                            shutil.copyfileobj(src, dst, 1 << 22)
                    else:
                        one = io.BytesIO()
                        np.lib.format.write_array(
                            one, np.ascontiguousarray(items[name]), allow_pickle=False
                        )
                        zf.writestr(info, one.getvalue())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MAX_TEACHER_STORE = 4 * 1024**4  # a default: bytes a teacher read through a memory map may hold


def _teacher_members(data: bytes, source: str, limit: int) -> None:
    check_teacher_members(io.BytesIO(data), source, limit)


def check_teacher_members(fh: Any, source: str, limit: int) -> None:
    """Every member's declared shape and dtype, checked against the limit and the bytes the
    member really holds, before numpy allocates anything (an .npz bomb asks for GiBs)."""
    np = _np()
    total = 0
    try:
        with zipfile.ZipFile(fh) as zf:
            infos = zf.infolist()
            if len(infos) > len(TEACHER_ARRAYS):
                raise _teacher_error(f"{len(infos)} members, a teacher has at most 7", source)
            for info in infos:
                name = info.filename.removesuffix(".npy")
                if name not in TEACHER_ARRAYS or not info.filename.endswith(".npy"):
                    raise _teacher_error(f"unexpected member {info.filename!r}", source)
                if info.compress_type != zipfile.ZIP_STORED:  # what teacher_bytes writes
                    raise _teacher_error(
                        f"{info.filename} is compressed: a teacher file stores its arrays "
                        "(a compressed member could unpack to any size)",
                        source,
                    )
                if info.file_size > limit:
                    raise _teacher_error(
                        f"{info.filename} unpacks to {info.file_size} bytes, over the "
                        f"{limit}-byte limit",
                        source,
                    )
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    if version not in ((1, 0), (2, 0), (3, 0)):
                        raise _teacher_error(f"{info.filename}: npy version {version}", source)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _fortran, dtype = read(fh, max_header_size=10000)
                    header = fh.tell()
                kind, ndim = TEACHER_ARRAYS[name]
                if dtype.str.lstrip("<|") != kind or len(shape) != ndim:
                    raise _teacher_error(
                        f"{name} is {dtype.str}{list(shape)}, a teacher stores {kind} with "
                        f"{ndim} dimension(s)",
                        source,
                    )
                nbytes = math.prod(shape) * dtype.itemsize
                if nbytes != info.file_size - header:
                    raise _teacher_error(
                        f"{name} declares {list(shape)} ({nbytes} bytes), the member holds "
                        f"{info.file_size - header}",
                        source,
                    )
                total += nbytes
                if total > limit:
                    raise _teacher_error(
                        f"the arrays hold more than the {limit}-byte limit", source
                    )
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise _teacher_error(str(exc), source) from None


def _teacher_shapes(arrays: Mapping[str, Any], source: str) -> None:
    """The arrays agree with each other: positions, windows, K or V."""
    np = _np()
    for name in ("offsets", "target", "target_logprob"):
        if name not in arrays:
            raise _teacher_error(f"no {name} array", source)
    offsets, p = arrays["offsets"], len(arrays["target"])
    if len(offsets) < 2 or offsets[0] != 0 or np.any(np.diff(offsets) < 1) or offsets[-1] != p:
        raise _teacher_error(
            f"offsets are not 0 = o[0] < o[1] < ... < o[-1] = {p} positions", source
        )
    if len(arrays["target_logprob"]) != p:
        raise _teacher_error("target_logprob has another length than target", source)
    full: Any = arrays.get("full")
    ids: Any = arrays.get("top_ids")
    lps: Any = arrays.get("top_logprobs")
    if full is None and (ids is None or lps is None):
        raise _teacher_error("neither full rows nor top_ids + top_logprobs", source)
    if full is not None and (full.shape[0] != p or full.shape[1] < 1):
        raise _teacher_error(f"full is {list(full.shape)}, expected [{p}, vocabulary]", source)
    if full is None and (ids.shape != lps.shape or ids.shape[0] != p or ids.shape[1] < 1):
        raise _teacher_error(
            f"top_ids {list(ids.shape)} and top_logprobs {list(lps.shape)} are not both [{p}, K]",
            source,
        )
    if np.any(arrays["target"] < 0) or (
        full is not None and np.any(arrays["target"] >= full.shape[1])
    ):
        raise _teacher_error("a target token id is outside the vocabulary", source)


def load_teacher(data: bytes, source: str, *, limit: int = MAX_TEACHER) -> Teacher:
    from pinwheel import untrusted

    np = _np()
    _teacher_members(data, source, limit)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise UsageError(f"not a teacher file: {exc}", where=source) from None
    if "meta" not in arrays:
        raise _teacher_error("no meta", source)
    raw = untrusted.parse_json(bytes(arrays.pop("meta")), untrusted.TEACHER_META, source)
    if not isinstance(raw, dict) or raw.get("schema") != TEACHER_SCHEMA:
        raise UsageError(
            f"not a {TEACHER_SCHEMA} file",
            where=source,
            next="capture it with `pinwheel qualify teacher --out FILE`",
        )
    meta = untrusted.decode(documents.TeacherMetaDoc, raw, untrusted.TEACHER_META, source)
    _teacher_shapes(arrays, source)
    return Teacher(
        meta={**raw, "source": meta.source},
        offsets=arrays["offsets"],
        target=arrays["target"],
        target_logprob=arrays["target_logprob"],
        top_ids=arrays.get("top_ids"),
        top_logprobs=arrays.get("top_logprobs"),
        full=arrays.get("full"),
        sha256=hashlib.sha256(data).hexdigest(),
        source=source,
    )


def read_teacher(path: Path, sha256: str | None) -> Teacher:
    if not path.is_file():
        raise UsageError(
            f"no teacher file at {path}",
            where="[qualify.fidelity].teacher",
            next="capture it once: `pinwheel qualify teacher --out FILE ...`, then pin its sha256",
        )
    size = path.stat().st_size
    if size > MAX_TEACHER:
        raise _teacher_error(f"{size} bytes, over the {MAX_TEACHER}-byte limit", str(path))
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise VerifyError(
            f"teacher sha256 is {digest}, the manifest pins {sha256}",
            where=str(path),
            next="restore the pinned teacher file, or recapture it and pin the new sha256",
        )
    return load_teacher(data, str(path))


def check_panel(teacher: Teacher, panel: Panel) -> None:
    """The teacher was captured on this panel (its sha256 and its window lengths)."""
    _check_panel(teacher, panel)


@dataclass(frozen=True, eq=False)
class TeacherIndex:
    """What pinwheel reads of a teacher file for the in-process path: never the rows."""

    path: Path
    sha256: str
    meta: Mapping[str, Any]
    offsets: Any
    target: Any
    positions: int
    vocab: int


def read_index(path: Path, sha256: str | None) -> TeacherIndex:
    """The teacher's meta, offsets and targets; the file checked whole (streamed sha256,
    every member's header against its bytes), its ``full`` rows left on disk."""
    np = _np()
    from pinwheel import untrusted

    if not path.is_file():
        raise UsageError(
            f"no teacher file at {path}",
            where="[qualify.fidelity].teacher",
            next="capture it once: `pinwheel qualify teacher --top-k -1 --out FILE`",
        )
    digest = sha256_file(path)  # checksums' one file-hashing loop (streamed)
    if sha256 is not None and digest != sha256:
        raise VerifyError(
            f"teacher sha256 is {digest}, the manifest pins {sha256}",
            where=str(path),
            next="restore the pinned teacher file, or recapture it and pin the new sha256",
        )
    with open(path, "rb") as fh:
        check_teacher_members(fh, str(path), limit=MAX_TEACHER_STORE)
        try:
            with zipfile.ZipFile(fh) as zf:
                small = {}
                for name in ("meta", "offsets", "target"):
                    with zf.open(name + ".npy") as member:
                        small[name] = np.lib.format.read_array(
                            io.BytesIO(member.read(64 * 1024 * 1024)), allow_pickle=False
                        )
                names = {i.filename for i in zf.infolist()}
                if "full.npy" not in names:
                    raise UsageError(
                        "the in-process scorer needs a teacher with full rows",
                        where=str(path),
                        next="recapture it with `pinwheel qualify teacher --top-k -1`",
                    )
                with zf.open("full.npy") as member:
                    version = np.lib.format.read_magic(member)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _f, _d = read(member, max_header_size=10000)
        except (KeyError, ValueError, zipfile.BadZipFile, OSError, EOFError) as exc:
            raise UsageError(f"not a usable teacher file: {exc}", where=str(path)) from None
    raw = untrusted.parse_json(bytes(small["meta"]), untrusted.TEACHER_META, str(path))
    if not isinstance(raw, dict) or raw.get("schema") != TEACHER_SCHEMA:
        raise UsageError(f"not a {TEACHER_SCHEMA} file", where=str(path))
    meta = untrusted.decode(documents.TeacherMetaDoc, raw, untrusted.TEACHER_META, str(path))
    offsets, target = small["offsets"], small["target"]
    p = len(target)
    if len(offsets) < 2 or offsets[0] != 0 or np.any(np.diff(offsets) < 1) or offsets[-1] != p:
        raise UsageError(f"offsets are not 0 < ... < {p} positions", where=str(path))
    if shape[0] != p or np.any(target < 0) or np.any(target >= shape[1]):
        raise UsageError("full rows and targets disagree", where=str(path))
    return TeacherIndex(
        path, digest, {**raw, "source": meta.source}, offsets, target, p, int(shape[1])
    )


def _check_panel(teacher: Teacher, panel: Panel) -> None:
    np = _np()
    want = np.array([0] + [len(w) - 1 for w in panel.windows], np.int64).cumsum()
    pinned = teacher.meta.get("panel_sha256")
    if pinned != panel.sha256:
        raise VerifyError(
            f"the teacher was captured on panel {pinned}, not {panel.sha256}",
            where=teacher.source,
            next="recapture the teacher on this panel: `pinwheel qualify teacher --out FILE`",
        )
    if not np.array_equal(teacher.offsets, want):
        raise VerifyError(
            f"the teacher names panel {pinned} but its windows differ from that panel's "
            f"({len(teacher.offsets) - 1} windows / {int(teacher.offsets[-1])} positions, "
            f"the panel has {len(panel.windows)} / {int(want[-1])}): the file was altered "
            "or written by another tool",
            where=teacher.source,
            next="recapture the teacher on this panel: `pinwheel qualify teacher --out FILE`",
        )

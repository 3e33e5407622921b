"""Fidelity: KLD(teacher || student) over a pinned panel of token windows.

In: a panel (JSON token windows, sha256-pinned), a teacher (a file written by
``pinwheel qualify teacher``, sha256-pinned, or a reference server), and the
served model's ``prompt_logprobs`` on the same windows. Out: per-position KLD in
nats (float64) and its summary: mean with a seeded bootstrap 95% CI, median,
p99, top-1 agreement (and how many positions had a tied maximum), and
``kld_sha256``: the sha256 of the canonical per-position text (one
``printf("%.9f\\n")`` line per position, :mod:`pinwheel.serve.kld`), which a
third party recomputes from the same log-probabilities on any CPU.

Position j of a window (j >= 1) is the distribution that predicted token j from
tokens < j: vLLM's ``prompt_logprobs[j]`` and the teacher's logits row j-1.

Methods (``FidelityResult.method`` / ``.bound``; the math is in docs/qualify.md):

- ``full`` / ``exact``: both sides returned the whole vocabulary; both rows are
  renormalized in float64, then ``sum_v p_t (log p_t - log p_s)`` (exactly rounded
  sum; 0 * log 0 = 0; +inf where the student has no mass and the teacher has).
- ``top-K+tail`` / ``lower``: otherwise. A proven lower bound of the KLD, even
  with float32 log-probabilities and tiny tails: it can FAIL a ``max_mean_kld``
  gate, never PASS it (the gate is then NOT PROVEN).

Teacher file (``.npz``, byte-reproducible: fixed zip timestamps, stored): ``meta``
(JSON bytes), ``offsets`` (int64 [W+1], positions per window), ``target``
(int32 [P], token j), ``target_logprob`` (float32 [P]); then either ``full``
(float32 [P, V], every log-probability) or ``top_ids`` (int32 [P, K], by
descending log-probability) and ``top_logprobs`` (float32 [P, K]).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import documents, runner
from pinwheel.checksums import sha256_file
from pinwheel.errors import PinwheelError, UsageError, VerifyError
from pinwheel.fsutil import atomic_write_bytes
from pinwheel.manifest.serve import FidelityConfig
from pinwheel.serve import workers
from pinwheel.serve.receipt import FidelityResult, Gate

PANEL_SCHEMA = "pinwheel.panel/1"
TEACHER_SCHEMA = "pinwheel.teacher/1"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
MAX_BOOTSTRAP_DRAWS = 2_000_000_000  # resamples x windows: ~1 min of numpy, never more
BOOTSTRAP_BLOCK = 4_000_000  # indices drawn at once (32 MB of int64)


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


# --------------------------------------------------------------------------- panel


@dataclass(frozen=True)
class Panel:
    windows: tuple[tuple[int, ...], ...]
    sha256: str
    path: str

    @property
    def positions(self) -> int:
        return sum(len(w) - 1 for w in self.windows)


def read_panel(
    path: Path,
    sha256: str | None,
    tokenize: Callable[[str], list[int]] | None = None,
) -> Panel:
    """Read and check a panel; a ``texts`` panel needs ``tokenize`` (the server's)."""
    if not path.is_file():
        raise UsageError(
            f"no panel file at {path}",
            where="[qualify.fidelity].panel",
            next="commit the panel JSON beside the manifest, or fix its path",
        )
    digest = sha256_file(path)
    if sha256 is not None and digest != sha256:
        raise VerifyError(
            f"panel sha256 is {digest}, the manifest pins {sha256}",
            where=str(path),
            next="restore the pinned panel, or review the change and pin the new sha256",
        )
    from pinwheel import untrusted

    data = untrusted.read_json(path, untrusted.PANEL)
    if not isinstance(data, dict) or data.get("schema") != PANEL_SCHEMA:
        raise UsageError(
            f"the panel's schema is not {PANEL_SCHEMA!r}",
            where=str(path),
            next='write {"schema": "pinwheel.panel/1", "windows": [[token ids...], ...]}',
        )
    untrusted.decode(documents.PanelDoc, data, untrusted.PANEL, str(path))  # types, field by field
    windows: list[tuple[int, ...]] = []
    if "windows" in data:
        for w in data["windows"]:
            if not isinstance(w, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in w
            ):
                raise UsageError(
                    "a window is not a list of token ids (0 to 2^31-1: the teacher stores int32)",
                    where=str(path),
                    next="write token ids the model's tokenizer gave, then pin the new sha256",
                )
            windows.append(tuple(w))
    elif "texts" in data:
        size = data.get("window")
        if tokenize is None:
            raise UsageError(
                "a texts panel needs the server's tokenizer",
                where=str(path),
                next="pass a server (--url) or write token windows into the panel",
            )
        for text in data["texts"]:
            ids = tokenize(str(text))
            windows.append(tuple(ids[:size] if isinstance(size, int) else ids))
    if any(not 0 <= t < 2**31 for w in windows for t in w):  # a texts panel's tokenizer
        raise UsageError(
            "a token id outside 0..2^31-1 (the teacher stores int32)",
            where=str(path),
            next="check the server's tokenizer (`curl URL/tokenize`)",
        )
    if not windows or any(len(w) < 2 for w in windows):
        raise UsageError(
            "the panel needs at least one window of two or more tokens", where=str(path)
        )
    return Panel(tuple(windows), digest, str(path))


def write_panel(path: Path, windows: Sequence[Sequence[int]]) -> str:
    """Write a token-window panel; returns its sha256 (to pin in the manifest)."""
    text = json.dumps({"schema": PANEL_SCHEMA, "windows": [list(w) for w in windows]})
    atomic_write_bytes(path, text.encode() + b"\n")
    return hashlib.sha256(text.encode() + b"\n").hexdigest()


# --------------------------------------------------------------------------- teacher file


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


def _sha256_stream(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


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
    digest = _sha256_stream(path)
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


# --------------------------------------------------------------------------- capture


@dataclass(frozen=True)
class TeacherRequest:
    out: Path
    panel: Panel
    top_k: int  # teacher log-probabilities kept per position (-1: full rows)
    url: str | None = None  # a reference server, or
    python: str | None = None  # an interpreter with transformers + torch
    model: str | None = None  # the unquantized model directory (for python)
    dtype: str = "float32"


@dataclass(frozen=True)
class TeacherOutcome:
    path: str
    sha256: str
    positions: int
    source: str
    stored: str  # "full" or "top-K"
    bytes: int


def parse_position(entry: Mapping[str, Any]) -> tuple[Any, Any, int]:
    """One ``prompt_logprobs`` entry -> (ids int64, logprobs float64, top-1 id).

    The top-1 id follows the one tie rule both sides use (highest log-probability,
    ties to the lowest id), not the server's ``rank`` (its order among ties is arbitrary).
    """
    np = _np()
    ids = np.fromiter((int(k) for k in entry), np.int64, len(entry))
    lps = np.fromiter((float(v["logprob"]) for v in entry.values()), np.float64, len(entry))
    at = ids[lps == lps.max()] if len(lps) else ids
    return ids, lps, int(at.min()) if len(at) else -1  # -1: empty, or NaN (refused later)


VLLM_DEFAULT_MAX_LOGPROBS = 20  # vLLM's --max-logprobs default caps prompt_logprobs


def server_flags(cfg: FidelityConfig | None, args: Sequence[str]) -> tuple[str, ...]:
    """What a server started for qualification needs so vLLM returns ``top_k`` prompt
    log-probabilities (``-1``: the whole vocabulary, for the exact KLD): ``--max-logprobs``
    when the profile's ``args`` leave it at vLLM's default cap of 20."""
    if cfg is None:
        return ()
    need = cfg.top_k
    given: str | None = None
    for i, a in enumerate(args):
        if a == "--max-logprobs" and i + 1 < len(args):
            given = args[i + 1]
        elif a.startswith("--max-logprobs="):
            given = a.split("=", 1)[1]
    if given is None:
        if need != -1 and need <= VLLM_DEFAULT_MAX_LOGPROBS:
            return ()
        return ("--max-logprobs", str(need))
    try:
        have = int(given)
    except ValueError:
        have = None
    if have == -1 or (have is not None and need != -1 and have >= need):
        return ()
    raise UsageError(
        f"the serve profile starts vLLM with --max-logprobs {given}, but [qualify.fidelity] "
        f"asks for top_k = {need}" + (" (the whole vocabulary)" if need == -1 else ""),
        where="[serve.profile].args",
        next=f"set --max-logprobs {need} in the profile's args (or drop it: qualify sets it)",
    )


def _server_rows(client: Any, model: str, panel: Panel, top_k: int) -> list[tuple[Any, Any, int]]:
    from pinwheel.serve.client import ServerRefused

    rows: list[tuple[Any, Any, int]] = []
    for w in panel.windows:
        try:
            got = client.prompt_logprobs(model, w, top_k)
        except ServerRefused as exc:
            if exc.status != 400 or "logprobs" not in exc.what:
                raise
            raise PinwheelError(
                exc.what,
                where=client.url,
                next=f"start the server with --max-logprobs {top_k} (vLLM caps prompt_logprobs "
                "at 20 by default; -1 allows the whole vocabulary), or let `pinwheel qualify` "
                "start it (drop --url)",
            ) from None
        if len(got) != len(w) or got[0] is not None:
            raise PinwheelError(
                f"the server returned {len(got)} prompt positions for a window of {len(w)}",
                where=client.url,
                next="the server must support prompt_logprobs on /v1/completions",
            )
        rows.extend(parse_position(e) for e in got[1:])
    return rows


TOKEN_ID_LIMIT = 2**31  # the teacher file stores token ids as int32


def _refuse_row(client: Any, position: int, what: str) -> PinwheelError:
    from pinwheel.untrusted import LOGPROBS, fail

    return fail(LOGPROBS, f"prompt position {position}: {what}", client.url,
                field="choices[0].prompt_logprobs")  # fmt: skip


def _check_rows(client: Any, rows: list[tuple[Any, Any, int]], targets: list[int],
                top_k: int) -> None:  # fmt: skip
    """Every row whole before a byte of the teacher is written: the target token present,
    ids distinct and below 2^31, finite log-probabilities; with ``top_k`` -1 every row the
    whole vocabulary (ids exactly 0..V-1), else at least ``top_k`` entries. A row with a
    token missing is refused, never stored as whatever memory held."""
    np = _np()
    vocab = len(rows[0][0]) if rows else 0
    for i, ((ids, lps, _), t) in enumerate(zip(rows, targets, strict=True)):
        if len(ids) and (ids.min() < 0 or ids.max() >= TOKEN_ID_LIMIT):
            raise _refuse_row(client, i, f"a token id outside 0..2^31-1 ({int(ids.max())})")
        if len(np.unique(ids)) != len(ids):
            raise _refuse_row(client, i, "a token id listed twice")
        if not np.isfinite(lps).all():
            raise _refuse_row(client, i, "a log-probability that is not finite")
        if not (ids == t).any():
            raise _refuse_row(client, i, f"the answer lacks the prompt token {t}")
        if top_k == -1:
            if len(ids) != vocab or (vocab and ids.max() >= vocab):
                raise _refuse_row(
                    client, i,
                    f"{len(ids)} entries with ids up to {int(ids.max()) if len(ids) else -1}; "
                    f"a full row has every id of the {vocab}-token vocabulary",
                )  # fmt: skip
        elif len(ids) < top_k:
            raise _refuse_row(client, i, f"{len(ids)} entries, top_k = {top_k} asked for")


def capture_from_server(client: Any, model: str, panel: Panel, top_k: int) -> bytes:
    """Teacher file bytes from a reference server's prompt_logprobs."""
    np = _np()
    rows = _server_rows(client, model, panel, top_k)
    targets = [t for w in panel.windows for t in w[1:]]
    _check_rows(client, rows, targets, top_k)
    tlp = []
    for (ids, lps, _), t in zip(rows, targets, strict=True):
        tlp.append(lps[np.flatnonzero(ids == t)[0]])
    arrays: dict[str, Any] = {
        "offsets": np.array([0] + [len(w) - 1 for w in panel.windows], np.int64).cumsum(),
        "target": np.array(targets, np.int32),
        "target_logprob": np.array(tlp, np.float32),
    }
    if top_k == -1:
        vocab = len(rows[0][0])
        full = np.full((len(rows), vocab), np.nan, np.float32)  # every cell set below
        for i, (ids, lps, _) in enumerate(rows):
            full[i, ids] = lps
        arrays["full"] = full
    else:
        k = top_k  # every row has at least top_k entries (_check_rows)
        ti = np.full((len(rows), k), -1, np.int32)
        tl = np.full((len(rows), k), np.nan, np.float32)
        for i, (ids, lps, _) in enumerate(rows):
            order = np.lexsort((ids, -lps))[:k]  # rank order; ties by token id
            ti[i], tl[i] = ids[order], lps[order]
        arrays |= {"top_ids": ti, "top_logprobs": tl}
    meta = {
        "schema": TEACHER_SCHEMA,
        "panel_sha256": panel.sha256,
        "source": f"server {client.url} model {model}",
        "top_k": top_k,
    }
    return teacher_bytes(arrays, meta)


# Run by the engine's (or any) python with transformers + torch: full log-softmax rows.
def capture_with_transformers(req: TeacherRequest, out: Path | None = None) -> bytes:
    """Teacher file bytes; with ``out`` and full rows, the file is streamed to ``out``
    instead (a large panel's rows never sit in memory) and b"" is returned."""
    np = _np()
    assert req.python and req.model
    panel = req.panel
    with tempfile.TemporaryDirectory(
        prefix="pinwheel-teacher-", dir=out.parent if out else None
    ) as tmp:
        spec = Path(tmp) / "request.json"
        spec.write_text(
            json.dumps(
                {
                    "model": req.model,
                    "dtype": req.dtype,
                    "windows": [list(w) for w in panel.windows],
                }
            )
        )
        cmd = runner.Command(
            (req.python, "-c", workers.source("teacher"), str(spec), tmp),
            what="the teacher",
            check=False,
        )
        proc = runner.run(cmd)
        if proc.returncode != 0:
            raise PinwheelError(
                "transformers could not compute the teacher log-probabilities",
                where=req.python,
                next="that python needs transformers + torch and the model directory:\n"
                + proc.err_text[-2000:],
            )
        full = np.load(Path(tmp) / "full.npy", mmap_mode="r")
        versions = json.loads((Path(tmp) / "versions.json").read_text())
        targets = np.array([t for w in panel.windows for t in w[1:]], np.int64)
        arrays: dict[str, Any] = {
            "offsets": np.array([0] + [len(w) - 1 for w in panel.windows], np.int64).cumsum(),
            "target": targets.astype(np.int32),
            "target_logprob": np.array(full[np.arange(len(targets)), targets], np.float32),
        }
        meta = {
            "schema": TEACHER_SCHEMA,
            "panel_sha256": panel.sha256,
            "source": f"transformers {versions['transformers']} torch {versions['torch']} "
            f"{req.dtype} on {Path(req.model).name}",
            "top_k": req.top_k,
        }
        if req.top_k == -1 and out is not None:
            del full
            write_teacher_file(out, arrays, meta, Path(tmp) / "full.npy")
            return b""
        full = np.array(full)
    if req.top_k == -1:
        arrays["full"] = full
    else:
        k = min(req.top_k, full.shape[1])
        ids = np.empty((len(full), k), np.int32)
        for i, row in enumerate(full):
            ids[i] = np.lexsort((np.arange(len(row)), -row))[:k]
        arrays |= {"top_ids": ids, "top_logprobs": np.take_along_axis(full, ids, 1)}
    return teacher_bytes(arrays, meta)


def capture_teacher(req: TeacherRequest) -> TeacherOutcome:
    """Capture once, write atomically; the returned sha256 goes into the manifest."""
    if req.url:
        from pinwheel.serve.client import Client

        client = Client(req.url)
        try:
            models = client.models()
            if not models:
                raise PinwheelError("the server lists no model", where=f"{req.url}/v1/models")
            data = capture_from_server(client, str(models[0]["id"]), req.panel, req.top_k)
        finally:
            client.close()
    elif req.python and req.model and req.top_k == -1:  # full rows: streamed to the file
        capture_with_transformers(req, req.out)
        ix = read_index(req.out, None)
        return TeacherOutcome(
            path=str(req.out), sha256=ix.sha256, positions=ix.positions,
            source=str(ix.meta["source"]), stored="full", bytes=req.out.stat().st_size,
        )  # fmt: skip
    elif req.python and req.model:
        data = capture_with_transformers(req)
    else:
        raise UsageError(
            "no teacher to capture from",
            where="pinwheel qualify teacher",
            next="pass --url URL (a reference server) or --model DIR --python PY (transformers)",
        )
    atomic_write_bytes(req.out, data)
    t = load_teacher(data, str(req.out))
    return TeacherOutcome(
        path=str(req.out),
        sha256=t.sha256,
        positions=t.positions,
        source=str(t.meta["source"]),
        stored="full" if t.full is not None else f"top-{t.top_ids.shape[1]}",
        bytes=len(data),
    )


# --------------------------------------------------------------------------- KLD


def score_positions(
    teacher: Teacher, student: Sequence[tuple[Any, Any, int]]
) -> tuple[Any, Any, bool, int]:
    """Per-position KLD (float64), top-1 agreement, whether every value is exact, top-1 ties.

    Exact where both sides gave the whole vocabulary (:mod:`pinwheel.serve.workers.detkl`:
    the same bits on every CPU, the in-process scorer's code); a proven
    lower bound (:func:`kld.lower_bound`) elsewhere. Top-1 on both sides: the highest
    log-probability, ties to the lowest token id; a position where either side's
    maximum is tied counts in ``ties``.
    """
    np = _np()
    from pinwheel.serve import kld as K
    from pinwheel.serve.workers import detkl

    n = len(student)
    out = np.empty(n, np.float64)
    scorer = None if teacher.full is None else detkl.Scorer(teacher.full.shape[1])
    agree = np.empty(n, bool)
    exact = True
    ties = 0
    vocab = None if teacher.full is None else teacher.full.shape[1]
    for p, (ids, lps, _) in enumerate(student):
        target = int(teacher.target[p])
        if teacher.full is not None:
            t_side = K.Side.whole(teacher.full[p])
        else:
            t_side = K.Side.top(
                teacher.top_ids[p], teacher.top_logprobs[p], [target], [teacher.target_logprob[p]]
            )
        if vocab is not None and len(ids) and int(ids.max()) >= vocab:
            raise VerifyError(
                f"position {p}: the server answered token id {int(ids.max())}, beyond the "
                f"teacher's {vocab}-token vocabulary",
                where=teacher.source,
                next="the teacher and the served model must share a tokenizer; recapture the "
                "teacher from the same model",
            )
        try:
            if vocab is not None and len(ids) == vocab:
                s_row = np.full(vocab, np.nan)
                s_row[ids] = lps
                assert scorer is not None
                try:  # the canonical values: the same bits on every CPU (workers/detkl.py)
                    out[p] = scorer.one(teacher.full[p], s_row)[0]
                except ValueError as exc:
                    raise K.KldInputError(str(exc)) from None
            else:
                exact = False
                out[p] = K.lower_bound(t_side, K.Side.served(ids, lps, target))
        except K.KldInputError as exc:
            raise VerifyError(
                f"position {p}: {exc}",
                where=teacher.source,
                next="the server or the teacher file returned log-probabilities that are not "
                "a distribution; recapture, or report it to the engine",
            ) from None
        t_top, t_tie = K.top1(t_side.ids, t_side.lps)
        s_top, s_tie = K.top1(ids, lps)
        agree[p] = t_top == s_top
        ties += int(t_tie or s_tie)
    return out, agree, exact, ties


def kld_sha256(kld: Any) -> str:
    """sha256 of the canonical per-position text (:func:`pinwheel.serve.kld.canonical_text`)."""
    from pinwheel.serve import kld as K

    return K.kld_sha256(kld)


def _f64_sha256(kld: Any) -> str:
    from pinwheel.serve.workers import detkl

    return detkl.f64_sha256(kld)


def _math_name() -> str:
    from pinwheel.serve.workers import detkl

    return detkl.METHOD


def served_rows_sha256(student: Sequence[tuple[Any, Any, int]], vocab: int) -> str | None:
    """sha256 of the served full rows as float64 little-endian [P, V] in token-id order
    (what a third party recaptures and checks); None unless every row is full."""
    np = _np()
    h = hashlib.sha256()
    for ids, lps, _ in student:
        if len(ids) != vocab:
            return None
        row = np.full(vocab, np.nan)
        row[ids] = lps
        h.update(row.astype("<f8").tobytes())
    return h.hexdigest()


def bootstrap_ci(
    kld: Any, offsets: Any, resamples: int, seed: int
) -> tuple[tuple[float, float], str]:
    """95% percentile CI of the token-mean, resampling windows (or positions if one window)."""
    np = _np()
    rng = np.random.default_rng(seed)
    windows = len(offsets) - 1
    units = windows if windows >= 2 else len(kld)
    if resamples * units > MAX_BOOTSTRAP_DRAWS:
        raise UsageError(
            f"the bootstrap would draw {resamples} x {units} = {resamples * units} indices, "
            f"over the limit of {MAX_BOOTSTRAP_DRAWS}",
            where="[qualify.fidelity] bootstrap",
            next=f"lower bootstrap to at most {max(MAX_BOOTSTRAP_DRAWS // max(units, 1), 1)}",
        )
    # Drawn in blocks of at most BOOTSTRAP_BLOCK indices: memory stays bounded, and the
    # generator yields the same stream as one (resamples, units) draw would.
    rows = max(1, BOOTSTRAP_BLOCK // max(units, 1))
    means = np.empty(resamples, np.float64)
    if windows >= 2:
        sums = np.add.reduceat(kld, offsets[:-1]) if len(kld) else np.zeros(windows)
        counts = np.diff(offsets).astype(np.float64)
        for at in range(0, resamples, rows):
            idx = rng.integers(0, windows, size=(min(rows, resamples - at), windows))
            means[at : at + len(idx)] = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
        how = f"bootstrap over {windows} windows, {resamples} resamples, seed {seed}"
    else:
        for at in range(0, resamples, rows):
            idx = rng.integers(0, len(kld), size=(min(rows, resamples - at), len(kld)))
            means[at : at + len(idx)] = kld[idx].mean(axis=1)
        how = f"bootstrap over {len(kld)} positions, {resamples} resamples, seed {seed}"
    lo, hi = np.percentile(means, [2.5, 97.5])
    return (float(lo), float(hi)), how


def summarize(
    kld: Any,
    agree: Any,
    exact: bool,
    *,
    panel: Panel,
    teacher: Teacher,
    top_k: int,
    resamples: int,
    seed: int,
    ties: int = 0,
) -> FidelityResult:
    np = _np()
    with np.errstate(invalid="ignore"):  # +inf positions: inf - inf inside percentiles
        ci, how = bootstrap_ci(kld, teacher.offsets, resamples, seed)
        median, p99 = float(np.median(kld)), float(np.percentile(kld, 99))
    if np.isinf(kld).any():  # an infinite position makes the figures above it infinite
        ci = tuple(math.inf if x != x else x for x in ci)  # type: ignore[assignment]
        median, p99 = (math.inf if x != x else x for x in (median, p99))
    return FidelityResult(
        mean_kld=float(kld.mean()),
        ci95=ci,
        median=median,
        p99=p99,
        max=float(kld.max()),
        top1=float(agree.mean()),
        positions=int(len(kld)),
        windows=len(panel.windows),
        method="full" if exact else f"top-{top_k}+tail",
        kld_sha256=kld_sha256(kld),
        kld_f64_sha256=_f64_sha256(kld),
        math=_math_name() if exact else "pinwheel.kld.lower_bound",
        panel_sha256=panel.sha256,
        teacher_sha256=teacher.sha256,
        teacher_source=str(teacher.meta.get("source", "")),
        top_k=top_k,
        ci_method=how,
        kld=tuple(float(x) for x in kld),
        bound="exact" if exact else "lower",
        top1_ties=ties,
    )


def measure(client: Any, model: str, cfg: FidelityConfig) -> FidelityResult:
    """Score the served model against the teacher on the panel (one request per window):
    in the engine (``scorer = "in-process"``, :mod:`pinwheel.serve.inprocess`) or from the
    served rows (``"rows"``, the reference path)."""
    if cfg.scorer == "in-process":
        raise UsageError(
            'scorer = "in-process" is measured by pinwheel.serve.inprocess.measure',
            where="[qualify.fidelity].scorer",
        )

    def tokenize(text: str) -> list[int]:
        return list(client.tokenize(model, prompt=text))

    if cfg.panel is None:
        raise UsageError(
            "[qualify.fidelity] pins no panel (FILL IN)",
            where="[qualify.fidelity]",
            next="pin the card's panel and teacher: panel = { file, sha256 }, teacher = ...",
        )
    panel = read_panel(cfg.panel, cfg.panel_sha256, tokenize)
    if cfg.teacher_url:
        from pinwheel.serve.client import Client

        ref = Client(cfg.teacher_url)
        try:
            ref_models = ref.models()
            data = capture_from_server(ref, str(ref_models[0]["id"]), panel, cfg.top_k)
        finally:
            ref.close()
        teacher = load_teacher(data, cfg.teacher_url)
    else:
        assert cfg.teacher is not None
        teacher = read_teacher(cfg.teacher, cfg.teacher_sha256)
    _check_panel(teacher, panel)
    if cfg.top_k == -1 and teacher.full is None:
        raise UsageError(
            "top_k = -1 (full vocabulary) needs a teacher with full rows",
            where=teacher.source,
            next="recapture with `pinwheel qualify teacher --top-k -1`, or set top_k",
        )
    student = _server_rows(client, model, panel, cfg.top_k)
    kld, agree, exact, ties = score_positions(teacher, student)
    rows_sha = None
    if exact and teacher.full is not None:
        rows_sha = served_rows_sha256(student, teacher.full.shape[1])
    result = summarize(
        kld,
        agree,
        exact,
        ties=ties,
        panel=panel,
        teacher=teacher,
        top_k=cfg.top_k,
        resamples=cfg.bootstrap,
        seed=cfg.seed,
    )
    from dataclasses import replace

    return replace(result, served_rows_sha256=rows_sha)


# --------------------------------------------------------------------------- gates


NOT_PROVEN = "NOT PROVEN"  # a gate failure: the figure cannot show the limit is met


def judge(cfg: FidelityConfig | None, result: FidelityResult | None) -> tuple[Gate, ...]:
    """The card's fidelity gates on the raw figures: ``<`` where the card writes ``<``.

    ``max_mean_kld`` PASSes only on the exact KLD: a lower bound FAILs it when the bound
    already breaks the limit and leaves it NOT PROVEN (a failure) otherwise.
    ``tolerance`` widens a gate that is a card's own measurement (never a strict gate);
    without a pinned panel (FILL IN) the gates SKIP with the reason: never PASS.
    """
    if cfg is None:
        return ()
    gates: list[Gate] = []
    unpinned = cfg.panel is None
    why = "FILL IN: the card's panel and teacher are not pinned in [qualify.fidelity]"
    if cfg.max_mean_kld is not None:
        name = "fidelity mean KLD (nats)"
        t = cfg.max_mean_kld if cfg.strict else cfg.max_mean_kld * (1 + cfg.tolerance)
        op = "<" if cfg.strict else "<="
        needs = f"{op} {t:.6g}" + _card(cfg.max_mean_kld, cfg.tolerance, cfg.strict)
        if unpinned:
            gates.append(Gate(name, "SKIP", "not measured", needs, why))
        elif result is None:
            gates.append(Gate(name, "FAIL", "not measured", needs))
        else:
            ok = result.mean_kld < t if cfg.strict else result.mean_kld <= t
            detail = (
                f"{result.method}, {result.positions} positions, 95% CI "
                f"{result.ci95[0]:.3e}-{result.ci95[1]:.3e}"
            )
            if result.bound == "exact":
                status, measured = ("PASS" if ok else "FAIL"), repr(result.mean_kld)  # raw
            else:
                measured = f">= {result.mean_kld!r} (lower bound)"
                if not ok:
                    status = "FAIL"
                    detail = "the lower bound already breaks the limit; " + detail
                else:
                    status = NOT_PROVEN
                    detail = (
                        "a top-K figure is only a lower bound of the KLD: it can prove a "
                        "FAIL, never a PASS; score full-vocabulary rows (top_k = -1, a "
                        "teacher with full rows; qualify starts vLLM with --max-logprobs "
                        "-1); " + detail
                    )
            gates.append(Gate(name, status, measured, needs, detail))
    if cfg.min_top1 is not None:
        t = cfg.min_top1 * (1 - cfg.tolerance)
        needs = f">= {t:.6g}" + _card(cfg.min_top1, cfg.tolerance, False)
        if unpinned:
            gates.append(Gate("fidelity top-1 agreement", "SKIP", "not measured", needs, why))
        elif result is None:
            gates.append(Gate("fidelity top-1 agreement", "FAIL", "not measured", needs))
        else:
            gates.append(
                Gate(
                    "fidelity top-1 agreement",
                    "PASS" if result.top1 >= t else "FAIL",
                    repr(result.top1),
                    needs,
                    f"{round(result.top1 * result.positions)}/{result.positions} positions; "
                    f"{result.top1_ties} with a tied maximum (ties go to the lowest token id)",
                )
            )
    return tuple(gates)


def _card(figure: float, tolerance: float, strict: bool) -> str:
    if strict or not tolerance:
        return ""
    return f" (card {figure:g}, {tolerance:.0%} margin)"

"""Fidelity: KLD(teacher || student) over a pinned panel of token windows.

In: a panel (JSON token windows, sha256-pinned), a teacher (a file written by
``pinwheel qualify teacher``, sha256-pinned, or a reference server), and the
served model's ``prompt_logprobs`` on the same windows. Out: per-position KLD in
nats (float64) and its summary: mean with a seeded bootstrap 95% CI, median,
p99, top-1 agreement, and the sha256 of the per-position array's float64
little-endian bytes, so repeated runs compare bit for bit.

Position j of a window (j >= 1) is the distribution that predicted token j from
tokens < j: vLLM's ``prompt_logprobs[j]`` and the teacher's logits row j-1.

Methods (``FidelityResult.method``):

- ``full``: both sides return the whole vocabulary. Both rows are renormalized
  in float64 first (fp32 log-softmax rows sum to 1 + 1e-6..3e-5; without it
  the sum is +-1e-5 of noise), then ``sum_v p_t (log p_t - log p_s)``.
- ``top-K+tail``: the student returned its top K plus the prompt token. S = the
  tokens whose probability is known on both sides (all of the student's when the
  teacher file holds full rows); the KL is taken over the buckets {each token in
  S} + {the rest}, tails ``1 - sum_S p`` as served (clamped at 1e-12). By the
  log-sum inequality this is a lower bound of the full KLD.

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

from pinwheel import runner
from pinwheel.checksums import sha256_file
from pinwheel.errors import PinwheelError, UsageError, VerifyError
from pinwheel.fsutil import atomic_write_bytes
from pinwheel.manifest.serve import FidelityConfig
from pinwheel.serve.receipt import FidelityResult, Gate

PANEL_SCHEMA = "pinwheel.panel/1"
TEACHER_SCHEMA = "pinwheel.teacher/1"
FLOOR = 1e-12  # smallest tail mass: a sum of K probabilities can round just above 1
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
    untrusted.decode(untrusted.PanelDoc, data, untrusted.PANEL, str(path))  # types, field by field
    windows: list[tuple[int, ...]] = []
    if "windows" in data:
        for w in data["windows"]:
            if not isinstance(w, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in w
            ):
                raise UsageError("a window is not a list of token ids", where=str(path))
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


def _teacher_members(data: bytes, source: str, limit: int) -> None:
    """Every member's declared shape and dtype, checked against the limit and the bytes the
    member really holds, before numpy allocates anything (an .npz bomb asks for GiBs)."""
    np = _np()
    total = 0
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
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
            f"top_ids {list(ids.shape)} and top_logprobs {list(lps.shape)} are not both "
            f"[{p}, K]",
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
    meta = untrusted.decode(untrusted.TeacherMetaDoc, raw, untrusted.TEACHER_META, source)
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
    """One ``prompt_logprobs`` entry -> (ids int64, logprobs float64, rank-1 id or -1)."""
    np = _np()
    ids = np.fromiter((int(k) for k in entry), np.int64, len(entry))
    lps = np.fromiter((float(v["logprob"]) for v in entry.values()), np.float64, len(entry))
    top1 = next((int(k) for k, v in entry.items() if v.get("rank") == 1), -1)
    return ids, lps, top1


def _server_rows(client: Any, model: str, panel: Panel, top_k: int) -> list[tuple[Any, Any, int]]:
    rows: list[tuple[Any, Any, int]] = []
    for w in panel.windows:
        got = client.prompt_logprobs(model, w, top_k)
        if len(got) != len(w) or got[0] is not None:
            raise PinwheelError(
                f"the server returned {len(got)} prompt positions for a window of {len(w)}",
                where=client.url,
                next="the server must support prompt_logprobs on /v1/completions",
            )
        rows.extend(parse_position(e) for e in got[1:])
    return rows


def capture_from_server(client: Any, model: str, panel: Panel, top_k: int) -> bytes:
    """Teacher file bytes from a reference server's prompt_logprobs."""
    np = _np()
    rows = _server_rows(client, model, panel, top_k)
    targets = [t for w in panel.windows for t in w[1:]]
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
        full = np.empty((len(rows), vocab), np.float32)
        for i, (ids, lps, _) in enumerate(rows):
            full[i, ids] = lps
        arrays["full"] = full
    else:
        k = min(top_k, min(len(r[0]) for r in rows))
        ti = np.empty((len(rows), k), np.int32)
        tl = np.empty((len(rows), k), np.float32)
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
_TRANSFORMERS = r"""
import json, sys, numpy as np, torch
from transformers import AutoModelForCausalLM
req = json.load(open(sys.argv[1]))
out = sys.argv[2]
torch.manual_seed(0)
m = AutoModelForCausalLM.from_pretrained(req["model"], dtype=getattr(torch, req["dtype"])).eval()
rows = []
with torch.no_grad():
    for w in req["windows"]:
        logits = m(torch.tensor([w])).logits[0, :-1].float()
        rows.append(torch.log_softmax(logits, dim=-1).numpy())
lp = np.concatenate(rows).astype(np.float32)
np.save(out + "/full.npy", lp)
json.dump({"transformers": __import__("transformers").__version__,
           "torch": torch.__version__}, open(out + "/versions.json", "w"))
"""


def capture_with_transformers(req: TeacherRequest) -> bytes:
    np = _np()
    assert req.python and req.model
    panel = req.panel
    with tempfile.TemporaryDirectory(prefix="pinwheel-teacher-") as tmp:
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
            (req.python, "-c", _TRANSFORMERS, str(spec), tmp), what="the teacher", check=False
        )
        proc = runner.run(cmd)
        if proc.returncode != 0:
            raise PinwheelError(
                "transformers could not compute the teacher log-probabilities",
                where=req.python,
                next="that python needs transformers + torch and the model directory:\n"
                + proc.err_text[-2000:],
            )
        full = np.load(Path(tmp) / "full.npy")
        versions = json.loads((Path(tmp) / "versions.json").read_text())
    targets = np.array([t for w in panel.windows for t in w[1:]], np.int64)
    arrays: dict[str, Any] = {
        "offsets": np.array([0] + [len(w) - 1 for w in panel.windows], np.int64).cumsum(),
        "target": targets.astype(np.int32),
        "target_logprob": full[np.arange(len(targets)), targets],
    }
    if req.top_k == -1:
        arrays["full"] = full
    else:
        k = min(req.top_k, full.shape[1])
        ids = np.empty((len(full), k), np.int32)
        for i, row in enumerate(full):
            ids[i] = np.lexsort((np.arange(len(row)), -row))[:k]
        arrays |= {"top_ids": ids, "top_logprobs": np.take_along_axis(full, ids, 1)}
    meta = {
        "schema": TEACHER_SCHEMA,
        "panel_sha256": panel.sha256,
        "source": f"transformers {versions['transformers']} torch {versions['torch']} "
        f"{req.dtype} on {Path(req.model).name}",
        "top_k": req.top_k,
    }
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


def coarse_kl(pt: Any, ps: Any) -> float:
    """KL over the buckets {each token of S} + {tail}, probabilities on S given (float64)."""
    np = _np()
    tt = max(1.0 - float(pt.sum()), FLOOR)
    ts = max(1.0 - float(ps.sum()), FLOOR)
    body = float(np.sum(pt * (np.log(pt) - np.log(ps))))
    return body + tt * (math.log(tt) - math.log(ts))


def full_kl(t: Any, s: Any) -> float:
    """KL of two full log-probability rows, both renormalized in float64 first."""
    np = _np()
    tn = t.astype(np.float64)
    tn = tn - np.logaddexp.reduce(tn)
    sn = s.astype(np.float64)
    sn = sn - np.logaddexp.reduce(sn)
    return float(np.sum(np.exp(tn) * (tn - sn)))


def score_positions(
    teacher: Teacher, student: Sequence[tuple[Any, Any, int]]
) -> tuple[Any, Any, bool]:
    """Per-position KLD (float64), top-1 agreement (bool) and whether every row was full."""
    np = _np()
    n = len(student)
    kld = np.empty(n, np.float64)
    agree = np.empty(n, bool)
    all_full = True
    for p, (ids, lps, s_top1) in enumerate(student):
        if teacher.full is not None:
            row = teacher.full[p]
            t_top1 = int(np.argmax(row))  # first maximum: ties go to the lowest id
            if len(ids) == len(row):
                s = np.empty(len(row), np.float64)
                s[ids] = lps
                kld[p] = full_kl(row, s)
            else:
                all_full = False
                kld[p] = coarse_kl(np.exp(row[ids].astype(np.float64)), np.exp(lps))
        else:
            all_full = False
            known = dict(
                zip(teacher.top_ids[p].tolist(), teacher.top_logprobs[p].tolist(), strict=True)
            )
            known[int(teacher.target[p])] = float(teacher.target_logprob[p])
            t_top1 = int(teacher.top_ids[p, 0])
            mask = np.fromiter((int(i) in known for i in ids), bool, len(ids))
            t_lp = np.array([known[int(i)] for i in ids[mask]], np.float64)
            kld[p] = coarse_kl(np.exp(t_lp), np.exp(lps[mask]))
        agree[p] = t_top1 == s_top1
    return kld, agree, all_full


def kld_sha256(kld: Any) -> str:
    np = _np()
    return hashlib.sha256(np.asarray(kld, dtype="<f8").tobytes()).hexdigest()


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
    all_full: bool,
    *,
    panel: Panel,
    teacher: Teacher,
    top_k: int,
    resamples: int,
    seed: int,
) -> FidelityResult:
    np = _np()
    ci, how = bootstrap_ci(kld, teacher.offsets, resamples, seed)
    return FidelityResult(
        mean_kld=float(kld.mean()),
        ci95=ci,
        median=float(np.median(kld)),
        p99=float(np.percentile(kld, 99)),
        max=float(kld.max()),
        top1=float(agree.mean()),
        positions=int(len(kld)),
        windows=len(panel.windows),
        method="full" if all_full else f"top-{top_k}+tail",
        kld_sha256=kld_sha256(kld),
        panel_sha256=panel.sha256,
        teacher_sha256=teacher.sha256,
        teacher_source=str(teacher.meta.get("source", "")),
        top_k=top_k,
        ci_method=how,
        kld=tuple(float(x) for x in kld),
    )


def measure(client: Any, model: str, cfg: FidelityConfig) -> FidelityResult:
    """Score the served model against the teacher on the panel (one request per window)."""

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
    kld, agree, all_full = score_positions(teacher, student)
    return summarize(
        kld,
        agree,
        all_full,
        panel=panel,
        teacher=teacher,
        top_k=cfg.top_k,
        resamples=cfg.bootstrap,
        seed=cfg.seed,
    )


# --------------------------------------------------------------------------- gates


def judge(cfg: FidelityConfig | None, result: FidelityResult | None) -> tuple[Gate, ...]:
    """The card's fidelity gates on the raw figures: ``<`` where the card writes ``<``.

    ``tolerance`` widens a gate that is a card's own measurement (never a strict gate);
    without a pinned panel (FILL IN) the gates SKIP with the reason: never PASS.
    """
    if cfg is None:
        return ()
    gates: list[Gate] = []
    unpinned = cfg.panel is None
    why = "FILL IN: the card's panel and teacher are not pinned in [qualify.fidelity]"
    if cfg.max_mean_kld is not None:
        t = cfg.max_mean_kld if cfg.strict else cfg.max_mean_kld * (1 + cfg.tolerance)
        op = "<" if cfg.strict else "<="
        needs = f"{op} {t:.6g}" + _card(cfg.max_mean_kld, cfg.tolerance, cfg.strict)
        if unpinned:
            gates.append(Gate("fidelity mean KLD (nats)", "SKIP", "not measured", needs, why))
        elif result is None:
            gates.append(Gate("fidelity mean KLD (nats)", "FAIL", "not measured", needs))
        else:
            ok = result.mean_kld < t if cfg.strict else result.mean_kld <= t
            gates.append(
                Gate(
                    "fidelity mean KLD (nats)",
                    "PASS" if ok else "FAIL",
                    repr(result.mean_kld),  # raw: never rounded
                    needs,
                    f"{result.method}, {result.positions} positions, 95% CI "
                    f"{result.ci95[0]:.3e}-{result.ci95[1]:.3e}",
                )
            )
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
                    f"{round(result.top1 * result.positions)}/{result.positions} positions",
                )
            )
    return tuple(gates)


def _card(figure: float, tolerance: float, strict: bool) -> str:
    if strict or not tolerance:
        return ""
    return f" (card {figure:g}, {tolerance:.0%} margin)"

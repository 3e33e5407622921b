"""The typed shapes of the documents :mod:`pinwheel.untrusted` reads, and their readers:
provenance receipts, teacher meta, panels, model packs, server and worker answers.

Each shape is a frozen dataclass that :func:`pinwheel.untrusted.decode` fills field by
field; the reading itself (size, UTF-8, depth, regular files only) is
:mod:`pinwheel.untrusted`'s. Kept apart from it so that reading a manifest or a stamp
builds none of these classes.
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel.errors import PinwheelError
from pinwheel.untrusted import (
    MODEL_CONFIG,
    PROVENANCE,
    SAFETENSORS_HEADER,
    SHA256,
    STREAM_EVENT,
    MiB,
    NotRegular,
    _decode,
    _Mismatch,
    _shown,
    decode,
    fail,
    open_regular,
    parse_json,
    read_json,
)
from pinwheel.validate import member_problem


@dataclass(frozen=True)
class ManifestRef:
    sha256: str
    name: str | None = None
    path: str | None = None


@dataclass(frozen=True)
class ComponentSource:
    tree: str | None = None
    url: str | None = None
    commit: str | None = None


@dataclass(frozen=True)
class ComponentRecord:
    name: str
    kind: str
    wheel: str
    sha256: str
    source: ComponentSource | None = None
    version: str | None = None
    source_date_epoch: int | None = None

    def check(self) -> str | None:
        if not SHA256.fullmatch(self.sha256):
            return f"sha256 {_shown(self.sha256)} is not 64 lowercase hex digits"
        if "/" in self.wheel or "\\" in self.wheel or not self.wheel.endswith(".whl"):
            return f"wheel {_shown(self.wheel)} is not a wheel file name"
        return None


@dataclass(frozen=True)
class TorchRecord:
    version: str | None = None  # None: the build saw no torch
    index: str | None = None
    requested: str | None = None


@dataclass(frozen=True)
class ProvenanceDoc:
    """The fields of ``provenance.json`` that release, reuse, verify-build, install and
    qualify read (other keys are kept as written)."""

    schema: str
    manifest: ManifestRef | None = None
    upstream: Mapping[str, str | None] | None = None
    steps: Sequence[Mapping[str, Any]] = ()
    head: str | None = None
    tree: str | None = None
    tag: str | None = None
    toolchain: Mapping[str, Any] | None = None
    arches: Sequence[str] = ()
    components: Sequence[ComponentRecord] = ()
    wheels: Mapping[str, str] | None = None
    built: Sequence[str] = ()
    torch: TorchRecord | None = None
    version: str | None = None
    source_date_epoch: int | None = None

    def check(self) -> str | None:
        for name, digest in (self.wheels or {}).items():
            if not SHA256.fullmatch(digest):
                return f"wheels.{name}: {_shown(digest)} is not 64 lowercase hex digits"
        return None


def read_provenance(path: Path, schema: str) -> tuple[ProvenanceDoc, dict[str, Any]]:
    """The checked receipt and its raw mapping (for code that copies keys through)."""
    raw = read_json(path, PROVENANCE)
    if not isinstance(raw, dict):
        raise fail(PROVENANCE, f"expected an object, got {_shown(raw)}", str(path))
    if raw.get("schema") != schema:
        raise fail(
            PROVENANCE,
            f"unknown receipt schema {_shown(raw.get('schema'))}, expected {schema!r}",
            str(path),
            field="schema",
        )
    return decode(ProvenanceDoc, raw, PROVENANCE, str(path)), raw


# --------------------------------------------------------------------------- teacher meta


@dataclass(frozen=True)
class TeacherMetaDoc:
    schema: str
    panel_sha256: str
    source: str = ""
    top_k: int | None = None  # None: not recorded

    def check(self) -> str | None:
        if not SHA256.fullmatch(self.panel_sha256):
            return f"panel_sha256 {_shown(self.panel_sha256)} is not 64 lowercase hex digits"
        if self.top_k is not None and self.top_k != -1 and self.top_k < 1:
            return f"top_k {self.top_k} is neither -1 (full rows) nor >= 1"
        return None


# --------------------------------------------------------------------------- fidelity panel

@dataclass(frozen=True)
class PanelDoc:
    schema: str
    windows: Sequence[Sequence[int]] | None = None
    texts: Sequence[str] | None = None
    window: int | None = None

    def check(self) -> str | None:
        if self.windows is None and self.texts is None:
            return "neither windows nor texts"
        if self.window is not None and self.window < 2:
            return f"window {self.window} is below 2 tokens"
        return None


# --------------------------------------------------------------------------- server answers


@dataclass(frozen=True)
class ModelEntry:
    id: str


@dataclass(frozen=True)
class ModelsAnswer:
    data: Sequence[ModelEntry]


@dataclass(frozen=True)
class VersionAnswer:
    version: str | None = None


@dataclass(frozen=True)
class TokenizeAnswer:
    tokens: Sequence[int]

    def check(self) -> str | None:
        bad = next((t for t in self.tokens if t < 0), None)
        return f"token id {bad} is negative" if bad is not None else None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def check(self) -> str | None:
        if self.prompt_tokens < 0 or self.completion_tokens < 0:
            return "a negative token count"
        return None


@dataclass(frozen=True)
class LogprobEntry:
    logprob: float
    rank: int | None = None

    def check(self) -> str | None:
        if self.logprob > 1e-6:  # a log-probability is <= 0 (float noise allowed)
            return f"logprob {self.logprob} is above 0"
        return None


_TOKEN_ID = re.compile(r"[0-9]{1,10}")


@dataclass(frozen=True)
class CompletionChoice:
    text: str | None = None
    finish_reason: str | None = None
    prompt_logprobs: Sequence[Mapping[str, LogprobEntry] | None] | None = None

    def check(self) -> str | None:
        for j, entry in enumerate(self.prompt_logprobs or ()):
            if entry is None:
                continue
            bad = next((k for k in entry if not _TOKEN_ID.fullmatch(k)), None)
            if bad is not None:
                return f"prompt_logprobs[{j}] key {_shown(bad)} is not a token id"
        return None


@dataclass(frozen=True)
class CompletionAnswer:
    choices: Sequence[CompletionChoice]
    usage: Usage | None = None

    def check(self) -> str | None:
        return None if self.choices else "choices is empty"


@dataclass(frozen=True)
class Delta:
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


@dataclass(frozen=True)
class StreamChoice:
    delta: Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class StreamEvent:
    choices: Sequence[StreamChoice] | None = None
    usage: Usage | None = None


def stream_event(value: Any, where: str) -> StreamEvent:
    """One streamed event as :class:`StreamEvent`: the same checks as :func:`decode`,
    written out, because a reply has one event per token and this is its hot path."""

    def bad(field: str, want: str, got: Any) -> PinwheelError:
        return fail(STREAM_EVENT, f"expected {want}, got {_shown(got)}", where, field=field)

    if not isinstance(value, dict):
        raise bad("(top level)", "an object", value)
    raw = value.get("choices")
    choices: list[StreamChoice] | None = None
    if raw is not None:
        if not isinstance(raw, list):
            raise bad("choices", "a list", raw)
        choices = []
        for i, c in enumerate(raw):
            if not isinstance(c, dict):
                raise bad(f"choices[{i}]", "an object", c)
            d = c.get("delta")
            delta = None
            if d is not None:
                if not isinstance(d, dict):
                    raise bad(f"choices[{i}].delta", "an object or null", d)
                for key in ("content", "reasoning_content", "reasoning"):
                    v = d.get(key)
                    if v is not None and not isinstance(v, str):
                        raise bad(f"choices[{i}].delta.{key}", "a string or null", v)
                delta = Delta(d.get("content"), d.get("reasoning_content"), d.get("reasoning"))
            for key in ("text", "finish_reason"):
                v = c.get(key)
                if v is not None and not isinstance(v, str):
                    raise bad(f"choices[{i}].{key}", "a string or null", v)
            choices.append(StreamChoice(delta, c.get("text"), c.get("finish_reason")))
    usage = value.get("usage")
    if usage is None:
        return StreamEvent(choices, None)
    try:
        return StreamEvent(choices, _decode(Usage, usage, "usage"))
    except _Mismatch as m:
        raise fail(STREAM_EVENT, m.what, where, field=m.path) from None


DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
# sub-byte dtypes: elements per byte
DTYPE_PACKED = {"F4": 2, "F6_E2M3": 0, "F6_E3M2": 0}
MAX_HEADER = 100 * MiB  # the format's own limit; larger means a corrupt file
MAX_RANK = 16


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: Sequence[int]
    data_offsets: Sequence[int]

    def check(self) -> str | None:
        if self.dtype not in DTYPE_SIZES and self.dtype not in DTYPE_PACKED:
            return f"unknown dtype {_shown(self.dtype)}"
        if len(self.shape) > MAX_RANK or any(d < 0 for d in self.shape):
            return f"shape {list(self.shape)} is not a list of at most {MAX_RANK} sizes >= 0"
        if len(self.data_offsets) != 2:
            return f"data_offsets {list(self.data_offsets)} is not [begin, end]"
        begin, end = self.data_offsets
        if begin < 0 or end < begin:
            return f"data_offsets [{begin}, {end}] are negative or end before they begin"
        count = math.prod(self.shape)
        if self.dtype in DTYPE_SIZES:
            want: int | None = count * DTYPE_SIZES[self.dtype]
        elif DTYPE_PACKED[self.dtype]:
            want = -(-count // DTYPE_PACKED[self.dtype])
        else:  # 6-bit: 3 bytes per 4 elements
            want = -(-count * 6 // 8)
        if end - begin != want:
            return (
                f"shape {list(self.shape)} of {self.dtype} needs {want} bytes, "
                f"data_offsets [{begin}, {end}] hold {end - begin}"
            )
        return None


@dataclass(frozen=True)
class SafetensorsLayout:
    header_bytes: int  # the JSON header's length
    data_bytes: int  # what the tensors occupy after it
    tensors: Mapping[str, TensorInfo]

    @property
    def file_size(self) -> int:
        return 8 + self.header_bytes + self.data_bytes


def safetensors_header(path: Path) -> SafetensorsLayout:
    """The checked header of one .safetensors file: every tensor's dtype known, its shape
    matching its byte range, ranges not overlapping and without holes. Whether the file
    holds all of them is the caller's to compare (:attr:`SafetensorsLayout.file_size`)."""
    kind, where = SAFETENSORS_HEADER, str(path)
    try:
        fd = open_regular(Path(path))
    except NotRegular as exc:
        raise fail(kind, f"is {exc}, not a regular file", where) from None
    with open(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        raw = fh.read(8)
        if len(raw) < 8:
            raise fail(kind, "shorter than the 8-byte header length", where)
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER:
            raise fail(kind, f"header length {n} is over the format's {MAX_HEADER}", where)
        if n > size - 8:
            raise fail(kind, f"truncated inside the {n}-byte header ({size} bytes)", where)
        blob = fh.read(n)
    header = parse_json(blob, kind, where)
    if not isinstance(header, dict):
        raise fail(kind, f"expected an object, got {_shown(header)}", where)
    meta = header.pop("__metadata__", None)
    try:
        _decode(Mapping[str, str] | None, meta, "__metadata__")
    except _Mismatch as m:
        raise fail(kind, m.what, where, field=m.path) from None
    tensors = decode(Mapping[str, TensorInfo], header, kind, where)  # type: ignore[type-abstract]
    spans = sorted((t.data_offsets[0], t.data_offsets[1], name) for name, t in tensors.items())
    at = 0
    for begin, end, name in spans:
        if begin < at:
            raise fail(kind, f"data_offsets [{begin}, {end}] overlap the tensor before", where,
                       field=name)  # fmt: skip
        if begin > at:
            raise fail(kind, f"a hole of {begin - at} bytes before data_offsets [{begin}, {end}]",
                       where, field=name)  # fmt: skip
        at = end
    return SafetensorsLayout(header_bytes=n, data_bytes=at, tensors=tensors)


@dataclass(frozen=True)
class ModelIndexDoc:
    weight_map: Mapping[str, str]
    metadata: Mapping[str, Any] | None = None

    def check(self) -> str | None:
        for tensor, shard in self.weight_map.items():
            if "\\" in shard or member_problem(shard):
                return f"weight_map.{tensor}: shard {_shown(shard)} is not a file in the pack"
        return None


def model_config(path: Path) -> Mapping[str, Any]:
    """config.json as an object (bounded like every model-pack document)."""
    value = read_json(path, MODEL_CONFIG)
    return decode(Mapping[str, Any], value, MODEL_CONFIG, str(path))  # type: ignore[type-abstract]


# --------------------------------------------------------------------------- GPU probes and workers

# What pinwheel's own probes print in the engine's Python (preflight's engine probe and
# self-test, the all-reduce and tp workers): one JSON line, read as bounded, typed answers
# (a torch that prints NaN, a driver that prints nonsense: a clear failure, not a crash).
def _finite(name: str, value: float | None) -> str | None:
    if value is not None and not math.isfinite(value):
        return f"{name} {value} is not a finite number"
    return None


@dataclass(frozen=True)
class EngineProbe:
    python: Sequence[int]
    path: str | None = None
    version: str | None = None

    def check(self) -> str | None:
        if len(self.python) < 2 or any(not 0 <= v < 1000 for v in self.python):
            return f"python {list(self.python)[:4]} is not a version like [3, 12, 1]"
        return None


@dataclass(frozen=True)
class SelftestPair:
    src: int
    dst: int
    ok: bool
    peer: bool | None = None


@dataclass(frozen=True)
class SelftestGemm:
    device: int
    err: float
    ok: bool
    err_kind: str = "max err"
    jit: bool | None = None

    def check(self) -> str | None:
        return _finite("err", self.err)


@dataclass(frozen=True)
class SelftestAnswer:
    devices: int
    via: str | None = None
    pairs: Sequence[SelftestPair] = ()
    gemm: Sequence[SelftestGemm] = ()

    def check(self) -> str | None:
        if not 0 <= self.devices <= 1024:
            return f"devices {self.devices} is not a GPU count"
        for p in self.pairs:
            if not (0 <= p.src < self.devices and 0 <= p.dst < self.devices) or p.src == p.dst:
                return f"pair {p.src}->{p.dst} is not a pair of the {self.devices} GPUs"
        for g in self.gemm:
            if not 0 <= g.device < self.devices:
                return f"gemm device {g.device} is not one of the {self.devices} GPUs"
        return None


@dataclass(frozen=True)
class AllReduceFirstWrong:
    index: int | None = None
    got: float | None = None
    want: float | None = None


@dataclass(frozen=True)
class AllReduceRank:
    """One rank's line from serve/workers/allreduce.py."""

    rank: int
    sum_ok: bool
    bytes: int | None = None
    seconds: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    device: str | None = None
    nccl: str | None = None
    env: Mapping[str, str | None] | None = None
    wrong: int | None = None
    first_wrong: AllReduceFirstWrong | None = None

    def check(self) -> str | None:
        for name in ("seconds", "algbw_gbps", "busbw_gbps"):
            value = getattr(self, name)
            problem = _finite(name, value)
            if problem or (value is not None and value < 0):
                return problem or f"{name} {value} is negative"
        if self.bytes is not None and self.bytes < 0:
            return f"bytes {self.bytes} is negative"
        return None


@dataclass(frozen=True)
class TpSource:
    rank: int
    columns: Sequence[int]
    wrong: int = 0
    unwritten: int | None = None

    def check(self) -> str | None:
        return None if len(self.columns) == 2 else f"columns {list(self.columns)} is not [lo, hi]"


@dataclass(frozen=True)
class TpCaseRow:
    """One case a rank of serve/workers/pg_primitives.py compared (the fields read)."""

    op: str
    case: str
    match: bool
    rank: int | None = None
    bytes: int | None = None
    error: str | None = None
    wrong: int | None = None
    elements: int | None = None
    unwritten: int | None = None
    by_source: Sequence[TpSource] = ()
    waited_s: float | None = None
    torch_waited_s: float | None = None
    tolerance: Mapping[str, Any] | None = None
    exact: bool | None = None
    detail: str | None = None
    first_wrong: int | None = None

    def check(self) -> str | None:
        if self.bytes is not None and self.bytes < 0:
            return f"bytes {self.bytes} is negative"
        return _finite("waited_s", self.waited_s) or _finite("torch_waited_s", self.torch_waited_s)


@dataclass(frozen=True)
class TpRank:
    rank: int | None = None
    device: str | None = None
    init: Mapping[str, Any] | None = None
    cases: Sequence[TpCaseRow] = ()
    error: str | None = None
    gather_skipped: str | None = None
    aborted: str | None = None

"""One reader for documents pinwheel did not write in this run: bounded, checked, typed.

A provenance receipt from another machine, a teacher file's meta, a server's
answers, a model pack's headers and index: each is untrusted. Every one is read
here, the same way:

1. **size**: the byte count is checked against the kind's cap *before* the bytes
   are read (a 1 GB index is refused by its ``stat``, not by MemoryError);
2. **UTF-8**: strict decoding, the byte offset of the first bad byte named;
3. **depth**: nesting is measured without recursion before ``json.loads`` sees
   the text, so a ``[[[[...`` bomb is a clean error, never RecursionError;
4. **schema**: the value is decoded into frozen dataclasses (:func:`decode`),
   field by field, so a list where an object belongs or a string where a number
   belongs is named by its path (``components[2].sha256``).

Every failure is a :class:`~pinwheel.errors.PinwheelError` of the kind's class,
naming the document, the field, and the next step.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import stat
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pinwheel import validate
from pinwheel.errors import PinwheelError, UsageError, VerifyError

T = TypeVar("T")

KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024


# --------------------------------------------------------------------------- document kinds


@dataclass(frozen=True)
class Kind:
    """A kind of untrusted document: its caps, its error class and what to do next."""

    name: str  # "provenance.json", "server answer", ...
    max_bytes: int
    max_depth: int
    error: type[PinwheelError]
    next: str


class ServerAnswerError(PinwheelError):
    """A server answered something that is not what its API promises (exit 1)."""


PROVENANCE = Kind(
    "provenance.json",
    16 * MiB,
    32,
    VerifyError,
    "use the provenance.json a pinwheel build wrote (rebuild with `pinwheel build`)",
)
QUALIFICATION = Kind(
    "qualification receipt",
    16 * MiB,
    32,
    VerifyError,
    "use the qualification.json `pinwheel qualify` wrote (run it again to rewrite it)",
)
SHA256SUMS = Kind(
    "SHA256SUMS",
    16 * MiB,
    0,
    VerifyError,
    "use the SHA256SUMS a pinwheel build or release wrote (a release lists a few wheels)",
)
TEACHER_META = Kind(
    "teacher file meta",
    1 * MiB,
    16,
    UsageError,
    "recapture the teacher: `pinwheel qualify teacher --out FILE`, then pin its sha256",
)
SERVER = Kind(
    "server answer",
    64 * MiB,
    64,
    ServerAnswerError,
    "check that the URL is a vLLM OpenAI-compatible server (`curl URL/v1/models`), "
    "then run `pinwheel qualify` again",
)
LOGPROBS = dataclasses.replace(SERVER, name="prompt_logprobs answer", max_bytes=1 * GiB)
STREAM_EVENT = dataclasses.replace(SERVER, name="stream event", max_bytes=4 * MiB)
METRICS = dataclasses.replace(SERVER, name="/metrics answer", max_bytes=32 * MiB)
MODEL_INDEX = Kind(
    "model.safetensors.index.json",
    64 * MiB,
    16,
    VerifyError,
    "download the pack again (`pinwheel model fetch`)",
)
MODEL_CONFIG = dataclasses.replace(
    MODEL_INDEX, name="config.json", max_bytes=16 * MiB, max_depth=32
)
SAFETENSORS_HEADER = dataclasses.replace(
    MODEL_INDEX, name="safetensors header", max_bytes=100 * MiB, max_depth=8
)


# The manifest is read by pinwheel.manifest (TOML, its own errors); only its cap is here.
# 4 MiB: a default, over 200 times this repository's own manifest.toml (17.7 kB).
MANIFEST = Kind(
    "manifest.toml", 4 * MiB, 0, UsageError, "pass --manifest PATH to a manifest.toml file"
)
# A git repository's small files pinwheel reads before git does (HEAD, a ref): a default.
GIT_FILE = Kind(
    "cache repository file", 1 * MiB, 0, VerifyError,
    "remove the repository from the cache (`pinwheel cache clean`) and fetch again",
)  # fmt: skip
# A provisioned toolkit's record (a few hundred bytes when pinwheel writes it): a default.
TOOLKIT_MARKER = Kind(
    "provisioned toolkit record", 1 * MiB, 8, VerifyError,
    "remove that toolkit folder from the cache; `pinwheel toolchain` provisions it again",
)  # fmt: skip
# A replay's stamp in the cache (pinwheel.source.stamp): a default, over 100 times the
# stamp of a 6-step, 10-commit stack (4.3 kB). A bad one is ignored, never an error.
REPLAY_STAMP = Kind(
    "replay stamp", 1 * MiB, 8, VerifyError, "nothing: the replay runs in full and rewrites it"
)
# An export's stamp in a workspace (pinwheel.compile.workspace) or a kept build source's
# record (pinwheel.compile.keptsources): a default, 64 MiB, about 90 bytes a file: 700,000
# files (the 1Cat-vLLM tree is 5,451, cutlass 6,881). A bad one is ignored.
EXPORT_STAMP = Kind(
    "export stamp", 64 * MiB, 8, VerifyError, "nothing: the tree is exported again"
)


def fail(kind: Kind, what: str, where: str, *, field: str | None = None) -> PinwheelError:
    """The kind's error: ``<where>: <document>[ field <f>]: <what>`` plus its next step."""
    at = f" field {field}" if field else ""
    return kind.error(f"{kind.name}{at}: {what}", where=where, next=kind.next)


# --------------------------------------------------------------------------- bytes


def open_regular(path: Path) -> int:
    """A descriptor of ``path`` if it is a regular file: opened without blocking (a FIFO
    with no writer, a terminal) and checked with ``fstat`` before a byte is read.

    ``FileNotFoundError`` and ``IsADirectoryError`` pass through for the caller to word;
    any other kind of file (FIFO, device, socket) is :class:`NotRegular`.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
        if not stat.S_ISREG(mode):
            raise NotRegular(file_type(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class NotRegular(OSError):
    """The path is a FIFO, a device or a socket: nothing pinwheel reads as a document."""


def file_type(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a FIFO", "a symbolic link", ...)."""
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: Path, cap: int) -> bytes | int:
    """The bytes of the regular file ``path``, or its size when that is over ``cap`` (the
    caller words the refusal); nothing past ``cap`` + 1 bytes is ever read.

    Raises ``FileNotFoundError``, ``IsADirectoryError``, :class:`NotRegular` or another
    ``OSError`` for the caller to word.
    """
    return _read_fd(open_regular(Path(path)), cap)


def _read_fd(fd: int, cap: int) -> bytes | int:
    """Read the open regular file ``fd`` (closed here) up to ``cap``; its size when over."""
    try:
        size = os.fstat(fd).st_size
        if size > cap:
            return size
        chunks, got = [], 0
        while got <= cap:
            block = os.read(fd, min(cap + 1 - got, 1 << 20))
            if not block:
                break
            chunks.append(block)
            got += len(block)
    finally:
        os.close(fd)
    if got > cap:  # the file grew while read
        return got
    return b"".join(chunks)


def regular_size(path: Path, kind: Kind, *, cap: int | None = None) -> int:
    """The size of the regular file ``path`` (checked against the cap), no byte read: a
    FIFO, device, socket, directory or missing file is the kind's error."""
    cap = kind.max_bytes if cap is None else cap
    try:
        fd = open_regular(Path(path))
    except IsADirectoryError:
        raise fail(kind, "is a directory, not a file", str(path)) from None
    except FileNotFoundError:
        raise fail(kind, "missing", str(path)) from None
    except NotRegular as exc:
        raise fail(kind, f"is {exc}, not a regular file", str(path)) from None
    except OSError as exc:
        raise fail(kind, f"cannot be read: {exc.strerror or exc}", str(path)) from None
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size > cap:
        raise fail(kind, f"{size} bytes, more than the {cap} it may have", str(path))
    return size


def read_bytes(path: Path, kind: Kind, *, cap: int | None = None) -> bytes:
    """The file's bytes, its size checked against the cap before they are read; a FIFO,
    device or socket is refused without a byte read (never waited on)."""
    cap = kind.max_bytes if cap is None else cap
    path = Path(path)
    try:
        data = read_regular(path, cap)
    except IsADirectoryError:
        raise fail(kind, "is a directory, not a file", str(path)) from None
    except FileNotFoundError:
        raise fail(kind, "missing", str(path)) from None
    except NotRegular as exc:
        raise fail(kind, f"is {exc}, not a regular file", str(path)) from None
    except OSError as exc:
        raise fail(kind, f"cannot be read: {exc.strerror or exc}", str(path)) from None
    if isinstance(data, int):
        raise fail(kind, f"{data} bytes, more than the {cap} it may have", str(path))
    return data


def read_beneath(root: Path, rel: str, kind: Kind, *, cap: int | None = None) -> bytes:
    """The bytes of the regular file ``root/rel`` read as :func:`read_bytes` reads, with no
    symlink followed on the way or at the end (a tree someone else filled: a venv's
    site-packages): a link, FIFO, device or socket is the kind's error, never read or waited on.
    """
    from pinwheel import confine  # confine imports nothing from here; kept local all the same

    cap = kind.max_bytes if cap is None else cap
    where = f"{root}/{rel}"
    folder, _, name = rel.rpartition("/")
    if name in ("", ".", "..") or any(p in ("", ".", "..") for p in folder.split("/") if folder):
        raise fail(kind, "not a plain relative name", where)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        with confine.folder_beneath(root, folder) as dfd:
            try:
                fd = os.open(name, flags | getattr(os, "O_NOFOLLOW", 0), dir_fd=dfd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise fail(kind, "is a symlink (never followed here)", where) from None
                raise
            try:
                mode = os.fstat(fd).st_mode
                if stat.S_ISDIR(mode):
                    raise fail(kind, "is a directory, not a file", where)
                if not stat.S_ISREG(mode):
                    raise fail(kind, f"is {file_type(mode)}, not a regular file", where)
                os.set_blocking(fd, True)
            except BaseException:
                os.close(fd)
                raise
    except confine.Escape:
        why = "a symlink or a non-folder on the way (never followed here)"
        raise fail(kind, why, where) from None
    except (FileNotFoundError, NotADirectoryError):
        raise fail(kind, "missing", where) from None
    except OSError as exc:
        raise fail(kind, f"cannot be read: {exc.strerror or exc}", where) from None
    data = _read_fd(fd, cap)
    if isinstance(data, int):
        raise fail(kind, f"{data} bytes, more than the {cap} it may have", where)
    return data


def text(data: bytes, kind: Kind, where: str) -> str:
    """Strict UTF-8 (a leading BOM dropped); the offset of the first bad byte named."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise fail(
            kind, f"not UTF-8 (byte {exc.start}: {data[exc.start : exc.start + 1]!r})", where
        ) from None


# --------------------------------------------------------------------------- JSON

_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.S)


def json_depth(doc: str, limit: int) -> int:
    """Deepest nesting of ``doc``'s arrays and objects, counted without recursion; stops
    counting (returns limit + 1) as soon as it passes ``limit``."""
    depth = deepest = 0
    for m in _TOKENS.finditer(doc):
        c = m.group()[0]
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif c in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(data: bytes | str, kind: Kind, where: str) -> Any:
    """Bounded, strict JSON: size, UTF-8, depth, then ``json.loads`` (no NaN/Infinity)."""
    size = len(data)
    if size > kind.max_bytes:
        raise fail(kind, f"{size} bytes, more than the {kind.max_bytes} it may have", where)
    doc = text(data, kind, where) if isinstance(data, bytes) else data
    # Fewer opening brackets than the cap cannot nest past it: the scan is skipped (it
    # would cost more than json.loads on the many small stream events of a reply).
    if doc.count("[") + doc.count("{") > kind.max_depth:
        depth = json_depth(doc, kind.max_depth)
        if depth > kind.max_depth:
            raise fail(kind, f"nested more than {kind.max_depth} levels deep", where)
    try:
        return json.loads(doc, parse_constant=_no_constant)
    except ValueError as exc:  # JSONDecodeError and the constants above
        raise fail(kind, f"not JSON: {exc}", where) from None
    except RecursionError:  # pragma: no cover - json_depth caps nesting first
        raise fail(kind, "nested too deeply", where) from None


def read_json(path: Path, kind: Kind) -> Any:
    return parse_json(read_bytes(path, kind), kind, str(path))


def load(path: Path, cls: type[T], kind: Kind) -> T:
    """Read ``path`` as ``kind`` and decode it into ``cls``."""
    return decode(cls, read_json(path, kind), kind, str(path))


# --------------------------------------------------------------------------- typed decoding


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple, Sequence):
        return "a list"
    if origin in (dict, Mapping) or dataclasses.is_dataclass(tp):
        return "an object"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (bytes, bytearray)) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Mismatch(Exception):
    def __init__(self, path: str, what: str):
        super().__init__(what)
        self.path, self.what = path, what


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _decode(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        deepest: _Mismatch | None = None
        for option in typing.get_args(tp):
            try:
                return _decode(option, value, path)
            except _Mismatch as m:
                if m.path != (path or "(top level)") and (
                    deepest is None or len(m.path) > len(deepest.path)
                ):
                    deepest = m  # the option of the value's shape failed inside: say where
        if deepest is not None:
            raise deepest
        raise _Mismatch(path or "(top level)", f"expected {_type_name(tp)}, got {_shown(value)}")
    if tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and math.isnan(value):
                raise _Mismatch(path, "expected a number, got NaN")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin in (list, tuple, Sequence):
        if isinstance(value, list):
            (item,) = typing.get_args(tp)[:1] or (Any,)
            return tuple(_decode(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    elif origin in (dict, Mapping):
        if isinstance(value, dict):
            _, item = typing.get_args(tp)
            return {k: _decode(item, v, f"{path}.{k}" if path else k) for k, v in value.items()}
    elif dataclasses.is_dataclass(tp):
        if isinstance(value, dict):
            hints = _hints(tp)  # type: ignore[arg-type]
            kwargs = {}
            for f in dataclasses.fields(tp):
                key = f.metadata.get("json", f.name)
                sub = f"{path}.{key}" if path else key
                if key in value:
                    kwargs[f.name] = _decode(hints[f.name], value[key], sub)
                elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise _Mismatch(sub, "missing (it is required)")
            obj = tp(**kwargs)  # type: ignore[operator]
            check = getattr(obj, "check", None)
            if check is not None:
                problem = check()
                if problem:
                    raise _Mismatch(path or "(top level)", problem)
            return obj
    else:  # pragma: no cover - a schema written with a type this decoder does not know
        raise TypeError(f"cannot decode {tp!r}")
    raise _Mismatch(path or "(top level)", f"expected {_type_name(tp)}, got {_shown(value)}")


def decode(cls: type[T], value: Any, kind: Kind, where: str) -> T:
    """``value`` (parsed JSON) as ``cls``; the first field that does not fit is named."""
    try:
        return typing.cast(T, _decode(cls, value, ""))
    except _Mismatch as m:
        raise fail(kind, m.what, where, field=m.path) from None


# --------------------------------------------------------------------------- provenance.json

SHA256 = validate.SHA256


PANEL = Kind(
    "fidelity panel",
    64 * MiB,
    8,
    UsageError,
    'write {"schema": "pinwheel.panel/1", "windows": [[token ids...], ...]} and pin its sha256',
)



WORKER = Kind(
    "worker answer",
    16 * MiB,
    32,
    PinwheelError,
    "run the probe by hand in the engine's Python to see what it prints, then rerun",
)



_METRIC_LINE = re.compile(
    r"(?P<key>[A-Za-z_:][A-Za-z0-9_:]*(?:\{(?:[^\"}]|\"(?:[^\"\\]|\\.)*\")*\})?)"
    r"[ \t]+(?P<value>[^ \t]+)(?:[ \t]+-?[0-9]+)?[ \t]*"
)


def parse_metrics(data: bytes, where: str) -> dict[str, float]:
    """Prometheus text: ``{'name{labels}': value}``; lines that are not samples are skipped,
    NaN samples too (a gauge with no observation yet)."""
    body = text(data, METRICS, where) if len(data) <= METRICS.max_bytes else None
    if body is None:
        raise fail(METRICS, f"more than {METRICS.max_bytes} bytes", where)
    samples: dict[str, float] = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_LINE.fullmatch(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if not math.isnan(value):
            samples[m.group("key")] = value
    return samples


# --------------------------------------------------------------------------- model packs

# bytes per element of each safetensors dtype (the format's own list)

def answer_line(text: str, cls: type[T], kind: Kind, where: str) -> T:
    """The last non-empty line of a probe's output, as bounded JSON decoded into ``cls``."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        raise fail(kind, "printed nothing", where)
    return decode(cls, parse_json(lines[-1].strip(), kind, where), kind, where)

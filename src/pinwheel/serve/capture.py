"""Capturing a fidelity teacher: from a reference server's prompt_logprobs or transformers.

In: a :class:`TeacherRequest` (the panel, top-K or full rows, a server URL or an
interpreter with transformers + torch). Out: the teacher file, written atomically
(:mod:`pinwheel.serve.teacherfile`), and its sha256 to pin. Also the served rows'
parsing and the server flags vLLM needs to return them.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import runner
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.fsutil import atomic_write_bytes
from pinwheel.manifest.serve import FidelityConfig
from pinwheel.serve import workers
from pinwheel.serve.panel import Panel
from pinwheel.serve.teacherfile import (
    TEACHER_SCHEMA,
    _np,
    load_teacher,
    read_index,
    teacher_bytes,
    write_teacher_file,
)


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

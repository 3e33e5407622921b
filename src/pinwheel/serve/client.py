"""A small client for a vLLM OpenAI-compatible server: health, metrics, tokenize, streams.

Standard library only (http.client), one persistent connection per client, so
its own cost per streamed token stays far below the ~11 ms a V100 takes to
make one (``bench/harness_overhead.py`` measures it). Every transport failure
becomes :class:`ServerGone`, naming the URL and the request.

A server is untrusted input: every answer is read with a byte cap and a
deadline (``deadline`` seconds per request, however slowly the bytes trickle),
and decoded through :mod:`pinwheel.untrusted` into the fields its API promises.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pinwheel import documents, untrusted
from pinwheel.errors import PinwheelError
from pinwheel.net import httpget


class ServerGone(PinwheelError):
    """The server stopped answering (refused, reset, or closed a stream early)."""


class ServerRefused(PinwheelError):
    """The server answered a request with an HTTP error."""

    def __init__(self, what: str, *, status: int, **kw: Any):
        super().__init__(what, **kw)
        self.status = status


@dataclass(frozen=True)
class Stream:
    """One streamed reply, timed on this side of the socket."""

    started: float  # perf_counter when the request was sent
    first: float  # first chunk that carried text
    last: float  # last chunk that carried text
    chunks: int  # chunks that carried text (several tokens each under spec decode)
    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str | None
    chunk_times: tuple[float, ...] = ()  # perf_counter of every chunk that carried text
    # perf_counter of every chunk with a non-empty ``choices`` (the role chunk, text
    # chunks, the finish chunk; not the usage-only chunk): what `vllm bench serve` times
    choice_times: tuple[float, ...] = ()

    @property
    def ttft_s(self) -> float:
        return self.first - self.started

    # -- as `vllm bench serve` measures them (vllm/benchmarks/lib/endpoint_request_func.py)
    @property
    def bench_ttft_s(self) -> float:
        """First chunk with ``choices`` - request sent (0 when none came, as vLLM leaves it)."""
        return self.choice_times[0] - self.started if self.choice_times else 0.0

    @property
    def bench_latency_s(self) -> float:
        """Last chunk with ``choices`` - request sent (vLLM's E2EL)."""
        return self.choice_times[-1] - self.started if self.choice_times else 0.0

    @property
    def bench_itl_s(self) -> tuple[float, ...]:
        """Gaps between consecutive chunks with ``choices`` (vLLM's ITL)."""
        t = self.choice_times
        return tuple(b - a for a, b in zip(t, t[1:], strict=False))

    @property
    def decode_s(self) -> float:
        return self.last - self.first

    @property
    def decode_tok_s(self) -> float:
        """Steady decode speed: tokens after the first over the time after the first."""
        if self.completion_tokens < 2 or self.decode_s <= 0:
            return 0.0
        return (self.completion_tokens - 1) / self.decode_s


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


class Client:
    def __init__(self, base_url: str, *, timeout: float = 600.0, deadline: float = 1800.0):
        try:
            parts = urllib.parse.urlsplit(base_url.rstrip("/"))
            port = parts.port  # ValueError for a port out of 0-65535 or not a number
        except ValueError as exc:
            raise PinwheelError(
                f"bad server URL {base_url!r}: {exc}", next="pass --url http://HOST:PORT"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
            raise PinwheelError(f"bad server URL {base_url!r}", next="pass --url http://HOST:PORT")
        self.url = base_url.rstrip("/")
        self._host = parts.hostname
        self._port = port or (443 if parts.scheme == "https" else 80)
        self._https = parts.scheme == "https"
        self._prefix = parts.path
        self.timeout = timeout  # connect, and the longest silence mid-answer
        self.deadline = deadline  # the longest one request may take, bytes trickling or not
        self._conn: http.client.HTTPConnection | None = None

    # -- transport -----------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _send(self, method: str, path: str, body: Any = None) -> http.client.HTTPResponse:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (0, 1):
            conn = self._connection()
            if conn.sock is not None:  # a deadline may have shortened it for the last answer
                conn.sock.settimeout(self.timeout)
            try:
                conn.request(method, self._prefix + path, body=data, headers=headers)
                return conn.getresponse()
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                self.close()
                # A kept-alive connection the server closed while idle: retry once.
                if attempt == 0 and isinstance(
                    exc, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
                ):
                    continue
                raise self._gone(f"{method} {path}", exc) from None
        raise AssertionError("unreachable")

    def _gone(self, request: str, exc: BaseException) -> ServerGone:
        return ServerGone(
            f"server stopped answering during {request}: {exc.__class__.__name__}: {exc}",
            where=self.url,
            next="look at the server log, restart it, then run `pinwheel qualify` again",
        )

    def _budget(self, request: str, kind: untrusted.Kind) -> _Budget:
        return _Budget(self, request, kind, time.monotonic() + self.deadline)

    def _body(self, resp: http.client.HTTPResponse, budget: _Budget) -> bytes:
        """The whole answer, within the kind's byte cap and the request's deadline."""
        data = bytearray()
        try:
            budget.announced(resp.headers.get("Content-Length"))
            for block in budget.blocks(resp):
                data += block
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            resp.close()
            self.close()
            raise self._gone(budget.request, exc) from None
        except BaseException:  # past the cap or the deadline: drop the answer and its socket
            resp.close()
            self.close()
            raise
        return bytes(data)

    def _answer(
        self, method: str, path: str, body: Any = None, kind: untrusted.Kind = untrusted.SERVER
    ) -> Any:
        """The parsed JSON of a 200 answer (bounded, strict), or ServerRefused."""
        budget = self._budget(f"{method} {path}", kind)
        resp = self._send(method, path, body)
        raw = self._body(resp, budget)
        if resp.status != 200:
            raise ServerRefused(
                f"{method} {path} answered HTTP {resp.status}: "
                + raw[:300].decode(errors="replace"),
                status=resp.status,
                where=self.url,
            )
        return untrusted.parse_json(raw, kind, f"{self.url}{path}")

    def _json(
        self,
        method: str,
        path: str,
        schema: type[_T],
        body: Any = None,
        kind: untrusted.Kind = untrusted.SERVER,
    ) -> tuple[_T, Any]:
        """The answer decoded into ``schema``, and the raw JSON it was decoded from."""
        raw = self._answer(method, path, body, kind)
        return untrusted.decode(schema, raw, kind, f"{self.url}{path}"), raw

    last_health = ""  # what the latest GET /health got: "HTTP 503", "connection refused"

    # -- plain endpoints -----------------------------------------------------
    def healthy(self) -> bool:
        """True when GET /health answers 200; False while it refuses or answers otherwise."""
        try:
            budget = self._budget("GET /health", untrusted.SERVER)
            resp = self._send("GET", "/health")
            self._body(resp, budget)
        except PinwheelError as exc:  # gone, or an answer past its cap or deadline
            self.last_health = (
                f"server gone ({exc.what})" if isinstance(exc, ServerGone) else exc.what
            )
            return False
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            self.close()
            self.last_health = _why(exc)
            return False
        self.last_health = f"HTTP {resp.status}" + (
            " (no /health here: is this a vLLM server?)" if resp.status == 404 else ""
        )
        return resp.status == 200

    def models(self) -> list[dict[str, Any]]:
        """``/v1/models`` entries (each with a string ``id``); an empty list is an error."""
        answer, raw = self._json("GET", "/v1/models", documents.ModelsAnswer)
        if not answer.data:
            raise PinwheelError(
                "the server lists no model (GET /v1/models answered an empty data list)",
                where=f"{self.url}/v1/models",
                next="start the server with the model to qualify (`vllm serve MODEL_DIR`), "
                "or point --url at the server that serves it",
            )
        return [dict(e) for e in raw["data"]]

    def version(self) -> str | None:
        try:
            answer, _ = self._json("GET", "/version", documents.VersionAnswer)
        except ServerRefused:
            return None
        return answer.version

    def metrics(self) -> dict[str, float]:
        budget = self._budget("GET /metrics", untrusted.METRICS)
        resp = self._send("GET", "/metrics")
        return untrusted.parse_metrics(self._body(resp, budget), f"{self.url}/metrics")

    def tokenize(
        self,
        model: str,
        *,
        prompt: str | None = None,
        messages: Sequence[Mapping[str, str]] | None = None,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """Token ids from the server's own tokenizer (the model's, exactly)."""
        body: dict[str, Any] = {"model": model}
        if messages is not None:
            body |= {"messages": list(messages), "add_generation_prompt": True}
        else:
            body |= {"prompt": prompt, "add_special_tokens": add_special_tokens}
        answer, _ = self._json("POST", "/tokenize", documents.TokenizeAnswer, body)
        return list(answer.tokens)

    def complete(self, model: str, prompt_ids: Sequence[int], max_tokens: int) -> Completion:
        body = {
            "model": model,
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        out, _ = self._json("POST", "/v1/completions", documents.CompletionAnswer, body)
        choice = out.choices[0]
        usage = out.usage or documents.Usage()
        return Completion(
            text=choice.text or "",
            finish_reason=choice.finish_reason,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
        )

    def prompt_logprobs(
        self, model: str, prompt_ids: Sequence[int], top_k: int
    ) -> list[dict[str, Any] | None]:
        """``choices[0].prompt_logprobs``: per prompt position, ``{id: {logprob, rank}}``.

        Position j holds the distribution that predicted token j (j=0 is None); the
        server returns its top ``top_k`` (-1: the whole vocabulary) plus token j itself.
        Every entry is checked (ids are token ids, log-probabilities numbers <= 0).
        """
        body = {
            "model": model,
            "prompt": list(prompt_ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": top_k,
        }
        _, raw = self._json(
            "POST", "/v1/completions", documents.CompletionAnswer, body,
            logprobs_kind(len(prompt_ids), top_k),
        )  # fmt: skip
        return list(raw["choices"][0].get("prompt_logprobs") or [])

    # -- streaming -----------------------------------------------------------
    def stream_chat(
        self,
        model: str,
        prompt: str,
        max_tokens: int,
        *,
        ignore_eos: bool = True,
        thinking: bool | None = None,
    ) -> Stream:
        """A greedy streamed chat reply of exactly ``max_tokens`` (EOS ignored).

        ``thinking`` (``[qualify] thinking``) goes to the chat template as vLLM takes it:
        ``chat_template_kwargs: {"enable_thinking": false}`` (GLM's template variable);
        None leaves the template's own default.
        """
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": thinking}
        return self.stream("/v1/chat/completions", body)

    def stream(self, path: str, body: Mapping[str, Any]) -> Stream:
        started = time.perf_counter()
        budget = self._budget(f"POST {path}", untrusted.STREAM_EVENT)
        resp = self._send("POST", path, body)
        if resp.status != 200:
            raw = self._body(resp, budget)
            raise ServerRefused(
                f"POST {path} answered HTTP {resp.status}: {raw[:300].decode(errors='replace')}",
                status=resp.status,
                where=self.url,
            )
        return read_stream(
            resp,
            started,
            on_error=lambda e: self._gone(f"POST {path}", e),
            close=self.close,
            budget=budget,
        )


_T = TypeVar("_T")
# One prompt_logprobs entry, ``"ID": {"logprob": X, "rank": N, "decoded_token": "..."}``,
# at most this many bytes (a default, generous: a token's text escaped 6 bytes a character)
LOGPROB_ENTRY_BYTES = 1024
LOGPROB_OVERHEAD = 64 * 1024  # the answer's other fields


def logprobs_kind(positions: int, top_k: int) -> untrusted.Kind:
    """The cap of a prompt_logprobs answer: what ``positions`` rows of ``top_k`` + 1
    entries can take (the answer is refused past it, before it is parsed); the whole
    vocabulary (``top_k`` -1) keeps :data:`pinwheel.untrusted.LOGPROBS`' cap."""
    if top_k < 0:
        return untrusted.LOGPROBS
    need = LOGPROB_OVERHEAD + positions * (top_k + 1) * LOGPROB_ENTRY_BYTES
    return dataclasses.replace(
        untrusted.LOGPROBS, max_bytes=min(need, untrusted.LOGPROBS.max_bytes)
    )


MAX_STREAM = 256 * 1024 * 1024  # a whole streamed reply; a server that never stops ends here
MAX_LINE = untrusted.STREAM_EVENT.max_bytes  # one event line
MAX_DRAIN = 64 * 1024  # bytes after [DONE] read to keep the connection; more: close it


class _Budget:
    """A request's byte cap and deadline: every read waits at most what is left of it."""

    def __init__(self, client: Client | None, request: str, kind: untrusted.Kind, until: float):
        self.client, self.request, self.kind, self.until = client, request, kind, until
        self.where = client.url if client is not None else "(server)"

    def _fail(self, what: str, next: str) -> PinwheelError:
        return untrusted.fail(self.kind, what, self.where)  # the kind says what to do next

    def announced(self, length: str | None) -> None:
        httpget.Bounds(self.request, self.kind.max_bytes, self._fail).announced(length)

    def left(self) -> float:
        left = self.until - time.monotonic()
        if left <= 0:
            if self.client is not None:
                self.client.close()
            deadline = self.client.deadline if self.client is not None else 0
            raise ServerGone(
                f"{self.request}: no complete answer within the {deadline:g} s deadline "
                "(the server kept the answer open)",
                where=self.where,
                next="look at the server log; a server that streams without end or "
                "trickles its answer is not fit to qualify",
            )
        return left

    def blocks(self, resp: Any, cap: int | None = None) -> Iterator[bytes]:
        """The body in blocks as they arrive, until its end, the cap or the deadline."""
        bounds = httpget.Bounds(
            self.request, self.kind.max_bytes if cap is None else cap, self._fail
        )
        try:
            yield from bounds.blocks(resp, before=lambda: self._wait_at_most(resp, self.left()))
        except TimeoutError:
            if self.until - time.monotonic() < 0.1:  # the read waited out the deadline
                self.until = time.monotonic()
                self.left()  # raises: no complete answer within the deadline
            raise
        except PinwheelError:  # past the cap (or the deadline): drop the connection
            if self.client is not None:
                self.client.close()
            raise
        # read1 leaves a response whose Content-Length is used up open; read() closes it
        # so the connection can carry the next request.
        if hasattr(resp, "isclosed") and not resp.isclosed():
            resp.read()

    def _wait_at_most(self, resp: Any, seconds: float) -> None:
        """The next read waits no longer than the stall timeout or what is left."""
        conn = self.client._conn if self.client is not None else None
        sock = getattr(conn, "sock", None)
        if sock is None:  # a Connection: close answer owns the socket (its file's raw part)
            sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
        if sock is not None:
            sock.settimeout(min(self.client.timeout if self.client else seconds, seconds))


def _lines(budget: _Budget, resp: Any) -> Iterator[bytes]:
    """Lines of a streamed body, each at most MAX_LINE bytes."""
    buf = b""
    for block in budget.blocks(resp, MAX_STREAM):
        buf += block
        *done, buf = buf.split(b"\n")
        yield from done
        if len(buf) > MAX_LINE:
            raise untrusted.fail(budget.kind, f"a line longer than {MAX_LINE} bytes", budget.where)
    if buf:
        yield buf


def read_stream(
    resp: Any, started: float, *, on_error: Any, close: Any, budget: _Budget | None = None
) -> Stream:
    """Parse an OpenAI server-sent-event stream, timing the chunks that carry text."""
    if budget is None:
        budget = _Budget(None, "stream", untrusted.STREAM_EVENT, time.monotonic() + 1800.0)
    first = last = 0.0
    chunks = completion_tokens = prompt_tokens = 0
    parts: list[str] = []
    times: list[float] = []
    choice_times: list[float] = []
    finish: str | None = None
    done = False
    try:
        for line in _lines(budget, resp):
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                done = True
                break
            event = documents.stream_event(
                untrusted.parse_json(payload, untrusted.STREAM_EVENT, budget.where),
                budget.where,
            )
            stamp = time.perf_counter()
            if event.choices:  # vllm bench serve times every chunk with choices
                choice_times.append(stamp)
            for choice in event.choices or ():
                delta = choice.delta
                piece = (
                    (delta.content or delta.reasoning_content or delta.reasoning or "")
                    if delta is not None
                    else choice.text or ""
                )
                if piece:
                    now = stamp
                    if not chunks:
                        first = now
                    last = now
                    times.append(now)
                    chunks += 1
                    parts.append(piece)
                finish = choice.finish_reason or finish
            if event.usage:
                completion_tokens = event.usage.completion_tokens
                prompt_tokens = event.usage.prompt_tokens
        if done:  # drain the closing chunk so the connection can be reused, a little only
            try:
                for _ in budget.blocks(resp, MAX_DRAIN):
                    pass
            except PinwheelError:
                resp.close()
                close()
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        resp.close()
        close()
        raise on_error(exc) from None
    except PinwheelError:
        resp.close()
        close()
        raise
    if not done:
        resp.close()
        close()
        raise on_error(ConnectionError("the stream ended before [DONE]"))
    return Stream(
        started=started,
        first=first or started,
        last=last or started,
        chunks=chunks,
        text="".join(parts),
        completion_tokens=completion_tokens or chunks,
        prompt_tokens=prompt_tokens,
        finish_reason=finish,
        chunk_times=tuple(times),
        choice_times=tuple(choice_times),
    )


# --------------------------------------------------------------------------- Prometheus


def parse_prometheus(text: str) -> dict[str, float]:
    """``{'name{labels}': value}`` for every sample line (comments skipped)."""
    return untrusted.parse_metrics(text.encode(), "(metrics text)")


def metric_total(samples: Mapping[str, float], name: str) -> float | None:
    """Sum of every series of ``name`` (all label sets); None when the server has none."""
    found = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
    bad = next((v for v in found if not math.isfinite(v)), None)
    if bad is not None:  # +Inf in a counter: never int(inf), never a figure
        raise untrusted.fail(untrusted.METRICS, f"{name} is {bad}, not a finite count", "/metrics")
    return sum(found) if found else None


def metric_by_label(samples: Mapping[str, float], name: str, label: str) -> dict[str, float]:
    """``{label value: summed value}`` for the series of ``name`` (e.g. per draft position)."""
    out: dict[str, float] = {}
    needle = f'{label}="'
    for key, value in samples.items():
        if not key.startswith(name + "{"):
            continue
        start = key.find(needle)
        if start < 0:
            continue
        start += len(needle)
        tag = key[start : key.index('"', start)]
        out[tag] = out.get(tag, 0.0) + value
    return out


def _why(exc: BaseException) -> str:
    """A short reason for a failed request: "connection refused", "timed out", ..."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text)[:120]

"""A small client for a vLLM OpenAI-compatible server: health, metrics, tokenize, streams.

Standard library only (http.client), one persistent connection per client, so
its own cost per streamed token stays far below the ~11 ms a V100 takes to
make one (``bench/harness_overhead.py`` measures it). Every transport failure
becomes :class:`ServerGone`, naming the URL and the request.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pinwheel.errors import PinwheelError


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

    @property
    def e2el_s(self) -> float:
        return self.last - self.started

    @property
    def itl_s(self) -> tuple[float, ...]:
        """Gaps between text chunks (as ``vllm bench serve`` measures ITL)."""
        t = self.chunk_times
        return tuple(b - a for a, b in zip(t, t[1:], strict=False))

    @property
    def ttft_s(self) -> float:
        return self.first - self.started

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
    def __init__(self, base_url: str, *, timeout: float = 600.0):
        parts = urllib.parse.urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PinwheelError(f"bad server URL {base_url!r}", next="pass --url http://HOST:PORT")
        self.url = base_url.rstrip("/")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._https = parts.scheme == "https"
        self._prefix = parts.path
        self.timeout = timeout
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

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        resp = self._send(method, path, body)
        try:
            raw = resp.read()
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            self.close()
            raise self._gone(f"{method} {path}", exc) from None
        if resp.status != 200:
            raise ServerRefused(
                f"{method} {path} answered HTTP {resp.status}: "
                + raw[:300].decode(errors="replace"),
                status=resp.status,
                where=self.url,
            )
        return json.loads(raw)

    last_health = ""  # what the latest GET /health got: "HTTP 503", "connection refused"

    # -- plain endpoints -----------------------------------------------------
    def healthy(self) -> bool:
        """True when GET /health answers 200; False while it refuses or answers otherwise."""
        try:
            resp = self._send("GET", "/health")
            resp.read()
        except ServerGone as exc:
            self.last_health = f"server gone ({exc.what})"
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
        return list(self._json("GET", "/v1/models").get("data", []))

    def version(self) -> str | None:
        try:
            return str(self._json("GET", "/version").get("version"))
        except ServerRefused:
            return None

    def metrics(self) -> dict[str, float]:
        resp = self._send("GET", "/metrics")
        try:
            text = resp.read().decode()
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            self.close()
            raise self._gone("GET /metrics", exc) from None
        return parse_prometheus(text)

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
        return [int(t) for t in self._json("POST", "/tokenize", body)["tokens"]]

    def complete(self, model: str, prompt_ids: Sequence[int], max_tokens: int) -> Completion:
        body = {
            "model": model,
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        out = self._json("POST", "/v1/completions", body)
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return Completion(
            text=choice.get("text") or "",
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
        )

    def prompt_logprobs(
        self, model: str, prompt_ids: Sequence[int], top_k: int
    ) -> list[dict[str, Any] | None]:
        """``choices[0].prompt_logprobs``: per prompt position, ``{id: {logprob, rank}}``.

        Position j holds the distribution that predicted token j (j=0 is None); the
        server returns its top ``top_k`` (-1: the whole vocabulary) plus token j itself.
        """
        body = {
            "model": model,
            "prompt": list(prompt_ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": top_k,
        }
        out = self._json("POST", "/v1/completions", body)
        return list(out["choices"][0].get("prompt_logprobs") or [])

    # -- streaming -----------------------------------------------------------
    def stream_chat(
        self, model: str, prompt: str, max_tokens: int, *, ignore_eos: bool = True
    ) -> Stream:
        """A greedy streamed chat reply of exactly ``max_tokens`` (EOS ignored)."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return self.stream("/v1/chat/completions", body)

    def stream(self, path: str, body: Mapping[str, Any]) -> Stream:
        started = time.perf_counter()
        resp = self._send("POST", path, body)
        if resp.status != 200:
            raw = resp.read()
            raise ServerRefused(
                f"POST {path} answered HTTP {resp.status}: {raw[:300].decode(errors='replace')}",
                status=resp.status,
                where=self.url,
            )
        return read_stream(
            resp, started, on_error=lambda e: self._gone(f"POST {path}", e), close=self.close
        )


def read_stream(resp: Any, started: float, *, on_error: Any, close: Any) -> Stream:
    """Parse an OpenAI server-sent-event stream, timing the chunks that carry text."""
    first = last = 0.0
    chunks = completion_tokens = prompt_tokens = 0
    parts: list[str] = []
    times: list[float] = []
    finish: str | None = None
    done = False
    try:
        while True:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                done = True
                resp.read()  # drain the closing chunk so the connection can be reused
                break
            event = json.loads(payload)
            for choice in event.get("choices") or ():
                delta = choice.get("delta")
                piece = (
                    (
                        delta.get("content")
                        or delta.get("reasoning_content")
                        or delta.get("reasoning")
                        or ""
                    )
                    if delta is not None
                    else choice.get("text") or ""
                )
                if piece:
                    now = time.perf_counter()
                    if not chunks:
                        first = now
                    last = now
                    times.append(now)
                    chunks += 1
                    parts.append(piece)
                finish = choice.get("finish_reason") or finish
            usage = event.get("usage")
            if usage:
                completion_tokens = int(usage.get("completion_tokens", 0))
                prompt_tokens = int(usage.get("prompt_tokens", 0))
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        close()
        raise on_error(exc) from None
    if not done:
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
    )


# --------------------------------------------------------------------------- Prometheus


def parse_prometheus(text: str) -> dict[str, float]:
    """``{'name{labels}': value}`` for every sample line (comments skipped)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            samples[key.strip()] = float(value)
        except ValueError:
            continue
    return samples


def metric_total(samples: Mapping[str, float], name: str) -> float | None:
    """Sum of every series of ``name`` (all label sets); None when the server has none."""
    found = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
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

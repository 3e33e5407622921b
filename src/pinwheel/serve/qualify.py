"""Qualification: prove a running build serves the model at the card's numbers.

Phases, in order: wait for health, check start-up log markers, check the
server is idle, decode (warm-up, then repeats over several prompts, steady
tok/s without TTFT, ms per forward pass and draft acceptance from Prometheus
counter deltas around each run), concurrency (N parallel streams, aggregate
tok/s), needle ladder (exact token lengths x depths). Then gates from
``[qualify]`` are judged on raw numbers: a miss is FAIL, never rounded.

Outputs in ``--out``: ``receipt.json`` (schema ``pinwheel.qualify/1``, with
the manifest and provenance hashes), ``report.md`` and PNG plots. :func:`qualify`
returns the :class:`Receipt` (verdict PASS or FAIL) once they are written; the CLI
prints it and exits 7 through :func:`gate_failure` when a gate failed. Only a run
that could not finish raises (its receipt, verdict ERROR, is written first).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pinwheel import runner, saferegex
from pinwheel.errors import GateFailed, PinwheelError
from pinwheel.heartbeat import Heartbeat
from pinwheel.manifest import Manifest
from pinwheel.manifest.serve import QualifyConfig, QualifyProfile
from pinwheel.progress import SILENT, Reporter
from pinwheel.serve import fidelity, inprocess, needle, stats
from pinwheel.serve.client import (
    Client,
    ServerGone,
    ServerRefused,
    Stream,
    metric_by_label,
    metric_total,
)
from pinwheel.serve.gates import table as gate_table
from pinwheel.serve.gates.base import Measured
from pinwheel.serve.receipt import (
    FAILING,
    NOT_MEASURABLE,
    SCHEMA,
    Acceptance,
    ConcurrencyResult,
    DecodeSample,
    FidelityResult,
    Gate,
    MarkerResult,
    NeedleResult,
    Receipt,
    SmokeResult,
    Spread,
    read_provenance,
    spread,
)
from pinwheel.serve.report import write_outputs

# Prometheus names (vLLM >= 0.10). iteration_tokens_total's _count is one per engine step.
M_ITERATIONS = "vllm:iteration_tokens_total_count"
M_DRAFTS = "vllm:spec_decode_num_drafts_total"
M_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
M_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
M_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
M_RUNNING = "vllm:num_requests_running"
M_WAITING = "vllm:num_requests_waiting"


# --------------------------------------------------------------------------- the table


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Target:
    """The server under test and, when pinwheel started it, how to watch it."""

    url: str
    log: Path | None  # start-up log, for markers and error reports
    alive: Callable[[], int | None] | None = None  # poll(): None while running, else exit code


def log_tail(log: Path | None, lines: int = 25) -> str:
    return "\n".join(runner.tail_of(log, lines)) if log is not None else ""


def wait_healthy(
    client: Client,
    target: Target,
    timeout_s: float,
    poll_s: float = 1.0,
    refused_grace_s: float = 5.0,
    reporter: Reporter = SILENT,
    heartbeat_s: float = 10.0,
) -> float:
    """Seconds until GET /health answered 200; raises if the server exits or time runs out.

    A server pinwheel did not start (``--url``, no ``alive``) that refuses connections for
    ``refused_grace_s`` fails at once with that reason: nothing is listening, and waiting
    ``timeout_s`` for it would only hide that. A host name that does not resolve fails at once.
    """
    import urllib.parse

    from pinwheel.errors import UsageError
    from pinwheel.net import tcp  # local: this module's imports are being reworked elsewhere

    parts = urllib.parse.urlsplit(target.url)
    host = parts.hostname or "127.0.0.1"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UsageError(
            f"bad port in {target.url!r}", where="--url", next="pass --url http://HOST:PORT"
        ) from None
    start = time.monotonic()
    refused_since: float | None = None
    beat = Heartbeat(
        reporter,
        f"waiting for GET {target.url.rstrip('/')}/health",
        limit_s=timeout_s,
        every_s=min(heartbeat_s, max(1.0, timeout_s / 4)),  # a short wait still beats
    )
    while True:
        if client.healthy():
            return time.monotonic() - start
        beat.tick(client.last_health)
        _check_alive(target, "before it became healthy")
        if target.alive is None:  # attached with --url: is anything listening at all?
            seen = tcp.probe(host, port, min(poll_s * 2, 5.0))
            if seen.state == "unresolved":
                raise PinwheelError(
                    f"cannot resolve {host!r}: {seen.reason}",
                    where=target.url,
                    next="fix --url (host and port of the running server)",
                )
            if seen.state == "refused":
                now = time.monotonic()
                refused_since = now if refused_since is None else refused_since
                if now - refused_since >= refused_grace_s:
                    raise PinwheelError(
                        f"nothing is listening at {host}:{port} (connection refused for "
                        f"{now - refused_since:.0f} s)",
                        where=target.url,
                        next="start the server first (recipes/ or `pinwheel serve`) and rerun "
                        "once it listens, fix --url, or drop --url so qualify starts one",
                    )
            else:
                refused_since = None  # timeouts, unreachable: the deadline below decides
        if time.monotonic() - start > timeout_s:
            raise PinwheelError(
                f"the server was not healthy after {timeout_s:.0f} s (GET /health; last "
                f"answer: {client.last_health or 'none'})",
                where=target.url,
                next="check the server log; raise [qualify].health_timeout_s if it is only slow"
                + _tail_block(target.log),
            )
        time.sleep(poll_s)


def _tail_block(log: Path | None) -> str:
    tail = log_tail(log)
    return (
        f"\n  last lines of {log}:\n" + "\n".join("    " + ln for ln in tail.splitlines())
        if tail
        else ""
    )


MAX_MARKER_LOG = 32 * 1024 * 1024  # start-up markers are looked for in the log's first 32 MiB


def check_markers(patterns: Sequence[str], log: Path | None) -> tuple[MarkerResult, ...]:
    """Each pattern against the log's lines, in linear time (:mod:`pinwheel.saferegex`)."""
    if log is None or not log.is_file():
        return tuple(MarkerResult(p, "unchecked", None) for p in patterns)
    with open(log, "rb") as fh:
        text = fh.read(MAX_MARKER_LOG).decode(errors="replace").splitlines()
    out = []
    for p in patterns:
        rx = saferegex.compile(p)
        line = next((ln.strip() for ln in text if rx.search(ln)), None)
        out.append(MarkerResult(p, "found" if line else "missing", line[:300] if line else None))
    return tuple(out)


def wait_idle(client: Client, timeout_s: float, poll_s: float = 0.5) -> None:
    """Measure only an idle server: someone else's requests would skew every number."""
    start = time.monotonic()
    while True:
        m = client.metrics()
        busy = (metric_total(m, M_RUNNING) or 0) + (metric_total(m, M_WAITING) or 0)
        if busy == 0:
            return
        if time.monotonic() - start >= timeout_s:
            raise PinwheelError(
                f"the server is not idle: {busy:.0f} requests running or waiting",
                where=client.url,
                next="stop other clients of this server, then run `pinwheel qualify` again",
            )
        time.sleep(poll_s)


def _delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float | None:
    a, b = metric_total(after, name), metric_total(before, name)
    return None if a is None or b is None else a - b


def decode_sample(
    client: Client,
    model: str,
    prompt: str,
    max_tokens: int,
    index: int,
    repeat: int,
    streams: list[Stream] | None = None,
    thinking: bool | None = None,
) -> DecodeSample:
    before = client.metrics()
    s = client.stream_chat(model, prompt, max_tokens, thinking=thinking)
    after = client.metrics()
    if streams is not None:
        streams.append(s)
    drafts = _delta(before, after, M_DRAFTS)
    draft_tokens = _delta(before, after, M_DRAFT_TOKENS)
    accepted = _delta(before, after, M_ACCEPTED)
    steps = _delta(before, after, M_ITERATIONS)
    # Passes after the first token: engine steps less the prefill step (decode
    # prompts are short: one prefill step); else one pass per draft. Without
    # either counter ms/pass is not measurable: tokens - 1 would be ms per TOKEN,
    # which under MTP k=3 is ~1/3 of ms per pass and would pass its gate falsely.
    passes: int | None
    if steps is not None and steps > 1:
        passes, source = int(steps) - 1, "engine steps - 1"
    elif drafts:
        passes, source = int(drafts), "spec-decode drafts"
    else:
        passes, source = None, NOT_MEASURABLE
    per_pos_b = metric_by_label(before, M_PER_POS, "position")
    per_pos = {
        k: v - per_pos_b.get(k, 0.0)
        for k, v in metric_by_label(after, M_PER_POS, "position").items()
    }
    return DecodeSample(
        prompt=index,
        repeat=repeat,
        tokens=s.completion_tokens,
        ttft_s=s.ttft_s,
        decode_s=s.decode_s,
        tok_s=s.decode_tok_s,
        passes=passes,
        passes_from=source,
        ms_per_pass=(s.decode_s * 1000 / passes) if passes else None,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        acceptance_length=(1 + accepted / drafts) if drafts and accepted is not None else None,
        accepted_per_pos=per_pos,
    )


def run_concurrency(
    client_factory: Callable[[], Client],
    model: str,
    prompts: Sequence[str],
    streams: int,
    max_tokens: int,
    thinking: bool | None = None,
) -> ConcurrencyResult:
    results: list[Any] = [None] * streams
    errors: list[BaseException] = []

    def one(i: int) -> None:
        c = client_factory()
        try:
            results[i] = c.stream_chat(
                model, prompts[i % len(prompts)], max_tokens, thinking=thinking
            )
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    start = min(r.started for r in results)
    end = max(r.last for r in results)
    total = sum(r.completion_tokens for r in results)
    return ConcurrencyResult(
        streams=streams,
        total_tokens=total,
        wall_s=end - start,
        aggregate_tok_s=total / (end - start) if end > start else 0.0,
        per_stream_tok_s=tuple(r.decode_tok_s for r in results),
    )


def run_needles(
    client: Client,
    model: str,
    prof: QualifyProfile,
    max_len: int | None,
    reporter: Reporter,
) -> tuple[NeedleResult, ...]:
    if not prof.needle_lengths:
        return ()

    def tokenize(**kw: Any) -> list[int]:
        return client.tokenize(model, **kw)

    lay = needle.layout(tokenize)
    out = []
    for length in prof.needle_lengths:
        for depth in prof.needle_depths:
            value = needle.needle_value(length, depth)
            if max_len is not None and length + prof.needle_max_tokens > max_len:
                out.append(
                    NeedleResult(
                        length,
                        depth,
                        0,
                        value,
                        "skipped",
                        f"over the server's max_model_len {max_len}",
                        "",
                        0.0,
                    )
                )
                continue
            ids = needle.build(
                lay, tokenize(prompt=f" The secret passphrase is {value}."), length, depth
            )
            t0 = time.perf_counter()
            c = client.complete(model, ids, prof.needle_max_tokens)
            secs = time.perf_counter() - t0
            if c.prompt_tokens and c.prompt_tokens != length:
                raise needle.NeedleError(
                    f"the server counted {c.prompt_tokens} prompt tokens, expected {length}",
                    where=f"needle {length} x {depth}",
                    next="report this: the haystack builder and the server disagree",
                )
            sc = needle.score(c.text, value, c.finish_reason)
            out.append(
                NeedleResult(
                    length, depth, c.prompt_tokens, value, sc.status, sc.reason, sc.answer, secs
                )
            )
            reporter.info(f"needle {length} @ {depth}: {sc.status} ({secs:.1f} s)")
    return tuple(out)


def run_smoke(
    client: Client, model: str, smoke: Sequence[Any], thinking: bool | None = None
) -> tuple[SmokeResult, ...]:
    """The card's smoke prompts, greedy, stopping at EOS; the reply must hold ``expect``."""
    out = []
    for sm in smoke:
        s = client.stream_chat(model, sm.prompt, sm.max_tokens, ignore_eos=False,
                               thinking=thinking)  # fmt: skip
        ok = (sm.expect in s.text) if sm.expect else bool(s.text.strip())
        out.append(
            SmokeResult(
                sm.prompt, sm.expect, "pass" if ok else "fail", s.text[:300], s.finish_reason
            )
        )
    return tuple(out)


@dataclass
class _Partial:
    """What has been measured so far, so a run that breaks still leaves a receipt."""

    server: dict[str, Any] = field(default_factory=dict)
    markers: tuple[MarkerResult, ...] = ()
    decode: list[DecodeSample] = field(default_factory=list)
    concurrency: list[ConcurrencyResult] = field(default_factory=list)
    needles: tuple[NeedleResult, ...] = ()
    streams: list[Stream] = field(default_factory=list)
    decode_wall: list[float] = field(default_factory=list)  # start, end of the decode phase
    fidelity: FidelityResult | None = None
    smoke: tuple[SmokeResult, ...] = ()


def qualify(
    manifest: Manifest,
    profile_name: str,
    target: Target,
    out: Path,
    *,
    provenance: Path | None = None,
    reporter: Reporter = SILENT,
) -> Receipt:
    """Run every phase against ``target`` and write the receipt, report and plots to ``out``."""
    config = manifest.require("qualify")
    prof = config.profile(profile_name)
    prov = read_provenance(provenance)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()
    part = _Partial()
    client = Client(target.url)
    error: PinwheelError | None = None
    try:
        _measure(part, client, target, config, prof, reporter)
    except (ServerGone, ServerRefused) as exc:
        error = _explain(exc, target)
    except PinwheelError as exc:
        error = exc
    finally:
        client.close()

    single = spread([s.tok_s for s in part.decode])
    ms_pass = spread([s.ms_per_pass for s in part.decode if s.ms_per_pass is not None])
    gates = _judge(manifest, config, prof, part, single, ms_pass)
    verdict = "ERROR" if error else ("FAIL" if any(g.status in FAILING for g in gates) else "PASS")
    serve_cfg = manifest.serve
    receipt = Receipt(
        schema=SCHEMA,
        verdict=verdict,
        profile=prof.name,
        manifest={"name": manifest.name, "path": manifest.path.name, "sha256": manifest.sha256},
        provenance=prov,
        server=part.server,
        started=started,
        seconds=round(time.monotonic() - t0, 2),
        markers=part.markers,
        decode=tuple(part.decode),
        summary=_summary(part.decode, single, ms_pass),
        concurrency=tuple(part.concurrency),
        needles=part.needles,
        gates=gates,
        reference=dict(prof.reference),
        error=str(error) if error else None,
        fidelity=part.fidelity,
        serving=_serving(part, config),
        smoke=part.smoke,
        known_issues=serve_cfg.known_issues if serve_cfg else (),
    )
    write_outputs(receipt, out)
    if error:
        raise error
    return receipt


def _judge(
    manifest: Manifest,
    config: QualifyConfig,
    prof: QualifyProfile,
    part: _Partial,
    single: Spread | None,
    ms_pass: Spread | None,
) -> tuple[Gate, ...]:
    """Every gate, by the one loop over the gate table (:mod:`pinwheel.serve.gates.table`)."""
    sources = sorted({s.passes_from for s in part.decode if s.ms_per_pass is not None})
    served_name = manifest.serve.served_model_name if manifest.serve else None
    return gate_table.judge(
        Measured(
            prof=prof,
            decode=part.decode,
            single=single,
            ms_pass=ms_pass,
            ms_source=", ".join(sources),
            acceptance=_acceptance(part.decode),
            concurrency=part.concurrency,
            needles=part.needles,
            markers=part.markers,
            smoke=part.smoke,
            served=(served_name, part.server.get("model") if served_name else None),
            fidelity_cfg=config.fidelity,
            fidelity=part.fidelity,
        )
    )


def _measure(
    part: _Partial,
    client: Client,
    target: Target,
    config: QualifyConfig,
    prof: QualifyProfile,
    reporter: Reporter,
) -> None:
    """Every phase in turn, each result kept in ``part`` as it comes (a run that breaks
    still leaves a receipt of what it measured)."""
    part.server["health_wait_s"] = round(
        wait_healthy(client, target, config.health_timeout_s, reporter=reporter), 2
    )
    reporter.info(f"healthy after {part.server['health_wait_s']} s")
    part.markers = check_markers((*config.markers, *prof.markers), target.log)
    models = client.models()
    if not models:
        raise PinwheelError("the server lists no model", where=f"{target.url}/v1/models")
    model = str(models[0]["id"])
    part.server |= {
        "url": target.url,
        "model": model,
        "version": client.version(),
        "max_model_len": models[0].get("max_model_len"),
    }
    wait_idle(client, config.idle_timeout_s)
    if config.smoke:
        part.smoke = run_smoke(client, model, config.smoke, config.thinking)
        for sm in part.smoke:
            reporter.info(f"smoke {sm.prompt!r}: {sm.status} ({sm.reply[:60]!r})")
    for w in range(config.warmup):
        client.stream_chat(model, config.prompts[w % len(config.prompts)], config.max_tokens,
                           thinking=config.thinking)  # fmt: skip
    part.decode_wall.append(time.perf_counter())
    for r in range(config.repeats):
        for i, p in enumerate(config.prompts):
            _check_alive(target)
            s = decode_sample(
                client, model, p, config.max_tokens, i, r, part.streams, config.thinking
            )
            part.decode.append(s)
            reporter.info(
                f"decode prompt {i} repeat {r}: {s.tok_s:.2f} tok/s, "
                + (
                    f"{s.ms_per_pass:.2f} ms/pass"
                    if s.ms_per_pass
                    else "ms/pass " + NOT_MEASURABLE
                )
            )
    part.decode_wall.append(time.perf_counter())
    for n in prof.concurrency:
        if n < 2:
            continue
        _check_alive(target)
        c = run_concurrency(
            lambda: Client(target.url), model, config.prompts, n, config.max_tokens,
            config.thinking,
        )  # fmt: skip
        part.concurrency.append(c)
        reporter.info(f"{n} streams: {c.aggregate_tok_s:.2f} tok/s aggregate")
    _check_alive(target)
    part.needles = run_needles(client, model, prof, part.server.get("max_model_len"), reporter)
    if config.fidelity is not None and config.fidelity.panel is not None:
        _check_alive(target)
        reporter.info("fidelity: scoring the panel's prompt log-probabilities")
        part.fidelity = (  # exact KLD in the engine, or from the served rows
            inprocess.measure if config.fidelity.scorer == "in-process" else fidelity.measure
        )(client, model, config.fidelity)
        f = part.fidelity
        reporter.info(
            f"fidelity: mean KLD {'>= ' if f.bound == 'lower' else ''}{f.mean_kld:.4e} "
            f"nats ({f.method}, {f.bound}, {f.positions} positions), top-1 {f.top1:.4f}"
        )


def gate_failure(receipt: Receipt, out: Path) -> GateFailed | None:
    """The error the CLI exits with (7) when a gate failed; None for a passing receipt."""
    failed = [g for g in receipt.gates if g.status in FAILING]
    if not failed:
        return None
    return GateFailed(
        "qualification FAILED: "
        + "; ".join(
            f"{g.name} {'' if g.status == 'FAIL' else g.status + ': '}{g.measured} "
            f"(needs {g.threshold})"
            for g in failed
        ),
        where=str(out / "report.md"),
        next="read the report; compare builds by ms/pass, then rerun `pinwheel qualify`",
    )


def _acceptance(decode: Sequence[DecodeSample]) -> Acceptance | None:
    """Totals over the decode phase (vLLM sums the counters the same way), None without MTP."""
    if not any(d.drafts for d in decode):
        return None
    return Acceptance(
        drafts=sum(d.drafts or 0 for d in decode),
        draft_tokens=sum(d.draft_tokens or 0 for d in decode),
        accepted=sum(d.accepted or 0 for d in decode),
    )


def _serving(part: _Partial, config: QualifyConfig) -> dict[str, Any]:
    """`vllm bench serve` statistics over the decode phase's requests (one at a time)."""
    if not part.streams:
        return {}
    end = part.decode_wall[1] if len(part.decode_wall) > 1 else part.streams[-1].last
    per_pos: dict[str, float] = {}
    for d in part.decode:
        for k, v in d.accepted_per_pos.items():
            per_pos[k] = per_pos.get(k, 0.0) + v
    spec = stats.spec_decode_stats(
        sum(d.drafts or 0 for d in part.decode),
        sum(d.draft_tokens or 0 for d in part.decode),
        sum(d.accepted or 0 for d in part.decode),
        per_pos,
    )
    out = stats.serving_stats(part.streams, end - part.decode_wall[0], config.slo, spec)
    return {"phase": "decode (single stream, sequential)", "max_concurrency": 1} | out


def _check_alive(target: Target, when: str = "during qualification") -> None:
    """A server we started that has exited: say so with its log's tail."""
    code = target.alive() if target.alive else None
    if code is not None:
        raise PinwheelError(
            f"the server exited with code {code} {when}",
            where=str(target.log or target.url),
            next="read the server log, fix the cause, run `pinwheel qualify` again"
            + _tail_block(target.log),
        )


def _explain(exc: PinwheelError, target: Target) -> PinwheelError:
    """A transport error plus the server's own last words, when pinwheel started it."""
    code = target.alive() if target.alive else None
    if code is None and target.alive is not None:
        time.sleep(1.0)  # a dying server may need a moment to be reaped
        code = target.alive()
    if code is not None:
        return PinwheelError(
            f"the server died mid-run (exit code {code}): {exc.what}",
            where=str(target.log or target.url),
            next="read the server log, fix the cause, run `pinwheel qualify` again"
            + _tail_block(target.log),
        )
    return exc


def _mean_acceptance_length(decode: Sequence[DecodeSample]) -> float | None:
    """vLLM's mean acceptance length over the decode phase: 1 + accepted / drafts."""
    a = _acceptance(decode)
    return a.mean_length if a else None


def _summary(
    decode: Sequence[DecodeSample], single: Spread | None, ms_pass: Spread | None
) -> dict[str, Any]:
    acc = spread([s.acceptance_length for s in decode if s.acceptance_length is not None])
    drafts = sum(s.drafts or 0 for s in decode)
    draft_tokens = sum(s.draft_tokens or 0 for s in decode)
    accepted = sum(s.accepted or 0 for s in decode)
    per_pos: dict[str, float] = {}
    for s in decode:
        for k, v in s.accepted_per_pos.items():
            per_pos[k] = per_pos.get(k, 0.0) + v
    per_prompt = {}
    for i in sorted({s.prompt for s in decode}):
        one = spread([s.tok_s for s in decode if s.prompt == i])
        per_prompt[str(i)] = asdict(one) if one else None
    return {
        "tok_s": asdict(single) | {"relative_spread": round(single.relative, 4)}
        if single
        else None,
        "ms_per_pass": asdict(ms_pass) if ms_pass else None,
        "ms_per_pass_source": ", ".join(
            sorted({s.passes_from for s in decode if s.ms_per_pass is not None})
        )
        or NOT_MEASURABLE,
        "acceptance_length": asdict(acc) if acc else None,  # per decode run
        "acceptance_rate": (accepted / draft_tokens) if draft_tokens else None,
        "mean_acceptance_length": _mean_acceptance_length(decode),
        "per_position_acceptance_rates": [
            per_pos[k] / drafts for k in sorted(per_pos, key=lambda k: (len(k), k))
        ]
        if drafts
        else None,
        "ttft_s": asdict(ttft) if (ttft := spread([s.ttft_s for s in decode])) else None,
        "per_prompt_tok_s": per_prompt,
    }

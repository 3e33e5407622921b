"""Fidelity: KLD(teacher || student) over a pinned panel of token windows.

In: a panel (JSON token windows, sha256-pinned), a teacher (a file written by
``pinwheel qualify teacher``, sha256-pinned, or a reference server), and the
served model's ``prompt_logprobs`` on the same windows. Out: per-position KLD in
nats (float64) and its summary: mean with a seeded bootstrap 95% CI, median,
p99, top-1 agreement (and how many positions had a tied maximum), and
``kld_sha256``: the sha256 of the canonical per-position text (one
``printf("%.9f\\n")`` line per position, :mod:`pinwheel.serve.kld`), which a
third party recomputes from the same log-probabilities on any CPU.

Position j of a window (j >= 1) is the distribution that predicted token j from
tokens < j: vLLM's ``prompt_logprobs[j]`` and the teacher's logits row j-1.

Methods (``FidelityResult.method`` / ``.bound``; the math is in docs/qualify.md):

- ``full`` / ``exact``: both sides returned the whole vocabulary; both rows are
  renormalized in float64, then ``sum_v p_t (log p_t - log p_s)`` (exactly rounded
  sum; 0 * log 0 = 0; +inf where the student has no mass and the teacher has).
- ``top-K+tail`` / ``lower``: otherwise. A proven lower bound of the KLD, even
  with float32 log-probabilities and tiny tails: it can FAIL a ``max_mean_kld``
  gate, never PASS it (the gate is then NOT PROVEN).

The panel (:mod:`pinwheel.serve.panel`), the teacher file
(:mod:`pinwheel.serve.teacherfile`) and its capture (:mod:`pinwheel.serve.capture`)
live apart; their names are re-exported here for callers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

from pinwheel.errors import UsageError, VerifyError
from pinwheel.manifest.serve import FidelityConfig
from pinwheel.serve.capture import (  # noqa: F401 (re-exported: callers say fidelity.X)
    VLLM_DEFAULT_MAX_LOGPROBS,
    TeacherOutcome,
    TeacherRequest,
    _check_rows,
    _server_rows,
    capture_from_server,
    capture_teacher,
    capture_with_transformers,
    parse_position,
    server_flags,
)
from pinwheel.serve.panel import PANEL_SCHEMA, Panel, read_panel, write_panel  # noqa: F401
from pinwheel.serve.receipt import FidelityResult, Gate
from pinwheel.serve.teacherfile import (  # noqa: F401 (re-exported: callers say fidelity.X)
    MAX_TEACHER,
    MAX_TEACHER_STORE,
    TEACHER_ARRAYS,
    TEACHER_SCHEMA,
    ZIP_TIME,
    Teacher,
    TeacherIndex,
    _check_panel,
    _np,
    check_panel,
    check_teacher_members,
    load_teacher,
    read_index,
    read_teacher,
    teacher_bytes,
    write_teacher_file,
)

MAX_BOOTSTRAP_DRAWS = 2_000_000_000  # resamples x windows: ~1 min of numpy, never more
BOOTSTRAP_BLOCK = 4_000_000  # indices drawn at once (32 MB of int64)


# --------------------------------------------------------------------------- KLD


def score_positions(
    teacher: Teacher, student: Sequence[tuple[Any, Any, int]]
) -> tuple[Any, Any, bool, int]:
    """Per-position KLD (float64), top-1 agreement, whether every value is exact, top-1 ties.

    Exact where both sides gave the whole vocabulary (:mod:`pinwheel.serve.workers.detkl`:
    the same bits on every CPU, the in-process scorer's code); a proven
    lower bound (:func:`kld.lower_bound`) elsewhere. Top-1 on both sides: the highest
    log-probability, ties to the lowest token id; a position where either side's
    maximum is tied counts in ``ties``.
    """
    np = _np()
    from pinwheel.serve import kld as K
    from pinwheel.serve.workers import detkl

    n = len(student)
    out = np.empty(n, np.float64)
    scorer = None if teacher.full is None else detkl.Scorer(teacher.full.shape[1])
    agree = np.empty(n, bool)
    exact = True
    ties = 0
    vocab = None if teacher.full is None else teacher.full.shape[1]
    for p, (ids, lps, _) in enumerate(student):
        target = int(teacher.target[p])
        if teacher.full is not None:
            t_side = K.Side.whole(teacher.full[p])
        else:
            t_side = K.Side.top(
                teacher.top_ids[p], teacher.top_logprobs[p], [target], [teacher.target_logprob[p]]
            )
        if vocab is not None and len(ids) and int(ids.max()) >= vocab:
            raise VerifyError(
                f"position {p}: the server answered token id {int(ids.max())}, beyond the "
                f"teacher's {vocab}-token vocabulary",
                where=teacher.source,
                next="the teacher and the served model must share a tokenizer; recapture the "
                "teacher from the same model",
            )
        try:
            if vocab is not None and len(ids) == vocab:
                s_row = np.full(vocab, np.nan)
                s_row[ids] = lps
                assert scorer is not None
                try:  # the canonical values: the same bits on every CPU (workers/detkl.py)
                    out[p] = scorer.one(teacher.full[p], s_row)[0]
                except ValueError as exc:
                    raise K.KldInputError(str(exc)) from None
            else:
                exact = False
                out[p] = K.lower_bound(t_side, K.Side.served(ids, lps, target))
        except K.KldInputError as exc:
            raise VerifyError(
                f"position {p}: {exc}",
                where=teacher.source,
                next="the server or the teacher file returned log-probabilities that are not "
                "a distribution; recapture, or report it to the engine",
            ) from None
        t_top, t_tie = K.top1(t_side.ids, t_side.lps)
        s_top, s_tie = K.top1(ids, lps)
        agree[p] = t_top == s_top
        ties += int(t_tie or s_tie)
    return out, agree, exact, ties


def kld_sha256(kld: Any) -> str:
    """sha256 of the canonical per-position text (:func:`pinwheel.serve.kld.canonical_text`)."""
    from pinwheel.serve import kld as K

    return K.kld_sha256(kld)


def _f64_sha256(kld: Any) -> str:
    from pinwheel.serve.workers import detkl

    return detkl.f64_sha256(kld)


def _math_name() -> str:
    from pinwheel.serve.workers import detkl

    return detkl.METHOD


def served_rows_sha256(student: Sequence[tuple[Any, Any, int]], vocab: int) -> str | None:
    """sha256 of the served full rows as float64 little-endian [P, V] in token-id order
    (what a third party recaptures and checks); None unless every row is full."""
    np = _np()
    h = hashlib.sha256()
    for ids, lps, _ in student:
        if len(ids) != vocab:
            return None
        row = np.full(vocab, np.nan)
        row[ids] = lps
        h.update(row.astype("<f8").tobytes())
    return h.hexdigest()


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
    exact: bool,
    *,
    panel: Panel,
    teacher: Teacher,
    top_k: int,
    resamples: int,
    seed: int,
    ties: int = 0,
) -> FidelityResult:
    np = _np()
    with np.errstate(invalid="ignore"):  # +inf positions: inf - inf inside percentiles
        ci, how = bootstrap_ci(kld, teacher.offsets, resamples, seed)
        median, p99 = float(np.median(kld)), float(np.percentile(kld, 99))
    if np.isinf(kld).any():  # an infinite position makes the figures above it infinite
        ci = tuple(math.inf if x != x else x for x in ci)  # type: ignore[assignment]
        median, p99 = (math.inf if x != x else x for x in (median, p99))
    return FidelityResult(
        mean_kld=float(kld.mean()),
        ci95=ci,
        median=median,
        p99=p99,
        max=float(kld.max()),
        top1=float(agree.mean()),
        positions=int(len(kld)),
        windows=len(panel.windows),
        method="full" if exact else f"top-{top_k}+tail",
        kld_sha256=kld_sha256(kld),
        kld_f64_sha256=_f64_sha256(kld),
        math=_math_name() if exact else "pinwheel.kld.lower_bound",
        panel_sha256=panel.sha256,
        teacher_sha256=teacher.sha256,
        teacher_source=str(teacher.meta.get("source", "")),
        top_k=top_k,
        ci_method=how,
        kld=tuple(float(x) for x in kld),
        bound="exact" if exact else "lower",
        top1_ties=ties,
    )


def measure(client: Any, model: str, cfg: FidelityConfig) -> FidelityResult:
    """Score the served model against the teacher on the panel (one request per window):
    in the engine (``scorer = "in-process"``, :mod:`pinwheel.serve.inprocess`) or from the
    served rows (``"rows"``, the reference path)."""
    if cfg.scorer == "in-process":
        raise UsageError(
            'scorer = "in-process" is measured by pinwheel.serve.inprocess.measure',
            where="[qualify.fidelity].scorer",
        )

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
    kld, agree, exact, ties = score_positions(teacher, student)
    rows_sha = None
    if exact and teacher.full is not None:
        rows_sha = served_rows_sha256(student, teacher.full.shape[1])
    result = summarize(
        kld,
        agree,
        exact,
        ties=ties,
        panel=panel,
        teacher=teacher,
        top_k=cfg.top_k,
        resamples=cfg.bootstrap,
        seed=cfg.seed,
    )
    from dataclasses import replace

    return replace(result, served_rows_sha256=rows_sha)


# --------------------------------------------------------------------------- gates


NOT_PROVEN = "NOT PROVEN"  # a gate failure: the figure cannot show the limit is met


def judge(cfg: FidelityConfig | None, result: FidelityResult | None) -> tuple[Gate, ...]:
    """The card's fidelity gates on the raw figures: ``<`` where the card writes ``<``.

    ``max_mean_kld`` PASSes only on the exact KLD: a lower bound FAILs it when the bound
    already breaks the limit and leaves it NOT PROVEN (a failure) otherwise.
    ``tolerance`` widens a gate that is a card's own measurement (never a strict gate);
    without a pinned panel (FILL IN) the gates SKIP with the reason: never PASS.
    """
    if cfg is None:
        return ()
    gates: list[Gate] = []
    unpinned = cfg.panel is None
    why = "FILL IN: the card's panel and teacher are not pinned in [qualify.fidelity]"
    if cfg.max_mean_kld is not None:
        name = "fidelity mean KLD (nats)"
        t = cfg.max_mean_kld if cfg.strict else cfg.max_mean_kld * (1 + cfg.tolerance)
        op = "<" if cfg.strict else "<="
        needs = f"{op} {t:.6g}" + _card(cfg.max_mean_kld, cfg.tolerance, cfg.strict)
        if unpinned:
            gates.append(Gate(name, "SKIP", "not measured", needs, why))
        elif result is None:
            gates.append(Gate(name, "FAIL", "not measured", needs))
        else:
            ok = result.mean_kld < t if cfg.strict else result.mean_kld <= t
            detail = (
                f"{result.method}, {result.positions} positions, 95% CI "
                f"{result.ci95[0]:.3e}-{result.ci95[1]:.3e}"
            )
            if result.bound == "exact":
                status, measured = ("PASS" if ok else "FAIL"), repr(result.mean_kld)  # raw
            else:
                measured = f">= {result.mean_kld!r} (lower bound)"
                if not ok:
                    status = "FAIL"
                    detail = "the lower bound already breaks the limit; " + detail
                else:
                    status = NOT_PROVEN
                    detail = (
                        "a top-K figure is only a lower bound of the KLD: it can prove a "
                        "FAIL, never a PASS; score full-vocabulary rows (top_k = -1, a "
                        "teacher with full rows; qualify starts vLLM with --max-logprobs "
                        "-1); " + detail
                    )
            gates.append(Gate(name, status, measured, needs, detail))
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
                    f"{round(result.top1 * result.positions)}/{result.positions} positions; "
                    f"{result.top1_ties} with a tied maximum (ties go to the lowest token id)",
                )
            )
    return tuple(gates)


def _card(figure: float, tolerance: float, strict: bool) -> str:
    if strict or not tolerance:
        return ""
    return f" (card {figure:g}, {tolerance:.0%} margin)"

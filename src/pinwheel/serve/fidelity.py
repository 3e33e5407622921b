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
from collections.abc import Sequence
from typing import Any

from pinwheel.errors import PinwheelError, UsageError, VerifyError
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
from pinwheel.serve.gates import table as gate_table
from pinwheel.serve.gates.base import Measured
from pinwheel.serve.gates.fidelity import (  # noqa: F401 (re-exported: callers say fidelity.X)
    MEAN_GATE,
    SPOT_GATE,
    TOP1_GATE,
    spot_gate,
)
from pinwheel.serve.panel import PANEL_SCHEMA, Panel, read_panel, write_panel  # noqa: F401
from pinwheel.serve.receipt import NOT_PROVEN_STATUS, FidelityResult, Gate
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
BOOTSTRAP_BLOCK = 2_000_000  # indices drawn at once (16 MB of int64, a few arrays of it)


# --------------------------------------------------------------------------- KLD


def score_positions(
    teacher: Teacher, student: Sequence[tuple[Any, Any, int]]
) -> tuple[Any, Any, bool, Any]:
    """Per-position KLD (float64), top-1 agreement, whether every value is exact, and per
    position whether either side's maximum was tied (bool arrays).

    Exact where both sides gave the whole vocabulary (:mod:`pinwheel.serve.workers.detkl`:
    the same bits on every CPU, the in-process scorer's code); a proven
    lower bound (:func:`kld.lower_bound`) elsewhere. Top-1 on both sides: the highest
    log-probability, ties to the lowest token id; a position where either side's
    maximum is tied is True in the last array.
    """
    np = _np()
    from pinwheel.serve import kld as K
    from pinwheel.serve.workers import detkl

    n = len(student)
    out = np.empty(n, np.float64)
    scorer = None if teacher.full is None else detkl.Scorer(teacher.full.shape[1])
    agree = np.empty(n, bool)
    exact = True
    tied = np.zeros(n, bool)
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
        tied[p] = t_tie or s_tie
    return out, agree, exact, tied


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


def _splitmix(seed: int, k: Any) -> Any:
    """:func:`kldsummary.splitmix64` of ``seed + (k + 1) * GOLDEN`` over a uint64 array."""
    np = _np()
    from pinwheel.serve import kldsummary as S

    u = np.uint64
    z = u(seed & S.MASK) + (k + u(1)) * u(S.GOLDEN)  # uint64 arrays wrap modulo 2**64
    z = (z ^ (z >> u(30))) * u(S.MIX1)
    z = (z ^ (z >> u(27))) * u(S.MIX2)
    return z ^ (z >> u(31))


def bootstrap_ci(
    kld: Any, offsets: Any, resamples: int, seed: int
) -> tuple[tuple[float, float], str]:
    """95% CI of the token-mean, resampling windows (or positions if one window), exactly
    as :mod:`pinwheel.serve.kldsummary` defines it (the same bits; numpy for speed)."""
    np = _np()
    from pinwheel.serve import kldsummary as S

    windows = len(offsets) - 1
    units = windows if windows >= 2 else len(kld)  # what units_of resamples, counted first
    if resamples * units > MAX_BOOTSTRAP_DRAWS:
        raise UsageError(
            f"the bootstrap would draw {resamples} x {units} = {resamples * units} indices, "
            f"over the limit of {MAX_BOOTSTRAP_DRAWS}",
            where="[qualify.fidelity] bootstrap",
            next=f"lower bootstrap to at most {max(MAX_BOOTSTRAP_DRAWS // max(units, 1), 1)}",
        )
    sums, counts = S.units_of([float(x) for x in kld], [int(n) for n in np.diff(offsets)])
    s = np.array(sums, np.float64)
    c = np.array(counts, np.int64)
    rows = max(1, BOOTSTRAP_BLOCK // max(units, 1))  # memory stays bounded
    means = np.empty(resamples, np.float64)
    with np.errstate(over="ignore"):  # an overflowing sum is +inf, as in pure Python
        for at in range(0, resamples, rows):
            n = min(rows, resamples - at)
            k = np.arange(at * units, (at + n) * units, dtype=np.uint64)
            idx = (_splitmix(seed, k) % np.uint64(units)).astype(np.intp).reshape(n, units)
            # cumsum adds left to right (each element to the previous sum): the
            # definition's order, not numpy's pairwise sum
            means[at : at + n] = np.cumsum(s[idx], axis=1)[:, -1] / c[idx].sum(axis=1)
    ci = S.rank_ci(np.sort(means).tolist())
    unit = f"{windows} windows" if windows >= 2 else f"{units} positions"
    return ci, f"{S.METHOD} bootstrap over {unit}, {resamples} resamples, seed {seed}"


def flag_bytes(agree: Any, tied: Any) -> bytes:
    """One byte a position: bit 1 top-1 agreement, bit 2 a tied maximum
    (``fidelity_flags.u8``, hashed as ``flags_sha256``)."""
    np = _np()
    a = np.asarray(agree, bool).astype(np.uint8)
    b = np.asarray(tied, bool).astype(np.uint8) * np.uint8(2)
    out: bytes = (a | b).tobytes()
    return out


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
    tied: Any = None,
) -> FidelityResult:
    """The figures of :mod:`pinwheel.serve.kldsummary` (what verify-receipt recomputes);
    a NaN value is refused here (never a number in the receipt)."""
    np = _np()
    from pinwheel.serve import kldsummary as S

    kld = np.asarray(kld, np.float64)
    if not len(kld):
        raise PinwheelError("no position was scored", where=teacher.source)
    if np.isnan(kld).any() or (kld < 0).any():
        raise PinwheelError(
            f"position {int(np.flatnonzero(np.isnan(kld) | (kld < 0))[0])}: the KLD is NaN "
            "or negative (not a divergence)",
            where=teacher.source,
            next="the rows are not distributions: recapture the teacher, or report it to the "
            "engine",
        )
    flags = flag_bytes(agree, np.zeros(len(kld), bool) if tied is None else tied)
    ci, how = bootstrap_ci(kld, teacher.offsets, resamples, seed)
    values = [float(x) + 0.0 for x in kld]
    ordered = sorted(values)
    return FidelityResult(
        mean_kld=S.mean(values),
        ci95=ci,
        median=S.median(ordered),
        p99=S.p99(ordered),
        max=ordered[-1],
        top1=sum(1 for f in flags if f & S.AGREE) / len(flags),
        positions=len(values),
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
        kld=tuple(values),
        bound="exact" if exact else "lower",
        top1_ties=sum(1 for f in flags if f & S.TIED),
        flags=flags,
        flags_sha256=hashlib.sha256(flags).hexdigest(),
        stats=S.METHOD,
        window_positions=tuple(int(n) for n in np.diff(teacher.offsets)),
        panel_positions=panel.positions,
        bootstrap_resamples=resamples,
        bootstrap_seed=seed,
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
    kld, agree, exact, tied = score_positions(teacher, student)
    rows_sha = None
    if exact and teacher.full is not None:
        rows_sha = served_rows_sha256(student, teacher.full.shape[1])
    result = summarize(
        kld,
        agree,
        exact,
        tied=tied,
        panel=panel,
        teacher=teacher,
        top_k=cfg.top_k,
        resamples=cfg.bootstrap,
        seed=cfg.seed,
    )
    from dataclasses import replace

    return replace(result, served_rows_sha256=rows_sha)


# --------------------------------------------------------------------------- gates


NOT_PROVEN = NOT_PROVEN_STATUS  # a gate failure: the figure cannot show the limit is met


def judge(cfg: FidelityConfig | None, result: FidelityResult | None) -> tuple[Gate, ...]:
    """The card's fidelity gates on the raw figures: the rows of
    :mod:`pinwheel.serve.gates.fidelity` (mean KLD, top-1, the in-process spot-check),
    through the one gate loop (:func:`pinwheel.serve.gates.table.judge`)."""
    return gate_table.judge(Measured(fidelity_cfg=cfg, fidelity=result))

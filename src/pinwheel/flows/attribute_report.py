"""The attribution report: ``attribution.json`` (schema ``pinwheel.attribution/1``),
``attribution.md`` (every value escaped through :mod:`pinwheel.markup`) and
``attribution.png`` (the per-step ms/pass effects with their intervals) when matplotlib
(the ``qualify`` extra) is installed.

Signs: every delta is *with the step minus without it*: a negative ms/pass delta is a step
that makes a forward pass faster; a positive acceptance delta one that accepts more drafts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pinwheel import markup as md
from pinwheel.flows.attribution import SCHEMA, AttributeOutcome, StepEffect
from pinwheel.fsutil import atomic_write_bytes, atomic_write_text
from pinwheel.serve.pairstats import NOISE, POWER, Effect

JSON_FILE = "attribution.json"
MD_FILE = "attribution.md"
PLOT_FILE = "attribution.png"
MAX_CHANGED = 200  # changed paths listed per variant in the JSON (the count is always there)


def to_json(o: AttributeOutcome) -> dict[str, Any]:
    builds = {b.variant: b for b in o.builds}
    first = {s.variant: s for s in o.servings if s.round == 0}
    variants = []
    for v in o.plan.variants:
        b = builds.get(v.name)
        s = first.get(v.name)
        variants.append(
            {
                "name": v.name,
                "steps": list(v.steps),
                "tree": v.tree,
                "head": v.result.head if v.result is not None else None,
                "blocked": v.blocked.to_json() if v.blocked is not None else None,
                "wheel": b.wheel if b else None,
                "sha256": b.sha256 if b else None,
                "build_seconds": round(b.seconds, 2) if b else None,
                "build_wall_s": round(b.wall_s, 2) if b else None,
                "reused_members": list(b.reused) if b else [],
                "changed_files": len(b.changed) if b else None,
                "changed": list(b.changed[:MAX_CHANGED]) if b else [],
                "install": [list(c) for c in b.install] if b else [],
                "serve_command": list(s.command) if s else None,
            }
        )
    return {
        "schema": SCHEMA,
        "manifest": dict(o.manifest),
        "mode": o.mode,
        "rounds": o.rounds,
        "samples": o.samples,
        "settings": dict(o.settings),
        "steps": [_step_json(e) for e in o.effects],
        "blocked": [
            {"number": step.number, "label": step.label, "title": step.title, **why.to_json()}
            for step, why in o.plan.blocked
        ],
        "variants": variants,
        "servings": [
            {
                "variant": s.variant,
                "round": s.round + 1,
                "seconds": round(s.seconds, 3),
                "texts": list(s.texts),
                "samples": [
                    {
                        "prompt": d.prompt,
                        "tokens": d.tokens,
                        "passes": d.passes,
                        "passes_from": d.passes_from,
                        "ms_per_pass": d.ms_per_pass,
                        "tok_s": d.tok_s,
                        "acceptance_length": d.acceptance_length,
                    }
                    for d in s.samples
                ],
                "needles": [
                    {"length": n.length, "depth": n.depth, "status": n.status} for n in s.needles
                ],
                "fidelity": (
                    {
                        "mean_kld": s.fidelity.mean_kld,
                        "ci95": list(s.fidelity.ci95),
                        "method": s.fidelity.method,
                    }
                    if s.fidelity is not None
                    else None
                ),
            }
            for s in o.servings
        ],
        "files": dict(o.files),
    }


def _step_json(e: StepEffect) -> dict[str, Any]:
    def eff(x: Effect | None) -> dict[str, Any] | None:
        return x.to_json() if x is not None else None

    return {
        "number": e.number,
        "label": e.label,
        "title": e.title,
        "with": e.with_,
        "without": e.without,
        "ms_per_pass": eff(e.ms_per_pass),
        "acceptance_length": eff(e.acceptance),
        "tok_s": eff(e.tok_s),
        "kld": {"with": e.kld[0], "without": e.kld[1], "delta": e.delta_kld},
        "needles": {"with": e.needles[0], "without": e.needles[1]},
        "text": e.text,
    }


def ms_cell(e: Effect | None) -> str:
    if e is None:
        return "not measurable"
    pct = f" ({e.relative * 100:+.1f}%)" if e.relative is not None else ""
    if not e.decided:
        return f"{e.delta:+.3f}{pct} [no interval]"
    return f"{e.delta:+.3f}{pct} [{e.ci_low:+.3f}, {e.ci_high:+.3f}]"


def ms_verdict(e: Effect | None) -> str:
    if e is None:
        return "not measured"
    if e.verdict == NOISE or not e.decided:
        return e.verdict
    return "faster" if e.delta < 0 else "slower"


def mde_cell(e: Effect | None, digits: int = 3) -> str:
    """The smallest |effect| the design detects with POWER, and the Holm p-value."""
    if e is None or e.mde is None:
        return "n/a"
    p = f"; p {e.p_holm:.3g}" if e.p_holm is not None else ""
    holm = f" (Holm over {e.family})" if e.family > 1 else ""
    return f"{e.mde:.{digits}f}{p}{holm}"


def _plain(e: Effect | None, digits: int = 3) -> str:
    if e is None:
        return "n/a"
    if not e.decided:
        return f"{e.delta:+.{digits}f} ({e.verdict})"
    tag = f" ({NOISE})" if e.verdict == NOISE else ""
    return f"{e.delta:+.{digits}f} [{e.ci_low:+.{digits}f}, {e.ci_high:+.{digits}f}]{tag}"


def _kld(e: StepEffect) -> str:
    d = e.delta_kld
    return "n/a" if d is None else f"{d:+.3e}"


def human_lines(o: AttributeOutcome) -> list[str]:
    """The table as plain lines (the CLI prints these)."""
    lines = [
        f"attribution of {o.manifest.get('name')} ({o.mode}, {o.rounds} round(s) x "
        f"{o.samples} sample(s) per variant; {level_line(o)})",
    ]
    for e in o.effects:
        lines.append(
            f"  {e.label}: ms/pass {ms_cell(e.ms_per_pass)} -> {ms_verdict(e.ms_per_pass)} "
            f"(detectable: {mde_cell(e.ms_per_pass)}); acceptance {_plain(e.acceptance)}; "
            f"KLD {_kld(e)}; needle {e.needles[0]} vs {e.needles[1]}; text {e.text}"
        )
    for step, why in o.plan.blocked:
        files = f" in {', '.join(why.files)}" if why.files else ""
        lines.append(f"  {step.label}: cannot be left out: {why.label} fails{files} ({why.what})")
    for b in o.builds:
        reused = f", reused {len(b.reused)} compiled member(s)" if b.reused else ""
        lines.append(
            f"  built {b.variant}: {b.wheel} sha256 {b.sha256[:16]} in {b.seconds:.1f} s "
            f"({len(b.changed)} file(s) changed{reused})"
        )
    return lines


def level_line(o: AttributeOutcome) -> str:
    """What the intervals and verdicts mean, in one line."""
    return level_text(o.settings, unit="the server start", family=len(o.effects), of="steps")


def level_text(settings: Mapping[str, Any], *, unit: str, family: int, of: str) -> str:
    """The level line of an attribution (a stack's steps, a kernel's step x case
    comparisons): the unit paired, the t intervals' confidence, the family-wise level
    and Holm's family, and the power the detectable effect is stated at."""
    conf = float(settings.get("confidence", 0.95))
    holm = f", Holm over {family} {of}" if family > 1 else ""
    return (
        f"deltas are with the step minus without it; unit: {unit}, one difference "
        f"per round; {conf * 100:g}% t intervals over rounds; verdicts at "
        f"{(1 - conf) * 100:g}% family-wise{holm}; detectable: the smallest |effect| found "
        f"{POWER * 100:g}% of the time"
    )


def markdown(o: AttributeOutcome) -> str:
    t = md.text
    out = [
        f"# Attribution: {t(o.manifest.get('name'))}",
        "",
        f"Manifest `{md.code(o.manifest.get('path'))}` "
        f"(sha256 `{md.code(o.manifest.get('sha256'))}`); "
        f"mode {t(o.mode)}; {o.rounds} round(s) x {o.samples} sample(s) per variant, served "
        f"interleaved; profile {t(o.settings.get('profile'))}.",
        "",
        f"{t(level_line(o))}. Order: {t(o.settings.get('order'))}. A verdict needs "
        f"{t(o.settings.get('rounds_needed'))} rounds.",
        "",
        "| step | title | Δ ms/pass [CI] | verdict | detectable Δ ms/pass; p | Δ acceptance "
        "[CI] | Δ tok/s (info) | Δ KLD | needle with / without | greedy text |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in o.effects:
        out.append(
            f"| {t(e.label)} | {t(e.title or '')} | {t(ms_cell(e.ms_per_pass))} | "
            f"{t(ms_verdict(e.ms_per_pass))} | {t(mde_cell(e.ms_per_pass))} | "
            f"{t(_plain(e.acceptance))} | "
            f"{t(_plain(e.tok_s, 2))} | {t(_kld(e))} | {t(e.needles[0])} / {t(e.needles[1])} "
            f"| {t(e.text)} |"
        )
    if o.plan.blocked:
        out += ["", "## Steps that cannot be left out", ""]
        for step, why in o.plan.blocked:
            files = ", ".join(f"`{md.code(f)}`" for f in why.files) or "(no file named)"
            out.append(
                f"- {t(step.label)}: without it {t(why.label)} fails: {t(why.what)}; files: {files}"
            )
    out += [
        "",
        "## Receipts",
        "",
        "| variant | steps | tree | wheel | sha256 | build s | files changed | reused members "
        "| serve command |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    first = {s.variant: s for s in o.servings if s.round == 0}
    builds = {b.variant: b for b in o.builds}
    for v in o.plan.variants:
        b = builds.get(v.name)
        s = first.get(v.name)
        steps = ", ".join(map(str, v.steps)) or "none"
        if b is None:
            state = "blocked" if v.blocked else "not built"
            out.append(
                f"| {t(v.name)} | {t(steps)} | `{md.code(v.tree or '-')}` | {state} | | | | | |"
            )
            continue
        cmd = " ".join(s.command) if s else ""
        out.append(
            f"| {t(v.name)} | {t(steps)} | `{md.code(v.tree)}` | `{md.code(b.wheel)}` | "
            f"`{md.code(b.sha256)}` | {b.seconds:.1f} | {len(b.changed)} | {len(b.reused)} | "
            f"`{md.code(cmd, 600)}` |"
        )
    if o.files.get("plot"):
        out += ["", f"![ms/pass effects]({md.code(o.files['plot'])})"]
    return "\n".join(out) + "\n"


def render_plot(o: AttributeOutcome, out: Path) -> str | None:
    """A horizontal interval plot of Δ ms/pass per step; None without matplotlib."""
    rows = [
        (e.label, e.ms_per_pass)
        for e in o.effects
        if e.ms_per_pass is not None and e.ms_per_pass.decided
    ]
    if not rows:
        return None
    try:
        import io

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(rows) + 1.5))
    for y, (_, e) in enumerate(rows):
        assert e is not None
        color = "#9e9e9e" if e.verdict == NOISE else ("#2e7d32" if e.delta < 0 else "#c62828")
        ax.plot([e.ci_low, e.ci_high], [y, y], color=color, linewidth=3)
        ax.plot([e.delta], [y], "o", color=color)
    ax.axvline(0.0, color="#424242", linewidth=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows])
    ax.set_xlabel("Δ ms per forward pass (with step − without), CI")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(out / PLOT_FILE, buf.getvalue())
    return PLOT_FILE


def write_outputs(o: AttributeOutcome, out: Path) -> dict[str, str]:
    """attribution.json, attribution.md and (when possible) attribution.png in ``out``."""
    import dataclasses

    files = {"json": JSON_FILE, "markdown": MD_FILE}
    plot = render_plot(o, out)
    if plot:
        files["plot"] = plot
    done = dataclasses.replace(o, files=files)
    atomic_write_text(out / JSON_FILE, json.dumps(to_json(done), indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / MD_FILE, markdown(done))
    return files

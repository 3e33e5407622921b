"""The kernel attribution report: ``attribution.json`` (schema
``pinwheel.kernel-attribution/1``) and ``attribution.md`` (every value escaped through
:mod:`pinwheel.markup`), with the engine report's cells (:mod:`pinwheel.flows.attribute_report`):
Δ ms [CI], verdict, the smallest detectable effect and the Holm p-value, per step and case.

Signs: every delta is *with the step minus without it*: a negative Δ ms is a step that
makes the kernel faster.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pinwheel import markup as md
from pinwheel.flows.attribute_report import level_text, mde_cell, ms_cell, ms_verdict
from pinwheel.flows.kernel_attribution import KernelAttributeOutcome
from pinwheel.fsutil import atomic_write_text

SCHEMA = "pinwheel.kernel-attribution/1"
JSON_FILE = "attribution.json"
MD_FILE = "attribution.md"


def to_json(o: KernelAttributeOutcome) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "kernel": o.kernel,
        "manifest": dict(o.manifest),
        "rounds": o.rounds,
        "samples": o.samples,
        "iters": o.iters,
        "settings": dict(o.settings),
        "steps": [
            {
                "number": e.number,
                "label": e.label,
                "title": e.title,
                "case": e.case,
                "with": e.with_,
                "without": e.without,
                "ms": e.effect.to_json() if e.effect is not None else None,
                "error": {"with": e.error[0], "without": e.error[1]},
            }
            for e in o.effects
        ],
        "blocked": [
            {"number": s.number, "label": s.label, "title": s.title, "what": why}
            for s, why in o.blocked
        ],
        "variants": [
            {
                "name": v.name,
                "steps": list(v.steps),
                "wheel": v.wheel.name if v.wheel else None,
                "sha256": v.sha256,
                "build_seconds": round(v.seconds, 1),
                "blocked": v.blocked,
            }
            for v in o.variants
        ],
        "runs": [
            {
                "variant": r.variant,
                "round": r.round + 1,
                "seconds": round(r.seconds, 3),
                "times": {k: list(v) for k, v in r.times.items()},
                "error": dict(r.error),
            }
            for r in o.runs
        ],
        "files": dict(o.files),
    }


def level_line(o: KernelAttributeOutcome) -> str:
    return level_text(
        o.settings, unit="the process", family=len(o.effects), of="step x case comparisons"
    )


def _err(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def human_lines(o: KernelAttributeOutcome) -> list[str]:
    lines = [
        f"kernel attribution of {o.kernel} ({o.manifest.get('name')}; {o.rounds} round(s) x "
        f"{o.samples} sample(s) x {o.iters} call(s) per variant; {level_line(o)})"
    ]
    for e in o.effects:
        lines.append(
            f"  {e.label} {e.case}: ms {ms_cell(e.effect)} -> {ms_verdict(e.effect)} "
            f"(detectable: {mde_cell(e.effect, 4)}); error {_err(e.error[0])} vs "
            f"{_err(e.error[1])}"
        )
    for step, why in o.blocked:
        lines.append(f"  {step.label}: cannot be left out: {why}")
    for v in o.variants:
        if v.wheel is not None:
            lines.append(f"  built {v.name}: {v.wheel.name} sha256 {(v.sha256 or '')[:16]}")
    return lines


def markdown(o: KernelAttributeOutcome) -> str:
    t = md.text
    out = [
        f"# Kernel attribution: {t(o.kernel)} ({t(o.manifest.get('name'))})",
        "",
        f"Manifest `{md.code(o.manifest.get('path'))}` (sha256 "
        f"`{md.code(o.manifest.get('sha256'))}`); {o.rounds} round(s) x {o.samples} "
        f"sample(s) x {o.iters} call(s) per variant; timing program "
        f"`{md.code(o.settings.get('timing'))}`.",
        "",
        f"{t(level_line(o))}. Order: {t(o.settings.get('order'))}. A verdict needs "
        f"{t(o.settings.get('rounds_needed'))} rounds.",
        "",
        "| step | title | case | Δ ms [CI] | verdict | detectable Δ ms; p | error with / "
        "without |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in o.effects:
        out.append(
            f"| {t(e.label)} | {t(e.title or '')} | {t(e.case)} | {t(ms_cell(e.effect))} | "
            f"{t(ms_verdict(e.effect))} | {t(mde_cell(e.effect, 4))} | "
            f"{t(_err(e.error[0]))} / {t(_err(e.error[1]))} |"
        )
    if o.blocked:
        out += ["", "## Steps that cannot be left out", ""]
        out += [f"- {t(step.label)}: {t(why)}" for step, why in o.blocked]
    out += ["", "## Receipts", "", "| variant | steps | wheel | sha256 | build s |",
            "|---|---|---|---|---|"]  # fmt: skip
    for v in o.variants:
        steps = ", ".join(map(str, v.steps)) or "none"
        wheel = f"`{md.code(v.wheel.name)}`" if v.wheel else t(v.blocked or "not built")
        out.append(
            f"| {t(v.name)} | {t(steps)} | {wheel} | `{md.code(v.sha256 or '-')}` | "
            f"{v.seconds:.1f} |"
        )
    return "\n".join(out) + "\n"


def write_outputs(o: KernelAttributeOutcome, out: Path) -> dict[str, str]:
    import dataclasses

    files = {"json": JSON_FILE, "markdown": MD_FILE}
    done = dataclasses.replace(o, files=files)
    atomic_write_text(out / JSON_FILE, json.dumps(to_json(done), indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / MD_FILE, markdown(done))
    return files

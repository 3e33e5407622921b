"""The qualification report: Markdown for people, PNG plots when matplotlib is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pinwheel.fsutil import atomic_write_text
from pinwheel.serve.receipt import Receipt

STATUS_COLOURS = {"pass": "#2e7d32", "miss": "#c62828", "garbage": "#6a1b9a", "skipped": "#9e9e9e"}


def _num(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_markdown(r: Receipt, plots: dict[str, str]) -> str:
    lines = [f"# Qualification: {r.verdict}", ""]
    lines += [
        f"- manifest: `{r.manifest['path']}` ({r.manifest['name']}), "
        f"sha256 `{r.manifest['sha256']}`",
        f"- profile: `{r.profile}`",
        f"- server: {r.server.get('url', '?')}, model `{r.server.get('model', '?')}`, "
        f"vLLM {r.server.get('version', '?')}",
        f"- started {r.started}, took {r.seconds:.0f} s",
    ]
    if r.provenance:
        p = r.provenance
        lines.append(f"- provenance: `{p.path}` sha256 `{p.sha256}` (tag {p.tag}, tree {p.tree})")
    else:
        lines.append("- provenance: none given (pass --provenance wheels/provenance.json)")
    if r.error:
        lines += ["", "## Error", "", "```", r.error, "```"]
    lines += [
        "",
        "## Gates",
        "",
        "| gate | result | measured | needs | detail |",
        "|---|---|---|---|---|",
    ]
    for g in r.gates:
        mark = f"**{g.status}**" if g.status == "FAIL" else g.status
        lines.append(f"| {g.name} | {mark} | {g.measured} | {g.threshold} | {g.detail} |")
    if not r.gates:
        lines.append("| (none) | | | | |")

    s = r.summary
    lines += ["", "## Decode (single stream, greedy, TTFT excluded)", ""]
    if s.get("tok_s"):
        t = s["tok_s"]
        lines.append(
            f"- tok/s: median **{t['median']:.2f}** (range {t['low']:.2f}-{t['high']:.2f}, "
            f"spread {t['relative_spread'] * 100:.1f}%, n={t['n']})"
        )
    if s.get("ms_per_pass"):
        m = s["ms_per_pass"]
        lines.append(
            f"- ms per forward pass: median **{m['median']:.2f}** ({m['low']:.2f}-{m['high']:.2f})"
        )
    if s.get("accepted_per_pass"):
        a = s["accepted_per_pass"]
        lines.append(
            f"- accepted draft tokens per pass: median {a['median']:.2f}; acceptance rate "
            f"{_num(s.get('acceptance_rate'))}; "
            f"mean acceptance length {_num(s.get('mean_acceptance_length'))}"
        )
    if s.get("ttft_s"):
        lines.append(f"- time to first token: median {s['ttft_s']['median']:.3f} s")
    if r.reference:
        ref = ", ".join(f"{k} {v}" for k, v in r.reference.items())
        lines.append(f"- the card measured: {ref}")
    lines += [
        "",
        "| prompt | repeat | tokens | TTFT s | tok/s | passes | ms/pass | accepted/pass |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in r.decode:
        lines.append(
            f"| {d.prompt} | {d.repeat} | {d.tokens} | {d.ttft_s:.3f} | {d.tok_s:.2f} | "
            f"{d.passes} | {_num(d.ms_per_pass)} | {_num(d.accepted_per_pass)} |"
        )
    if "decode" in plots:
        lines += ["", f"![per-prompt tok/s]({plots['decode']})"]

    if r.concurrency:
        lines += [
            "",
            "## Concurrency",
            "",
            "| streams | tokens | wall s | aggregate tok/s |",
            "|---|---|---|---|",
        ]
        for c in r.concurrency:
            lines.append(
                f"| {c.streams} | {c.total_tokens} | {c.wall_s:.2f} | {c.aggregate_tok_s:.2f} |"
            )

    if r.needles:
        depths = sorted({n.depth for n in r.needles})
        lines += [
            "",
            "## Needle (exact token lengths, model's own tokenizer)",
            "",
            "| length | " + " | ".join(f"depth {d}" for d in depths) + " |",
            "|---|" + "---|" * len(depths),
        ]
        for length in sorted({n.length for n in r.needles}):
            row = {n.depth: n for n in r.needles if n.length == length}
            cells = [row[d].status.upper() if d in row else "" for d in depths]
            lines.append(f"| {length} | " + " | ".join(cells) + " |")
        odd = [n for n in r.needles if n.status not in ("pass", "skipped")]
        for n in odd:
            lines.append(f"- {n.length} @ {n.depth}: {n.status}, {n.reason}: `{n.answer[:120]!r}`")
        if "needle" in plots:
            lines += ["", f"![needle grid]({plots['needle']})"]

    if r.markers:
        lines += ["", "## Start-up log markers", ""]
        for m in r.markers:
            lines.append(f"- `/{m.pattern}/`: {m.status}" + (f" — `{m.line}`" if m.line else ""))
    if "missing" in plots:
        lines += ["", f"_plots not drawn: {plots['missing']}_"]
    return "\n".join(lines) + "\n"


def render_plots(r: Receipt, out: Path) -> dict[str, str]:
    """Write PNGs beside the report; returns {kind: file name} (or {'missing': why})."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {
            "missing": "matplotlib is not installed "
            "(`pip install -e '.[qualify]'` from the pinwheel checkout)"
        }
    made: dict[str, str] = {}
    if r.decode:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        prompts = sorted({d.prompt for d in r.decode})
        for p in prompts:
            ys = [d.tok_s for d in r.decode if d.prompt == p]
            ax.scatter([p] * len(ys), ys, color="#1565c0")
        for g in r.gates:
            if g.name == "single-stream tok/s" and g.threshold.startswith(">="):
                ax.axhline(float(g.threshold[2:]), color="#c62828", linestyle="--", label="gate")
                ax.legend()
        ax.set_xticks(prompts)
        ax.set_xlabel("prompt")
        ax.set_ylabel("decode tok/s (TTFT excluded)")
        ax.set_title(f"single-stream decode, {r.profile}")
        fig.tight_layout()
        fig.savefig(out / "decode_tok_s.png", dpi=100)
        plt.close(fig)
        made["decode"] = "decode_tok_s.png"
    if r.needles:
        lengths = sorted({n.length for n in r.needles})
        depths = sorted({n.depth for n in r.needles})
        fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(depths), 1 + 0.6 * len(lengths)))
        for n in r.needles:
            x, y = depths.index(n.depth), lengths.index(n.length)
            ax.add_patch(
                plt.Rectangle(
                    (x - 0.45, y - 0.4), 0.9, 0.8, color=STATUS_COLOURS.get(n.status, "#000")
                )
            )
            ax.text(x, y, n.status, ha="center", va="center", color="white", fontsize=8)
        ax.set_xlim(-0.5, len(depths) - 0.5)
        ax.set_ylim(-0.5, len(lengths) - 0.5)
        ax.set_xticks(range(len(depths)), [str(d) for d in depths])
        ax.set_yticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_xlabel("needle depth")
        ax.set_ylabel("prompt tokens")
        ax.set_title("needle: length x depth")
        fig.tight_layout()
        fig.savefig(out / "needle_grid.png", dpi=100)
        plt.close(fig)
        made["needle"] = "needle_grid.png"
    return made


def write_outputs(receipt: Receipt, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plots = render_plots(receipt, out)
    atomic_write_text(out / "receipt.json", receipt.to_json())
    atomic_write_text(out / "report.md", render_markdown(receipt, plots))

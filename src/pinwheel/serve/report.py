"""The qualification report: Markdown for people, PNG plots when matplotlib is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pinwheel import markup as md
from pinwheel.fsutil import atomic_write_bytes, atomic_write_text
from pinwheel.serve.receipt import FAILING, Receipt
from pinwheel.urls import redact

STATUS_COLOURS = {"pass": "#2e7d32", "miss": "#c62828", "garbage": "#6a1b9a", "skipped": "#9e9e9e"}


def _num(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_markdown(r: Receipt, plots: dict[str, str]) -> str:
    lines = [f"# Qualification: {r.verdict}", ""]
    lines += _head_markdown(r)
    lines += _gates_markdown(r)
    lines += _decode_markdown(r, plots)
    lines += _serving_markdown(r, plots)
    lines += _fidelity_markdown(r, plots)
    lines += _concurrency_markdown(r)
    lines += _needle_markdown(r, plots)
    lines += _records_markdown(r)
    if "missing" in plots:
        lines += ["", f"_plots not drawn: {plots['missing']}_"]
    return "\n".join(lines) + "\n"


def _head_markdown(r: Receipt) -> list[str]:
    lines = [
        f"- manifest: `{md.code(r.manifest['path'])}` ({md.text(r.manifest['name'])}), "
        f"sha256 `{md.code(r.manifest['sha256'])}`",
        f"- profile: `{md.code(r.profile)}`",
        # The server's answers (model id, version) are untrusted text: escaped, one line.
        f"- server: {md.text(r.server.get('url', '?'))}, "
        f"model `{md.code(r.server.get('model', '?'))}`, "
        f"vLLM {md.text(r.server.get('version', '?'))}",
        f"- started {r.started}, took {r.seconds:.0f} s",
    ]
    if r.provenance:
        p = r.provenance
        lines.append(
            f"- provenance: `{md.code(p.path)}` sha256 `{md.code(p.sha256)}` "
            f"(tag {md.text(p.tag)}, tree {md.text(p.tree)})"
        )
    else:
        lines.append("- provenance: none given (pass --provenance wheels/provenance.json)")
    if r.error:
        fenced = redact(r.error).replace("```", "'''")
        lines += ["", "## Error", "", "```", fenced, "```"]
    return lines


def _gates_markdown(r: Receipt) -> list[str]:
    """One table row per gate, whatever row of the gate table made it."""
    lines = [
        "",
        "## Gates",
        "",
        "| gate | result | measured | needs | detail |",
        "|---|---|---|---|---|",
    ]
    for g in r.gates:
        mark = f"**{g.status}**" if g.status in FAILING else g.status
        lines.append(
            f"| {md.text(g.name)} | {mark} | {md.text(g.measured)} | {md.text(g.threshold)} "
            f"| {md.text(g.detail)} |"
        )
    if not r.gates:
        lines.append("| (none) | | | | |")
    return lines


def _decode_markdown(r: Receipt, plots: dict[str, str]) -> list[str]:
    s = r.summary
    lines = ["", "## Decode (single stream, greedy, TTFT excluded)", ""]
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
    if s.get("mean_acceptance_length") is not None:
        rates = ", ".join(f"{x:.2f}" for x in s.get("per_position_acceptance_rates") or ())
        lines.append(
            f"- mean acceptance length (1 + accepted/drafts) "
            f"**{_num(s.get('mean_acceptance_length'))}**; acceptance rate "
            f"{_num(s.get('acceptance_rate'))}; per-position acceptance rate: {rates}"
        )
    if s.get("ttft_s"):
        lines.append(f"- time to first token: median {s['ttft_s']['median']:.3f} s")
    if r.reference:
        ref = ", ".join(f"{k} {v}" for k, v in r.reference.items())
        lines.append(f"- the card measured: {ref}")
    lines += [
        "",
        "| prompt | repeat | tokens | TTFT s | tok/s | passes | ms/pass | acceptance length |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in r.decode:
        lines.append(
            f"| {md.text(d.prompt)} | {d.repeat} | {d.tokens} | {d.ttft_s:.3f} | {d.tok_s:.2f} | "
            f"{d.passes} | {_num(d.ms_per_pass)} | {_num(d.acceptance_length)} |"
        )
    if "decode" in plots:
        lines += ["", f"![per-prompt tok/s]({plots['decode']})"]
    return lines


def _concurrency_markdown(r: Receipt) -> list[str]:
    if not r.concurrency:
        return []
    lines = [
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
    return lines


def _needle_markdown(r: Receipt, plots: dict[str, str]) -> list[str]:
    if not r.needles:
        return []
    depths = sorted({n.depth for n in r.needles})
    lines = [
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
        lines.append(
            f"- {n.length} @ {n.depth}: {md.text(n.status)}, {md.text(n.reason)}: "
            f"`{md.code(repr(n.answer[:120]))}`"
        )
    if "needle" in plots:
        lines += ["", f"![needle grid]({plots['needle']})"]
    return lines


def _records_markdown(r: Receipt) -> list[str]:
    """The smoke replies, the card's known issues and the start-up log markers."""
    lines: list[str] = []
    if r.smoke:
        lines += ["", "## Smoke prompts (the card's, greedy)", ""]
        for sm in r.smoke:
            lines.append(
                f"- `{md.code(sm.prompt)}`: {md.text(sm.status)} — reply "
                f"`{md.code(repr(sm.reply[:120]))}`"
            )
    if r.known_issues:
        lines += ["", "## Known issues (the card's warnings)", ""]
        lines += [f"- {md.text(issue, limit=1000)}" for issue in r.known_issues]
    if r.markers:
        lines += ["", "## Start-up log markers", ""]
        for m in r.markers:
            lines.append(
                f"- `/{md.code(m.pattern)}/`: {md.text(m.status)}"
                + (f" — `{md.code(m.line)}`" if m.line else "")
            )
    return lines


def _sci(value: Any) -> str:
    return "-" if value is None else f"{value:.4e}"


def _fidelity_markdown(r: Receipt, plots: dict[str, str]) -> list[str]:
    f = r.fidelity
    if f is None:
        return []
    lines = [
        "",
        "## Fidelity: KLD(teacher || served model), nats",
        "",
        "| fidelity.mean_kld | fidelity.ci95 | fidelity.median | fidelity.p99 | "
        "fidelity.top1 | fidelity.positions | fidelity.method | fidelity.bound |",
        "|---|---|---|---|---|---|---|---|",
        f"| {f.mean_kld!r} | {_sci(f.ci95[0])} - {_sci(f.ci95[1])} | {_sci(f.median)} | "
        f"{_sci(f.p99)} | {f.top1!r} | {f.positions} ({f.windows} windows) | {f.method} | "
        f"{f.bound} |",
        "",
        f"- fidelity.kld_sha256 `{f.kld_sha256}` (sha256 of `fidelity_kld.txt`: one "
        '`printf("%.9f\\n")` line per position; the float64 values: `fidelity_kld.f64`)',
        f"- top-1 ties (either side's maximum tied; ties go to the lowest token id): {f.top1_ties}",
        f"- panel sha256 `{f.panel_sha256}`; teacher sha256 `{f.teacher_sha256}` "
        f"({f.teacher_source})",
        f"- 95% CI: {f.ci_method}; max {_sci(f.max)}",
    ]
    if "fidelity" in plots:
        lines += ["", f"![per-position KLD]({plots['fidelity']})"]
    return lines


def _serving_markdown(r: Receipt, plots: dict[str, str]) -> list[str]:
    s = r.serving
    if not s:
        return []
    lines = [
        "",
        f"## Serving statistics ({s.get('phase', '')}; `vllm bench serve` names)",
        "",
        "| metric | mean | median | std | p90 | p99 |",
        "|---|---|---|---|---|---|",
    ]
    for m in ("ttft", "tpot", "itl", "e2el"):
        cells = [_num(s.get(f"{k}_{m}_ms")) for k in ("mean", "median", "std", "p90", "p99")]
        lines.append(f"| {m}_ms | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"- completed {s.get('completed')} requests in {_num(s.get('duration'))} s; "
        f"output_throughput {_num(s.get('output_throughput'))} tok/s; request_goodput "
        + (
            f"{s['request_goodput']:.4f} req/s ({s.get('good_requests')} of "
            f"{s.get('completed')} within {s.get('goodput_slo_ms')} ms)"
            if s.get("request_goodput") is not None
            else "- (no [qualify].slo)"
        ),
    ]
    if s.get("spec_decode_num_drafts"):
        rates = ", ".join(f"{x:.3f}" for x in s["spec_decode_per_position_acceptance_rates"])
        lines.append(
            f"- spec decode: acceptance rate {s['spec_decode_acceptance_rate']:.2f}%, "
            f"acceptance length {s['spec_decode_acceptance_length']:.3f}, "
            f"per-position acceptance [{rates}]"
        )
    src = r.summary.get("ms_per_pass_source")
    if src:
        lines.append(f"- ms per forward pass from: {src}")
    if "latency" in plots:
        lines += ["", f"![latency distributions]({plots['latency']})"]
    return lines


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
    if r.fidelity is not None and r.fidelity.kld:
        import math

        fig, ax = plt.subplots(figsize=(6, 3.5))
        logs = [math.log10(max(x, 1e-16)) for x in r.fidelity.kld]
        ax.hist(logs, bins=40, color="#1565c0")
        ax.axvline(math.log10(max(r.fidelity.mean_kld, 1e-16)), color="#000", label="mean")
        for g in r.gates:
            if g.name.startswith("fidelity mean KLD") and g.threshold.startswith("<"):
                limit = float(g.threshold.lstrip("<= "))
                if limit > 0:
                    ax.axvline(math.log10(limit), color="#c62828", ls="--", label="gate")
        ax.legend()
        ax.set_xlabel("log10 KLD per position (nats; 1e-16 floor)")
        ax.set_ylabel("positions")
        ax.set_title(f"fidelity: {r.fidelity.method}, {r.fidelity.positions} positions")
        fig.tight_layout()
        fig.savefig(out / "fidelity_kld.png", dpi=100)
        plt.close(fig)
        made["fidelity"] = "fidelity_kld.png"
    if r.serving.get("completed"):
        s = r.serving
        series = {
            "ttft": [x * 1000 for x in s.get("ttfts", [])],
            "itl": [x * 1000 for xs in s.get("itls", []) for x in xs],
            "e2el": [x * 1000 for x in s.get("latencies", [])],
        }
        series = {k: v for k, v in series.items() if v}
        fig, axes = plt.subplots(1, len(series), figsize=(3.2 * len(series), 3.2))
        for ax, (name, values) in zip(
            axes if len(series) > 1 else [axes], series.items(), strict=True
        ):
            ax.hist(values, bins=30, color="#2e7d32")
            ax.set_xlabel(f"{name} (ms)")
            ax.set_title(f"{name}: n={len(values)}")
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=100)
        plt.close(fig)
        made["latency"] = "latency.png"
    return made


def write_outputs(receipt: Receipt, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plots = render_plots(receipt, out)
    if receipt.fidelity is not None:
        kld = receipt.fidelity.kld
        for name, data in receipt.files().items():  # fidelity_kld.f64, fidelity_flags.u8
            atomic_write_bytes(out / name, data)
        from pinwheel.serve.kld import canonical_text  # numpy: fidelity ran, so it is there

        atomic_write_bytes(out / "fidelity_kld.txt", canonical_text(kld))
    atomic_write_text(out / "receipt.json", receipt.to_json())
    atomic_write_text(out / "report.md", render_markdown(receipt, plots))

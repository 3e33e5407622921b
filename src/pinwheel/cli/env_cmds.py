"""`pinwheel env`: every environment variable pinwheel reads, its flag, value and source.

The table is :data:`pinwheel.options.VARIABLES`; this module only prints it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from pinwheel import options
from pinwheel.cli import Context, command


def cmd_env(ctx: Context, args: argparse.Namespace) -> int:
    flags = {
        var.name: getattr(args, options.dest(var), None)
        for var in options.VARIABLES
        if options.GLOBAL in var.commands
    }
    rows = options.resolve(os.environ, flags)
    payload: dict[str, Any] = {
        "variables": [r.to_json() for r in rows],
        "pass_through": list(options.PASS_THROUGH),
        "pass_through_prefixes": list(options.PASS_THROUGH_PREFIXES),
    }
    width = max(len(r.var.name) for r in rows)
    lines = []
    for r in rows:
        flag = f" ({r.var.flag})" if r.var.flag else ""
        shown = "" if r.value is None else f" = {r.value}"
        lines.append(f"{r.var.name:<{width}}  {r.source:<11}{shown}{flag}")
        lines.append(f"{'':<{width}}  {r.var.meaning}; read by {r.var.read_by}")
    lines.append(
        "children also inherit: "
        + ", ".join(options.PASS_THROUGH)
        + " and "
        + ", ".join(p + "*" for p in options.PASS_THROUGH_PREFIXES)
    )
    ctx.emit(payload, "\n".join(lines))
    return 0


def register(sub: Any) -> None:
    command(
        sub,
        "env",
        "the environment variables pinwheel reads: flag, value and where it came from",
        cmd_env,
    )

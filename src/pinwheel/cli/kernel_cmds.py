"""`pinwheel toolchain` (find or provision CUDA 12.x) and `pinwheel kernels` (kernel wheels)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.markup import escape

from pinwheel.build.toolchain import BuildConfig, Toolkit, resolve_toolkit
from pinwheel.cli import Context, command
from pinwheel.errors import ManifestError


def add_kernel_commands(sub: Any) -> None:
    t = command(sub, "toolchain", "show the CUDA toolkit [build] needs; provision it if absent",
                cmd_toolchain)  # fmt: skip
    t.add_argument("--no-provision", action="store_true",
                   help="only look for an installed toolkit; fail if none fits")  # fmt: skip

    k = command(sub, "kernels", "build the [[kernel]] packages into wheels", cmd_kernels)
    k.add_argument("--name", action="append", metavar="NAME", help="build only NAME (repeatable)")
    k.add_argument("--all", action="store_true", help="also the kernels marked default = false")
    k.add_argument("--out", type=Path, default=None, help="wheel directory (default: wheels/)")
    k.add_argument(
        "--twice", action="store_true", help="build twice; fail unless the wheels are identical"
    )
    k.add_argument(
        "--source-date-epoch", type=int, default=None,
        help="timestamp for the wheels (default: date of each kernel's source)",
    )  # fmt: skip
    k.add_argument("--no-provision", action="store_true", help="do not provision a toolkit")


def _config(ctx: Context) -> BuildConfig:
    manifest = ctx.manifest()
    config: BuildConfig = manifest.require("build")
    return config


def _toolkit(ctx: Context, config: BuildConfig, provision: bool) -> tuple[Toolkit, float]:
    started = time.monotonic()
    with ctx.console.status(f"resolving CUDA {config.cuda} for {', '.join(config.arches)}"):
        toolkit = resolve_toolkit(config, ctx.cache, provision=provision)
    return toolkit, time.monotonic() - started


def cmd_toolchain(ctx: Context, args: argparse.Namespace) -> int:
    config = _config(ctx)
    toolkit, seconds = _toolkit(ctx, config, not args.no_provision)
    payload = {
        "root": str(toolkit.root),
        "nvcc": str(toolkit.nvcc),
        "version": toolkit.version,
        "arches": list(toolkit.arches),
        "source": toolkit.source,
        "seconds": round(seconds, 2),
        "cmake_architectures": config.cmake_architectures,
        "torch_arch_list": config.torch_arch_list,
    }
    human = (
        f"CUDA {toolkit.version} ({toolkit.source}) at {toolkit.root}\n"
        f"compiles {', '.join('sm_' + a.replace('.', '') for a in toolkit.arches)} "
        f"(probed in {seconds:.1f} s)\n"
        f"use it: export CUDA_HOME={toolkit.root} PATH={toolkit.root / 'bin'}:$PATH"
    )
    ctx.emit(payload, human)
    return 0


def build_kernel_wheels(
    ctx: Context,
    out: Path,
    *,
    names: list[str] | None = None,
    all_: bool = False,
    twice: bool = False,
    source_date_epoch: int | None = None,
    provision: bool = True,
) -> tuple[Any, list[tuple[Any, float | None]]]:
    """Build the selected [[kernel]] wheels into ``out``; shared by `kernels` and `build`."""
    from pinwheel.build.kernels import BuildOptions, build_kernel, build_twice, select

    manifest = ctx.manifest()
    config = _config(ctx)
    specs = select(manifest.kernels, names, all_=all_)
    if not specs:
        raise ManifestError(
            "no [[kernel]] to build",
            where=manifest.path.name,
            next="add a [[kernel]] table, or pass --all for the non-default ones",
        )
    toolkit, _ = _toolkit(ctx, config, provision)

    def log(msg: str) -> None:
        if not ctx.json:
            ctx.console.print(escape(msg), highlight=False)

    opts = BuildOptions(
        cache=ctx.cache,
        out=out,
        mirrors=ctx.mirrors,
        offline=ctx.offline,
        source_date_epoch=source_date_epoch,
        log=log,
    )
    results: list[tuple[Any, float | None]] = []
    for spec in specs:
        if twice:
            first, second = build_twice(spec, config, toolkit, opts)
            results.append((second, first.seconds))
        else:
            results.append((build_kernel(spec, config, toolkit, opts), None))
    return toolkit, results


def cmd_kernels(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.build.kernels import write_wheel_sums

    out = (args.out or ctx.manifest().root / "wheels").absolute()
    toolkit, results = build_kernel_wheels(
        ctx,
        out,
        names=args.name,
        all_=args.all,
        twice=args.twice,
        source_date_epoch=args.source_date_epoch,
        provision=not args.no_provision,
    )
    sums = write_wheel_sums(out)
    payload: dict[str, Any] = {
        "toolkit": toolkit.facts(),
        "wheels": [
            {
                "name": w.name,
                "wheel": w.wheel.name,
                "sha256": w.sha256,
                "seconds": round(w.seconds, 1),
                "first_build_seconds": None if cold is None else round(cold, 1),
                "origin": w.origin,
                "tree": w.tree,
                "source_date_epoch": w.source_date_epoch,
                "reproduced": args.twice,
            }
            for w, cold in results
        ],
        "sha256sums": str(sums),
    }
    human = "\n".join(
        f"{w.sha256}  {w.wheel.name}  ({w.seconds:.1f} s"
        + (f", first build {cold:.1f} s, identical" if cold is not None else "")
        + ")"
        for w, cold in results
    )
    ctx.emit(payload, human + f"\nwrote {sums}")
    return 0

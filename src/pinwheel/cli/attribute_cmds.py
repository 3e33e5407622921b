"""`pinwheel attribute`: what each step of the stack does, measured on this box."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pinwheel import options
from pinwheel.cli import Context, command
from pinwheel.errors import UsageError


def register(sub: Any) -> None:
    p = command(
        sub,
        "attribute",
        "per-step attribution: replay, build and serve the stack with and without each "
        "step, in a balanced order; Δ ms/pass, acceptance, KLD and needles, t intervals over "
        "server starts, Holm over steps",
        run_attribute,
    )
    p.add_argument(
        "--step",
        type=int,
        action="append",
        default=None,
        metavar="N",
        help="attribute step N only (repeatable; default: every step)",
    )
    p.add_argument(
        "--prefixes",
        action="store_true",
        help="compare the first N steps with the first N-1 (default: the full stack with and "
        "without each step)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="directory for attribution.json/.md/.png, the variants' wheels, venvs and server logs",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds; each starts every variant once, in a balanced order, so a multiple of "
        "the number of variants (default: the smallest such number >= 4)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=4,
        help="greedy decodes per serving, [qualify].max_tokens each (default 4)",
    )
    options.add_flag(p, "<PREFIX>_PROFILE")
    options.add_flag(p, "<[model] var>", metavar="DIR")
    p.add_argument("--installer", choices=("auto", "uv", "pip"), default="auto")
    p.add_argument("--torch-backend", default=None, help="uv's --torch-backend for the venvs")
    p.add_argument("--no-deps", action="store_true", help="install each variant's wheels only")
    p.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="interval level; verdicts at 1 - this, family-wise over the steps (default 0.95)",
    )
    p.add_argument(
        "--min-effect-ms",
        type=float,
        default=0.0,
        help="also call a |Δ ms/pass| below this within noise (default 0: the CI alone decides)",
    )
    p.add_argument("--no-needles", action="store_true", help="skip the profile's needles")
    p.add_argument("--no-kld", action="store_true", help="skip the pinned panel's KLD")
    p.add_argument("--allow-drift", action="store_true", help="replay pinned heads that moved")
    p.add_argument("--no-cache", action="store_true", help="build without the compiler cache")
    k = p.add_argument_group(
        "kernel steps", "attribute a [[kernel]]'s [[kernel.step]]s instead of the engine's"
    )
    k.add_argument("--kernel", default=None, metavar="NAME", help="the [[kernel]] to attribute")
    k.add_argument(
        "--timing",
        type=Path,
        default=None,
        metavar="PROGRAM",
        help="the program that times the kernel: run as PYTHON PROGRAM --samples S --iters I "
        "with the variant's directory as PYTHONPATH; prints "
        'RESULT {"times": {case: [ms, ...]}}',
    )
    options.add_flag(k, "PINWHEEL_TORCH_PYTHON")
    k.add_argument("--iters", type=int, default=50, help="calls per timed sample (default 50)")
    options.add_flag(p, "PINWHEEL_WHEELHOUSE", metavar="DIR")


def run_attribute(ctx: Context, args: argparse.Namespace) -> int:
    if args.kernel is not None:
        return run_kernel_attribute(ctx, args)
    for flag, value in (("--timing", args.timing), ("--python", args.python)):
        if value is not None:
            raise UsageError(
                f"{flag} times a kernel: it needs --kernel NAME",
                where=flag,
                next="pass --kernel NAME with it, or leave it out",
            )
    from pinwheel.cli.replay_cmds import build_request
    from pinwheel.flows.attribute import AttributeRequest, attribute
    from pinwheel.flows.attribute_report import human_lines, to_json
    from pinwheel.source.result import ReplayRequest
    from pinwheel.source.variants import LEAVE_ONE_OUT, PREFIXES, VariantRequest

    manifest = ctx.manifest()
    config = manifest.require("serve")
    model = ctx.option(args, "<[model] var>", env_name=config.model_var).chosen
    if not model:
        raise UsageError(
            "no model directory to serve the variants with",
            where="--model / $" + config.model_var,
            next=f"pass --model DIR or export {config.model_var}=DIR",
        )
    request = AttributeRequest(
        variants=VariantRequest(
            ReplayRequest(manifest, ctx.cache, ctx.mirrors, ctx.offline, args.allow_drift),
            steps=tuple(args.step) if args.step else None,
            mode=PREFIXES if args.prefixes else LEAVE_ONE_OUT,
        ),
        build=build_request(ctx, args, Path(args.out), kernels=()),
        out=Path(args.out).absolute(),
        model=str(model),
        environ=ctx.environ,
        profile=ctx.option(args, "<PREFIX>_PROFILE", env_name=f"{config.env_prefix}_PROFILE",
                           manifest=config.default_profile).chosen,
        rounds=args.rounds,
        samples=args.samples,
        installer=args.installer,
        torch_backend=args.torch_backend,
        no_deps=args.no_deps,
        confidence=args.confidence,
        min_effect_ms=args.min_effect_ms,
        needles=not args.no_needles,
        kld=not args.no_kld,
    )
    outcome = attribute(request, ctx.reporter)
    ctx.emit(to_json(outcome), "\n".join(human_lines(outcome)))
    return 0


def run_kernel_attribute(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.cli.replay_cmds import build_request
    from pinwheel.flows.kernel_attribute import KernelAttributeRequest, attribute_kernel
    from pinwheel.flows.kernel_report import human_lines, to_json

    chosen = ctx.option(args, "PINWHEEL_TORCH_PYTHON")
    python = Path(chosen.value) if chosen.source == "flag" and chosen.value else None
    python = python or ctx.host.torch_python  # the variable, checked to be absolute
    if python is None:
        raise UsageError(
            "no Python to run the timing program with",
            where="--python / $PINWHEEL_TORCH_PYTHON",
            next="pass --python PATH (a Python with CUDA torch) or export PINWHEEL_TORCH_PYTHON",
        )
    if args.timing is None:
        raise UsageError(
            "--kernel needs --timing PROGRAM: what to time in each variant",
            where="--timing",
            next="pass e.g. --timing bench/kernel_times_exllamav3.py",
        )
    if args.prefixes:
        raise UsageError(
            "--prefixes is for the engine's steps; a kernel's steps are left out one at a time",
            where="--prefixes",
            next="leave --prefixes out with --kernel",
        )
    request = KernelAttributeRequest(
        build=build_request(ctx, args, Path(args.out), reach=True, kernels=(args.kernel,)),
        kernel=args.kernel,
        out=Path(args.out).absolute(),
        timing=args.timing.absolute(),
        python=Path(python).absolute(),
        environ=ctx.environ,
        steps=tuple(args.step) if args.step else None,
        rounds=args.rounds,
        samples=args.samples,
        iters=args.iters,
        confidence=args.confidence,
        min_effect_ms=args.min_effect_ms,
    )
    outcome = attribute_kernel(request, ctx.reporter)
    ctx.emit(to_json(outcome), "\n".join(human_lines(outcome)))
    return 0

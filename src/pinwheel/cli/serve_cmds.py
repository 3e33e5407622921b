"""`pinwheel preflight`, `pinwheel serve`, `pinwheel qualify`."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel import options, validate
from pinwheel.cli import Context, command
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.fsutil import atomic_write_text
from pinwheel.printable import shown_cmd

if TYPE_CHECKING:
    from pinwheel.manifest.serve import ServeConfig, ServeProfile


def register(sub: Any) -> None:
    p = command(
        sub,
        "preflight",
        "check GPUs, topology, toolchain and engine against [serve]",
        run_preflight,
    )
    _profile_options(p)
    p.add_argument(
        "--selftest",
        action="store_true",
        help="also copy a patterned buffer between every GPU pair and check an fp16 GEMM",
    )
    p.add_argument("--nvidia-smi", default="nvidia-smi", help=argparse.SUPPRESS)
    p.add_argument("--container-runtime", default=None, help=argparse.SUPPRESS)

    p = command(
        sub,
        "serve",
        "start the engine with the [serve] profile (the recipe, as a command)",
        run_serve,
    )
    _profile_options(p)
    options.add_flag(p, "HOST")
    options.add_flag(p, "PORT")
    p.add_argument("--print-recipe", action="store_true", help="print the generated shell recipe")
    p.add_argument(
        "--write-recipe", action="store_true", help="rewrite [serve].recipe from the manifest"
    )
    p.add_argument("--check-recipe", action="store_true", help="fail if [serve].recipe differs")

    p = command(
        sub,
        "qualify",
        "measure a server against [qualify] gates; writes receipt, report, plots "
        "(`qualify teacher`: capture the fidelity teacher once; `qualify tp`: a built "
        "component's tensor-parallel primitives against torch.distributed)",
        run_qualify,
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("teacher", "tp", "verify-receipt", "cold-starts"),
        help="teacher: capture reference log-probabilities on the fidelity panel into --out "
        "(from --url, a reference server, or transformers with --model DIR --python PY); "
        "tp: run the exllamav3 wheel's pg_* primitives on --devices (one process per GPU) "
        "and compare each result with torch.distributed's; "
        "verify-receipt RECEIPT: recompute a fidelity receipt's hashes (match/mismatch); "
        "cold-starts: start the server [qualify.fidelity].cold_starts times, score the panel "
        "each time and gate one tokenwise hash across them",
    )
    p.add_argument("receipt", nargs="?", help="verify-receipt: the receipt.json to check")
    p.add_argument("--teacher", default=None, help="verify-receipt: the teacher file (full rows)")
    p.add_argument(
        "--served",
        default=None,
        help="verify-receipt: the served rows (`qualify teacher --url URL --top-k -1`)",
    )
    p.add_argument("--wheel", default=None, help="tp: the exllamav3 wheel `pinwheel kernels` built")
    _profile_options(p)
    p.add_argument(
        "--panel", default=None, help="teacher: panel JSON (default: [qualify.fidelity].panel)"
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=128,
        help="teacher: log-probabilities kept per position (-1: full rows, large)",
    )
    p.add_argument("--dtype", default="float32", help="teacher: transformers dtype")
    p.add_argument("--url", default=None, help="attach to a running server instead of starting one")
    p.add_argument("--log", default=None, help="the attached server's log (for start-up markers)")
    p.add_argument("--out", default=None, help="directory for receipt.json, report.md and plots")
    p.add_argument(
        "--provenance",
        default=None,
        help="the build's provenance.json (default: wheels/provenance.json if present)",
    )
    p.add_argument(
        "--port", type=int, default=None, help="port for a server qualify starts (default: free)"
    )


def _profile_options(p: argparse.ArgumentParser) -> None:
    for name in ("<PREFIX>_PROFILE", "<[model] var>", "PYTHON", "CUDA_VISIBLE_DEVICES"):
        options.add_flag(p, name)


def _serve_config(ctx: Context) -> ServeConfig:
    m = ctx.manifest()
    config = m.require("serve")
    return config


@dataclass(frozen=True)
class ServeOptions:
    """Serve/preflight/qualify options, resolved once: flags before environment."""

    config: ServeConfig
    profile: ServeProfile
    model: Path | None
    python: str
    python_from: str  # "--python" | "$PYTHON" | "default"
    devices: str | None  # "0,1"


def _profile_name(ctx: Context, args: argparse.Namespace, config: ServeConfig) -> str | None:
    """--profile, else $<PREFIX>_PROFILE, else [serve] default (None: the first profile)."""
    return ctx.option(args, "<PREFIX>_PROFILE", env_name=f"{config.env_prefix}_PROFILE",
                      manifest=config.default_profile).chosen  # fmt: skip


def _resolve(ctx: Context, args: argparse.Namespace) -> ServeOptions:
    """Options resolved once, flags before environment (:meth:`Context.option`)."""
    config = _serve_config(ctx)
    python = ctx.option(args, "PYTHON")
    profile = config.profile(_profile_name(ctx, args, config))
    model = ctx.option(args, "<[model] var>", env_name=config.model_var).chosen
    devices = ctx.option(args, "CUDA_VISIBLE_DEVICES").chosen  # None: the profile's
    if devices:  # it reaches a container runtime's argv or a child's environment
        _checked(validate.devices, devices, "--devices / $CUDA_VISIBLE_DEVICES")
    return ServeOptions(
        config=config,
        profile=profile,
        model=Path(model).absolute() if model else None,
        python=str(python.value),
        python_from={"flag": "--python", "environment": "$PYTHON"}.get(python.source, "default"),
        devices=devices,
    )


def python_line(r: ServeOptions) -> str:
    """Which Python the engine checks run in, and how to point them at the installed venv."""
    image = r.config.engine.image
    if image is not None:
        return f"engine: the image {image.ref} (run by {image.runtime}; --python is not used)"
    found = shutil.which(r.python) or r.python
    return (
        f"engine python: {found} (from {r.python_from}); to test the venv `pinwheel install` "
        "made, pass --python VENV/bin/python (or set PYTHON)"
    )


# --------------------------------------------------------------------------- preflight


def _pinned_python(ctx: Context) -> str | None:
    """The manifest's `[build] python` (the wheels' Python), when it has a [build] table."""
    build = getattr(ctx.manifest(), "build", None)
    return getattr(build, "python", None)


def run_preflight(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.serve.preflight import FAIL, Options, PreflightFailed, device_indices, preflight

    r = _resolve(ctx, args)
    start = time.monotonic()
    opts = Options(
        profile=r.profile,
        config=r.config,
        python=r.python,
        model=r.model,
        devices=device_indices(r.profile, r.devices),
        selftest=args.selftest,
        nvidia_smi=args.nvidia_smi,
        environ=ctx.environ,
        cuda_home=ctx.host.cuda_home,
        search_path=ctx.host.path,
        container_runtime=args.container_runtime,
        torch_python=ctx.option(args, "PYTHON").chosen,
        cache=ctx.cache,
        pinned_python=_pinned_python(ctx),
    )
    checks = preflight(opts)
    took = time.monotonic() - start
    failed = [c for c in checks if c.status == FAIL]
    ctx.emit(
        {
            "profile": opts.profile.name,
            "python": shutil.which(r.python) or r.python,
            "seconds": round(took, 3),
            "checks": [asdict(c) for c in checks],
            "known_issues": list(opts.config.known_issues),
        }
    )
    if not ctx.json:
        marks = {"ok": "ok  ", "warn": "warn", "fail": "FAIL", "skip": "skip"}
        styles = {"ok": "green", "warn": "yellow", "fail": "red", "skip": None}
        ctx.say(f"preflight for profile {opts.profile.name} ({took:.2f} s)", style="bold")
        ctx.say(f"  {python_line(r)}")
        for c in checks:
            # The detail is literal text (it may hold [brackets]); only the mark is coloured.
            ctx.say(f"  {marks[c.status]} {c.name}: {c.detail}", style=styles[c.status])
            if c.next and c.status in ("fail", "warn"):
                ctx.say(f"        next: {c.next}")
        for issue in opts.config.known_issues:
            ctx.say(f"  note (the card): {issue}")
    if failed:
        raise PreflightFailed(
            f"{len(failed)} preflight check(s) failed: " + ", ".join(c.name for c in failed),
            where=f"profile '{opts.profile.name}'",
            next=failed[0].next,
        )
    return 0


# --------------------------------------------------------------------------- serve


def _shown(path: Path) -> str:
    """A path as the user would type it from here: relative to the current directory when
    it is below it, else absolute."""
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path.absolute())


def recipe_diff(committed: str | None, wanted: str, name: str, limit: int = 60) -> str:
    """A unified diff from the committed recipe to the one [serve] generates."""
    import difflib

    lines = list(
        difflib.unified_diff(
            (committed or "").splitlines(keepends=True),
            wanted.splitlines(keepends=True),
            fromfile=f"{name} (committed)",
            tofile=f"{name} (from [serve])",
        )
    )
    shown = "".join(lines[:limit]).rstrip("\n")
    return shown + (f"\n... {len(lines) - limit} more diff line(s)" if len(lines) > limit else "")


def _no_vllm(python: str) -> str | None:
    """Why ``python`` cannot run vLLM's server module, or None when it can."""
    from pinwheel import runner

    exe = shutil.which(python)
    if exe is None:
        return "no such interpreter"
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') else 3)"
    try:
        done = runner.run(
            runner.Command((exe, "-c", probe), what="probe for vllm", timeout=60, check=False)
        )
    except PinwheelError as exc:  # cannot start it, or it hangs
        return exc.what
    if done.returncode == 3:
        return "no module named vllm"
    if not done.ok:
        return done.tail()[-1] if done.tail() else f"exit {done.returncode}"
    return None


def run_serve(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel import confine  # here: the other commands never load it
    from pinwheel.serve.recipe import launch, render_recipe

    config = _serve_config(ctx)
    m = ctx.manifest()
    text = render_recipe(config, m.path.name)
    # The recipe stays in the manifest's folder, whatever symlinked folder lies on the way.
    recipe = confine.inside(m.root, config.recipe, what="serve recipe")
    if args.print_recipe:
        if ctx.json:  # one JSON document, the script inside it
            ctx.emit({"recipe": str(recipe), "text": text})
        else:
            sys.stdout.write(text)
        return 0
    if args.write_recipe:
        confine.write_text(m.root, recipe, text, mode=0o755)
        ctx.emit({"recipe": str(recipe)}, f"wrote {_shown(recipe)}")
        return 0
    if args.check_recipe:
        committed = recipe.read_text() if recipe.is_file() else None
        if committed != text:
            diff = recipe_diff(committed, text, _shown(recipe))
            raise UsageError(
                f"{_shown(recipe)} differs from [serve] in {m.path.name}"
                + (" (it does not exist)" if committed is None else f":\n{diff}"),
                where=config.recipe,
                next="run `pinwheel serve --write-recipe` and commit it",
            )
        ctx.emit({"recipe": str(recipe), "ok": True}, f"{_shown(recipe)} matches [serve]")
        return 0
    r = _resolve(ctx, args)
    # An image engine brings its own vLLM: the host's Python is never asked for one.
    # The command is right; the machine lacks a part: exit 1, not a usage error.
    if config.engine.image is None and (why := _no_vllm(r.python)) is not None:
        raise PinwheelError(
            f"vLLM cannot be imported by the engine python {r.python} ({why})",
            where=f"pinwheel serve (python from {r.python_from})",
            next="install the fetched release into a venv (`pinwheel install fetched-release "
            "--venv engine-venv`) and pass --python engine-venv/bin/python (or set PYTHON)",
        )
    if r.devices:  # unique ASCII indices only: they reach CUDA_VISIBLE_DEVICES or --device
        _checked(validate.gpu_indices, r.devices, "--devices / $CUDA_VISIBLE_DEVICES")
    if r.model is None:
        raise UsageError(
            "no model directory",
            where="--model / $" + config.model_var,
            next=f"pass --model DIR or export {config.model_var}=DIR (`pinwheel model` fetches it)",
        )
    if config.engine.image is not None:  # it reaches the runtime's -v SRC:DST:ro
        _checked(validate.host_path, str(r.model), "--model / $" + config.model_var)
    run = launch(
        config,
        r.profile,
        model=str(r.model),
        python=r.python,
        host=_checked(
            validate.host, ctx.option(args, "HOST").value, "--host / $HOST"
        ).strip("[]"),
        port=_port(ctx, args, config.port),
        max_num_seqs=_seqs(ctx, config.seqs_var),
        devices=r.devices,
    )
    from pinwheel import runner

    runner.replace_process(
        runner.Command(
            tuple(run.argv),
            what="the server",
            env={**ctx.environ, **run.env},
            missing_hint="pass --python with the engine venv's python",
        ),
        ctx.reporter,
    )


def _checked(check: Any, value: Any, where: str) -> Any:
    """``check(value)``, or a usage error naming the flag or variable it came from."""
    try:
        return check(value)
    except ValueError as exc:
        raise UsageError(
            f"{exc}", where=where, next=f"fix {where.split(' / ')[0]} (or unset the variable)"
        ) from None


def _port(ctx: Context, args: argparse.Namespace, default: int | None = None) -> int:
    """--port, else $PORT, else the manifest's [serve] port (what the recipe publishes),
    else 8000 (vLLM's own default)."""
    port = ctx.option(args, "PORT", manifest=default)
    where = {"flag": "--port", "environment": "$PORT"}.get(port.source, "[serve] port")
    return int(_checked(validate.port, port.value, where))


def _seqs(ctx: Context, var: str) -> int | None:
    seqs = ctx.variable(var)
    if not seqs:
        return None
    return int(_checked(lambda v: validate.count(v, minimum=1, maximum=99999), seqs, f"${var}"))


# --------------------------------------------------------------------------- qualify


@contextlib.contextmanager
def _started_server(ctx: Context, args: argparse.Namespace, out: Path) -> Iterator[Any]:
    """Start the profile's server for qualification; stopped when the block ends."""
    from pinwheel.serve.recipe import launch
    from pinwheel.serve.supervise import free_port, started_server

    r = _resolve(ctx, args)
    config = r.config
    if r.model is None:
        raise UsageError(
            "no model directory to start a server with",
            where="--model / $" + config.model_var,
            next="pass --model DIR (or --url URL to attach to a running server)",
        )
    if config.engine.image is not None:  # it reaches the runtime's -v SRC:DST:ro
        _checked(validate.host_path, str(r.model), "--model / $" + config.model_var)
    port = _checked(validate.port, args.port, "--port") if args.port is not None else free_port()
    run = launch(
        config,
        r.profile,
        model=str(r.model),
        python=r.python,
        host="127.0.0.1",
        port=port,
        max_num_seqs=_seqs(ctx, config.seqs_var),
        devices=r.devices,
    )
    fid = ctx.manifest().require("qualify").fidelity
    if fid is not None:  # vLLM must be allowed to return the panel's prompt log-probabilities
        from dataclasses import replace

        from pinwheel.serve.capture import server_flags

        run = replace(run, argv=run.argv + server_flags(fid, r.profile.args))
        if fid.scorer == "in-process":  # exact KLD in the engine: the worker extension
            from pinwheel.serve.inprocess import engine_package, server_additions

            flags, env = server_additions(engine_package(out / "engine-ext"), ctx.host.pythonpath)
            run = replace(run, argv=run.argv + flags, env={**run.env, **env})
    url = f"http://127.0.0.1:{port}"
    with started_server(run, out, environ=ctx.environ, url=url, reporter=ctx.reporter) as target:
        yield target


def _teacher_model(ctx: Context, args: argparse.Namespace) -> str | None:
    """--model, else the [serve] model variable when the manifest has [serve]."""
    wanted = args.model is None and ctx.manifest_path.is_file()
    serve = ctx.manifest().serve if wanted else None
    name = serve.model_var if serve is not None else None
    return ctx.option(args, "<[model] var>", env_name=name).chosen


def run_teacher(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.serve.capture import TeacherRequest, capture_teacher
    from pinwheel.serve.panel import read_panel

    if args.panel:
        panel_path, pinned = Path(args.panel), None
    else:
        config = ctx.manifest().require("qualify")
        if config.fidelity is None or config.fidelity.panel is None:
            raise UsageError(
                "no panel: the manifest's [qualify.fidelity] pins none",
                where="--panel",
                next="pass --panel FILE, or pin [qualify.fidelity] panel = { file, sha256 }",
            )
        panel_path, pinned = config.fidelity.panel, config.fidelity.panel_sha256
    tokenize = None
    if args.url:
        from pinwheel.serve.client import Client

        client = Client(args.url)
        model = str(client.models()[0]["id"])

        def tokenize(text: str) -> list[int]:
            return client.tokenize(model, prompt=text)

    try:
        panel = read_panel(panel_path, pinned, tokenize)
    finally:
        if args.url:
            client.close()
    if args.top_k == 0 or args.top_k < -1:
        raise UsageError("--top-k must be positive, or -1 for full rows", where="--top-k")
    req = TeacherRequest(
        out=Path(args.out),
        panel=panel,
        top_k=args.top_k,
        url=args.url,
        python=ctx.option(args, "PYTHON").chosen if not args.url else None,
        model=_teacher_model(ctx, args) if not args.url else None,
        dtype=args.dtype,
    )
    if not req.url and not (req.python and req.model):
        raise UsageError(
            "no teacher to capture from",
            where="pinwheel qualify teacher",
            next="pass --url URL (a reference server) or --model DIR --python PY (transformers)",
        )
    ctx.reporter.info(
        f"  capturing {panel.positions} positions ({len(panel.windows)} windows) from "
        + (req.url or f"transformers ({req.dtype}) on {req.model}")
    )
    done = capture_teacher(req)
    ctx.emit(
        asdict(done),
        f"teacher {done.path}: {done.positions} positions, {done.stored}, {done.bytes} bytes\n"
        f"  sha256 {done.sha256}\n"
        f'  pin it: teacher = {{ file = "{done.path}", sha256 = "{done.sha256}" }}',
    )
    return 0


def run_cold_starts(ctx: Context, args: argparse.Namespace) -> int:
    """`pinwheel qualify cold-starts`: the panel scored on N fresh servers, one hash."""
    from pinwheel.errors import GateFailed
    from pinwheel.serve import coldstarts, fidelity, inprocess
    from pinwheel.serve.client import Client
    from pinwheel.serve.qualify import wait_healthy

    if args.url:
        raise UsageError(
            "cold starts need servers pinwheel starts itself",
            where="--url",
            next="drop --url; pass --model DIR and --python VENV_PY",
        )
    config = ctx.manifest().require("qualify")
    fid = config.fidelity
    if fid is None or fid.panel is None:
        raise UsageError(
            "no pinned panel: [qualify.fidelity] pins none",
            where="[qualify.fidelity]",
            next="pin panel and teacher, then run `pinwheel qualify cold-starts` again",
        )
    out = Path(args.out)
    measure_fn = inprocess.measure if fid.scorer == "in-process" else fidelity.measure

    def wait(target: Any) -> float:
        c = Client(target.url)
        try:
            return wait_healthy(c, target, config.health_timeout_s, reporter=ctx.reporter)
        finally:
            c.close()

    def measure(target: Any) -> Any:
        c = Client(target.url)
        try:
            return measure_fn(c, str(c.models()[0]["id"]), fid)
        finally:
            c.close()

    done = coldstarts.run(
        lambda i: _started_server(ctx, args, out / f"start-{i}"),
        measure,
        wait,
        coldstarts.Protocol.of(config, _resolve(ctx, args).profile.name),
        ctx.reporter,
    )
    atomic_write_text(out / "cold-starts.json", json.dumps(asdict(done), indent=2) + "\n")
    g = done.gate
    ctx.emit(
        asdict(done),
        "\n".join(
            f"start {r.start}: mean KLD {r.mean_kld!r} over {r.positions} ({r.scorer}), "
            f"kld_f64_sha256 {r.kld_f64_sha256}, kld_sha256 {r.kld_sha256}"
            for r in done.runs
        )
        + f"\nprotocol {done.protocol}: mean {done.mean_kld!r}, population stddev "
        f"{done.stddev!r}\n{g.name}: {g.status} ({g.measured})"
        + "".join(f"\n  card reference {k}: {v}" for k, v in done.reference.items()),
    )
    if not done.ok:
        raise GateFailed(
            f"{g.name}: {g.measured}",
            where=str(out / "cold-starts.json"),
            next="compare the runs' values in cold-starts.json (protocol "
            f"{done.protocol}: {g.threshold})",
        )
    return 0


def run_verify_receipt(ctx: Context, args: argparse.Namespace) -> int:
    """`pinwheel qualify verify-receipt RECEIPT`: recompute the fidelity hashes."""
    from pinwheel.errors import VerifyError
    from pinwheel.serve.verify import VerifyRequest, verify

    if not args.receipt:
        raise UsageError(
            "no receipt to verify",
            where="pinwheel qualify verify-receipt",
            next="pass the receipt.json: pinwheel qualify verify-receipt OUT/receipt.json",
        )
    done = verify(
        VerifyRequest(
            receipt=Path(args.receipt),
            teacher=Path(args.teacher) if args.teacher else None,
            served=Path(args.served) if args.served else None,
        )
    )
    ctx.emit(
        asdict(done) | {"ok": done.ok},
        "\n".join(f"{c.status:>8}  {c.name}: {c.detail}" for c in done.checks),
    )
    if not done.ok:
        bad = [c.name for c in done.checks if c.status == "mismatch"]
        raise VerifyError(
            "the receipt does not recompute: " + ", ".join(bad),
            where=args.receipt,
            next="the values or the rows were altered, or belong to another run",
        )
    return 0


def run_tp(ctx: Context, args: argparse.Namespace) -> int:
    """`pinwheel qualify tp`: pg_* primitives of a built exllamav3 against torch.distributed."""
    from pinwheel.errors import GateFailed
    from pinwheel.serve.preflight import FAIL
    from pinwheel.serve.tpcheck import TpRequest, run_tpcheck

    if not args.wheel:
        raise UsageError(
            "no wheel to check",
            where="pinwheel qualify tp",
            next="pass --wheel wheels/exllamav3-*.whl (`pinwheel kernels --name exllamav3`)",
        )
    text = ctx.option(args, "CUDA_VISIBLE_DEVICES").chosen
    if not text:
        raise UsageError(
            "no GPUs named", where="--devices", next="pass --devices 0,1 (or --devices 0)"
        )
    try:
        devices = validate.gpu_indices(text)
    except ValueError as exc:
        raise UsageError(
            f"{text[:80]!r} is not a list of GPU indices: {exc}",
            where="--devices",
            next="e.g. --devices 0,1 (unique ASCII-digit indices)",
        ) from None
    python = str(ctx.option(args, "PYTHON").value)
    out = Path(args.out)
    outcome = run_tpcheck(
        TpRequest(python=python, wheel=Path(args.wheel), devices=devices, environ=ctx.environ)
    )
    checks = outcome.checks()
    out.mkdir(parents=True, exist_ok=True)
    doc = {"wheel": str(args.wheel), "devices": list(devices), "outcome": asdict(outcome),
           "checks": [asdict(c) for c in checks]}  # fmt: skip
    atomic_write_text(out / "tp-primitives.json", json.dumps(doc, indent=2) + "\n")
    lines = [f"tp primitives of {args.wheel} on GPUs {text} ({outcome.device}):"]
    lines += [f"  {c.status:4} {c.name}: {c.detail}" for c in checks]
    ctx.emit(doc, "\n".join(lines))
    failed = [c for c in checks if c.status == FAIL]
    if failed:
        raise GateFailed(
            f"{len(failed)} primitive check(s) failed: " + ", ".join(c.name for c in failed),
            where=str(args.wheel),
            next=failed[0].next,
        )
    return 0


def _venv_of(python: str) -> Path | None:
    """The venv whose ``bin/python`` runs the engine (``pyvenv.cfg`` beside ``bin``), if any."""
    exe = shutil.which(python) or python
    venv = Path(exe).absolute().parent.parent
    return venv if (venv / "pyvenv.cfg").is_file() else None


def run_qualify(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.serve.qualify import Target, gate_failure, qualify

    if args.action == "verify-receipt":
        return run_verify_receipt(ctx, args)
    if not args.out:
        raise UsageError(
            "the following arguments are required: --out",
            where="pinwheel qualify",
            next="pass --out DIR",
        )
    if args.action == "teacher":
        return run_teacher(ctx, args)
    if args.action == "cold-starts":
        return run_cold_starts(ctx, args)
    if args.action == "tp":
        return run_tp(ctx, args)
    m = ctx.manifest()
    out = Path(args.out)
    config = _serve_config(ctx)
    profile = config.profile(_profile_name(ctx, args, config)).name
    prov = Path(args.provenance) if args.provenance else m.root / "wheels" / "provenance.json"
    if args.provenance and not prov.is_file():
        raise UsageError(
            f"no provenance file at {prov}",
            where="--provenance",
            next="pass the provenance.json of the build being qualified",
        )

    def progress(msg: str) -> None:
        ctx.reporter.info(f"  {msg}")

    if args.url:
        target = Target(url=args.url, log=Path(args.log) if args.log else None)
        server: Any = contextlib.nullcontext(target)
        progress(
            f"attached to {args.url}: the engine python is whatever started that server; "
            "to qualify the venv `pinwheel install` made, start it with VENV/bin/python "
            "(or drop --url and pass --python VENV/bin/python)"
        )
    else:
        progress(python_line(_resolve(ctx, args)))
        server = _started_server(ctx, args, out)
    with server as target:
        receipt = qualify(m, profile, target, out, provenance=prov, reporter=ctx.reporter)
    if not args.url and (venv := _venv_of(_resolve(ctx, args).python)) is not None:
        lock_cmd = shown_cmd("pinwheel", "runtime-lock", venv, "--release", "RELEASE_DIR",
                             "--out", out / "pylock.toml")  # fmt: skip
        progress(f"the runtime lock of the environment this ran in: {lock_cmd}")
    ctx.emit(
        {"verdict": receipt.verdict, "out": str(out)},
        f"qualification {receipt.verdict}: {out / 'report.md'}",
    )
    failure = gate_failure(receipt, out)
    if failure is not None:
        raise failure  # the outcome is printed; the exit code says a gate failed
    return 0

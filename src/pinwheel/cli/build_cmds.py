"""Build-stage commands: kernels and toolchain (``register_kernels``), check, verify-build
and wheeldiff (``register_check``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pinwheel.cli import Context, command, refuse_url
from pinwheel.errors import EXIT_MISMATCH, EXIT_VERIFY
from pinwheel.printable import shown, shown_cmd


def register(sub: Any) -> None:
    register_kernels(sub)
    register_check(sub)


def register_kernels(sub: Any) -> None:
    """`pinwheel kernels`, `pinwheel toolchain` (their code: cli/kernel_cmds.py)."""
    from pinwheel.cli.kernel_cmds import add_kernel_commands

    add_kernel_commands(sub)


def register_check(sub: Any) -> None:
    p = command(sub, "check", "artifact check: SASS per arch, RPATH, zip safety, RECORD", _check)
    p.add_argument("wheels", nargs="+", metavar="WHEEL")  # paths: a URL is refused by name
    p.add_argument(
        "--arch",
        action="append",
        default=[],
        metavar="ARCH",
        help="required arch (7.0, 7.0+PTX, sm_70; repeatable); default: [build] arches",
    )
    p.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="PATTERN",
        help="required member glob ([dist:]pattern); default: [build] required_members",
    )
    p.add_argument(
        "--build-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="an RPATH into DIR fails the check (repeatable)",
    )
    p.add_argument(
        "--allow-no-cuda", action="store_true", help="a wheel with no CUDA shared object passes"
    )
    p.add_argument("--cuobjdump", metavar="PATH", help="cuobjdump to cross-check with")
    p.add_argument(
        "--max-glibc",
        metavar="2.X",
        help="a wheel needing a newer glibc fails (default: [build] max_glibc)",
    )
    p.add_argument(
        "--no-tools",
        action="store_true",
        help="use neither cuobjdump nor auditwheel, only the built-in readers",
    )

    v = command(
        sub, "verify-build", "rebuild from the manifest and compare wheel sha256s", _verify_build
    )
    v.add_argument(
        "--wheels",
        type=Path,
        default=Path("wheels"),
        help="the build to verify (holds provenance.json; default: wheels/)",
    )
    v.add_argument(
        "--source",
        type=Path,
        help="rebuild from this exported tree instead of replaying the manifest",
    )
    v.add_argument("--keep", type=Path, help="keep the rebuilt wheels in this directory")
    v.add_argument(
        "--with-cache",
        action="store_true",
        help="rebuild through the compiler cache (default: none, so the rebuild is cold)",
    )


    d = command(
        sub, "wheeldiff", "name each member two wheels differ in (ELF: first symbol or section)",
        _wheeldiff,
    )  # fmt: skip
    d.add_argument("first", type=Path, metavar="A.whl")
    d.add_argument("second", type=Path, metavar="B.whl")


def _wheeldiff(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.errors import VerifyError
    from pinwheel.wheels.wheeldiff import UnreadableWheel, diff_members

    try:
        diffs = diff_members(args.first, args.second)
    except UnreadableWheel as exc:
        raise VerifyError(
            str(exc), where=f"{args.first} / {args.second}", next="pass two wheel files"
        ) from None
    lines = [d.line() for d in diffs] or ["same: every member has the same bytes, time and mode"]
    doc = {"same": not diffs, "members": [d.to_json() for d in diffs]}
    ctx.emit(doc, "\n".join(shown(line) for line in lines))
    return 0 if not diffs else EXIT_MISMATCH


def _wheels_exist(ctx: Context, wheels: list[str]) -> None:
    """A wheel path that is not there is a usage error that says where the build's wheels
    are: from a subdirectory, ``wheels/*.whl`` reaches the shell unexpanded, while the
    build wrote them beside the manifest."""
    from pinwheel.errors import UsageError

    for p in wheels:
        if Path(p).is_file():
            continue
        beside = ctx.manifest_path.absolute().parent / "wheels"
        found = sorted(beside.glob("*.whl")) if beside.is_dir() else []
        if found and Path.cwd().resolve() != beside.parent.resolve():
            raise UsageError(
                f"no such wheel: {p} (relative to {Path.cwd()})",
                next="the build's wheels are beside the manifest: "
                f"`{shown_cmd('pinwheel', 'check', beside)}/*.whl`",
            )
        raise UsageError(
            f"no such wheel: {p}",
            next="build first (`tools/replay build`), or pass the WHEEL files to check",
        )


def _check(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.cudaarch import parse_arches
    from pinwheel.wheels.check import CheckSpec, check_wheels, find_tools, spec_from_build

    for given in args.wheels:
        refuse_url(given, reads="wheel files on this machine", dest="fetched-release",
                   then=("check",), glob="fetched-release/*.whl",
                   source=given.rsplit("/", 1)[0] + "/")  # its release folder  # fmt: skip
    args.wheels = [Path(w) for w in args.wheels]
    tools: dict[str, Any] = {"cuobjdump": None, "auditwheel": None}
    if not args.no_tools:
        found_cuobjdump, found_auditwheel = find_tools()
        tools = {"cuobjdump": args.cuobjdump or found_cuobjdump, "auditwheel": found_auditwheel}
    overrides: dict[str, Any] = {
        "build_dirs": tuple(str(Path(d).absolute()) for d in args.build_dir),
        "require_cuda": not args.allow_no_cuda,
        **tools,
    }
    if args.max_glibc is not None:
        overrides["max_glibc"] = _glibc_flag(args.max_glibc)
    if args.arch:
        spec = CheckSpec(
            arches=parse_arches(args.arch), required_members=tuple(args.require), **overrides
        )
    else:
        build = ctx.manifest().build
        if build is None:
            from pinwheel.errors import UsageError

            raise UsageError(
                "no arches to check against: the manifest has no [build] table",
                where=str(ctx.manifest_path),
                next="pass --arch 7.0 or add [build]",
            )
        if args.require:
            overrides["required_members"] = tuple(args.require)
        spec = spec_from_build(build, **overrides)
    _wheels_exist(ctx, args.wheels)
    report = check_wheels(args.wheels, spec)
    stated, problems = _toolchain_statement(ctx, args)
    env_problems, env_notes = _environment_statement(args)
    if ctx.json:
        ctx.emit(report.to_json() | {"substitutions": stated, "toolchain_problems": problems,
                                     "environment_problems": env_problems,
                                     "environment_notes": env_notes})  # fmt: skip
    else:
        from pinwheel.wheels.substitute import from_receipt, headline

        lines = report.human_lines()
        if stated:
            lines.insert(0, str(headline(from_receipt({"substitutions": stated}))))
        lines += [f"FAIL toolchain: {p}" for p in problems]
        lines += [f"FAIL build environment: {p}" for p in env_problems]
        lines += [f"note build environment: {n}" for n in env_notes]
        print(shown("\n".join(lines)))
    return 0 if report.ok and not problems and not env_problems else EXIT_VERIFY


def _environment_statement(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Each checked wheel's recorded build environment against the checkout's lock, and its
    recorded member digests against its members (provenance.json beside the wheels)."""
    from pinwheel.compile.lockedvenv import recorded_against_lock
    from pinwheel.compile.toollocks import repo_root
    from pinwheel.wheels.provenance import (
        FILENAME,
        member_differences,
        member_digests,
        read_receipt,
    )

    problems: list[str] = []
    notes: list[str] = []
    root = repo_root()
    for wheel in map(Path, args.wheels):
        receipt_path = wheel.absolute().parent / FILENAME
        if not receipt_path.is_file():
            continue
        entry = next((c for c in read_receipt(receipt_path).get("components") or []
                      if isinstance(c, dict) and c.get("wheel") == wheel.name), None)  # fmt: skip
        if entry is None:
            continue
        env = entry.get("environment")
        if isinstance(env, dict) and root is not None:
            found, said = recorded_against_lock(env, root)
            problems += [f"{wheel.name}: {p}" for p in found]
            notes += [f"{wheel.name}: {n}" for n in said]
        if isinstance(entry.get("members"), dict) and wheel.is_file():
            for member, change in member_differences(entry["members"], member_digests(wheel)):
                problems.append(f"{wheel.name}: member {member} {change} (provenance vs wheel)")
    return problems, notes


def _toolchain_statement(
    ctx: Context, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], list[str]]:
    """The substitutions the build's provenance.json (beside the wheels) records, and any
    toolchain difference from [build] that none of them explains."""
    from pinwheel.wheels.provenance import FILENAME, read_receipt
    from pinwheel.wheels.substitute import from_receipt, to_json, undeclared

    folders = {Path(w).absolute().parent for w in args.wheels}
    receipts = [f / FILENAME for f in sorted(folders) if (f / FILENAME).is_file()]
    if not receipts:
        return [], []
    data = read_receipt(receipts[0])
    build = None if args.arch else ctx.manifest().build
    return to_json(from_receipt(data)), (undeclared(data, build) if build else [])


def _glibc_flag(text: str) -> tuple[int, ...]:
    import re

    m = re.fullmatch(r"2\.([0-9]{1,3})", text)  # ASCII digits only: not 2.٣١
    if not m:
        from pinwheel.errors import UsageError

        raise UsageError(
            f"--max-glibc {text!r} is not a glibc 2.x version",
            next="pass it like --max-glibc 2.31",
        )
    return (2, int(m.group(1)))


def _verify_build(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.cli.replay_cmds import build_request, replay_request
    from pinwheel.compile.verify import verify_build

    manifest = ctx.manifest()
    request = build_request(
        ctx,
        args,
        args.wheels,
        # replayed when the receipt records an engine wheel (verify_build decides)
        replay=None if args.source else replay_request(ctx, args, manifest, write_refs=False),
        engine_source=args.source.absolute() if args.source else None,
        compiler_cache=args.with_cache,  # default off: prove a cold rebuild from source
    )
    result = verify_build(request, args.wheels, keep=args.keep, reporter=ctx.reporter)
    ctx.emit(result.to_json(), "\n".join(result.human_lines()))
    return 0 if result.same else result.exit_code

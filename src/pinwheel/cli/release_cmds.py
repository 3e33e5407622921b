"""Subcommands of the release stage: release, publish, fetch, install, model fetch|check."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pinwheel import options
from pinwheel.cli import Context, command, refuse_url
from pinwheel.errors import UsageError
from pinwheel.manifest import Manifest
from pinwheel.printable import shown_cmd
from pinwheel.release.signing import UNSIGNED_NOTE

FETCH_DEST = "fetched-release"  # fetch's folder and install's: never the build's wheels/
INSTALL_VENV = ".venv"


def _manifest_or_none(ctx: Context) -> Manifest | None:
    """fetch and install work without a manifest (a user with only a URL); others need one."""
    return ctx.manifest() if ctx.manifest_path.exists() else None


def _signers(ctx: Context, args: argparse.Namespace) -> tuple[Path | None, str | None]:
    from pinwheel.release.assemble import release_config

    if getattr(args, "allow_unsigned", False):
        if args.allowed_signers:
            raise UsageError(
                "--allow-unsigned and --allowed-signers contradict each other",
                next="pass --allowed-signers FILE to verify, or --allow-unsigned alone",
            )
        return None, None  # the user's stated choice: [release] allowed_signers is not used
    config = release_config(_manifest_or_none(ctx))
    signers = Path(args.allowed_signers) if args.allowed_signers else config.allowed_signers
    return signers, args.principal or config.principal


def _sigstore_policy(ctx: Context, args: argparse.Namespace) -> Any:
    """Who must have signed a Sigstore bundle: --sigstore-repo, else the manifest's
    [release.sigstore] / [release.github]; None when neither names a repository."""
    from pinwheel.manifest.release import repo_problem
    from pinwheel.release.assemble import release_config
    from pinwheel.release.sigstorebundle import IdentityPolicy

    want = release_config(_manifest_or_none(ctx)).sigstore
    repository = args.sigstore_repo or want.repository
    if args.sigstore_repo and repo_problem(args.sigstore_repo):
        raise UsageError(
            f"--sigstore-repo {args.sigstore_repo!r} is not OWNER/NAME",
            next="pass the GitHub repository whose release workflow signs, e.g. owner/name",
        )
    if repository is None:
        return None
    return IdentityPolicy(repository=repository, workflow=want.workflow, issuer=want.issuer)


# --------------------------------------------------------------------------- release / publish


def cmd_release(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.release.assemble import AssembleRequest, assemble, release_config

    manifest = ctx.manifest()
    config = release_config(manifest)
    key = (
        None if args.no_sign else (Path(args.key).expanduser() if args.key else config.signing_key)
    )
    builder, invocation = _ci_builder(ctx, args)
    request = AssembleRequest(
        manifest,
        config,
        build=Path(args.source) if args.source else config.source,
        out=Path(args.out) if args.out else config.dir,
        key=key,
        qualification=Path(args.qualification) if args.qualification else None,
        allow_unverified=args.allow_unverified,
        builder_id=builder,
        invocation_id=invocation,
        lock=Path(args.lock) if args.lock else None,
    )
    built = assemble(request)
    for warning in built.warnings:
        ctx.say(f"warning: {warning}", style="yellow")
    ctx.emit(
        {"dir": str(built.dir), "files": list(built.files), "signed": built.signed},
        f"release in {built.dir}: {len(built.wheels)} wheels, "
        f"{len(built.files)} files in SHA256SUMS"
        + (", signed" if built.signed else ", NOT signed"),
    )
    return 0


def _ci_builder(ctx: Context, args: argparse.Namespace) -> tuple[str, str | None]:
    """SLSA builder id and invocation id: --builder-id (no invocation), else the GitHub
    Actions workflow and run that runs this (options.GithubRun, from GITHUB_*), else a
    local build."""
    from pinwheel.release.attest import LOCAL_BUILDER

    chosen = ctx.option(args, "GITHUB_WORKFLOW_REF")
    if chosen.source == "flag" and chosen.value:
        return chosen.value, None
    run = ctx.host.github
    if run is None:
        return LOCAL_BUILDER, None
    return run.builder_id, run.invocation_id


def cmd_keygen(ctx: Context, args: argparse.Namespace) -> int:
    """A first release key: an Ed25519 key and its line in allowed_signers, one command."""
    from pinwheel.release.assemble import release_config
    from pinwheel.release.signing import new_key

    manifest = _manifest_or_none(ctx)
    config = release_config(manifest)
    key = Path(args.key).expanduser() if args.key else config.signing_key
    if key is None:
        raise UsageError(
            "where should the new private key go?",
            where="pinwheel keygen",
            next="pass --key PATH (outside the repository, e.g. ~/.ssh/pinwheel_release), or "
            "set [release] signing_key",
        )
    default_signers = config.allowed_signers or (
        ctx.manifest_path.parent / "keys" / "allowed_signers")  # fmt: skip
    signers = Path(args.allowed_signers) if args.allowed_signers else default_signers
    principal = args.principal or config.principal or (
        f"{manifest.name}-release" if manifest is not None else "pinwheel-release")  # fmt: skip
    made = new_key(key, signers, principal)
    ctx.emit(
        {"key": str(made.key), "public_key": str(made.key) + ".pub",
         "allowed_signers": str(made.allowed_signers), "line": made.line},
        f"new release key {made.key} (public half {made.key}.pub)\n"
        f"added to {made.allowed_signers}: {made.line}\n"
        f"next: commit {shown_cmd(made.allowed_signers)}, then "
        f"`{shown_cmd('pinwheel', 'release', '--key', made.key)}`",
    )  # fmt: skip
    return 0


def cmd_verify_release(ctx: Context, args: argparse.Namespace) -> int:
    import re
    import tempfile

    from pinwheel.release.download import FetchOptions
    from pinwheel.release.verifyrelease import fetch_for_verify, verify_release_dir

    signers, principal = _signers(ctx, args)
    policy = _sigstore_policy(ctx, args)
    source = args.source
    with tempfile.TemporaryDirectory(prefix="pinwheel-verify.") as tmp:
        if re.match(r"^https?://", source):
            if ctx.offline:
                raise UsageError("--offline: a URL cannot be verified",
                                 next="fetch it first, then verify the directory")  # fmt: skip
            opts = FetchOptions(
                allowed_signers=signers,
                principal=principal,
                allow_unsigned=args.allow_unsigned,
                sums=args.sums,
                sigstore_policy=policy,
                command="pinwheel verify-release",
                reporter=ctx.reporter,
            )
            directory = Path(tmp) / "release"
            fetch_for_verify(source, directory, opts)
        else:
            directory = Path(source)
        check = verify_release_dir(directory, allowed_signers=signers, principal=principal,
                                   allow_unsigned=args.allow_unsigned,
                                   sigstore_policy=policy)  # fmt: skip
    wheels = [s for s in check.subjects if s.endswith(".whl")]
    trust = (
        f"SHA256SUMS signed by {check.sums_signed_by}, attestation signed by "
        f"{check.attestation_signed_by}"
        if not check.unsigned
        else UNSIGNED_NOTE + ": signatures over SHA256SUMS and the attestation not checked"
    )
    lines = [
        f"release OK: {len(wheels)} wheels and SHA256SUMS match the in-toto statement "
        f"({len(check.subjects)} subjects) and SHA256SUMS; {trust}",
        f"  builder: {check.builder}; resolved dependencies: {check.dependencies}",
    ]
    lines += [f"  {line}" for line in check.sigstore] or ["  no Sigstore bundle beside the release"]
    ctx.emit(
        {
            "source": source,
            "ok": True,
            "sums_signed_by": check.sums_signed_by,
            "attestation_signed_by": check.attestation_signed_by,
            "allow_unsigned": check.unsigned,
            "subjects": list(check.subjects),
            "builder": check.builder,
            "resolved_dependencies": check.dependencies,
            "sigstore": list(check.sigstore),
            "sigstore_verified": [b.name for b in check.bundles if b.verified],
        },
        "\n".join(lines),
    )
    return 0


def cmd_publish(ctx: Context, args: argparse.Namespace) -> int:
    """Verify the release, then hand it to the target ``--to`` names (release/targets/)."""
    from pinwheel.release import targets
    from pinwheel.release.assemble import release_config, verify_release

    target = targets.named(args.to)
    manifest = ctx.manifest()
    config = release_config(manifest)
    directory = Path(args.dir) if args.dir else config.dir
    verified = verify_release(
        directory, allowed_signers=config.allowed_signers, principal=config.principal
    )
    flags = {f.flag: getattr(args, f.dest, None) for f in target.flags}
    done = target.publish(targets.PublishRequest(verified, config, manifest, flags))
    ctx.emit(done.payload, done.text)
    return 0


def _register_publish(sub: Any) -> None:
    """``publish``: ``--to``'s choices, its help and each target's flags, from the table."""
    from pinwheel.release import targets

    rows = targets.TARGETS
    p = command(sub, "publish", "upload a verified release to a target: "
                + ", ".join(t.name for t in rows), cmd_publish)  # fmt: skip
    p.add_argument("dir", nargs="?", help="release dir (default: [release] dir)")
    p.add_argument("--to", required=True, choices=tuple(t.name for t in rows),
                   help="; ".join(f"{t.name}: {t.summary}" for t in rows))  # fmt: skip
    for target in rows:
        for flag in target.flags:
            p.add_argument(flag.flag, dest=flag.dest, metavar=flag.metavar,
                           help=f"{flag.help} (--to {target.name})")  # fmt: skip


def cmd_index(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.release.assemble import release_config
    from pinwheel.release.pyindex import IndexRequest, build_index

    if args.dir:
        refuse_url(args.dir, reads="a release folder on this machine", dest=FETCH_DEST,
                   then=("index", FETCH_DEST, "--out", f"{FETCH_DEST}-index"))  # fmt: skip
    config = release_config(_manifest_or_none(ctx))
    signers, principal = _signers(ctx, args)
    directory = Path(args.dir) if args.dir else config.dir
    out = Path(args.out) if args.out else directory.parent / f"{directory.name}-index"
    base = args.base_url
    outcome = build_index(IndexRequest(directory, out, signers, principal, base_url=base))
    lines = [f"index in {outcome.out}: {len(outcome.files)} wheels, "
             f"{len(outcome.variants)} variant(s)"
             + (f", release signed by {outcome.signed_by}" if outcome.signed_by else
                ", release signature not checked (no allowed_signers)")]  # fmt: skip
    lines += [f"  {v}: pip install --require-hashes -r BASE/{v}/requirements.txt "
              f"--index-url BASE/{v}/simple/  ({len(w)} wheels, "
              f"{len(outcome.dependencies)} dependencies by hash)"
              for v, w in outcome.variants.items()]  # fmt: skip
    if base:
        lines += [f"  {v}: uv pip install -r {base}{v}/pylock.toml  (or pip >= 26.1: pip install "
                  f"-r {base}{v}/pylock.toml; the lock names each wheel by URL under --base-url)"
                  for v in outcome.variants]  # fmt: skip
    else:
        lines.append("  pylock.toml names the wheels by relative path: install it from a local "
                     "copy of the whole index folder (uv pip install -r OUT/VARIANT/pylock.toml); "
                     "to install it over HTTP, index again with --base-url BASE/")  # fmt: skip
    lines.append("  the release itself: pinwheel fetch BASE/files/ (or verify-release BASE/files/)")
    if outcome.unserved:
        lines.append("  warning: no hash here for " + ", ".join(outcome.unserved) + " (the release "
                     "ships no pylock.toml): the requirements.txt above alone is refused by "
                     "--require-hashes; install instead with (each resolves a hashed lock first):")
        for variant, steps in outcome.steps.items():
            lines += [f"    {variant}: {step}" for step in steps]
        lines.append("    or ship the lock: pinwheel install, runtime-lock, release --lock "
                     "(docs/release.md), then index again")  # fmt: skip
    ctx.emit(
        {
            "out": str(outcome.out),
            "base_url": base,
            "signed_by": outcome.signed_by,
            "variants": {v: list(w) for v, w in outcome.variants.items()},
            "dependencies": [d.project for d in outcome.dependencies],
            "unserved": list(outcome.unserved),
            "steps": {v: list(s) for v, s in outcome.steps.items()},
        },
        "\n".join(lines),
    )
    return 0


def cmd_runtime_lock(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.release import envlock

    if args.release:
        refuse_url(args.release, reads="the release folder installed in VENV", flag="--release",
                   then=("runtime-lock", args.venv, "--release", FETCH_DEST, "--out", args.out),
                   dest=FETCH_DEST)  # fmt: skip
    venv = Path(args.venv)
    env = envlock.build(
        venv,
        release_dir=Path(args.release) if args.release else None,
        locks=[Path(p) for p in args.lock],
        leave_out=tuple(args.leave_out),
    )
    out = Path(args.out)
    lock = envlock.write(env, out)  # refused while anything is unpinned (nothing written)
    lines = [f"wrote {out}: {len(env.pinned)} package(s) pinned by wheel sha256 "
             f"({len(lock.packages)} in the lock), {len(env.release)} release wheel(s) by "
             "sha256 in [tool.pinwheel]"]  # fmt: skip
    lines += [f"  {p.name} {p.version}: {p.how}" for p in env.pinned]
    lines += [f"  {r.name} {r.version}: the release's {r.wheel}" for r in env.release]
    lines += [f"  LEFT OUT (--leave-out) {u.name} {u.version}: {u.why}" for u in env.left_out]
    ctx.emit(
        {
            "out": str(out),
            "python": env.python,
            "pinned": [{"name": p.name, "version": p.version, "hash_from": p.how,
                        "wheels": [w.__dict__ for w in p.wheels]} for p in env.pinned],
            "release_wheels": [r.__dict__ for r in env.release],
            "left_out": [u.__dict__ for u in env.left_out],
        },
        "\n".join(lines),
    )  # fmt: skip
    return 0


# --------------------------------------------------------------------------- fetch / install


def cmd_fetch(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.release.download import FetchOptions, fetch_release, resolve_source

    if ctx.offline and not Path(args.source).is_dir():
        raise UsageError(
            "--offline: only a directory source can be fetched",
            where="pinwheel fetch SOURCE",
            next="drop --offline or pass a directory",
        )
    signers, principal = _signers(ctx, args)
    opts = FetchOptions(
        timeout=args.timeout,
        retries=args.retries,
        min_rate=args.min_rate,
        deadline=args.deadline,
        allowed_signers=signers,
        principal=principal,
        allow_unsigned=args.allow_unsigned,
        sums=args.sums,
        sigstore_policy=_sigstore_policy(ctx, args),
        reporter=ctx.reporter,
    )
    source = resolve_source(args.source)
    dest = _fetch_dest(ctx, args, source.location if source.kind == "dir" else None)
    result = fetch_release(source, dest, opts, only=tuple(args.file))
    payload: dict[str, Any] = {
        "source": source.describe(),
        "dest": str(result.dest),
        "signed_by": result.signed_by,
        "signature": result.signature,
        "allow_unsigned": result.allow_unsigned,
        "files": [f.__dict__ for f in result.files],
        "attestation": _carried(result.check),
    }
    if result.allow_unsigned:
        payload["warning"] = UNSIGNED_NOTE
    resumed = [f.name for f in result.files if f.resumed_from]
    ctx.emit(
        payload,
        f"fetched {len(result.files)} files into {result.dest}, all sha256 verified"
        + {
            "verified": f", signature by {result.signed_by}",
            "present": f"; {UNSIGNED_NOTE}: a signature is present, pass --allowed-signers "
            "FILE to check it",
            "absent": f"; {UNSIGNED_NOTE}: the release is unsigned",
        }[result.signature]
        + (f"; resumed: {', '.join(resumed)}" if resumed else "")
        + "\n  " + "\n  ".join(_carried(result.check)),
    )
    return 0


def _carried(check: Any) -> list[str]:
    """What fetch and install say of the attestation and Sigstore bundles they checked."""
    if check is None:
        return ["no attestation.intoto.jsonl beside it (accepted: --allow-unsigned)"]
    signed = (f"signed by {check.attestation_signed_by}" if check.attestation_signed_by
              else "signature not checked (--allow-unsigned)")  # fmt: skip
    lines = [f"attestation.intoto.jsonl: {len(check.subjects)} subjects match, {signed}; "
             f"builder {check.builder}"]  # fmt: skip
    return lines + (list(check.sigstore) or ["no Sigstore bundle beside the release"])


def _fetch_dest(ctx: Context, args: argparse.Namespace, source_dir: str | None) -> Path:
    """--dest, never the build's output nor the release folder (a later build would change
    what fetch verified), nor the source directory itself."""
    from pinwheel.release.assemble import release_config

    dest = Path(args.dest)
    config = release_config(_manifest_or_none(ctx))
    taken = {config.source.resolve(): "the build output ([release] source)",
             config.dir.resolve(): "the release folder ([release] dir)"}  # fmt: skip
    if source_dir is not None:
        taken[Path(source_dir).resolve()] = "the folder fetched from"
    why = taken.get(dest.resolve())
    if why is not None:
        raise UsageError(
            f"--dest {args.dest} is {why}: fetched files never share a folder with it",
            where="pinwheel fetch --dest DIR",
            next="pass another folder, e.g. "
            f"`{shown_cmd('pinwheel', 'fetch', args.source, '--dest', FETCH_DEST)}`",
        )
    return dest


def cmd_install(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.release.assemble import release_config
    from pinwheel.release.install import InstallRequest, install

    venv_words = ("--venv", args.venv) if args.venv else ()
    refuse_url(args.dir, reads="a fetched release folder", dest=FETCH_DEST,
               then=("install", FETCH_DEST, *venv_words))  # fmt: skip
    signers, principal = _signers(ctx, args)
    backend = args.torch_backend or release_config(_manifest_or_none(ctx)).torch_backend
    venv = Path(args.venv or INSTALL_VENV)
    if args.venv is None and venv.resolve() == Path(sys.prefix).resolve():
        raise UsageError(
            f"{venv} is the venv pinwheel itself runs from: the engine would be installed "
            "over pinwheel's own dependencies",
            where="pinwheel install --venv",
            next="pass another venv, e.g. "
            f"`{shown_cmd('pinwheel', 'install', args.dir, '--venv', 'engine-venv')}`, "
            f"or name this one on purpose with {shown_cmd('--venv', venv)}",
        )
    request = InstallRequest(
        wheel_dir=Path(args.dir),
        venv=venv,
        sigstore_policy=_sigstore_policy(ctx, args),
        torch_backend=backend,
        installer=args.installer,
        no_deps=args.no_deps,
        allowed_signers=signers,
        principal=principal,
        allow_partial=args.allow_partial,
        allow_unsigned=args.allow_unsigned,
        python=args.python,
        offline=ctx.offline,
        host=ctx.host,
    )
    result = install(request)
    if result.fell_back:
        ctx.reporter.info(f"warning: {result.fell_back}")
    trust = f"signed by {result.signed_by}" if result.signed_by else UNSIGNED_NOTE
    ctx.emit(
        {
            "signed_by": result.signed_by,
            "allow_unsigned": result.allow_unsigned,
            "signature": trust,
            "venv": str(result.venv),
            "python": result.python,
            "python_found_by": result.python_how,
            "lock": result.lock,
            "installer": result.installer,
            "fell_back": result.fell_back,
            "wheels": list(result.wheels),
            "commands": [list(c) for c in result.commands],
            "attestation": _carried(result.check),
        },
        f"installed {', '.join(result.wheels)} into {result.venv} (Python "
        f"{result.python or '?'}: {result.python_how}) with {result.installer}"
        + (f", dependencies from {result.lock} (hashed)" if result.lock else "")
        + f"; {trust}\n  " + "\n  ".join(_carried(result.check)),
    )
    return 0


# --------------------------------------------------------------------------- model


def _model(ctx: Context) -> Any:
    manifest = ctx.manifest()
    pack = manifest.require("model")
    return pack


def cmd_model_check(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.release.modelpack import check_model

    report = check_model(Path(args.dir), _model(ctx), hashes=not args.no_hash)
    ctx.emit(
        {
            "dir": str(report.dir),
            "shards": list(report.shards),
            "total_bytes": report.total_bytes,
            "hashed": list(report.hashed),
        },
        f"model pack OK: {len(report.shards)} shards, {report.total_bytes} bytes"
        + (f", {len(report.hashed)} hashes match" if report.hashed else ""),
    )
    return 0


def cmd_model_fetch(ctx: Context, args: argparse.Namespace) -> int:
    from pinwheel.release.modelpack import fetch_model

    if ctx.offline:
        raise UsageError(
            "--offline: model fetch needs the hub", next="run `pinwheel model check DIR`"
        )
    pack = _model(ctx)
    local = Path(args.local_dir or pack.local_dir or (pack.repo or "model").rsplit("/", 1)[-1])
    report = fetch_model(pack, local)
    ctx.emit(
        {"dir": str(report.dir), "shards": len(report.shards)},
        f"model pack in {report.dir}: {len(report.shards)} shards, checked",
    )
    return 0


def _model_help(ctx: Context, args: argparse.Namespace) -> int:
    raise UsageError(
        "model needs a subcommand", next="pinwheel model check DIR | pinwheel model fetch"
    )


def register(sub: Any) -> None:
    """The release stage's commands, in the order `pinwheel --help` lists them."""
    _register_release(sub)
    _register_keygen(sub)
    _register_verify_release(sub)
    _register_publish(sub)
    _register_index(sub)
    _register_runtime_lock(sub)
    _register_fetch(sub)
    _register_install(sub)
    _register_model(sub)


def _register_release(sub: Any) -> None:
    p = command(sub, "release", "assemble a signed release dir from the build output", cmd_release)
    p.add_argument(
        "--from", dest="source", help="build output (default: [release] source, wheels/)"
    )
    p.add_argument("--out", help="release dir (default: [release] dir, release/)")
    p.add_argument(
        "--key", help="ssh private key to sign SHA256SUMS (default: [release] signing_key)"
    )
    p.add_argument("--no-sign", action="store_true", help="leave SHA256SUMS unsigned")
    p.add_argument("--qualification", help="qualification receipt (JSON) to include in the notes")
    p.add_argument(
        "--allow-unverified",
        action="store_true",
        help="release a build that `check` rejects or whose tree is not pinned; "
        "RELEASE_NOTES.md then says UNVERIFIED in its first line",
    )

    p.add_argument(
        "--lock",
        help="pylock.toml (PEP 751) of the environment qualification ran in: shipped in the "
        "release, installed from by `pinwheel install`",
    )
    options.add_flag(p, "GITHUB_WORKFLOW_REF")


def _register_keygen(sub: Any) -> None:
    p = command(sub, "keygen", "make a release signing key and its allowed_signers line",
                cmd_keygen)  # fmt: skip
    p.add_argument("--key", help="where the private key goes (default: [release] signing_key); "
                   "its .pub beside it")  # fmt: skip
    p.add_argument("--allowed-signers", help="the file the key's line is added to (default: "
                   "[release] allowed_signers, else keys/allowed_signers)")  # fmt: skip
    p.add_argument("--principal", help="the key's identity in allowed_signers (default: "
                   "[release] principal, else NAME-release)")  # fmt: skip


def _register_verify_release(sub: Any) -> None:
    p = command(
        sub,
        "verify-release",
        "check a release (DIR|URL): SHA256SUMS, signatures, the in-toto attestation's subjects",
        cmd_verify_release,
    )
    p.add_argument("source", help="release directory, base URL, or index project URL "
                   "(.../simple/NAME/, with --sums)")  # fmt: skip
    p.add_argument("--sums", help="SHA256SUMS URL or path (required for an index source)")
    _signer_options(p)
    _unsigned_option(p)
    _sigstore_option(p)


def _register_index(sub: Any) -> None:
    p = command(
        sub, "index", "a static PEP 503/691 index per variant for a release (pip, uv)", cmd_index
    )
    p.add_argument("dir", nargs="?", help="release dir (default: [release] dir)")
    p.add_argument("--out", help="index dir (default: DIR-index beside it): new, empty, or one "
                   "pinwheel index made (then replaced atomically)")  # fmt: skip
    p.add_argument("--base-url", metavar="URL",
                   help="the http(s) URL --out will be served at, ending with '/': each "
                   "VARIANT/pylock.toml then names its wheels by URL (uv pip install -r "
                   "URL/VARIANT/pylock.toml); without it, by path (a local copy of --out)",
                   )  # fmt: skip
    _signer_options(p)


def _register_runtime_lock(sub: Any) -> None:
    p = command(
        sub,
        "runtime-lock",
        "write pylock.toml from the venv qualification ran in (each package by wheel sha256)",
        cmd_runtime_lock,
    )
    p.add_argument("venv", help="the venv qualification ran in (qualify --python VENV/bin/python)")
    p.add_argument("--out", default="pylock.toml", help="the lock to write (default: pylock.toml)")
    p.add_argument(
        "--release", help="the release installed there: its wheels are matched by RECORD and sha256"
    )
    p.add_argument(
        "--lock", action="append", default=[],
        help="a pylock.toml the venv was installed from: its hashes of the same wheels "
        "(repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--leave-out", action="append", default=[], metavar="NAME",
        help="an unpinned package the engine does not need (pip): left out, named in the lock",
    )  # fmt: skip


def _register_fetch(sub: Any) -> None:
    p = command(sub, "fetch", "download a release (URL|DIR|INDEX) and verify every file", cmd_fetch)
    p.add_argument(
        "source", help="release base URL, directory, or index project URL (.../simple/NAME/)"
    )
    p.add_argument("--dest", default=FETCH_DEST,
                   help=f"where verified files go (default: {FETCH_DEST}; never the build "
                   "output or the release folder)")  # fmt: skip
    p.add_argument("--sums", help="SHA256SUMS URL or path (required for an index source)")
    p.add_argument("--file", action="append", default=[], help="only this listed file (repeatable)")
    _signer_options(p)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds of silence = stall")
    p.add_argument("--retries", type=int, default=5, help="retries per request, with backoff")
    p.add_argument(
        "--min-rate",
        type=float,
        default=10 * 1024,
        help="bytes/s a transfer must average over each minute (0: off; default 10240)",
    )
    _unsigned_option(p)
    p.add_argument(
        "--deadline",
        type=float,
        default=6 * 3600.0,
        help="seconds the whole fetch may take (0: none; default 21600)",
    )
    _sigstore_option(p)


def _register_install(sub: Any) -> None:
    p = command(sub, "install", "install verified wheels into a venv (uv, else pip)", cmd_install)
    p.add_argument("dir", nargs="?", default=FETCH_DEST,
                   help=f"a fetched release (default: {FETCH_DEST})")  # fmt: skip
    p.add_argument("--venv", help=f"target venv, created if missing (default: {INSTALL_VENV}; "
                   "pinwheel's own venv only when named here)")  # fmt: skip
    p.add_argument("--torch-backend", help="uv --torch-backend (default: [release] torch_backend)")
    p.add_argument("--installer", choices=("auto", "uv", "pip"), default="auto")
    p.add_argument("--no-deps", action="store_true", help="install only the release wheels")
    p.add_argument(
        "--python",
        help="interpreter for a new venv (default: the one the wheels' tags need, found on "
        "PATH or by uv)",
    )
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="install the listed wheels present even when others listed in SHA256SUMS are missing",
    )
    _signer_options(p)
    _unsigned_option(p)
    _sigstore_option(p)


def _register_model(sub: Any) -> None:
    p = command(
        sub, "model", "model pack: fetch at the pinned revision, check offline", _model_help
    )
    msub = p.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    m = command(
        msub, "check", "check a downloaded model pack against [model] (offline)", cmd_model_check
    )
    m.add_argument("dir", help="the model directory")
    m.add_argument("--no-hash", action="store_true", help="skip the pinned sha256s (fast)")
    m = command(
        msub,
        "fetch",
        "snapshot_download [model] at its pinned revision, then check",
        cmd_model_fetch,
    )
    m.add_argument("--local-dir", help="download into this dir (default: [model] local_dir)")


def _unsigned_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="go on without allowed_signers (SHA256SUMS then trusted from the server); "
        "every output and the install receipt say so",
    )


def _sigstore_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sigstore-repo",
        metavar="OWNER/NAME",
        help="a Sigstore bundle beside the release must be signed by this GitHub repository's "
        "release workflow (default: [release.sigstore] repository, else [release.github] repo)",
    )


def _signer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allowed-signers", help="verify SHA256SUMS.sig with this allowed_signers file")
    p.add_argument("--principal", help="signer identity in allowed_signers (default: any listed)")


__all__ = ["register"]

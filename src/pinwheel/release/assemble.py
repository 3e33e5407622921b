"""Release assembly: the build output, signed SHA256SUMS, generated notes.

A release directory holds the wheels, ``provenance.json``, an optional
``qualification.json``, ``RELEASE_NOTES.md``, ``SHA256SUMS`` over all of those,
and ``SHA256SUMS.sig`` (``ssh-keygen -Y sign -n pinwheel``). Where a release goes
from here is release/targets/ (`pinwheel publish --to`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import markup as md
from pinwheel import untrusted
from pinwheel.checksums import SIG, SUMS, format_sums, parse_sums, sha256_files, verify_dir
from pinwheel.errors import PinwheelError, VerifyError
from pinwheel.fsutil import atomic_dir, atomic_write_text, link_or_copy
from pinwheel.manifest import Manifest
from pinwheel.manifest.release import (
    DEFAULT_SIGSTORE_WORKFLOW,
    GITHUB_ACTIONS_ISSUER,
    ReleaseConfig,
    SigstoreIdentity,
)
from pinwheel.printable import shown_cmd
from pinwheel.release import attest, pylock, signing
from pinwheel.urls import redact
from pinwheel.wheels.provenance import FILENAME, read_receipt
from pinwheel.wheels.substitute import from_receipt, headline

NOTES = "RELEASE_NOTES.md"
QUALIFICATION = "qualification.json"


# --------------------------------------------------------------------------- [release]


def release_config(manifest: Manifest | None) -> ReleaseConfig:
    """The manifest's [release], or the defaults relative to the current directory."""
    if manifest is not None and manifest.release is not None:
        return manifest.release
    root = manifest.path.parent if manifest is not None else Path.cwd()
    return ReleaseConfig(
        root / "wheels", root / "release", None, None, None, None, None, None, None,
        SigstoreIdentity(None, DEFAULT_SIGSTORE_WORKFLOW, GITHUB_ACTIONS_ISSUER),
    )  # fmt: skip


# --------------------------------------------------------------------------- release notes


def _load_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = untrusted.read_json(path, untrusted.QUALIFICATION)
    return value if isinstance(value, dict) else {}


def _flatten(value: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    """Scalar leaves as (dotted key, text): qualification receipts vary, show what is there."""
    if isinstance(value, dict) and depth < 3:
        rows: list[tuple[str, str]] = []
        for key, item in value.items():
            rows += _flatten(item, f"{prefix}.{key}" if prefix else str(key), depth + 1)
        return rows
    if isinstance(value, (str, int, float, bool)) or value is None:
        return [(prefix, json.dumps(value) if not isinstance(value, str) else value)]
    return []


def _component_lines(
    provenance: Mapping[str, Any], floors: Mapping[str, Mapping[str, Any]] | None = None
) -> list[str]:
    """Each wheel's origin, the build-time sources that went in, and what was left out.
    ``floors`` (wheel -> floor read from its ELF members now) wins over the receipt's."""
    comps = [c for c in provenance.get("components") or [] if isinstance(c, dict)]
    if not comps:
        return []
    out = ["## Components", "", "| wheel | kind | from | sha256 |", "|---|---|---|---|"]
    lacks: list[str] = []
    sources: list[str] = []
    for c in comps:
        src = c.get("source") or {}
        origin = src.get("origin") or src.get("url") or ""
        commit = (src.get("commit") or "")[:12]
        out.append(
            f"| {md.text(c.get('wheel'))} | {md.text(c.get('kind'))} | {md.text(origin)} "
            f"{md.text(commit)} | `{md.code(c.get('sha256'))}` |"
        )
        for s in c.get("sources") or []:
            if not isinstance(s, dict):
                continue
            if s.get("omitted"):
                lacks.append(f"- {md.text(c.get('wheel'))}: build source "
                             f"`{md.code(s.get('name'))}` omitted: "
                             f"{md.text(s.get('reason'))}")  # fmt: skip
            else:
                sources.append(f"- `{md.code(s.get('name'))}`: `{md.code(s.get('url'))}` @ "
                               f"`{md.code(s.get('commit'))}` "
                               f"(declared `{md.code(s.get('ref'))}`)")  # fmt: skip
    out.append("")
    out += _floor_lines(comps, floors)
    if sources:
        out += ["## Build-time sources", "", *sources, ""]
    if lacks:
        out += ["## What the wheels lack", "", *lacks, ""]
    return out


def _floor_lines(
    comps: list[dict[str, Any]], floors: Mapping[str, Mapping[str, Any]] | None = None
) -> list[str]:
    """Where each wheel loads: its glibc/libstdc++ floor and platform tag (and why that tag).

    The floor is the one read from the wheel's ELF members by the release's own check
    (``floors``) when there is one: the receipt's is what the build wrote, not proof."""
    rows = []
    for c in comps:
        floor = c.get("floor")
        read = (floors or {}).get(str(c.get("wheel")))
        if read is not None:
            floor = read
        if not isinstance(floor, Mapping):
            continue
        needs = []
        for family in ("GLIBC", "GLIBCXX", "CXXABI"):
            req = floor.get(family)
            if isinstance(req, Mapping):
                where = ""
                if family == "GLIBC":  # the symbol and member names come from the wheel
                    where = f" ({md.text(req.get('symbol'))} in {md.text(req.get('member'))})"
                needs.append(f"{family} {md.text(req.get('version'))}{where}")
        tag = c.get("platform_tag")
        tag_text = "not recorded"
        if isinstance(tag, dict):
            tag_text = f"`{md.code(tag.get('platform'))}`: {md.text(tag.get('reason'))}"
        rows.append(
            f"| {md.text(c.get('wheel'))} | {'; '.join(needs) or 'no versioned symbols'} "
            f"| {tag_text} |"
        )
    if not rows:
        return []
    return [
        "## Where the wheels load",
        "",
        "The floor is the newest symbol version any shared object needs: a machine with an "
        "older glibc (or libstdc++) fails to import the wheel.",
        "",
        "| wheel | needs at least | platform tag |",
        "|---|---|---|",
        *rows,
        "",
    ]


_ABSENT = {
    "torch": "not installed in the build interpreter (no torch-extension build)",
    "cuda": "no CUDA toolkit (CPU-only build)",
    "nvcc": "no nvcc",
    "gcc": "no gcc found",
}


def _fact(key: str, value: Any) -> str:
    """One toolchain fact for the notes: the value, or what its absence means (never None)."""
    if value is None or value == "":
        return _ABSENT.get(key, "not recorded")
    return f"`{md.code(value)}`"


def stack_not_replayed(provenance: Mapping[str, Any]) -> bool:
    """A set of kernel wheels only, whose receipt records no replayed tree: the stack the
    manifest pins (base, steps, tag) was never replayed for it."""
    components = [c for c in provenance.get("components") or [] if isinstance(c, dict)]
    return (
        bool(components)
        and all(c.get("kind") == "kernel" for c in components)
        and not provenance.get("tree")
    )


def stack_statement(manifest: Manifest) -> str:
    steps = len(manifest.steps)
    tag = f", tag {manifest.result.tag}" if manifest.result.tag else ""
    return (
        f"the stack {manifest.path.name} pins ({manifest.upstream.commit[:12]} + {steps} "
        f"step(s){tag}) was not replayed or built for this release; it carries only the "
        "kernel wheels listed under Components, each with its own recorded source"
    )


_GITHUB = re.compile(
    r"(?:https://github\.com/|git@github\.com:|ssh://git@github\.com/)"
    r"([A-Za-z0-9][A-Za-z0-9-]{0,38})/([A-Za-z0-9._-]{1,100}?)(?:\.git)?/?"
)
_MENTION = re.compile(r"(?<![\w`])@([A-Za-z0-9](?:[A-Za-z0-9-]{0,38}))")


def github_slug(url: str) -> str | None:
    """``owner/repo`` of a GitHub URL, else None."""
    m = _GITHUB.fullmatch(url.strip())
    return f"{m.group(1)}/{m.group(2)}" if m else None


def pr_link(slug: str | None, number: int) -> str:
    """``[owner/repo#N](https://github.com/owner/repo/pull/N)``: on a release page of another
    repository a bare ``#N`` would link that repository's issue N."""
    if slug is None:
        return f"upstream PR {int(number)}"
    return f"[{slug}#{int(number)}](https://github.com/{slug}/pull/{int(number)})"


def quiet_mentions(text: str) -> str:
    """``@name`` as code: GitHub notifies nobody from a release page's text."""
    return _MENTION.sub(lambda m: f"`@{m.group(1)}`", text)


def render_notes(
    manifest: Manifest,
    provenance: Mapping[str, Any],
    files: Mapping[str, tuple[str, int]],
    qualification: Mapping[str, Any] | None,
    config: ReleaseConfig,
    floors: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """RELEASE_NOTES.md from the manifest and the receipts; deterministic (no clock).
    ``floors``: wheel -> the floor ``pinwheel check`` read from its ELF members."""
    tag = provenance.get("tag") or (
        f"{manifest.name} (kernels)" if stack_not_replayed(provenance) else None
    ) or manifest.result.tag or manifest.name
    upstream = provenance.get("upstream") or {}
    base = upstream.get("base") or manifest.upstream.commit
    url = redact(upstream.get("url") or manifest.upstream.url)
    out = [f"# {md.text(manifest.name)} {md.text(tag)}", ""]
    out += [f"- Base: `{md.code(url)}` at `{md.code(base)}`"]
    tree = provenance.get("tree") or manifest.result.tree
    out += [f"- Tree: `{md.code(tree)}`" if tree else "- Tree: not pinned ([result].tree unset)"]
    if provenance.get("head"):
        out += [f"- Head: `{md.code(provenance['head'])}`"]
    out += [f"- Manifest: `{manifest.path.name}` sha256 `{manifest.sha256}`", ""]

    out += ["## Steps", ""]
    if stack_not_replayed(provenance):
        out += [f"Not replayed for this release: {md.text(stack_statement(manifest))}", ""]
    slug = github_slug(str(upstream.get("url") or manifest.upstream.url))
    out += [
        "| # | action | PR | title | head | authors |",
        "|---|---|---|---|---|---|",
    ]
    receipts = {s.get("number"): s for s in provenance.get("steps") or [] if isinstance(s, dict)}
    for step in manifest.steps:
        got = receipts.get(step.number, {})
        authors = sorted(
            {str(c.get("author", "")) for c in got.get("commits") or [] if isinstance(c, dict)}
            - {""}
        )
        pr = pr_link(slug, step.pr) if step.pr else md.text(step.patch.name if step.patch else "")
        head = str(got.get("head") or step.head or "")[:12]
        title = quiet_mentions(md.text(step.title or ""))
        shown = ", ".join(f"`{md.code(a)}`" for a in authors)  # code: an email never mentions
        out += [
            f"| {step.number} | {step.action} | {pr} | {title} | `{md.code(head)}` | "
            f"{shown or 'n/a'} |"
        ]
    out += [""]

    toolchain = provenance.get("toolchain") or {}
    if toolchain or provenance.get("arches"):
        out += ["## Toolchain", ""]
        out += [f"- {md.text(k)}: {_fact(k, v)}" for k, v in sorted(toolchain.items())]
        if provenance.get("arches"):
            out += [f"- arches: `{md.code(', '.join(map(str, provenance['arches'])))}`"]
        if provenance.get("source_date_epoch") is not None:
            out += [f"- SOURCE_DATE_EPOCH: `{md.code(provenance['source_date_epoch'])}`"]
        out += [""]
    else:
        out += ["## Toolchain", "", "- not recorded (no provenance.json in the build output)", ""]

    out += _component_lines(provenance, floors)

    if qualification:
        out += ["## Qualification", "", "| figure | value |", "|---|---|"]
        out += [f"| {md.text(k)} | {md.text(v)} |" for k, v in _flatten(qualification)[:60]]
        out += [""]

    out += ["## Files", "", "| file | bytes | sha256 |", "|---|---|---|"]
    out += [
        f"| {md.text(name)} | {size} | `{md.code(digest)}` |"
        for name, (digest, size) in sorted(files.items())
    ]
    out += [
        "",
        "## Install",
        "",
        "```sh",
        "pinwheel fetch <release URL> --dest fetched-release"
        + (" --allowed-signers allowed_signers" if config.allowed_signers else ""),
        "pinwheel install fetched-release --venv engine-venv --torch-backend "
        f"{config.torch_backend or 'cu128'}"
        + (" --allowed-signers allowed_signers" if config.allowed_signers else ""),
        "```",
        "",
        "By hand: `sha256sum -c SHA256SUMS`",
    ]
    if config.allowed_signers:
        principal = config.principal or "<principal>"
        out += [
            f"and `ssh-keygen -Y verify -f allowed_signers -I {principal} -n pinwheel "
            "-s SHA256SUMS.sig < SHA256SUMS`"
        ]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- assembly


@dataclass(frozen=True)
class Release:
    dir: Path
    files: tuple[str, ...]  # everything SHA256SUMS lists
    wheels: tuple[str, ...]
    signed: bool
    warnings: tuple[str, ...]


def _check_build_output(
    build: Path, wheels: list[str], digests: Mapping[str, str], provenance: Mapping[str, Any]
) -> list[str]:
    """Cross-check the build's own SHA256SUMS and provenance against the wheels on disk."""
    warnings = []
    sums_path = build / SUMS
    if sums_path.is_file():
        data = untrusted.read_bytes(sums_path, untrusted.SHA256SUMS)
        listed = parse_sums(data, str(sums_path))
        unlisted = [w for w in wheels if w not in listed]
        if unlisted:
            raise VerifyError(
                f"wheel not listed in the build's SHA256SUMS: {', '.join(unlisted)}",
                where=str(sums_path),
                next="rebuild, or remove the stray wheel",
            )
        bad = [w for w in wheels if listed[w] != digests[w]]
        if bad:
            raise VerifyError(
                f"sha256 differs from the build's SHA256SUMS: {', '.join(bad)}",
                where=str(sums_path),
                next="rebuild (`pinwheel build`)",
            )
    else:
        warnings.append(f"no {SUMS} in {build}: hashed the wheels as found")
    pinned = provenance.get("wheels")
    if isinstance(pinned, dict):
        bad = [w for w in wheels if w in pinned and pinned[w] != digests[w]]
        if bad:
            raise VerifyError(
                f"sha256 differs from provenance.json: {', '.join(bad)}",
                where=str(build / FILENAME),
                next="rebuild (`pinwheel build`)",
            )
    if not provenance:
        warnings.append(f"no {FILENAME} in {build}: notes carry the manifest only")
    return warnings


@dataclass(frozen=True)
class AssembleRequest:
    """One `pinwheel release`, resolved once by the CLI (flags over [release])."""

    manifest: Manifest
    config: ReleaseConfig
    build: Path  # the build output: wheels, SHA256SUMS, provenance
    out: Path  # the release directory to make
    key: Path | None  # None: unsigned
    qualification: Path | None = None
    allow_unverified: bool = False
    builder_id: str = attest.LOCAL_BUILDER  # SLSA runDetails.builder.id (the CI names its own)
    invocation_id: str | None = None  # SLSA runDetails.metadata.invocationId (the CI run's URL)
    lock: Path | None = None  # pylock.toml of the environment qualification ran in


def assemble(request: AssembleRequest) -> Release:
    """Make the release directory ``out`` from the build output ``build`` (atomically).

    Refuses (before anything is written) a build that ``pinwheel check`` rejects or whose
    provenance does not tie it to the pinned ``[result].tree``, unless ``allow_unverified``:
    then RELEASE_NOTES.md starts with a line saying it is unverified and why.
    """
    manifest, config, build, out = request.manifest, request.config, request.build, request.out
    key, qualification = request.key, request.qualification
    allow_unverified = request.allow_unverified
    wheels = sorted(p.name for p in build.glob("*.whl"))
    if not wheels:
        raise PinwheelError(
            f"no wheels in {build}",
            where=str(build),
            next="run `pinwheel build` first, or pass --from DIR",
        )
    hashed = sha256_files([build / w for w in wheels])
    digests = {w: hashed[build / w] for w in wheels}
    # The build stage's one receipt reader (schema checked); an absent receipt reads as {}.
    receipt = read_receipt(build / FILENAME) if (build / FILENAME).is_file() else None
    provenance: Mapping[str, Any] = receipt if receipt is not None else {}
    warnings = _check_build_output(build, wheels, digests, provenance)
    floors: dict[str, dict[str, Any]] = {}
    reasons = unverified_reasons(manifest, provenance, [build / w for w in wheels], floors=floors)
    if reasons and not allow_unverified:
        raise VerifyError(
            "refusing to release an unverified build; nothing was written or signed:\n    "
            + "\n    ".join(reasons),
            where=str(build),
            next="fix the build (`pinwheel lock` to pin [result].tree, `tools/replay build` "
            "to rebuild, `pinwheel check WHEEL` to see the findings) and rerun `pinwheel "
            "release`; or pass --allow-unverified to publish it marked UNVERIFIED",
        )
    if reasons:
        warnings.append("UNVERIFIED release (--allow-unverified): " + "; ".join(reasons))
    qual_path = qualification or (build / QUALIFICATION)
    qual = _load_json(qual_path) if qual_path.is_file() else None
    if qualification is not None and not qualification.is_file():
        raise PinwheelError(
            f"no qualification receipt at {qualification}",
            next="run `pinwheel qualify` first, or drop --qualification",
        )

    if request.lock is not None:
        _check_lock(request.lock, digests)
    same_dir = out.resolve() == build.resolve()
    with atomic_dir(out) if not same_dir else _in_place(out) as tmp:
        os.chmod(tmp, 0o755)  # a web server running as another user serves the release
        if not same_dir:
            for w in wheels:
                link_or_copy(build / w, tmp / w)
            if provenance:
                shutil.copy2(build / FILENAME, tmp / FILENAME)
        if qual is not None and qual_path.resolve() != (tmp / QUALIFICATION).resolve():
            shutil.copy2(qual_path, tmp / QUALIFICATION)
        if request.lock is not None:
            shutil.copy2(request.lock, tmp / pylock.FILENAME)
        extras = [n for n in (FILENAME, QUALIFICATION, pylock.FILENAME) if (tmp / n).is_file()]
        extra_hashes = sha256_files([tmp / n for n in extras])
        listing = dict(digests) | {n: extra_hashes[tmp / n] for n in extras}
        sized = {n: (d, (tmp / n).stat().st_size) for n, d in listing.items()}
        notes = render_notes(manifest, provenance, sized, qual, config, floors)
        if first := _first_line(manifest, provenance, reasons):
            notes = " ".join(first) + "\n\n" + notes
        atomic_write_text(tmp / NOTES, notes)
        listing[NOTES] = sha256_files([tmp / NOTES])[tmp / NOTES]
        atomic_write_text(tmp / SUMS, format_sums(listing))
        signed = False
        (tmp / SIG).unlink(missing_ok=True)  # a stale signature must never sit beside new sums
        if key is not None:
            signing.sign(tmp / SUMS, key)
            signed = True
            if config.allowed_signers:  # catch a key that the published signers file lacks
                _signed_by_a_listed_key(tmp, key, config)
        else:
            warnings.append("not signed: no --key and no [release] signing_key")
        (tmp / attest.FILENAME).unlink(missing_ok=True)
        subjects = {w: digests[w] for w in wheels} | {SUMS: sha256_files([tmp / SUMS])[tmp / SUMS]}
        receipt_sha = extra_hashes.get(tmp / FILENAME) if FILENAME in extras else None
        attest.write_envelope(tmp, _statement(request, provenance, subjects, receipt_sha), key)
    return Release(
        dir=out,
        files=tuple(sorted(listing)),
        wheels=tuple(wheels),
        signed=signed,
        warnings=tuple(warnings),
    )


def _check_lock(lock: Path, digests: Mapping[str, str]) -> None:
    """``--lock``: every package hash-pinned (checked before anything is written), and the
    release wheels a lock from `pinwheel runtime-lock` names are this release's."""
    locked = pylock.check(lock)
    # A lock from `pinwheel runtime-lock` names the release wheels that were installed
    # where it was made: they must be this release's, byte for byte.
    other = [f"{w} ({sha[:12]}…)" for w, sha in locked.release_wheels if digests.get(w) != sha]
    if other:
        raise VerifyError(
            f"{lock} was made where other wheels than this release's were installed: "
            + ", ".join(other[:10]),
            where=str(lock),
            next="install this release, qualify it, and run `pinwheel runtime-lock VENV "
            "--release DIR` again",
        )


def _first_line(manifest: Manifest, provenance: Mapping[str, Any], reasons: list[str]) -> list[str]:
    """What a reader of RELEASE_NOTES.md must see before anything else, on the first line."""
    first = []
    if reasons:
        first.append(
            "**UNVERIFIED RELEASE** (made with --allow-unverified): "
            + md.text("; ".join(reasons), limit=2000)
        )
    if stack_not_replayed(provenance):
        first.append(f"**UNVERIFIED STACK**: {md.text(stack_statement(manifest))}")
    if substituted := headline(from_receipt(provenance)):  # receipt values: escaped
        first.append(f"**{md.text(substituted, limit=2000)}**")
    return first


def _statement(
    request: AssembleRequest,
    provenance: Mapping[str, Any],
    subjects: dict[str, str],
    receipt_sha: str | None,
) -> dict[str, Any]:
    """The in-toto statement over the wheels and SHA256SUMS (``receipt_sha``: provenance.json's)."""
    manifest = request.manifest
    return attest.statement(
        subjects,
        attest.resolved_dependencies(
            manifest.path.name, manifest.sha256, provenance, receipt_sha,
        ),
        request.builder_id,
        external={"manifest": manifest.path.name,
                  "tag": provenance.get("tag") or manifest.result.tag or manifest.name},
        internal={k: provenance[k] for k in ("arches", "toolchain", "source_date_epoch")
                  if provenance.get(k) is not None},
        invocation_id=request.invocation_id,
    )  # fmt: skip


def _signed_by_a_listed_key(tmp: Path, key: Path, config: ReleaseConfig) -> None:
    """The new SHA256SUMS.sig verifies against [release] allowed_signers; else the refusal
    names release's own way on (a signers line for this key, or --no-sign)."""
    assert config.allowed_signers is not None
    try:
        signing.verify((tmp / SUMS).read_bytes(), (tmp / SIG).read_bytes(),
                       config.allowed_signers, config.principal)  # fmt: skip
    except VerifyError as exc:
        pub = key.with_name(key.name + ".pub") if key.suffix != ".pub" else key
        raise VerifyError(
            f"{key} is not a key that {config.allowed_signers} lists, so no one could verify "
            f"this release; nothing was written ({exc.what})",
            where=f"[release] allowed_signers = {config.allowed_signers}",
            next=f"add this key's line to {config.allowed_signers} "
            f"(`{shown_cmd('ssh-keygen', '-y', '-f', key)}` "
            f"prints it; the format is `PRINCIPAL namespaces=\"pinwheel,"
            f"{signing.ATTESTATION_NAMESPACE}\" {pub.name}'s two fields`), or make a new key "
            f"and its line in one step: `pinwheel keygen --key NEW_KEY`; or pass --no-sign",
        ) from None


def _kernel_only_set(provenance: Mapping[str, Any], wheels: list[Path]) -> list[str] | None:
    """For a set whose receipt lists every wheel as a kernel (no engine): why a kernel is
    not tied to its source (empty: all are). None when the set has the engine, or the
    receipt does not say what the wheels are."""
    components = [c for c in (provenance or {}).get("components") or [] if isinstance(c, dict)]
    kinds = {c.get("wheel"): c for c in components}
    listed = [kinds.get(w.name) for w in wheels]
    if not wheels or any(c is None or c.get("kind") != "kernel" for c in listed):
        return None
    reasons = []
    for w, c in zip(wheels, listed, strict=True):
        source = c.get("source") if isinstance(c, dict) else None
        # out of tree: the replayed tree of its pinned commit; in tree: its path in this
        # repository (the manifest's sha256 is in the receipt)
        if not isinstance(source, dict) or not (
            source.get("tree") or source.get("commit") or source.get("path")
        ):
            reasons.append(f"{FILENAME} records no source (tree, commit or path) for {w.name}")
    return reasons


def unverified_reasons(
    manifest: Manifest,
    provenance: Mapping[str, Any],
    wheels: list[Path],
    *,
    floors: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """Why this build is not one to sign: the artifact check's errors and an unpinned tree.
    ``floors``, when given, receives each wheel's floor as the check read it from the ELF."""
    from pinwheel.wheels.check import CheckSpec, check_wheels, spec_from_build

    reasons = []
    pinned = manifest.result.tree
    tree = provenance.get("tree") if provenance else None
    kernels_only = _kernel_only_set(provenance, wheels)
    if kernels_only is not None:
        # No engine in the set: the replayed tree is not what these wheels are built
        # from; each kernel answers for its own recorded source.
        reasons += kernels_only
    else:
        if not provenance:
            reasons.append(f"no {FILENAME}: the wheels are not tied to a replayed tree")
        elif not tree:
            reasons.append(f"{FILENAME} records no replayed tree (built from a plain source dir)")
        if not pinned:
            reasons.append(
                f"[result].tree is not pinned in {manifest.path.name}: the replay is unverified"
            )
        elif tree and tree != pinned:
            reasons.append(f"{FILENAME} tree {tree} differs from [result].tree {pinned}")
    build = getattr(manifest, "build", None)
    spec = spec_from_build(build) if build is not None else CheckSpec((), require_cuda=False)
    report = check_wheels(wheels, spec)
    if floors is not None:
        floors.update({w.wheel: w.floor.to_json() for w in report.wheels})
    reasons += [f"pinwheel check: {f.line()}" for f in report.errors[:10]]
    if len(report.errors) > 10:
        reasons.append(f"pinwheel check: … and {len(report.errors) - 10} more errors")
    return reasons


class _in_place:
    """Context manager twin of atomic_dir for a release made inside the build dir."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        return None


# --------------------------------------------------------------------------- checking a release


@dataclass(frozen=True)
class Verified:
    dir: Path
    sums: dict[str, str]
    signed_by: str | None


def verify_release(
    directory: Path,
    *,
    allowed_signers: Path | None,
    principal: str | None,
    require_all: bool = True,
) -> Verified:
    """SHA256SUMS (+ signature when signers are configured) and every file it lists."""
    sums_path = directory / SUMS
    if not sums_path.is_file():
        raise VerifyError(
            f"no {SUMS} in {directory}",
            where=str(directory),
            next="run `pinwheel release` (or `pinwheel fetch`) to make one",
        )
    data = untrusted.read_bytes(sums_path, untrusted.SHA256SUMS)  # size-capped before reading
    signed_by = None
    if allowed_signers is not None:
        sig_path = directory / SIG
        if not sig_path.is_file():
            raise VerifyError(
                f"{SIG} missing but allowed_signers is configured",
                where=str(directory),
                next="fetch the signature with the release",
            )
        signed_by = signing.verify(data, sig_path.read_bytes(), allowed_signers, principal)
    sums = parse_sums(data, str(sums_path))
    stray = sorted(p.name for p in directory.glob("*.whl") if p.name not in sums)
    if stray:
        raise VerifyError(
            f"wheel not listed in {SUMS}, refused: {', '.join(stray)}",
            where=str(directory),
            next="remove it; only listed wheels are installed",
        )
    if require_all:
        verify_dir(directory, sums)
    else:
        verify_dir(directory, {n: d for n, d in sums.items() if (directory / n).exists()})
    return Verified(dir=directory, sums=sums, signed_by=signed_by)

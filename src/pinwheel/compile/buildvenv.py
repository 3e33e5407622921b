"""The isolated build environment: a hashed requirements file in, a venv's python out.

The engine's Python build requirements (torch == 2.10.0, cmake >= 3.26,
setuptools-scm, ...) are part of what is pinned: ``[build.requirements]`` names
a ``pip --require-hashes`` file (its sha256 is pinned in the manifest). The venv
is made once per file digest under ``<cache>/venvs/build-<digest>``, installed
with ``--require-hashes --no-deps`` (so nothing unlisted gets in), from the
package index or, offline, from a wheelhouse; then recorded in provenance.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from pinwheel import cachelayout, confine, locking, runner, validate
from pinwheel.compile import pipwatch, workspace
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_write_text, remove_tree
from pinwheel.manifest.build import Requirements
from pinwheel.progress import SILENT, Reporter

READY = ".pinwheel-build-venv.json"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_HASH = re.compile(f"--hash=sha256:({validate.SHA256_HEX})")


class BuildVenvError(PinwheelError):
    """The build environment could not be made."""


@dataclass(frozen=True)
class BuildVenv:
    python: Path
    requirements: Mapping[str, tuple[str, tuple[str, ...]]]  # name -> (version, sha256s)
    digest: str  # sha256 of the requirements file

    def record(self) -> dict[str, object]:
        return {
            "requirements_sha256": self.digest,
            "packages": {n: {"version": v, "sha256": list(h)} for n, (v, h) in
                         sorted(self.requirements.items())},
        }  # fmt: skip


def parse_requirements(text: str, source: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``name==version --hash=sha256:...`` lines (continuations joined); every line pinned."""
    logical = text.replace("\\\n", " ")
    pins: dict[str, tuple[str, tuple[str, ...]]] = {}
    for n, line in enumerate(logical.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        hashes = tuple(_HASH.findall(line))
        if not m or not hashes:
            raise BuildVenvError(
                f"requirement {line[:60]!r} is not pinned with == and --hash=sha256",
                where=f"{source} (logical line {n})",
                next="regenerate it with `pip-compile --generate-hashes` or `uv pip compile "
                "--generate-hashes`",
            )
        pins[canonicalize_name(m.group(1))] = (m.group(2), hashes)
    if not pins:
        raise BuildVenvError(f"{source} lists no requirements", where=source)
    return pins


def ensure_build_venv(
    reqs: Requirements,
    cache: Path,
    *,
    environ: Mapping[str, str],
    offline: bool,
    wheelhouse: Path | None = None,
    reporter: Reporter = SILENT,
    interpreter: str | None = None,
    index_url: str | None = None,
) -> BuildVenv:
    """The venv for ``reqs``, made once (atomically, under a lock) and reused.

    ``interpreter``: the base Python (default: this one; another gets a venv of its own);
    ``index_url``: where the hashed files come from (``[build] torch_index``, checked as an
    https URL when the manifest is read), else pip's default index."""
    pins = parse_requirements(reqs.path.read_text(), reqs.path.name)
    base = cachelayout.bucket(cache, "venvs")
    name = f"build-{reqs.sha256[:16]}"
    if interpreter is not None and interpreter != sys.executable:
        name += "-" + hashlib.sha256(interpreter.encode()).hexdigest()[:8]
    final = base / name
    confine.folder_in_cache(cache, "venvs", what="venvs folder")  # no link on the way
    with locking.held(base / f".{final.name}.lock"):
        marker = final / READY
        if not (marker.is_file() and json.loads(marker.read_text()).get("sha256") == reqs.sha256):
            if offline and wheelhouse is None:
                raise BuildVenvError(
                    f"the build environment {final.name} is not made yet and this run is offline",
                    where=str(reqs.path),
                    next="run once with network, or pass --wheelhouse DIR holding the wheels",
                )
            with reporter.status(f"making the build environment ({len(pins)} pinned packages)"):
                _make(final, reqs, environ, wheelhouse, interpreter, index_url, pins, reporter)
    return BuildVenv(python=final / "bin" / "python", requirements=pins, digest=reqs.sha256)


def _make(
    final: Path,
    reqs: Requirements,
    environ: Mapping[str, str],
    wheelhouse: Path | None,
    interpreter: str | None = None,
    index_url: str | None = None,
    pins: Mapping[str, tuple[str, tuple[str, ...]]] | None = None,
    reporter: Reporter = SILENT,
) -> None:
    """Made in place (venvs do not move), the marker written last: a venv without
    the marker is a half-made one and is made again. pip's log is kept beside it
    (``<name>.pip.log``); its size and progress go to ``reporter`` (:mod:`pipwatch`)."""
    remove_tree(final, ignore_errors=True)
    try:
        # No pip, no setuptools of the interpreter's ensurepip (Python 3.11 puts setuptools
        # 65.5.0 there, and a project that does not lock it built with that one): the
        # venv holds the lock and nothing else; pinwheel's own pip installs into it.
        runner.run(
            runner.Command(
                (interpreter or sys.executable, "-I", "-m", "venv", "--without-pip", str(final)),
                what="python -m venv",
                error=BuildVenvError,
            )
        )
        # pip's own config (extra indexes, find-links) must not add anything, nor may the
        # caller's PYTHONPATH or user site stand in for a locked package.
        env = {k: v for k, v in environ.items() if not k.startswith(("PIP_", "PYTHON"))}
        env["PIP_CONFIG_FILE"] = os.devnull
        env["PYTHONNOUSERSITE"] = "1"
        cmd = [
            sys.executable, "-m", "pip", "--python", str(final / "bin" / "python"), "install",
            "--disable-pip-version-check", "--require-hashes", "--no-deps",
            "--only-binary=:all:",
        ]  # fmt: skip
        if wheelhouse is not None:
            cmd += ["--no-index", "--find-links", str(wheelhouse)]
        elif index_url is not None:  # one argument: the URL can never read as an option
            cmd += [f"--index-url={index_url}"]
        cmd += ["-r", str(reqs.path)]
        log = final.parent / f"{final.name}.pip.log"
        code, tail = pipwatch.run(
            pipwatch.PipInstall(tuple(cmd), env, final, log,
                                pins or parse_requirements(reqs.path.read_text(), reqs.path.name),
                                f"the build environment {final.name}", wheelhouse),
            reporter,
        )  # fmt: skip
        if code != 0:
            raise BuildVenvError(
                "installing the build requirements failed:\n    " + "\n    ".join(tail[-6:]),
                where=f"{reqs.path} (pip's log: {log})",
                next="check the network or --wheelhouse; a hash mismatch means the index "
                "serves another file than the one pinned",
            )
        workspace.fix_header_times(final)  # torch's headers reach the cubins' line tables
        atomic_write_text(final / READY, json.dumps({"sha256": reqs.sha256}) + "\n")
    except BaseException:
        remove_tree(final, ignore_errors=True)
        raise

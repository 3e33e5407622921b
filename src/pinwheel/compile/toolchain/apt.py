"""Debian packages through a private apt state: the machine's own Debian mirrors, none of
its apt configuration or state."""

from __future__ import annotations

import getpass
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pinwheel import runner, validate
from pinwheel.compile.toolchain.download import check_download, fetch_resumable, verified
from pinwheel.compile.toolchain.pins import ToolkitLock
from pinwheel.compile.toolchain.toolkit import ToolchainError
from pinwheel.fsutil import atomic_write_text
from pinwheel.progress import SILENT, Reporter

DEBIAN_SUITES = {"buster", "bullseye", "bookworm", "trixie", "forky", "sid"}
DEBIAN_SUITES |= {"stable", "testing", "unstable", "oldstable"}


@dataclass(frozen=True)
class AptSource:
    uri: str
    signed_by: str | None


def debian_sources(etc: Path = Path("/etc/apt")) -> list[AptSource]:
    """Debian archive sources configured on this machine (one-line and deb822 formats).

    Only plain Debian archives count (a suite named after a Debian release, not
    -security/-updates); third-party repositories are skipped.
    """
    found: list[AptSource] = []
    files = [etc / "sources.list"] if (etc / "sources.list").is_file() else []
    parts = etc / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    for path in files:
        text = path.read_text(errors="replace")
        entries = _deb822(text) if path.suffix == ".sources" else _one_line(text)
        for types, uris, suites, signed in entries:
            if "deb" not in types or not any(s in DEBIAN_SUITES for s in suites):
                continue
            for uri in uris:
                src = AptSource(uri.rstrip("/"), signed)
                if src not in found:
                    found.append(src)
    return found


def _one_line(text: str) -> list[tuple[list[str], list[str], list[str], str | None]]:
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        signed = None
        m = re.search(r"\[([^\]]*)\]", line)
        if m:
            for opt in m.group(1).split():
                if opt.startswith("signed-by="):
                    signed = opt.split("=", 1)[1]
            line = line[: m.start()] + line[m.end() :]
        words = line.split()
        if len(words) >= 3:
            out.append(([words[0]], [words[1]], [words[2]], signed))
    return out


def _deb822(text: str) -> list[tuple[list[str], list[str], list[str], str | None]]:
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no" or "uris" not in fields:
            continue
        out.append(
            (
                fields.get("types", "").split(),
                fields["uris"].split(),
                fields.get("suites", "").split(),
                fields.get("signed-by") or None,
            )
        )
    return out


def _apt_config(state: Path, source: AptSource, lock: ToolkitLock) -> Path:
    """A private apt configuration: our own sources, lists and cache; nothing of the system's."""
    for sub in ("lists/partial", "cache/archives/partial", "sources", "preferences"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "status").touch()
    signed = f"Signed-By: {source.signed_by}\n" if source.signed_by else ""
    atomic_write_text(
        state / "sources" / "pinwheel.sources",
        f"Types: deb\nURIs: {source.uri}\nSuites: {lock.suite}\n"
        f"Components: {lock.component}\n{signed}",
    )
    conf = state / "apt.conf"
    atomic_write_text(
        conf,
        "\n".join(
            [
                f'Dir::State "{state}";',
                f'Dir::State::Lists "{state}/lists";',
                f'Dir::State::status "{state}/status";',
                f'Dir::Cache "{state}/cache";',
                'Dir::Etc::sourcelist "/dev/null";',
                f'Dir::Etc::sourceparts "{state}/sources";',
                f'Dir::Etc::preferencesparts "{state}/preferences";',
                'APT::Architecture "amd64";',
                # Downloads land in a directory the _apt sandbox user cannot write.
                f'APT::Sandbox::User "{getpass.getuser()}";',
                'Acquire::Languages "none";',
                "",
            ]
        ),
    )
    return conf


# `apt-get download --print-uris`: 'URI' FILENAME SIZE SHA256:HEX, one line per package
_PRINTED = re.compile(r"^'([^']+)' (\S+) (\d+) (?:SHA256:(" + validate.SHA256_HEX + "))?", re.M)


def printed_uris(text: str) -> dict[str, tuple[str, int]]:
    """FILENAME -> (URI, size) from ``apt-get download --print-uris`` output."""
    return {m.group(2): (m.group(1), int(m.group(3))) for m in _PRINTED.finditer(text)}


def fetch_debs(
    lock: ToolkitLock,
    downloads: Path,
    state: Path,
    environ: Mapping[str, str],
    reporter: Reporter = SILENT,
) -> list[Path]:
    """The lock's .debs, verified; what the cache lacks is located with one private apt
    update (``apt-get download --print-uris``: the URI from the signed index) and fetched
    with resume (:func:`fetch_resumable`: an interrupted download continues where it
    stopped); a mirror that is not http(s) is left to ``apt-get download``."""
    targets = [downloads / pin.filename for pin in lock.debs]
    missing = [p for p, t in zip(lock.debs, targets, strict=True) if not verified(t, p.sha256)]
    if not missing:
        return targets
    names = " ".join(f"{p.package}={p.version}" for p in missing)
    sources = debian_sources()
    if not sources:
        raise ToolchainError(
            f"this machine's apt sources name no Debian archive to fetch {names} from "
            f"(suite {lock.suite}, component {lock.component})",
            where="/etc/apt/sources.list, /etc/apt/sources.list.d/",
            next="add a Debian mirror to the apt sources, or set CUDA_HOME to a CUDA 12.x toolkit",
        )
    downloads.mkdir(parents=True, exist_ok=True)
    errors = []
    for source in sources:
        env = dict(environ, APT_CONFIG=str(_apt_config(state, source, lock)), LC_ALL="C")
        http = source.uri.lower().startswith(("http://", "https://"))
        steps = (
            ["apt-get", "-q", "update"],
            ["apt-get", "-q", "download", *(["--print-uris"] if http else []), *names.split()],
        )
        for cmd in steps:
            out = runner.run(
                runner.Command(
                    tuple(cmd), cwd=downloads, env=env, check=False, error=ToolchainError
                )
            )
            if out.returncode != 0:
                errors.append(f"{source.uri}: `{' '.join(cmd)}`: {out.err_text[-300:]}")
                break
        else:
            if http:
                uris = printed_uris(out.text)
                for pin in missing:
                    if pin.filename not in uris:
                        raise ToolchainError(
                            f"apt names no download for {pin.filename} in {source.uri} "
                            f"{lock.suite}/{lock.component}",
                            where=f"Debian {lock.suite}/{lock.component}",
                            next="check that the mirror carries the pinned version, or set "
                            "CUDA_HOME to a CUDA 12.x toolkit",
                        )
                    uri, size = uris[pin.filename]
                    fetch_resumable(uri, downloads / pin.filename, pin.sha256,
                                    pin.size or size, reporter)  # fmt: skip
            for pin in missing:
                check_download(downloads / pin.filename, pin.sha256, source.uri)
            return targets
    raise ToolchainError(
        f"could not download {names}: " + " | ".join(errors),
        where=f"Debian {lock.suite}/{lock.component}",
        next="check the network and the apt sources, or set CUDA_HOME to a CUDA 12.x toolkit",
    )

"""Variant labels: every wheel pinwheel builds says what it is in its version.

A wheel built from replayed sources is not upstream's release of the same
number: it holds other commits and was compiled against one CUDA and one torch.
Its version therefore carries a PEP 440 local label naming the variant,
``<public>+pw.<system>.cu<XY>.torch<M.m>`` (``exllamav3-0.0.43+pw.glm53card.
cu128.torch2.10``): ``pip list`` shows it, a pin ``==0.0.43+pw...`` can never
be met by the upstream wheel of the same public number, and ``pinwheel index``
files it under that variant.

:func:`relabel` rewrites a wheel's version everywhere a wheel states it, so
they stay consistent (``pinwheel check`` compares them): the file name, the
``.dist-info`` directory, ``METADATA``'s ``Version`` and every RECORD row (the
paths move with the directory; METADATA's hash and size change). All other
members are copied byte for byte with their ZipInfo in the original order.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from pinwheel.errors import VerifyError

PREFIX = "pw"
_PART = re.compile(r"[a-z0-9]+")


def _part(value: str, what: str) -> str:
    """``value`` lowercased with its separators (space - _) dropped; anything else refused."""
    text = re.sub(r"[ _-]+", "", value.lower()) if value.isascii() else ""
    if not _PART.fullmatch(text):
        raise VerifyError(
            f"cannot make a version label part from {what} {value[:80]!r}",
            where="[build] label / cuda / torch",
            next="use letters and digits (a PEP 440 local label)",
        )
    return text


def variant_label(system: str, cuda: str | None, torch: str | None) -> str:
    """``pw.<system>.cu<major><minor>.torch<major>.<minor>`` (``cpu`` without CUDA; no torch
    part without torch). ``system`` is the card's system name ([build] label)."""
    parts = [PREFIX, *(_part(p, "system") for p in system.split("."))]
    if cuda:
        major, _, rest = cuda.partition(".")
        parts.append("cu" + _part(major, "cuda") + _part(rest.split(".")[0] or "0", "cuda"))
    else:
        parts.append("cpu")
    if torch:
        try:
            release = Version(torch).release
        except InvalidVersion:
            raise VerifyError(
                f"not a torch version: {torch[:80]!r}",
                where="[build] torch",
                next='write it like "2.10.0"',
            ) from None
        parts += [f"torch{release[0]}", str(release[1] if len(release) > 1 else 0)]
    return ".".join(parts)


def labelled_version(version: str, label: str) -> str:
    """``version`` with its local label replaced by ``label``."""
    return f"{Version(version).public}+{label}"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def relabel(wheel: Path, label: str, out_dir: Path) -> Path:
    """A copy of ``wheel`` in ``out_dir`` whose version carries ``label``; ``wheel`` itself
    when it already does. File name, .dist-info, METADATA and RECORD all change together."""
    name, version, _build, _tags = parse_wheel_filename(wheel.name)
    new_version = labelled_version(str(version), label)
    if str(version) == new_version:
        return wheel
    stem = wheel.name[: -len(".whl")]
    dist, _old, rest = stem.split("-", 2)
    target = out_dir / f"{dist}-{new_version}-{rest}.whl"
    if target.resolve() == wheel.resolve():
        raise VerifyError(
            f"cannot relabel {wheel.name} in place", where=str(wheel), next="pass another out_dir"
        )
    with zipfile.ZipFile(wheel) as src:
        infos = src.infolist()
        tops = {i.filename.split("/", 1)[0] for i in infos if "/" in i.filename}
        old_info = [
            t
            for t in tops
            if t.endswith(".dist-info")
            and canonicalize_name(t[: -len(".dist-info")].rpartition("-")[0]) == name
        ]
        if len(old_info) != 1:
            raise VerifyError(
                f"expected one {name} .dist-info directory in the wheel, found {sorted(old_info)}",
                where=wheel.name,
                next="rebuild the wheel",
            )
        old = old_info[0]
        new = f"{old[: -len('.dist-info')].rpartition('-')[0]}-{new_version}.dist-info"
        meta_text = src.read(f"{old}/METADATA").decode("utf-8")
        head, sep, body = meta_text.partition("\n\n")
        lines = head.split("\n")
        versions = [i for i, line in enumerate(lines) if line.lower().startswith("version:")]
        if len(versions) != 1:
            raise VerifyError(
                f"METADATA has {len(versions)} Version lines", where=wheel.name, next="rebuild"
            )
        lines[versions[0]] = f"Version: {new_version}"
        new_meta = ("\n".join(lines) + sep + body).encode("utf-8")
        rows = []
        for row in src.read(f"{old}/RECORD").decode("utf-8").splitlines():
            if not row:
                continue
            path, _, tail = row.partition(",")
            if path == f"{old}/METADATA":
                rows.append(f"{new}/METADATA,{_record_hash(new_meta)},{len(new_meta)}")
            elif path.startswith(old + "/"):
                rows.append(f"{new}/{path[len(old) + 1 :]},{tail}")
            else:
                rows.append(row)
        new_record = ("\n".join(rows) + "\n").encode("utf-8")
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        with zipfile.ZipFile(tmp, "w") as dst:
            for info in infos:
                moved = info.filename
                if moved.startswith(old + "/"):
                    moved = new + moved[len(old) :]
                clone = zipfile.ZipInfo(moved, info.date_time)
                clone.compress_type, clone.external_attr = info.compress_type, info.external_attr
                clone.create_system = info.create_system
                if info.filename == f"{old}/METADATA":
                    dst.writestr(clone, new_meta)
                elif info.filename == f"{old}/RECORD":
                    dst.writestr(clone, new_record)
                else:
                    with src.open(info) as fh, dst.open(clone, "w") as out:
                        while block := fh.read(1 << 20):
                            out.write(block)
    tmp.replace(target)
    return target

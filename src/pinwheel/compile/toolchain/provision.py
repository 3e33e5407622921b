"""Assemble a pinned toolkit into ``<cache>/toolchains/cuda-X.Y.Z``.

NVIDIA's compiler binaries come from the Debian ``nvidia-cuda-toolkit`` package
(fetched from the machine's own Debian mirror, suite trixie, component
non-free, with a private APT state), the headers, libnvvm and libcudart from
PyPI's ``nvidia-cuda-*`` wheels, every file pinned by sha256 in
:data:`~pinwheel.compile.toolchain.pins.LOCKS`, assembled into one relocatable
tree with an ``nvcc.profile``.
"""

from __future__ import annotations

import contextlib
import json
import stat
from collections.abc import Mapping
from pathlib import Path

from pinwheel import cachelayout, confine, locking, untrusted
from pinwheel.compile.toolchain.apt import fetch_debs
from pinwheel.compile.toolchain.download import fetch_wheel, partial_of
from pinwheel.compile.toolchain.pins import MARKER, ToolkitLock
from pinwheel.compile.toolchain.share import link_twins
from pinwheel.compile.toolchain.toolkit import ToolchainError, nvcc_version
from pinwheel.compile.toolchain.unpack import unpack_deb, unpack_wheel
from pinwheel.errors import PinwheelError
from pinwheel.fsutil import atomic_dir, atomic_write_text
from pinwheel.heartbeat import tree_bytes, watch_bytes
from pinwheel.progress import SILENT, Reporter, human_bytes

# nvcc reads this beside itself; $(_HERE_) makes the tree relocatable.
NVCC_PROFILE = """\
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""


def download_plan(lock: ToolkitLock, downloads: Path) -> str:
    """What provisioning will download, said before it starts: files, sizes, destination."""
    todo = [
        (name, size)
        for name, size in lock.files_to_fetch()
        if not (
            (downloads / name).is_file() and (not size or (downloads / name).stat().st_size == size)
        )
    ]
    if not todo:
        return f"CUDA {lock.version}: every pinned file is already in {downloads}"
    known = sum(size for _, size in todo)
    unknown = sum(1 for _, size in todo if not size)
    total = human_bytes(known) + (f" + {unknown} file(s) of unknown size" if unknown else "")
    def said(name: str, size: int) -> str:
        part = partial_of(downloads / name)
        have = part.stat().st_size if part.is_file() else 0
        resumes = f"; {human_bytes(have)} here from an interrupted run, resumed" if have else ""
        return f"{name} ({human_bytes(size) if size else '?'}{resumes})"

    listing = ", ".join(said(name, size) for name, size in todo)
    return (
        f"CUDA {lock.version}: downloading {len(todo)} file(s), {total}, into {downloads} "
        f"(deleted once the tree is verified; --cache or PINWHEEL_CACHE puts it elsewhere): "
        f"{listing}"
    )


def variants(base: Path, lock: ToolkitLock) -> list[Path]:
    """The provisioned trees of ``lock``'s version under ``base`` (plain and ``-dev``) other
    than ``lock``'s own: what a new tree shares its identical files with."""
    names = (f"cuda-{lock.version}", f"cuda-{lock.version}-dev")
    return [base / n for n in names if n != lock.dirname and (base / n / MARKER).is_file()]


def provision_toolkit(
    lock: ToolkitLock,
    cache: Path,
    environ: Mapping[str, str],
    reporter: Reporter = SILENT,
) -> Path:
    """Download, verify and assemble ``lock`` into ``<cache>/toolchains/cuda-X.Y.Z``; idempotent.

    ``environ`` is the caller's environment: apt-get, pip and nvcc run in it. ``reporter``
    gets the plan (files, sizes, destination) before any download, the bytes as they
    arrive, each package's bytes as it is unpacked, and each phase. Once the assembled
    nvcc answers with the pinned version, the downloaded files and the private apt lists
    are removed (their sha256 and sizes stay in the tree's marker), and files identical
    to an already provisioned variant's (``-dev``) are hard links to them.
    """
    base = cachelayout.bucket(cache, "toolchains")
    final = base / lock.dirname
    confine.folder_in_cache(cache, "toolchains", what="toolchains folder")  # no link
    with locking.held(base / f".{lock.dirname}.lock"):
        if (final / MARKER).is_file():
            return final
        # One provision at a time uses downloads/: another variant's removes the files.
        with locking.held(base / ".downloads.lock"):
            _provision(lock, base, final, environ, reporter)
        reporter.info(f"CUDA {lock.version}: ready at {final}")
        return final


def _provision(
    lock: ToolkitLock, base: Path, final: Path, environ: Mapping[str, str], reporter: Reporter
) -> None:
    downloads = base / "downloads"
    reporter.info(download_plan(lock, downloads))
    expected = sum(size for _, size in lock.files_to_fetch()) or None
    what = f"downloading CUDA {lock.version}"
    with watch_bytes(reporter, what, downloads, expected=expected):
        debs = fetch_debs(lock, downloads, base / "apt", environ, reporter)
        wheels = [fetch_wheel(pin, downloads, environ) for pin in lock.wheels]
    sizes = {p.name: p.stat().st_size for p in (*debs, *wheels)}
    reporter.info(f"CUDA {lock.version}: sha256 verified; unpacking into {final}")
    with atomic_dir(final) as tmp:
        for pin, path in zip(lock.debs, debs, strict=True):
            with reporter.transfer(f"CUDA {lock.version}: unpacking {path.name}",
                                   sizes[path.name]) as advance:  # fmt: skip
                unpack_deb(path, pin, tmp, advance)
        for wpin, path in zip(lock.wheels, wheels, strict=True):
            with reporter.transfer(f"CUDA {lock.version}: unpacking {path.name}",
                                   sizes[path.name]) as advance:  # fmt: skip
                unpack_wheel(path, wpin, tmp, advance)
        for junk in tmp.rglob("__init__.py"):  # the wheels' namespace stubs
            junk.unlink()
        for so in sorted((tmp / "lib64").glob("libcudart.so.1[0-9]")):
            # torch's CUDAExtension links -lcudart: it needs the unversioned name.
            if not (tmp / "lib64" / "libcudart.so").exists():
                (tmp / "lib64" / "libcudart.so").symlink_to(so.name)
        atomic_write_text(tmp / "bin" / "nvcc.profile", NVCC_PROFILE)
        reporter.info(f"CUDA {lock.version}: checking the assembled nvcc")
        found = nvcc_version(tmp / "bin" / "nvcc", env=environ)
        if found != lock.version:
            raise ToolchainError(
                f"assembled nvcc reports {found}, the lock says {lock.version}",
                where=f"toolchain lock for CUDA {lock.version}",
                next="fix LOCKS in pinwheel/compile/toolchain/pins.py",
            )
        shared, shared_with = 0, None
        for sibling in variants(base, lock):
            shared, shared_with = link_twins(tmp, sibling), sibling.name
            if shared:
                reporter.info(
                    f"CUDA {lock.version}: {human_bytes(shared)} of identical files hard-linked "
                    f"to {sibling.name} (one copy on disk)"
                )
                break
        record = {
            "version": lock.version,
            "debs": {p.filename: p.sha256 for p in lock.debs},
            "wheels": {p.filename: p.sha256 for p in lock.wheels},
            "sizes": dict(sorted(sizes.items())),
            "kept": {
                "tree_bytes": tree_bytes(tmp),
                "shared_bytes": shared,
                "shared_with": shared_with if shared else None,
                "downloads": "removed once the assembled nvcc answered with the pinned version",
            },
        }
        tmp.chmod(0o755)  # mkdtemp made it private; the toolkit is for every user
        atomic_write_text(tmp / MARKER, json.dumps(record, indent=2, sort_keys=True) + "\n")
    removed = _remove_downloads(base, [*debs, *wheels])
    kept = record["kept"]
    assert isinstance(kept, dict)
    reporter.info(
        f"CUDA {lock.version}: removed the downloaded files ({human_bytes(removed)}) and the "
        f"private apt lists; kept the tree ({human_bytes(kept['tree_bytes'])}) and each "
        f"file's sha256 and size in {final / MARKER}"
    )


def _remove_downloads(base: Path, files: list[Path]) -> int:
    """Delete the verified downloads (and apt's private state) of a published tree; the
    bytes freed. ``downloads/`` goes when nothing else is in it."""
    freed = 0
    for path in files:
        with contextlib.suppress(FileNotFoundError):
            freed += path.lstat().st_size
            confine.remove(base, path)
    confine.remove(base, base / "apt")
    downloads = base / "downloads"
    with contextlib.suppress(OSError):  # not empty (another version's files) or gone
        downloads.rmdir()
    return freed


def kept(tree: Path) -> str:
    """What a provisioned tree keeps on disk, from its marker (read as an untrusted
    document: the cache is data), and any of its downloads still beside it."""
    try:
        doc = untrusted.read_json(tree / MARKER, untrusted.TOOLKIT_MARKER)
    except PinwheelError as exc:
        return f"its record is unreadable: {exc.what}"
    record = doc if isinstance(doc, dict) else {}
    names = [n for key in ("debs", "wheels") if isinstance(record.get(key), dict)
             for n in record[key]]  # fmt: skip
    downloads = tree.parent / "downloads"
    left = 0
    for name in names:
        st = confine.lstat_beneath(downloads, name) if downloads.is_dir() else None
        if st is not None and stat.S_ISREG(st.st_mode):
            left += st.st_size
    still = (
        f"; {human_bytes(left)} of its downloaded files are still in {downloads} (nothing "
        "reads them once the tree is provisioned: they may be deleted)"
        if left else ""
    )  # fmt: skip
    k = record.get("kept")
    sizes = record.get("sizes")
    if not isinstance(k, dict) or not isinstance(k.get("tree_bytes"), int):
        return "provisioned by an earlier pinwheel (no record of its size)" + still
    share = k.get("shared_bytes")
    shared = (
        f", {human_bytes(share)} of it hard links to {k.get('shared_with')}"
        if isinstance(share, int) and share else ""
    )  # fmt: skip
    got = sum(v for v in sizes.values() if isinstance(v, int)) if isinstance(sizes, dict) else 0
    return (
        f"keeps the assembled tree only: {human_bytes(k['tree_bytes'])}{shared}; the "
        f"{len(names)} downloaded files ({human_bytes(got)}) were removed once it was verified, "
        f"the sha256 and size of each is in {tree / MARKER}{still}"
    )

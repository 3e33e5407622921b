"""A toolkit's passing arch probe, remembered: a no-change build does not compile it again.

:func:`pinwheel.compile.toolchain.toolkit.probe_arches` compiles a tiny kernel per arch
(1.5 to 3.6 s on two cores), on every build: a tenth to a third of a no-change build's
time. A probe that passed is recorded under ``<cache>/memo/toolkit-probes/<key>.json``,
the key being everything the probe's outcome depends on:

- the probe's source and the arches;
- the stamp (size, mtime, ctime, inode, device) of nvcc and of the tools it runs
  (cicc, ptxas, fatbinary, nvlink, cudafe++, the nvcc.profile), so another or a
  replaced toolkit is probed again;
- the host compiler nvcc would run: ``gcc``, ``g++``, ``cc`` and ``c++`` as the probe's
  PATH resolves them (the real file and its stamp) and the variables that choose or
  flag it (``NVCC_CCBIN``, ``NVCC_PREPEND_FLAGS``, ``NVCC_APPEND_FLAGS``).

Only a pass is recorded; a failing probe runs (and fails, saying why) every time. The
record is read bounded and never through a link (:mod:`pinwheel.untrusted`); a malformed
one is no record. Like every memo it is per cache, never shared.

In: nvcc, the arches, the probe's environment, the cache. Out: whether the probe is
known to pass (:func:`passed`), and :func:`remember` after one did.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from pinwheel import confine, options, untrusted
from pinwheel.compile import derivation
from pinwheel.errors import PinwheelError

FORMAT = 1
SUBDIR = Path("memo") / "toolkit-probes"
# The toolkit's own programs nvcc runs for a probe (relative to the toolkit root).
TOOLS = ("bin/nvcc", "bin/nvcc.profile", "bin/ptxas", "bin/fatbinary", "bin/nvlink",
         "bin/cudafe++", "nvvm/bin/cicc")  # fmt: skip
HOST_COMPILERS = ("gcc", "g++", "cc", "c++")
HOST_ENV = ("NVCC_CCBIN", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")
KIND = untrusted.Kind(
    "toolkit probe record", 64 * 1024, 4, PinwheelError, "nothing: the probe runs again"
)


def _stamp(path: Path) -> list[object]:
    """The file behind ``path`` and its stamp; a missing one is recorded as missing."""
    try:
        real = path.resolve(strict=True)
        st = real.stat()
    except OSError:
        return [str(path), None]
    return [str(real), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def key(nvcc: Path, arches: tuple[str, ...], env: Mapping[str, str], probe_source: str) -> str:
    root = Path(nvcc).parent.parent
    search = options.value(env, "PATH", os.defpath)
    facts = {
        "format": FORMAT,
        "probe": hashlib.sha256(probe_source.encode()).hexdigest(),
        "arches": list(arches),
        "nvcc": _stamp(Path(nvcc)),
        "tools": [_stamp(root / rel) for rel in TOOLS],
        "host": [[name, _stamp(Path(found)) if (found := shutil.which(name, path=search))
                  else None] for name in HOST_COMPILERS],  # fmt: skip
        "host_env": {**dict.fromkeys(HOST_ENV), **options.select(env, HOST_ENV)},
    }
    return derivation.digest(facts)


def passed(cache: Path | None, probe_key: str) -> bool:
    """Whether a probe with ``probe_key`` passed before (a well-formed record says so)."""
    if cache is None:
        return False
    folder = Path(cache) / SUBDIR
    try:  # bounded, never through a link, no FIFO waited on
        doc = untrusted.parse_json(untrusted.read_beneath(folder, f"{probe_key}.json", KIND),
                                   KIND, str(folder / f"{probe_key}.json"))  # fmt: skip
    except PinwheelError:
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("key") == probe_key


def remember(cache: Path | None, probe_key: str, arches: tuple[str, ...]) -> None:
    """After a probe passed: its record (atomic)."""
    if cache is None:
        return
    doc = {"format": FORMAT, "key": probe_key, "arches": list(arches)}
    text = json.dumps(doc, sort_keys=True) + "\n"
    try:  # every folder from the cache down opened O_NOFOLLOW: a planted link is refused
        confine.write_beneath(Path(cache), f"{SUBDIR}/{probe_key}.json", text.encode())
    except confine.Escape:  # a record only saves a probe: without it the probe runs again
        return

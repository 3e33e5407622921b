"""The fidelity panel: pinned token windows (JSON, sha256-pinned) read and written.

In: a panel file (``{"schema": "pinwheel.panel/1", "windows": [[ids...], ...]}`` or
``texts`` tokenized by the server). Out: a :class:`Panel` (its windows and sha256).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pinwheel import documents
from pinwheel.checksums import sha256_file
from pinwheel.errors import UsageError, VerifyError
from pinwheel.fsutil import atomic_write_bytes

PANEL_SCHEMA = "pinwheel.panel/1"


@dataclass(frozen=True)
class Panel:
    windows: tuple[tuple[int, ...], ...]
    sha256: str
    path: str

    @property
    def positions(self) -> int:
        return sum(len(w) - 1 for w in self.windows)


def read_panel(
    path: Path,
    sha256: str | None,
    tokenize: Callable[[str], list[int]] | None = None,
) -> Panel:
    """Read and check a panel; a ``texts`` panel needs ``tokenize`` (the server's)."""
    if not path.is_file():
        raise UsageError(
            f"no panel file at {path}",
            where="[qualify.fidelity].panel",
            next="commit the panel JSON beside the manifest, or fix its path",
        )
    digest = sha256_file(path)
    if sha256 is not None and digest != sha256:
        raise VerifyError(
            f"panel sha256 is {digest}, the manifest pins {sha256}",
            where=str(path),
            next="restore the pinned panel, or review the change and pin the new sha256",
        )
    from pinwheel import untrusted

    data = untrusted.read_json(path, untrusted.PANEL)
    if not isinstance(data, dict) or data.get("schema") != PANEL_SCHEMA:
        raise UsageError(
            f"the panel's schema is not {PANEL_SCHEMA!r}",
            where=str(path),
            next='write {"schema": "pinwheel.panel/1", "windows": [[token ids...], ...]}',
        )
    untrusted.decode(documents.PanelDoc, data, untrusted.PANEL, str(path))  # types, field by field
    windows: list[tuple[int, ...]] = []
    if "windows" in data:
        for w in data["windows"]:
            if not isinstance(w, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in w
            ):
                raise UsageError(
                    "a window is not a list of token ids (0 to 2^31-1: the teacher stores int32)",
                    where=str(path),
                    next="write token ids the model's tokenizer gave, then pin the new sha256",
                )
            windows.append(tuple(w))
    elif "texts" in data:
        size = data.get("window")
        if tokenize is None:
            raise UsageError(
                "a texts panel needs the server's tokenizer",
                where=str(path),
                next="pass a server (--url) or write token windows into the panel",
            )
        for text in data["texts"]:
            ids = tokenize(str(text))
            windows.append(tuple(ids[:size] if isinstance(size, int) else ids))
    if any(not 0 <= t < 2**31 for w in windows for t in w):  # a texts panel's tokenizer
        raise UsageError(
            "a token id outside 0..2^31-1 (the teacher stores int32)",
            where=str(path),
            next="check the server's tokenizer (`curl URL/tokenize`)",
        )
    if not windows or any(len(w) < 2 for w in windows):
        raise UsageError(
            "the panel needs at least one window of two or more tokens", where=str(path)
        )
    return Panel(tuple(windows), digest, str(path))


def write_panel(path: Path, windows: Sequence[Sequence[int]]) -> str:
    """Write a token-window panel; returns its sha256 (to pin in the manifest)."""
    text = json.dumps({"schema": PANEL_SCHEMA, "windows": [list(w) for w in windows]})
    atomic_write_bytes(path, text.encode() + b"\n")
    return hashlib.sha256(text.encode() + b"\n").hexdigest()

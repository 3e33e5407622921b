"""The model pack: ``[model]`` pins a hub repo and what a good download looks like.

``pinwheel model check DIR`` works offline: every shard that
``model.safetensors.index.json`` names is present with exactly the size its
safetensors header implies (8-byte little-endian header length + JSON header
+ the largest ``data_offsets`` end), the shard count and total bytes are as
pinned, config.json carries the required values (``quant_method = "exl3"``),
and pinned file hashes match. All problems are reported together.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel.checksums import sha256_files
from pinwheel.errors import PinwheelError, VerifyError
from pinwheel.manifest.release import ModelConfig

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_HEADER = 100 * 1024 * 1024  # the format's own limit; larger means a corrupt file


# --------------------------------------------------------------------------- safetensors


def safetensors_layout(path: Path) -> tuple[int, set[str]]:
    """(file size the header implies, tensor names) for one .safetensors file."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise ValueError("shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER:
            raise ValueError(f"header length {n} is implausible (corrupt file)")
        blob = fh.read(n)
    if len(blob) < n:
        raise ValueError(f"truncated inside the {n}-byte header")
    try:
        header = json.loads(blob)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"header is not JSON: {exc}") from None
    end = 0
    names = set()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ValueError(f"tensor {name!r} has no data_offsets")
        end = max(end, int(offsets[1]))
        names.add(name)
    return 8 + n + end, names


# --------------------------------------------------------------------------- check


@dataclass(frozen=True)
class ModelReport:
    dir: Path
    shards: tuple[str, ...]
    total_bytes: int
    hashed: tuple[str, ...]


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    """A dotted key in config.json; multimodal configs nest the text model's under text_config."""
    for root in (config, config.get("text_config")):
        value: Any = root
        for part in dotted.split("."):
            if not isinstance(value, dict) or part not in value:
                value = _ABSENT
                break
            value = value[part]
        if value is not _ABSENT:
            return value
    return _ABSENT


_ABSENT = object()


def _same(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, bool) or isinstance(actual, bool):
        return actual is wanted
    if isinstance(wanted, (int, float)) and isinstance(actual, (int, float)):
        return float(actual) == float(wanted)
    return bool(actual == wanted)


def check_model(directory: Path, pack: ModelConfig, *, hashes: bool = True) -> ModelReport:
    directory = Path(directory)
    problems: list[str] = []
    index_path = directory / INDEX
    weight_map: dict[str, str] = {}
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text())
            weight_map = dict(index["weight_map"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise VerifyError(
                f"unreadable index: {exc}",
                where=str(index_path),
                next="download the pack again (`pinwheel model fetch`)",
            ) from None
        shards = sorted(set(weight_map.values()))
    elif (directory / SINGLE).is_file():
        shards = [SINGLE]
    else:
        raise VerifyError(
            f"neither {INDEX} nor {SINGLE} in {directory}",
            where=str(directory),
            next="run `pinwheel model fetch`, or point at the model directory",
        )

    total = 0
    for shard in shards:
        path = directory / shard
        if not path.is_file():
            problems.append(f"{shard}: missing")
            continue
        size = path.stat().st_size
        total += size
        try:
            implied, names = safetensors_layout(path)
        except (OSError, ValueError) as exc:
            problems.append(f"{shard}: {exc}")
            continue
        if size != implied:
            state = "truncated" if size < implied else "has trailing bytes"
            problems.append(f"{shard}: {state}: {size} bytes, header implies {implied}")
        lost = sorted(t for t, s in weight_map.items() if s == shard and t not in names)
        if lost:
            problems.append(
                f"{shard}: {len(lost)} tensors the index names are not in it (first: {lost[0]})"
            )

    if pack.shards is not None and len(shards) != pack.shards:
        problems.append(f"{len(shards)} shards, [model] shards pins {pack.shards}")
    if (
        pack.total_bytes is not None
        and total != pack.total_bytes
        and not any("missing" in p for p in problems)
    ):
        problems.append(f"shards total {total} bytes, [model] total_bytes pins {pack.total_bytes}")

    config_path = directory / "config.json"
    if pack.config:
        try:
            config = json.loads(config_path.read_text())
        except FileNotFoundError:
            config = None
            problems.append("config.json: missing")
        except json.JSONDecodeError as exc:
            config = None
            problems.append(f"config.json: not JSON: {exc}")
        if isinstance(config, dict):
            for key, wanted in pack.config.items():
                actual = _lookup(config, key)
                if actual is _ABSENT:
                    problems.append(
                        f"config.json: {key} absent, [model.config] requires {wanted!r}"
                    )
                elif not _same(actual, wanted):
                    problems.append(
                        f"config.json: {key} = {actual!r}, [model.config] requires {wanted!r}"
                    )

    hashed: list[str] = []
    if hashes and pack.sha256:
        present = [n for n in pack.sha256 if (directory / n).is_file()]
        problems += [
            f"{n}: missing (hash pinned)"
            for n in pack.sha256
            if n not in present and n not in shards
        ]
        digests = sha256_files([directory / n for n in present])
        for name in present:
            if digests[directory / name] != pack.sha256[name]:
                problems.append(
                    f"{name}: sha256 {digests[directory / name]}, pinned {pack.sha256[name]}"
                )
        hashed = present

    if problems:
        raise VerifyError(
            f"model pack check failed ({len(problems)} problems):\n    " + "\n    ".join(problems),
            where=f"{directory} against [model] {pack.repo or '(repo unset)'}"
            + (f"@{pack.revision[:12]}" if pack.revision else ""),
            next="run `pinwheel model fetch` to complete or repair the download",
        )
    return ModelReport(dir=directory, shards=tuple(shards), total_bytes=total, hashed=tuple(hashed))


def fetch_model(pack: ModelConfig, local_dir: Path) -> ModelReport:
    """snapshot_download at the pinned revision, then the offline check (hub part untested)."""
    if pack.repo is None:
        raise PinwheelError(
            "[model] has no repo",
            where="[model] key 'repo'",
            next='set repo = "<org>/<name>" of the model pack on the hub',
        )
    if pack.revision is None:  # a branch name would move under us: only a commit pins
        raise PinwheelError(
            f"[model] {pack.repo} has no pinned revision",
            where="[model] key 'revision'",
            next='pin the hub commit: revision = "<40-hex commit>"',
        )
    from pinwheel.release import hub

    hub.snapshot_download(repo=pack.repo, revision=pack.revision, local_dir=local_dir)
    return check_model(local_dir, pack)

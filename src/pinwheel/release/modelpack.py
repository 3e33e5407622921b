"""The model pack: ``[model]`` pins a hub repo and what a good download looks like.

``pinwheel model check DIR`` works offline: every shard that
``model.safetensors.index.json`` names is present with exactly the size its
safetensors header implies (8-byte little-endian header length + JSON header
+ the largest ``data_offsets`` end), the shard count and total bytes are as
pinned, config.json carries the required values (``quant_method = "exl3"``),
and pinned file hashes match. All problems are reported together.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import confine, documents, untrusted, validate
from pinwheel.checksums import sha256_files
from pinwheel.errors import ManifestError, PinwheelError, UsageError, VerifyError
from pinwheel.manifest.release import ModelConfig

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_HEADER = documents.MAX_HEADER


# --------------------------------------------------------------------------- safetensors


def safetensors_layout(path: Path) -> tuple[int, set[str]]:
    """(file size the header implies, tensor names) for one .safetensors file, its header
    checked by :func:`pinwheel.documents.safetensors_header` (dtypes, shapes, offsets)."""
    layout = documents.safetensors_header(path)
    return layout.file_size, set(layout.tensors)


# --------------------------------------------------------------------------- check


@dataclass(frozen=True)
class ModelReport:
    dir: Path
    shards: tuple[str, ...]
    total_bytes: int
    hashed: tuple[str, ...]


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    """A dotted key in config.json; multimodal configs nest the text model's under text_config."""
    for root in (config, config.get("text_config")):  # a Mapping: decoded JSON
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


def _member(directory: Path, name: str) -> tuple[Path | None, str | None]:
    """(path, None) for a file name inside the pack, or (None, why) when it climbs out:
    an absolute name, '..', or a symlink (the file or a folder) that leads outside."""
    if not isinstance(name, str) or validate.rel_path_problem(name):
        return None, f"{str(name)[:120]!r}: not a path inside the pack"
    try:
        path = confine.inside(directory, name, what="model file")
    except confine.Escape:
        return None, f"{name}: reached through a symlink out of the pack"
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(Path(os.path.realpath(directory))):
        return None, f"{name}: a symlink out of the pack (-> {real})"
    return path, None


def check_model(directory: Path, pack: ModelConfig, *, hashes: bool = True) -> ModelReport:
    directory = Path(directory)
    for fixed in (INDEX, SINGLE, "config.json"):
        _, escape = _member(directory, fixed)
        if escape:
            raise VerifyError(
                f"model pack file {escape}",
                where=str(directory),
                next="replace the symlink with the file itself (`pinwheel model fetch`)",
            )
    if not directory.is_dir():  # the command line names no pack: nothing was verified
        raise UsageError(
            f"{directory} is {'a file' if directory.exists() else 'missing'}, not a directory",
            where=str(directory),
            next="pass the model pack's directory: `pinwheel model check DIR`",
        )
    shards, weight_map = _shards_of(directory)
    problems: list[str] = []
    total = 0
    for shard in shards:
        size, found = _shard_problems(directory, shard, weight_map)
        total += size
        problems += found

    if pack.shards is not None and len(shards) != pack.shards:
        problems.append(f"{len(shards)} shards, [model] shards pins {pack.shards}")
    if (
        pack.total_bytes is not None
        and total != pack.total_bytes
        and not any("missing" in p for p in problems)
    ):
        problems.append(f"shards total {total} bytes, [model] total_bytes pins {pack.total_bytes}")
    problems += _config_problems(directory, pack)
    hashed: list[str] = []
    if hashes and pack.sha256:
        hashed, found = _hash_problems(directory, pack, shards)
        problems += found

    if problems:
        raise VerifyError(
            f"model pack check failed ({len(problems)} problems):\n    " + "\n    ".join(problems),
            where=f"{directory} against [model] {pack.repo or '(repo unset)'}"
            + (f"@{pack.revision[:12]}" if pack.revision else ""),
            next="run `pinwheel model fetch` to complete or repair the download",
        )
    return ModelReport(dir=directory, shards=tuple(shards), total_bytes=total, hashed=tuple(hashed))


def _shards_of(directory: Path) -> tuple[list[str], dict[str, str]]:
    """The shard files (from the index, else the single file) and the index's weight map."""
    index_path = directory / INDEX
    weight_map: dict[str, str] = {}
    if index_path.exists():
        index = untrusted.load(index_path, documents.ModelIndexDoc, untrusted.MODEL_INDEX)
        weight_map = dict(index.weight_map)
        shards = sorted(set(weight_map.values()))
    elif (directory / SINGLE).is_file():
        shards = [SINGLE]
    else:
        raise VerifyError(
            f"neither {INDEX} nor {SINGLE} in {directory}",
            where=str(directory),
            next="run `pinwheel model fetch`, or point at the model directory",
        )
    return shards, weight_map


def _shard_problems(
    directory: Path, shard: str, weight_map: Mapping[str, str]
) -> tuple[int, list[str]]:
    """(the shard's size, what is wrong with it): present, a file, as long as its header
    says, holding every tensor the index puts in it."""
    path, escape = _member(directory, shard)
    if path is None:
        return 0, [escape or shard]
    if path.is_dir():
        return 0, [f"{shard}: a directory, not a shard file"]
    if not path.is_file():
        return 0, [f"{shard}: missing"]
    size = path.stat().st_size
    try:
        implied, names = safetensors_layout(path)
    except PinwheelError as exc:
        return size, [f"{shard}: {exc.what}"]
    except OSError as exc:
        return size, [f"{shard}: cannot read: {exc.strerror or exc}"]
    problems = []
    if size != implied:
        state = "truncated" if size < implied else "has trailing bytes"
        problems.append(f"{shard}: {state}: {size} bytes, header implies {implied}")
    lost = sorted(t for t, s in weight_map.items() if s == shard and t not in names)
    if lost:
        problems.append(
            f"{shard}: {len(lost)} tensors the index names are not in it (first: {lost[0]})"
        )
    return size, problems


def _config_problems(directory: Path, pack: ModelConfig) -> list[str]:
    """config.json against every ``[model.config]`` key."""
    if not pack.config:
        return []
    try:
        config = documents.model_config(directory / "config.json")
    except PinwheelError as exc:
        return [exc.what]
    problems = []
    for key, wanted in pack.config.items():
        actual = _lookup(config, key)
        if actual is _ABSENT:
            problems.append(f"config.json: {key} absent, [model.config] requires {wanted!r}")
        elif not _same(actual, wanted):
            problems.append(
                f"config.json: {key} = {actual!r}, [model.config] requires {wanted!r}"
            )
    return problems


def _hash_problems(
    directory: Path, pack: ModelConfig, shards: list[str]
) -> tuple[list[str], list[str]]:
    """(the files hashed, what is wrong): every ``[model.sha256]`` file inside the pack,
    present (a missing shard is reported once, above) and with its pinned sha256."""
    problems: list[str] = []
    inside: list[str] = []
    for n in pack.sha256:
        member, escape = _member(directory, n)
        if member is None:
            problems.append(escape or n)
        else:
            inside.append(n)
    present = [n for n in inside if (directory / n).is_file()]
    problems += [
        f"{n}: missing (hash pinned)" for n in inside if n not in present and n not in shards
    ]
    digests = sha256_files([directory / n for n in present])
    for name in present:
        if digests[directory / name] != pack.sha256[name]:
            problems.append(
                f"{name}: sha256 {digests[directory / name]}, pinned {pack.sha256[name]}"
            )
    return present, problems


def fetch_model(pack: ModelConfig, local_dir: Path) -> ModelReport:
    """snapshot_download at the pinned revision, then the offline check (hub part untested)."""
    if pack.repo is None:
        raise ManifestError(
            "[model] has no repo",
            where="[model] key 'repo'",
            next='set repo = "<org>/<name>" of the model pack on the hub',
        )
    if pack.revision is None:  # a branch name would move under us: only a commit pins
        raise ManifestError(
            f"[model] {pack.repo} has no pinned revision",
            where="[model] key 'revision'",
            next='pin the hub commit: revision = "<40-hex commit>"',
        )
    from pinwheel.release import hub

    hub.snapshot_download(repo=pack.repo, revision=pack.revision, local_dir=local_dir)
    return check_model(local_dir, pack)

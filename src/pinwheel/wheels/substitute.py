"""An explicit toolchain substitution: build with another CUDA or gcc than ``[build]`` pins.

The manifest pins the card's toolchain (``[build] cuda``, ``[build] gcc``). Where that
cannot be had (a machine that reaches only Debian's CUDA 12.4, or whose glibc is too old
for Debian trixie's gcc-14), the build stops and names this way out: ``--substitute
cuda=12.4`` on the command line, or ``[build.substitute]`` in the manifest. Never silent:
:func:`apply` returns each substitution, and the build records them in provenance.json,
``pinwheel check`` prints them and the release notes' first line states them.

In: the manifest's ``[build]`` and the ``--substitute KEY=VALUE`` flags. Out: the
effective ``[build]`` and the frozen :class:`Substitution` records.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pinwheel.errors import UsageError
from pinwheel.manifest.build import BuildConfig
from pinwheel.manifest.targets import cuda_fits, fitting_cudas, target_problems

# What may be substituted, and how its value is written.
SUBSTITUTABLE: dict[str, re.Pattern[str]] = {
    "cuda": re.compile(r"[0-9]{1,2}\.[0-9]{1,2}"),
    "gcc": re.compile(r"[1-9][0-9]?"),
}
NAMES = {"cuda": "CUDA", "gcc": "gcc/g++"}


@dataclass(frozen=True)
class Substitution:
    key: str  # "cuda" | "gcc"
    pinned: str  # what [build] pins (the card's)
    used: str  # what the build used instead
    source: str  # "--substitute" | "[build.substitute]"
    reason: str | None = None

    def sentence(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return (
            f"{NAMES.get(self.key, self.key)} {self.used} instead of {self.pinned} "
            f"([build] {self.key}; {self.source}{why})"
        )


def parse_flags(values: Sequence[str]) -> dict[str, str]:
    """``["cuda=12.4", "gcc=12"]`` -> ``{"cuda": "12.4", "gcc": "12"}``, validated."""
    out: dict[str, str] = {}
    for text in values:
        key, sep, value = text.partition("=")
        pattern = SUBSTITUTABLE.get(key)
        if not sep or pattern is None or not pattern.fullmatch(value):
            raise UsageError(
                f"--substitute {text!r}: expected cuda=MAJOR.MINOR or gcc=MAJOR",
                where="--substitute",
                next="pass e.g. --substitute cuda=12.4 --substitute gcc=12",
            )
        out[key] = value
    return out


def cuda_advice(config: BuildConfig, offered: Sequence[str]) -> str | None:
    """``--substitute cuda=V`` for the ``offered`` (provisionable) CUDA versions that compile
    every one of ``[build] arches`` (and match the torch index's CUDA major); never one
    that the manifest's arches refuse. None when none does."""
    fits = fitting_cudas(tuple(offered), config.arches, config.torch_index)
    if not fits:
        return None
    which = (
        f"{fits[0]}, the provisionable CUDA"
        if len(fits) == 1
        else f"V, V one of the provisionable CUDAs {', '.join(fits)},"
    )
    return (
        f"--substitute cuda={which} that compiles {', '.join(config.arches)} (provenance.json, "
        "`pinwheel check` and the release notes' first line then say so)"
    )


def no_cuda_fits(config: BuildConfig, offered: Sequence[str]) -> str:
    """The way on when no provisionable CUDA compiles the manifest's arches."""
    return (
        f"no provisionable CUDA ({', '.join(offered) or 'none'}) compiles every one of "
        f"[build] arches ({', '.join(config.arches)}): install one that does and set "
        "CUDA_HOME to it"
    )


def apply(
    config: BuildConfig,
    flags: Mapping[str, str] | None = None,
    provisionable: Sequence[str] = (),
) -> tuple[BuildConfig, tuple[Substitution, ...]]:
    """The effective ``[build]``: the manifest's substitutions, then the flags' (flags win).

    A substituted CUDA the arches refuse is an error whose way on is another substitution
    from ``provisionable`` that fits (see :func:`cuda_advice`), not an edit of ``[build]``."""
    wanted = {k: (v, "[build.substitute]") for k, v in config.substitute}
    wanted |= {k: (v, "--substitute") for k, v in (flags or {}).items()}
    subs: list[Substitution] = []
    changes: dict[str, str] = {}
    for key, (value, source) in sorted(wanted.items()):
        pinned = getattr(config, key)
        if pinned is None:
            raise UsageError(
                f"{source} {key}={value}: [build] pins no {key} to substitute",
                where=source,
                next=f"drop the {key} substitution (the build uses whatever {key} it finds)",
            )
        if value == pinned:
            continue  # the pinned toolchain itself: nothing substituted
        reason = config.substitute_reason if source == "[build.substitute]" else None
        subs.append(Substitution(key, pinned, value, source, reason))
        changes[key] = value
    if not changes:
        return config, ()
    effective = dataclasses.replace(
        config, cuda=changes.get("cuda", config.cuda), gcc=changes.get("gcc", config.gcc)
    )
    problems = target_problems(
        effective.cuda, effective.arches, effective.torch, effective.torch_index
    )
    if problems:
        cuda_sub = next((s for s in subs if s.key == "cuda"), None)
        bad_cuda = cuda_sub is not None and not cuda_fits(
            effective.cuda, effective.arches, effective.torch_index
        )
        if cuda_sub is not None and bad_cuda:
            advice = cuda_advice(config, provisionable)
            if advice is None:
                way = no_cuda_fits(config, provisionable)
            elif cuda_sub.source == "[build.substitute]":
                way = f"change [build.substitute] cuda, or pass {advice}"
            else:
                way = f"use {advice}"
            what = next((p.what for p in problems if p.key == "cuda"), problems[0].what)
            raise UsageError(
                f"the substituted toolchain cannot build this: {what}",
                where=f"{cuda_sub.source} cuda={cuda_sub.used}",
                next=way,
            )
        raise UsageError(
            f"the substituted toolchain cannot build this: {problems[0].what}",
            where=subs[0].source,
            next=problems[0].fix,
        )
    return effective, tuple(subs)


def to_json(subs: Iterable[Substitution]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(s) for s in subs]


def from_receipt(receipt: Mapping[str, Any]) -> tuple[Substitution, ...]:
    """The substitutions a provenance receipt records (none for an older receipt)."""
    out = []
    for item in receipt.get("substitutions") or ():
        if isinstance(item, dict) and {"key", "pinned", "used", "source"} <= item.keys():
            out.append(
                Substitution(
                    str(item["key"]),
                    str(item["pinned"]),
                    str(item["used"]),
                    str(item["source"]),
                    str(item["reason"]) if item.get("reason") else None,
                )
            )
    return tuple(out)


def headline(subs: Sequence[Substitution]) -> str | None:
    """One line for the top of the release notes and check's report; None without any."""
    if not subs:
        return None
    return "SUBSTITUTED TOOLCHAIN (not the one [build] pins): " + "; ".join(
        s.sentence() for s in subs
    )


_GCC_VERSION = re.compile(r"(\d+)\.\d+(?:\.\d+)?\s*$")


def undeclared(receipt: Mapping[str, Any], config: BuildConfig) -> list[str]:
    """Toolchain differences between a build's receipt and ``[build]`` that no recorded
    substitution explains (a silent substitution: ``check`` fails on it)."""
    declared = {s.key for s in from_receipt(receipt)}
    facts = receipt.get("toolchain") or {}
    problems = []
    cuda = str(facts.get("cuda") or "")
    if cuda and "cuda" not in declared and cuda.split(".")[:2] != config.cuda.split(".")[:2]:
        problems.append(
            f"built with CUDA {cuda}, [build] pins {config.cuda}, and no substitution is recorded"
        )
    gcc = _GCC_VERSION.search(str(facts.get("gcc") or ""))
    if config.gcc and gcc and "gcc" not in declared and gcc.group(1) != config.gcc:
        problems.append(
            f"built with gcc/g++ {gcc.group(1)}, [build] pins {config.gcc}, and no substitution "
            "is recorded"
        )
    return problems

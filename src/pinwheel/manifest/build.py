"""The ``[build]`` and ``[[kernel]]`` tables: what wheels are built with, for what, from what."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from pinwheel import validate
from pinwheel.cudaarch import CudaArch, cmake_architectures, parse_dotted, targets, torch_arch_list
from pinwheel.errors import ManifestError, UsageError
from pinwheel.manifest.steps import Step, parse_step
from pinwheel.manifest.table import Table, check_file_sha
from pinwheel.manifest.targets import target_problems

_CUDA = re.compile(r"^(\d+)\.(\d+)$")
_PY = re.compile(r"^3\.\d+$")
_GLIBC = re.compile(r"2\.([0-9]{1,3})")  # ASCII digits only: "2.٣١" is refused


BUILD_KEYS = (
    "python",
    "cuda",
    "arches",
    "ptx",
    "torch",
    "label",
    "version",
    "env",
    "required_members",
    "runner_labels",
    "source",
    "exclude",
    "requirements",
    "cuda_dev",
    "network",
    "torch_index",
    "cache",
    "max_glibc",
    "gcc",
    "substitute",
    "torch_lock",
)
SOURCE_KEYS = (
    "name", "url", "commit", "ref", "variables", "patches", "submodule", "exclude", "omit",
    "reason", "used",
)  # fmt: skip
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NETWORK = ("none", "allowed")


@dataclass(frozen=True)
class Submodule:
    """A git submodule of a build source, pinned by the gitlink its commit records."""

    path: str  # inside the source, e.g. "csrc/cutlass"
    url: str
    commit: str
    exclude: tuple[str, ...] = ()  # pathspecs left out (blobs a mirror lacks)


@dataclass(frozen=True)
class BuildSource:
    """One ``[[build.source]]``: source code the engine's own build would download, pinned.

    The build hands it to the project through ``variables`` (the project's
    ``*_SRC_DIR`` override and ``FETCHCONTENT_SOURCE_DIR_<NAME>``), after applying
    ``patches`` (paths in the replayed tree: the declaration's PATCH_COMMAND, which an
    override skips). ``omit`` leaves a stand-in holding only a marker file, said in
    provenance and notes.
    """

    name: str  # the FetchContent name, e.g. "vllm-flash-attn"
    url: str | None
    commit: str | None
    ref: str | None  # what the declaration names (a tag or branch), for humans and drift
    variables: tuple[str, ...]
    patches: tuple[str, ...]
    submodules: tuple[Submodule, ...]
    exclude: tuple[str, ...]  # pathspecs left out of the export (blobs a mirror lacks)
    omit: bool
    reason: str | None
    used: str | None  # "yes" | "no" | "unknown": as `lock` found it for the arches

    @property
    def fetchcontent_var(self) -> str:
        return "FETCHCONTENT_SOURCE_DIR_" + self.name.upper()  # CMake keeps the dashes


@dataclass(frozen=True)
class Requirements:
    """A hashed requirements file (pip --require-hashes) for the isolated build environment."""

    path: Path
    sha256: str


CACHE_BACKENDS = ("local", "redis", "s3", "gha")
CACHE_KEYS = ("enabled", "backend", "size", "endpoint", "bucket", "region", "prefix")
# Credentials come only from the standard SCCACHE_* / AWS_* variables, never the manifest.
_SECRET = re.compile(r"(password|passwd|secret|token|credential|access_key|auth)", re.I)


@dataclass(frozen=True)
class CacheConfig:
    """``[build.cache]``: the compiler cache (sccache) every build goes through.

    Only non-secret settings live here; SCCACHE_* variables in the environment
    override them (pinwheel.compile.compcache).
    """

    enabled: bool = True
    backend: str = "local"  # local | redis | s3 | gha
    size: str = "20G"  # local disk cap (SCCACHE_CACHE_SIZE)
    endpoint: str | None = None  # redis://host:port, or the S3 endpoint URL
    bucket: str | None = None  # s3
    region: str | None = None  # s3
    prefix: str | None = None  # key prefix (redis, s3, gha version)


def _endpoint_problem(value: object) -> str | None:
    basic = validate.line_problem(value)
    if basic:
        return basic
    assert isinstance(value, str)
    if value.startswith("-") or not re.fullmatch(r"(rediss?|https?)://[^\s/@][^\s]*", value):
        return "redis://host:port, rediss://..., or an http(s):// S3 endpoint"
    return None


def _prefix_problem(value: object) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/\-]*", value):
        return "letters, digits, '.', '_', '-' and '/'"
    return None


def parse_cache_table(table: Table) -> CacheConfig:
    for key in table.data:
        if _SECRET.search(key):
            raise ManifestError(
                f"'{key}' looks like a credential: secrets never go in the manifest",
                where=table.where(key),
                next="remove it and export the standard variable instead "
                "(SCCACHE_REDIS_PASSWORD, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                "ACTIONS_RUNTIME_TOKEN)",
            )
    table.only(*CACHE_KEYS)
    backend = table.choice("backend", CACHE_BACKENDS) if table.has("backend") else "local"
    size = table.str("size", "20G")
    try:
        validate.size(size)
    except ValueError:
        raise table.error("size", 'a size like "20G" or "500M"', size) from None
    endpoint = table.checked(
        "endpoint", _endpoint_problem, "a redis://, rediss://, http(s):// endpoint URL", None
    )
    if endpoint and "@" in endpoint.split("//", 1)[-1].split("/", 1)[0]:
        raise ManifestError(
            "the endpoint carries user info (user:password@): secrets never go in the manifest",
            where=table.where("endpoint"),
            next="drop the user info and export SCCACHE_REDIS_USERNAME/SCCACHE_REDIS_PASSWORD",
        )
    if endpoint:  # host and port checked here, not when the compiler cache first dials it
        url = endpoint if "://" in endpoint else f"http://{endpoint}"  # S3: host[:port] too
        try:
            validate.http_url(url, schemes=("redis", "rediss", "http", "https"))
        except ValueError as exc:
            raise table.error(
                "endpoint", f"a redis:// or http(s):// URL ({exc})", endpoint
            ) from None
    if backend == "redis" and not endpoint:
        raise table.error("endpoint", 'a redis URL like "redis://cache.internal:6379"')
    bucket = table.checked("bucket", validate.identifier_problem, "an S3 bucket name", None)
    if backend == "s3" and not bucket:
        raise table.error("bucket", "the S3 bucket name (backend = s3)")
    return CacheConfig(
        enabled=table.bool("enabled", True),
        backend=backend,
        size=size,
        endpoint=endpoint,
        bucket=bucket,
        region=table.checked("region", validate.identifier_problem, "a region name", None),
        prefix=table.checked("prefix", _prefix_problem, "a key prefix", None),
    )


@dataclass(frozen=True)
class BuildConfig:
    """``[build]``: what the wheels are built with and for."""

    python: str  # "3.11"
    cuda: str  # "12.4": major.minor the toolkit must have
    arches: tuple[str, ...]  # ("7.0",): SASS for each
    ptx: bool  # also embed PTX for the lowest arch, so newer GPUs JIT it
    torch: str | None  # "2.9.1" pin for torch-extension builds
    label: str | None  # local version label, e.g. "glm53card"
    version: str | None  # e.g. "1.5.2.dev1486"
    env: Mapping[str, str] = field(default_factory=dict)  # MAX_JOBS, NVCC_THREADS...
    required_members: tuple[str, ...] = ()  # wheel members the check insists on
    runner_labels: tuple[str, ...] = ()  # release workflow's runs-on
    sources: tuple[BuildSource, ...] = ()  # [[build.source]]: what the build would download
    exclude: tuple[str, ...] = ()  # paths of the replayed tree the build does not need
    requirements: Requirements | None = None  # pinned, hashed build requirements
    cuda_dev: bool = False  # also the CUDA dev headers + driver/nvrtc stubs an engine links
    network: str = "none"  # "none": build in a network namespace where the machine allows
    torch_index: str | None = None  # where [build] torch comes from (a PEP 503 index URL)
    cache: CacheConfig = field(default_factory=CacheConfig)  # [build.cache]
    max_glibc: tuple[int, ...] | None = None  # the oldest glibc the wheels must load on
    gcc: str | None = None  # host compiler major the card builds with ("14"); None: any
    # [build.substitute]: another toolchain than the pinned one, on purpose and said so
    substitute: tuple[tuple[str, str], ...] = ()  # ("cuda", "12.4"), ("gcc", "12")
    substitute_reason: str | None = None
    # [build.torch_lock]: torch for the out-of-tree torch-extension kernels, by hash (the
    # engine's own build venv stays [build.requirements])
    torch_lock: Requirements | None = None

    @property
    def targets(self) -> tuple[CudaArch, ...]:
        """The arches as :class:`~pinwheel.cudaarch.CudaArch`, PTX on the lowest when ``ptx``."""
        return targets(self.arches, self.ptx)

    @property
    def cmake_architectures(self) -> str:
        """CMAKE_CUDA_ARCHITECTURES: SASS for each arch, PTX for the lowest one."""
        return cmake_architectures(self.targets)

    @property
    def torch_arch_list(self) -> str:
        """TORCH_CUDA_ARCH_LIST: "7.0+PTX" style."""
        return torch_arch_list(self.targets)

    @property
    def full_version(self) -> str | None:
        """``1.5.2.dev1486+glm53card`` (PEP 440 local label), when a version is set."""
        if not self.version:
            return None
        return f"{self.version}+{self.label}" if self.label else self.version


def parse_build_table(table: Table) -> BuildConfig:
    table.only(*BUILD_KEYS)
    python = table.str("python", "3.11")
    if not _PY.fullmatch(python):
        raise table.error("python", 'a Python minor version like "3.11"', python)
    cuda = table.str("cuda")
    if not _CUDA.fullmatch(cuda):
        raise table.error("cuda", 'a CUDA major.minor like "12.4"', cuda)
    arches = table.str_list("arches")
    if not arches:
        raise table.error("arches", 'at least one arch, like ["7.0"]', [])
    parsed = {}
    for arch in arches:
        try:
            parsed[arch] = parse_dotted(arch)
        except UsageError:
            raise table.error("arches", 'arches written like "7.0" or "9.0a"', arch) from None
    if len(set(arches)) != len(arches):
        raise table.error("arches", "each arch once", list(arches))
    arches = tuple(sorted(arches, key=lambda a: parsed[a].sm))
    label = table.str("label", None)
    if label is not None and not re.fullmatch(r"[a-z0-9]+(\.[a-z0-9]+)*", label):
        raise table.error("label", "a PEP 440 local label: lowercase letters, digits, dots", label)
    version = table.str("version", None)
    if version is not None and not re.fullmatch(
        r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$", version
    ):
        raise table.error("version", 'a PEP 440 public version like "1.5.2.dev1486"', version)
    torch = table.checked("torch", validate.version_problem, "a torch version", None)
    env = table.env_map("env", {})
    for key in env:
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            raise table.error("env", "environment variable names (A-Z, 0-9, _)", key)
    torch_index = table.str("torch_index", None)
    if torch_index is not None:
        try:
            validate.https_url(torch_index)
        except ValueError:
            raise table.error("torch_index", "an https:// package index URL", torch_index) from None
    problems = target_problems(cuda, arches, torch, torch_index)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ManifestError(first.what + more, where=table.where(first.key), next=first.fix)
    return BuildConfig(
        python=python,
        cuda=cuda,
        arches=arches,
        ptx=table.bool("ptx", True),
        torch=torch,
        label=label,
        version=version,
        env=env,
        required_members=table.checked_list(
            "required_members", validate.rel_path_problem, "wheel member paths", ()
        ),
        runner_labels=table.checked_list(
            "runner_labels", validate.identifier_problem, "runner labels", ()
        ),
        cache=parse_cache_table(table.sub("cache")) if table.has("cache") else CacheConfig(),
        torch_index=torch_index,
        sources=tuple(_parse_source(s) for s in table.subs("source")),
        exclude=_pathspecs(table, "exclude"),
        requirements=_requirements(table, "requirements"),
        torch_lock=_requirements(table, "torch_lock"),
        cuda_dev=table.bool("cuda_dev", False),
        network=table.choice("network", NETWORK, "none"),
        max_glibc=_glibc(table),
        gcc=_gcc(table),
        substitute=(sub := _substitute(table))[0],
        substitute_reason=sub[1],
    )


def _substitute(table: Table) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """``[build.substitute]``: cuda / gcc to build with instead of the pinned ones, and why."""
    if not table.has("substitute"):
        return (), None
    t = table.sub("substitute")
    t.only("cuda", "gcc", "reason")
    pairs = []
    for key, pattern in (("cuda", _CUDA), ("gcc", re.compile(r"[1-9][0-9]?"))):
        value = t.str(key, None)
        if value is None:
            continue
        if not pattern.fullmatch(value):
            raise t.error(key, 'a version like "12.4" (cuda) or "12" (gcc)', value)
        pairs.append((key, value))
    if not pairs:
        raise t.error("cuda", "cuda and/or gcc to substitute (or drop [build.substitute])")
    return tuple(pairs), t.str("reason")


def _glibc(t: Table) -> tuple[int, ...] | None:
    text = t.str("max_glibc", None)
    if text is None:
        return None
    m = _GLIBC.fullmatch(text)
    if not m:
        raise t.error("max_glibc", 'a glibc 2.x version like "2.31"', text)
    return (2, int(m.group(1)))


def _gcc(table: Table) -> str | None:
    value = table.str("gcc", None)
    if value is not None and not re.fullmatch(r"[1-9][0-9]?", value):
        raise table.error("gcc", 'a GCC major version like "14"', value)
    return value  # type: ignore[no-any-return]


def _pathspecs(t: Table, key: str) -> tuple[str, ...]:
    specs = t.str_list(key, ())
    for spec in specs:
        if (
            spec.startswith(("/", "-", ":"))
            or ".." in spec.split("/")
            or validate.line_problem(spec)
        ):
            raise t.error(key, "relative paths or globs inside the tree (no /, -, : or ..)", spec)
    return tuple(specs)


def _requirements(t: Table, key: str) -> Requirements | None:
    """``[build.requirements]`` or ``[build.torch_lock]``: a hashed requirements file beside
    the manifest, its sha256 pinned."""
    if not t.has(key):
        return None
    r = t.sub(key)
    r.only("path", "sha256")
    value = r.str("path")
    rel = PurePosixPath(value)
    root = t.source.parent.resolve()
    path = (root / rel).resolve()
    if rel.is_absolute() or ".." in rel.parts or not path.is_relative_to(root):
        raise r.error(
            "path", "a relative path beside the manifest (no /, no .., no link out)", value
        )
    digest = r.sha256("sha256")
    check_file_sha(
        r, "path", path, digest, repin=f"update [build.{key}] sha256", kind="hashed lock"
    )
    return Requirements(path=path, sha256=digest)


def _parse_source(t: Table) -> BuildSource:
    t.only(*SOURCE_KEYS)
    name = t.str("name")
    if not _SOURCE_NAME.fullmatch(name):
        raise t.error("name", "the FetchContent name (letters, digits, . _ -)", name)
    omit = t.bool("omit", False)
    url = t.url("url", None)
    commit = t.sha("commit", None)
    reason = t.checked("reason", validate.line_problem, "one line", None)
    if omit and not reason:
        raise t.error("reason", "why the source is omitted (provenance and notes say it)")
    if not omit and (url is None or commit is None):
        raise ManifestError(
            f"build source {name} is not pinned (no url + commit)",
            where=t.where("commit"),
            next="run `pinwheel lock` to pin it, or set omit = true with a reason",
        )
    variables = t.str_list("variables", ())
    for var in variables:
        if not _VAR.fullmatch(var):
            raise t.error("variables", "CMake/environment variable names", var)
    patches = _pathspecs(t, "patches")
    subs = []
    for s in t.subs("submodule"):
        s.only("path", "url", "commit", "exclude")
        subs.append(Submodule(
            path=s.checked("path", validate.rel_path_problem, "a submodule path inside the source"),
            url=s.url("url"), commit=s.sha("commit"), exclude=_pathspecs(s, "exclude"),
        ))  # fmt: skip
    return BuildSource(
        name=name,
        url=url,
        commit=commit,
        ref=t.ref("ref", None),
        variables=variables,
        patches=patches,
        submodules=tuple(subs),
        exclude=_pathspecs(t, "exclude"),
        omit=omit,
        reason=reason,
        used=t.choice("used", ("yes", "no", "unknown"), None),
    )


BUILDERS = ("cmake", "torch-extension")
KERNEL_KEYS = (
    "name",
    "builder",
    "path",
    "url",
    "commit",
    "branch",
    "tree",
    "patch",
    "step",
    "default",
)
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class KernelPatch:
    path: Path
    sha256: str
    at: str = field(default="", compare=False)  # "manifest.toml:30": its table, for blame


@dataclass(frozen=True)
class KernelSpec:
    """One ``[[kernel]]``: where its source is, and how it is built."""

    name: str
    builder: str  # "cmake" | "torch-extension"
    path: Path | None  # in-tree package directory under kernels/
    url: str | None  # out-of-tree upstream
    commit: str | None  # None on an out-of-tree kernel: unpinned, `pinwheel lock` pins the tip
    branch: str
    tree: str | None  # expected replayed tree, when pinned
    patches: tuple[KernelPatch, ...]
    default: bool  # built by a plain `pinwheel kernels`; heavy ones say false
    source: Path  # the manifest file, for messages
    # The component's own stack ([[kernel.step]]): pick / merge / patch, like [[step]].
    steps: tuple[Step, ...] = ()
    index: int = 0  # position among the [[kernel]] tables (lock and resolve edit it there)
    # Its table in the manifest, for blame: errors name the kernel and manifest:line.
    table: Table | None = field(default=None, compare=False, repr=False)

    @property
    def in_tree(self) -> bool:
        return self.path is not None

    @property
    def prs(self) -> tuple[int, ...]:
        return tuple(s.pr for s in self.steps if s.pr is not None)

    @property
    def where(self) -> str:
        """``manifest.toml:12: [[kernel]] kern``: file, line and the kernel's name."""
        return self.table.where() if self.table else f"{self.source.name}: [[kernel]] {self.name}"

    def where_key(self, key: str) -> str:
        """``manifest.toml:14: [[kernel]] kern key 'commit'``."""
        return self.table.where(key) if self.table else f"{self.where} key '{key}'"

    @property
    def commit_where(self) -> str:
        """What names the component's base commit: ``manifest.toml:14: [[kernel]] kern commit``."""
        at = self.table.at("commit") if self.table else self.source.name
        return f"{at}: [[kernel]] {self.name} commit"


def parse_kernel_tables(
    tables: tuple[Table, ...], *, allow_short: bool = False
) -> tuple[KernelSpec, ...]:
    specs: list[KernelSpec] = []
    seen: set[str] = set()
    for index, t in enumerate(tables):
        t = _named(t)
        t.only(*KERNEL_KEYS)
        name = t.str("name")
        if not _NAME.fullmatch(name):
            raise t.error("name", "a lowercase name (letters, digits, . _ -)", name)
        if name in seen:
            raise t.error("name", "a name no other [[kernel]] uses", name)
        seen.add(name)
        root = t.source.parent
        builder = t.choice("builder", BUILDERS)
        has_path, has_url = t.has("path"), t.has("url")
        if has_path == has_url:
            raise ManifestError(
                "give exactly one of 'path' (in-tree, under kernels/) or 'url' + 'commit' "
                "(out-of-tree)",
                where=t.where(),
                next=f"edit [[kernel]] {name} in {t.source.name}",
            )
        path = url = commit = tree = None
        patches: list[KernelPatch] = []
        steps: tuple[Step, ...] = ()
        if has_path:
            for key in ("commit", "branch", "tree", "patch", "step"):
                if t.has(key):
                    raise t.error(key, f"no '{key}' on an in-tree kernel (only with 'url')")
            path = t.path_under("path", root, "kernels")
            if not path.is_dir():
                raise t.error("path", "an existing directory under kernels/", t.raw("path"))
        else:
            url = t.url("url")
            commit = t.sha("commit", None, allow_short=allow_short)
            tree = t.sha("tree", None)
            if t.has("patch") and t.has("step"):
                raise t.error(
                    "patch",
                    "either [[kernel.patch]] or [[kernel.step]], not both "
                    '(a patch is a [[kernel.step]] with action = "patch")',
                )
            for i, p in enumerate(t.subs("patch")):
                p = replace(p, label=f"[[kernel.patch]] #{i + 1} of {t.label}")
                p.only("path", "sha256")
                file = p.path_under("path", root, "patches")
                digest = p.sha256("sha256")
                if not allow_short:
                    check_file_sha(
                        p, "path", file, digest, repin="update its sha256 in the manifest"
                    )
                patches.append(KernelPatch(file, digest, at=p.at()))
            steps = _parse_component_steps(t, name, root, allow_short)
        specs.append(
            KernelSpec(
                name=name,
                builder=builder,
                path=path,
                url=url,
                commit=commit,
                branch=t.ref("branch", "main"),
                tree=tree,
                patches=tuple(patches),
                default=t.bool("default", True),
                source=t.source,
                steps=steps,
                index=index,
                table=t,
            )
        )
    return tuple(specs)


def _named(t: Table) -> Table:
    """The table labelled by the kernel's name (``[[kernel]] kern``) once it has a valid one,
    so every error about it, from any key, says which kernel."""
    name = t.data.get("name")
    if isinstance(name, str) and _NAME.fullmatch(name):
        return replace(t, label=f"[[kernel]] {name}")
    return t


def _parse_component_steps(t: Table, name: str, root: Path, allow_short: bool) -> tuple[Step, ...]:
    """``[[kernel.step]]``: the same step model (and parser) as the engine's ``[[step]]``."""
    steps: list[Step] = []
    seen: dict[int, int] = {}
    for i, sub in enumerate(t.subs("step")):
        pr = sub.data.get("pr")
        sub = replace(
            sub, label=f"[[kernel.step]] #{i + 1}" + (f" (PR {pr})" if isinstance(pr, int) else "")
            + f" of {t.label}",
        )
        step = replace(parse_step(sub, i + 1, root, allow_short), owner=f"[[kernel]] {name} ")
        if step.pr is not None:
            if step.pr in seen:
                raise ManifestError(
                    f"PR #{step.pr} appears twice in [[kernel]] {name} "
                    f"(steps {seen[step.pr]} and {step.number})",
                    where=sub.where("pr"),
                    next="remove the duplicate step",
                )
            seen[step.pr] = step.number
        steps.append(step)
    return tuple(steps)

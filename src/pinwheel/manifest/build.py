"""The ``[build]`` and ``[[kernel]]`` tables: what wheels are built with, for what, from what."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pinwheel.cudaarch import CudaArch, cmake_architectures, targets, torch_arch_list
from pinwheel.errors import ManifestError
from pinwheel.manifest.table import Table, check_file_sha

_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)$")
_CUDA = re.compile(r"^(\d+)\.(\d+)$")
_PY = re.compile(r"^3\.\d+$")
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
    "cache",
)
CACHE_BACKENDS = ("local", "redis", "s3", "gha")
CACHE_KEYS = ("enabled", "backend", "size", "endpoint", "bucket", "region", "prefix")
# Credentials come only from the standard SCCACHE_* / AWS_* variables, never the manifest.
_SECRET = re.compile(r"(password|passwd|secret|token|credential|access_key|auth)", re.I)
_SIZE = re.compile(r"^\d+[KMGT]?$")


@dataclass(frozen=True)
class CacheConfig:
    """``[build.cache]``: the compiler cache (sccache) every build goes through.

    Only non-secret settings live here; SCCACHE_* variables in the environment
    override them (pinwheel.build.compcache).
    """

    enabled: bool = True
    backend: str = "local"  # local | redis | s3 | gha
    size: str = "20G"  # local disk cap (SCCACHE_CACHE_SIZE)
    endpoint: str | None = None  # redis://host:port, or the S3 endpoint URL
    bucket: str | None = None  # s3
    region: str | None = None  # s3
    prefix: str | None = None  # key prefix (redis, s3, gha version)


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
    if not _SIZE.match(size):
        raise table.error("size", 'a size like "20G" or "500M"', size)
    endpoint = table.str("endpoint", None)
    if endpoint and "@" in endpoint.split("//", 1)[-1].split("/", 1)[0]:
        raise ManifestError(
            "the endpoint carries user info (user:password@): secrets never go in the manifest",
            where=table.where("endpoint"),
            next="drop the user info and export SCCACHE_REDIS_USERNAME/SCCACHE_REDIS_PASSWORD",
        )
    if backend == "redis" and not endpoint:
        raise table.error("endpoint", 'a redis URL like "redis://cache.internal:6379"')
    bucket = table.str("bucket", None)
    if backend == "s3" and not bucket:
        raise table.error("bucket", "the S3 bucket name (backend = s3)")
    return CacheConfig(
        enabled=table.bool("enabled", True),
        backend=backend,
        size=size,
        endpoint=endpoint,
        bucket=bucket,
        region=table.str("region", None),
        prefix=table.str("prefix", None),
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
    cache: CacheConfig = field(default_factory=CacheConfig)  # [build.cache]

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
    if not _PY.match(python):
        raise table.error("python", 'a Python minor version like "3.11"', python)
    cuda = table.str("cuda")
    if not _CUDA.match(cuda):
        raise table.error("cuda", 'a CUDA major.minor like "12.4"', cuda)
    arches = table.str_list("arches")
    if not arches:
        raise table.error("arches", 'at least one arch, like ["7.0"]', [])
    for arch in arches:
        if not _ARCH.match(arch):
            raise table.error("arches", 'arches written like "7.0" or "9.0a"', arch)
    if len(set(arches)) != len(arches):
        raise table.error("arches", "each arch once", list(arches))
    arches = tuple(sorted(arches, key=lambda a: tuple(int(x) for x in _ARCH.match(a).groups()[:2])))  # type: ignore[union-attr]
    label = table.str("label", None)
    if label is not None and not re.match(r"^[a-z0-9]+(\.[a-z0-9]+)*$", label):
        raise table.error("label", "a PEP 440 local label: lowercase letters, digits, dots", label)
    version = table.str("version", None)
    if version is not None and not re.match(
        r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$", version
    ):
        raise table.error("version", 'a PEP 440 public version like "1.5.2.dev1486"', version)
    torch = table.str("torch", None)
    env = table.str_map("env", {})
    for key in env:
        if not re.match(r"^[A-Z_][A-Z0-9_]*$", key):
            raise table.error("env", "environment variable names (A-Z, 0-9, _)", key)
    return BuildConfig(
        python=python,
        cuda=cuda,
        arches=arches,
        ptx=table.bool("ptx", True),
        torch=torch,
        label=label,
        version=version,
        env=env,
        required_members=table.str_list("required_members", ()),
        runner_labels=table.str_list("runner_labels", ()),
        cache=parse_cache_table(table.sub("cache")) if table.has("cache") else CacheConfig(),
    )


BUILDERS = ("cmake", "torch-extension")
KERNEL_KEYS = ("name", "builder", "path", "url", "commit", "branch", "tree", "patch", "default")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class KernelPatch:
    path: Path
    sha256: str


@dataclass(frozen=True)
class KernelSpec:
    """One ``[[kernel]]``: where its source is, and how it is built."""

    name: str
    builder: str  # "cmake" | "torch-extension"
    path: Path | None  # in-tree package directory under kernels/
    url: str | None  # out-of-tree upstream
    commit: str | None
    branch: str
    tree: str | None  # expected replayed tree, when pinned
    patches: tuple[KernelPatch, ...]
    default: bool  # built by a plain `pinwheel kernels`; heavy ones say false
    source: Path  # the manifest file, for messages

    @property
    def in_tree(self) -> bool:
        return self.path is not None

    @property
    def where(self) -> str:
        return f"{self.source.name}: [[kernel]] {self.name}"


def parse_kernel_tables(tables: tuple[Table, ...]) -> tuple[KernelSpec, ...]:
    specs: list[KernelSpec] = []
    seen: set[str] = set()
    for t in tables:
        t.only(*KERNEL_KEYS)
        name = t.str("name")
        if not _NAME.match(name):
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
        if has_path:
            for key in ("commit", "branch", "tree", "patch"):
                if t.has(key):
                    raise t.error(key, f"no '{key}' on an in-tree kernel (only with 'url')")
            path = t.path_under("path", root, "kernels")
            if not path.is_dir():
                raise t.error("path", "an existing directory under kernels/", t.raw("path"))
        else:
            url = t.str("url")
            commit = t.sha("commit")
            tree = t.sha("tree", None)
            for p in t.subs("patch"):
                p.only("path", "sha256")
                file = p.path_under("path", root, "patches")
                digest = p.sha256("sha256")
                check_file_sha(p, "path", file, digest, repin="update its sha256 in the manifest")
                patches.append(KernelPatch(file, digest))
        specs.append(
            KernelSpec(
                name=name,
                builder=builder,
                path=path,
                url=url,
                commit=commit,
                branch=t.str("branch", "main"),
                tree=tree,
                patches=tuple(patches),
                default=t.bool("default", True),
                source=t.source,
            )
        )
    return tuple(specs)

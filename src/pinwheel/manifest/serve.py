"""The ``[serve]`` and ``[qualify]`` tables: how the engine starts, and its gates."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from pinwheel.errors import ManifestError, PinwheelError, UsageError
from pinwheel.manifest.table import Table


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


@dataclass(frozen=True)
class QualifyProfile:
    name: str
    concurrency: tuple[int, ...]
    needle_lengths: tuple[int, ...]
    needle_depths: tuple[float, ...]
    needle_max_tokens: int
    min_tok_s: float | None
    max_ms_per_pass: float | None
    min_aggregate_tok_s: float | None  # judged at the largest concurrency
    needle_required: int | None  # this length must pass at every depth
    reference: tuple[tuple[str, str], ...]  # what the card measured, shown beside results


@dataclass(frozen=True)
class FidelityConfig:
    """``[qualify.fidelity]``: teacher-to-student KLD over a pinned panel of token windows.

    ``panel`` is a JSON file (``{"windows": [[ids...], ...]}`` or ``{"texts": [...],
    "window": N}`` tokenized by the server) pinned by sha256. The teacher is a file
    written by ``pinwheel qualify teacher`` (pinned by sha256) or a reference server
    URL read at qualification time. ``top_k = -1`` asks the server for the full
    vocabulary (~4 MB of JSON per position: tiny panels only).
    """

    panel: Path
    panel_sha256: str
    teacher: Path | None
    teacher_sha256: str | None
    teacher_url: str | None
    top_k: int
    max_mean_kld: float | None
    min_top1: float | None
    bootstrap: int  # resamples for the 95% CI
    seed: int


@dataclass(frozen=True)
class Slo:
    """Latency targets for goodput, as ``vllm bench serve --goodput`` takes them (ms)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None


@dataclass(frozen=True)
class QualifyConfig:
    warmup: int
    repeats: int
    max_tokens: int
    health_timeout_s: int
    idle_timeout_s: int
    prompts: tuple[str, ...]
    markers: tuple[str, ...]  # regular expressions over the start-up log
    profiles: tuple[QualifyProfile, ...]
    fidelity: FidelityConfig | None = None
    slo: Slo | None = None

    def profile(self, name: str) -> QualifyProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise PinwheelError(
            f"no [qualify.profile.{name}] table",
            where="[qualify]",
            next=f"add [qualify.profile.{name}] with its gates, or pass --profile "
            + "/".join(p.name for p in self.profiles),
        )


_QUALIFY_PROFILE_KEYS = (
    "concurrency",
    "needle_lengths",
    "needle_depths",
    "needle_max_tokens",
    "min_tok_s",
    "max_ms_per_pass",
    "min_aggregate_tok_s",
    "needle_required",
    "reference",
)


def _int_list(t: Table, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    value = t.raw(key, list(default))
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
    ):
        raise t.error(key, "a list of positive integers", value)
    return tuple(value)


def _parse_qualify_profile(t: Table, name: str) -> QualifyProfile:
    t.only(*_QUALIFY_PROFILE_KEYS)
    depths = t.raw("needle_depths", [0.1, 0.5, 0.9])
    if not isinstance(depths, list) or not all(
        isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= 1 for d in depths
    ):
        raise t.error("needle_depths", "a list of fractions between 0 and 1", depths)
    lengths = _int_list(t, "needle_lengths", ())
    required = t.int("needle_required", None, minimum=1)
    if required is not None and required not in lengths:
        raise t.error("needle_required", "one of needle_lengths", required)
    return QualifyProfile(
        name=name,
        concurrency=_int_list(t, "concurrency", (1,)),
        needle_lengths=lengths,
        needle_depths=tuple(float(d) for d in depths),
        needle_max_tokens=t.int("needle_max_tokens", 256, minimum=1),
        min_tok_s=t.float("min_tok_s", None),
        max_ms_per_pass=t.float("max_ms_per_pass", None),
        min_aggregate_tok_s=t.float("min_aggregate_tok_s", None),
        needle_required=required,
        reference=tuple(t.str_map("reference", {}).items()),
    )


def parse_qualify_table(table: Table) -> QualifyConfig:
    table.only(
        "warmup",
        "repeats",
        "max_tokens",
        "health_timeout_s",
        "idle_timeout_s",
        "prompts",
        "markers",
        "profile",
        "fidelity",
        "slo",
    )
    markers = table.str_list("markers", ())
    for m in markers:
        try:
            re.compile(m)
        except re.error as exc:
            raise table.error("markers", f"valid regular expressions ({exc})", m) from None
    holder = table.sub("profile")
    profiles = tuple(
        _parse_qualify_profile(holder.sub(n, label=f"[qualify.profile.{n}]"), n)
        for n in holder.data
    )
    return QualifyConfig(
        warmup=table.int("warmup", 1, minimum=0),
        repeats=table.int("repeats", 3, minimum=1),
        max_tokens=table.int("max_tokens", 512, minimum=2),
        health_timeout_s=table.int("health_timeout_s", 600, minimum=1),
        idle_timeout_s=table.int("idle_timeout_s", 60, minimum=0),
        prompts=table.str_list("prompts"),
        markers=markers,
        profiles=profiles,
        fidelity=_parse_fidelity(table.sub("fidelity")) if table.has("fidelity") else None,
        slo=_parse_slo(table) if table.has("slo") else None,
    )


def _parse_slo(table: Table) -> Slo:
    t = table.sub("slo")
    t.only("ttft_ms", "tpot_ms", "e2el_ms")
    slo = Slo(t.float("ttft_ms", None), t.float("tpot_ms", None), t.float("e2el_ms", None))
    for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
        value = getattr(slo, key)
        if value is not None and value <= 0:
            raise t.error(key, "a positive number of milliseconds", value)
    return slo


def _file_ref(t: Table, key: str) -> tuple[Path, str]:
    """``{ file = "...", sha256 = "..." }``: a path relative to the manifest, pinned."""
    ref = t.sub(key)
    ref.only("file", "sha256")
    rel = Path(ref.str("file"))
    return (rel if rel.is_absolute() else t.source.parent / rel), ref.sha256("sha256")


def _parse_fidelity(t: Table) -> FidelityConfig:
    t.only("panel", "teacher", "top_k", "max_mean_kld", "min_top1", "bootstrap", "seed")
    panel_t = t.sub("panel")
    if panel_t.has("dataset"):
        raise ManifestError(
            "a hub dataset panel is not supported yet",
            where=panel_t.where("dataset"),
            next="export the windows to a JSON panel file in the repo and pin it: "
            'panel = { file = "...", sha256 = "..." }',
        )
    panel, panel_sha = _file_ref(t, "panel")
    teacher_t = t.sub("teacher")
    teacher: Path | None = None
    teacher_sha: str | None = None
    url: str | None = None
    if teacher_t.has("url"):
        teacher_t.only("url")
        url = teacher_t.str("url")
        if not re.match(r"^https?://", url):
            raise teacher_t.error("url", "an http:// or https:// URL", url)
    else:
        teacher, teacher_sha = _file_ref(t, "teacher")
    top_k = t.int("top_k", 20, minimum=-1)
    if top_k == 0:
        raise t.error("top_k", "a positive integer, or -1 for the full vocabulary", top_k)
    min_top1 = t.float("min_top1", None)
    if min_top1 is not None and not 0 <= min_top1 <= 1:
        raise t.error("min_top1", "a fraction between 0 and 1", min_top1)
    return FidelityConfig(
        panel=panel,
        panel_sha256=panel_sha,
        teacher=teacher,
        teacher_sha256=teacher_sha,
        teacher_url=url,
        top_k=top_k,
        max_mean_kld=t.float("max_mean_kld", None),
        min_top1=min_top1,
        bootstrap=t.int("bootstrap", 2000, minimum=100),
        seed=t.int("seed", 0, minimum=0),
    )

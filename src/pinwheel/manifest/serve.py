"""The ``[serve]`` and ``[qualify]`` tables: how the engine starts, and its gates."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from pinwheel import saferegex, validate
from pinwheel.cudaarch import CudaArch, parse_dotted
from pinwheel.errors import ManifestError, PinwheelError, UsageError
from pinwheel.manifest.image import CROSS_CHECKED, IMAGE_KEYS, Image, cross_check, parse_image
from pinwheel.manifest.runtime import RuntimePin, parse_runtime
from pinwheel.manifest.table import REQUIRED, Table


@dataclass(frozen=True)
class Engine:
    """What preflight expects to find in the engine's installed package (or image)."""

    module: str  # importable name, e.g. "vllm"
    quantization: str | None  # a quantization method the fork registers, e.g. "exl3"
    architecture: str | None  # a model architecture it registers
    image: Image | None = None  # a container image instead of a venv


@dataclass(frozen=True)
class ServeProfile:
    name: str
    gpus: int  # 0 = no GPU requirement (CPU server)
    compute_capability: CudaArch | None  # "7.0" in the manifest
    gpu_memory_gib: int | None  # per GPU, as nvidia-smi reports it (rounded)
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_model_len: int
    max_num_seqs: int | None  # default; $<PREFIX>_SEQS overrides it (None: the image decides)
    speculative: tuple[tuple[str, str | int | float | bool], ...]  # ordered, () = none
    args: tuple[str, ...]  # every other flag, in the order the card gives them
    env: tuple[tuple[str, str], ...]
    devices: str | None  # default CUDA_VISIBLE_DEVICES
    # The CUDA toolkit (nvcc) the JIT at start-up needs: "12" any 12.x, "12.8" 12.8 or a
    # later 12.x (a card that names a minor means at least that one; another major is
    # another ABI)
    cuda: str = "12"
    # preflight --selftest: the NCCL all-reduce bus bandwidth floor (GB/s, as nccl-tests
    # reports busbw); None = measured and shown, not gated
    min_allreduce_gbps: float | None = None
    # The card's own launcher knobs this profile stands for (PROFILE, CACHE, DCP, ...):
    # read on the host, shown in the recipe, never passed to the engine or the image.
    card_knobs: tuple[tuple[str, str], ...] = ()

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
    served_model_name: str | None = None  # --served-model-name; the id /v1/models lists
    port: int = 8000  # the recipe's default $PORT
    known_issues: tuple[str, ...] = ()  # failure modes the card warns about, shown by preflight
    runtime: RuntimePin | None = None  # [serve.runtime]: the venv engine's pinned wheels

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
    "min_allreduce_gbps",
    "card_knobs",
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
    "--served-model-name",
)
_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/\-]{0,199}")  # a served model name
_ENV_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")


def _parse_profile(
    t: Table, name: str, image: bool = False, all_flags: bool = False
) -> ServeProfile:
    t.only(*_PROFILE_KEYS)
    gpus = t.int("gpus", minimum=0)
    tp = t.int("tensor_parallel_size", 1, minimum=1)
    pp = t.int("pipeline_parallel_size", 1, minimum=1)
    if gpus and tp * pp != gpus:
        raise t.error("gpus", f"tensor_parallel_size x pipeline_parallel_size = {tp * pp}", gpus)
    cc_text = t.str("compute_capability", None)
    cc = None
    if cc_text is not None:
        try:
            cc = parse_dotted(cc_text, suffix=False)
        except UsageError:
            raise t.error(
                "compute_capability", 'a compute capability like "7.0"', cc_text
            ) from None
    spec: tuple[tuple[str, str | int | float | bool], ...] = ()
    if t.has("speculative"):
        raw = t.raw("speculative")
        if not isinstance(raw, dict) or "method" not in raw:
            raise t.error("speculative", "an inline table with at least 'method'", raw)
        if not all(isinstance(v, (str, int, float, bool)) for v in raw.values()):
            raise t.error("speculative", "scalar values only", raw)
        spec = tuple(raw.items())
    args: tuple[str, ...] = tuple(
        t.checked_list("args", validate.line_problem, "one-line engine flags", ())
    )
    for flag in args:
        name_only = str(flag).split("=", 1)[0]
        if name_only in _OWNED_FLAGS and not (all_flags and name_only in CROSS_CHECKED):
            raise t.error("args", f"no {name_only} here (a typed key sets it)", flag)
    profile = ServeProfile(
        name=name,
        gpus=gpus,
        compute_capability=cc,
        gpu_memory_gib=t.int("gpu_memory_gib", None, minimum=1),
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=t.int("max_model_len", minimum=1),
        # An image's own launcher may decide it; a venv engine always gets it explicitly.
        max_num_seqs=t.int("max_num_seqs", None if image else REQUIRED, minimum=1),
        speculative=spec,
        args=args,
        env=_env_map(t, "env"),
        devices=_devices(t),
        cuda=_cuda(t),
        min_allreduce_gbps=_gbps(t, "min_allreduce_gbps"),
        card_knobs=_env_map(t, "card_knobs"),
    )
    if all_flags:
        typed = {
            "--tensor-parallel-size": profile.tensor_parallel_size,
            "--pipeline-parallel-size": profile.pipeline_parallel_size,
            "--max-model-len": profile.max_model_len,
            "--max-num-seqs": profile.max_num_seqs,
        }
        cross_check(t, profile.args, typed, dict(spec) if spec else None)
    return profile


_RUNTIME_CUDA = re.compile(r"[1-9][0-9]?(\.[0-9]{1,2})?")


def _cuda(t: Table) -> str:
    """``cuda = 12`` (a major) or ``cuda = "12.8"`` (major.minor: that minor or later)."""
    value = t.raw("cuda", "12")
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not _RUNTIME_CUDA.fullmatch(text) or int(
        text.split(".")[0]
    ) < 10:
        raise t.error("cuda", 'a CUDA major (12) or major.minor ("12.8"), 10 or later', value)
    return text


def _env_map(t: Table, key: str) -> tuple[tuple[str, str], ...]:
    env = t.str_map(key, {})
    for k, v in env.items():
        if not _ENV_KEY.fullmatch(k):
            raise t.error(key, "environment variable names (A-Z, 0-9, _)", k)
        if validate.line_problem(v):
            raise t.error(key, "values without newlines or control characters", v)
    return tuple(env.items())


def _devices(t: Table) -> str | None:
    value: str | None = t.str("devices", None)
    if value is not None:
        try:
            validate.gpu_indices(value)
        except ValueError:
            raise t.error("devices", 'unique GPU indices like "0,1,2,3"', value) from None
    return value


def _gbps(t: Table, key: str) -> float | None:
    value = t.float(key, None)
    if value is not None and not (math.isfinite(value) and value > 0):
        raise t.error(key, "a positive, finite number (GB/s)", value)
    return None if value is None else float(value)


_SAFE_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._\-]*")


def _module_problem(value: object) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(
        r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", value
    ):
        return "a dotted Python module name"
    return None


_ENGINE_KEYS = ("module", "quantization", "architecture")


def parse_serve_table(table: Table) -> ServeConfig:
    table.only(
        "recipe",
        "env_prefix",
        "default",
        "model_disk_gib",
        "engine",
        "env",
        "profile",
        "served_model_name",
        "port",
        "known_issues",
        "runtime",
    )
    prefix = table.str("env_prefix", "MODEL")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", prefix):
        raise table.error("env_prefix", "a shell variable prefix like GLM53", prefix)
    recipe = table.str("recipe")
    if (
        validate.rel_path_problem(recipe)
        or not all(_SAFE_PART.fullmatch(part) for part in recipe.split("/"))
        or not recipe.endswith(".sh")
    ):
        raise table.error("recipe", "a relative path to a .sh file inside the repo", recipe)
    engine = Engine(module="vllm", quantization=None, architecture=None)
    if table.has("engine"):
        eng = table.sub("engine")
        eng.only(*_ENGINE_KEYS, *IMAGE_KEYS)
        image = None
        if eng.has("image"):
            image = parse_image(eng)
        else:
            for key in IMAGE_KEYS:
                if eng.has(key):
                    raise eng.error(key, "this key only with image = ... (a container engine)")
        engine = Engine(
            module=eng.checked("module", _module_problem, "a Python module name", "vllm"),
            quantization=eng.checked(
                "quantization", validate.identifier_problem, "a method name", None
            ),
            architecture=eng.checked(
                "architecture", validate.identifier_problem, "an architecture name", None
            ),
            image=image,
        )
    holder = table.sub("profile")
    for name in holder.data:
        if validate.identifier_problem(name):
            raise holder.error(name, "a profile name of letters, digits, '.', '_', '-'", name)
    profiles = tuple(
        _parse_profile(
            holder.sub(name, label=f"[serve.profile.{name}]"),
            name,
            engine.image is not None,
            engine.image is not None and engine.image.entrypoint is not None,
        )
        for name in holder.data
    )
    if not profiles:
        raise table.error("profile", "at least one [serve.profile.NAME] table")
    default = table.str("default", profiles[0].name)
    if default not in {p.name for p in profiles}:
        raise table.error("default", "the name of a [serve.profile.NAME] table", default)
    served = table.str("served_model_name", None)
    if served is not None and not _IDENT.fullmatch(served):
        raise table.error(
            "served_model_name", "a model name (letters, digits, . _ - : /; no leading -)", served
        )
    port = table.int("port", 8000, minimum=1)
    if port > 65535:
        raise table.error("port", "a port 1-65535", port)
    image = engine.image
    if image is not None and image.entrypoint is not None and image.container_port != port:
        raise table.error(
            "port", f"the engine's container_port {image.container_port} (one variable for "
            "both sides of -p when the recipe starts the engine itself)", port,
        )  # fmt: skip
    return ServeConfig(
        recipe=recipe,
        env_prefix=prefix,
        default_profile=default,
        model_disk_gib=table.int("model_disk_gib", 0, minimum=0),
        engine=engine,
        env=_env_map(table, "env"),
        profiles=profiles,
        served_model_name=served,
        port=port,
        known_issues=table.str_list("known_issues", ()),
        runtime=parse_runtime(table, image_engine=engine.image is not None)
        if table.has("runtime") else None,
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
    # Mean acceptance length as vLLM names it: 1 + accepted / drafts (the bonus token counts).
    min_acceptance_length: float | None = None
    # Acceptance rate per drafted token: accepted / draft tokens (a fraction, 0-1).
    min_acceptance_rate: float | None = None
    # Relative margin on the card's own measurements (min_* x (1 - t), max_* x (1 + t)).
    tolerance: float = 0.0
    # metric -> why it is compared with the card's figure but never fails the run
    informational: tuple[tuple[str, str], ...] = ()
    markers: tuple[str, ...] = ()  # start-up log regexes this profile adds to [qualify].markers
    # `qualify cold-starts --profile NAME`: this profile's protocol over [qualify.fidelity]'s
    cold_start_protocol: str | None = None

    def is_informational(self, metric: str) -> str | None:
        return dict(self.informational).get(metric)


@dataclass(frozen=True)
class FidelityConfig:
    """``[qualify.fidelity]``: teacher-to-student KLD over a pinned panel of token windows.

    ``panel`` is a JSON file (``{"windows": [[ids...], ...]}`` or ``{"texts": [...],
    "window": N}`` tokenized by the server) pinned by sha256. The teacher is a file
    written by ``pinwheel qualify teacher`` (pinned by sha256) or a reference server
    URL read at qualification time. ``top_k = -1`` asks the server for the full
    vocabulary (~4 MB of JSON per position: tiny panels only).
    """

    panel: Path | None  # None: FILL IN (the card's panel is not pinned yet): gates SKIP
    panel_sha256: str | None
    teacher: Path | None
    teacher_sha256: str | None
    teacher_url: str | None
    top_k: int
    max_mean_kld: float | None  # judged on the exact KLD; a lower bound can only FAIL it
    min_top1: float | None
    bootstrap: int  # resamples for the 95% CI
    seed: int
    strict: bool = False  # max_mean_kld is a strict bound (`<`), as the card writes its gate
    tolerance: float = 0.0  # relative margin on a card's measured figure (never on a strict gate)
    reference: tuple[tuple[str, str], ...] = ()  # the card's teacher, method and figures
    # "rows": the served prompt_logprobs as JSON (the reference; ~11 MB a position at a 150k
    # vocabulary when full); "in-process": exact KLD in the engine (serve/workers/kld_ext.py),
    # 13-byte records out, against a full-row teacher file.
    scorer: str = "rows"
    # where tolerance comes from: the card's words or "default" (shown in the gate)
    tolerance_source: str = ""
    cold_starts: int = 2  # `qualify cold-starts`: fresh servers (at least 2: one shows nothing)
    # how the starts are judged: "hash" (one tokenwise hash across them) or "mean" (the
    # mean of the runs' KLD and every run within max_mean_kld; the runs may differ)
    protocol: str = "hash"


@dataclass(frozen=True)
class Slo:
    """Latency targets for goodput, as ``vllm bench serve --goodput`` takes them (ms)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None


@dataclass(frozen=True)
class Smoke:
    """A prompt the card quotes, sent greedy; the reply must contain ``expect`` when given."""

    prompt: str
    max_tokens: int
    expect: str | None


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
    smoke: tuple[Smoke, ...] = ()
    # the chat template's thinking switch in every qualify request; None: the template's own
    thinking: bool | None = None

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
    "min_acceptance_length",
    "min_acceptance_rate",
    "tolerance",
    "informational",
    "markers",
    "cold_start_protocol",
)
METRICS = ("tok_s", "ms_per_pass", "acceptance_length", "acceptance_rate", "aggregate_tok_s")
# Old names, refused with what replaced them (the figure changed meaning, not only name).
_RENAMED = {
    "min_accepted_per_pass": "min_acceptance_length",
    "accepted_per_pass": "acceptance_length",
}
_RENAMED_WHY = (
    "the figure is vLLM's mean acceptance length, 1 + accepted / drafts (the bonus token "
    "counts); accepted / drafts alone is the acceptance rate per draft"
)


def _int_list(t: Table, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    value = t.raw(key, list(default))
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
    ):
        raise t.error(key, "a list of positive integers", value)
    return tuple(value)


def _refuse_renamed(t: Table, keys: object, where_key: str = "") -> None:
    for old in keys if isinstance(keys, dict) else ():
        if old in _RENAMED:
            raise ManifestError(
                f"'{old}' was renamed to '{_RENAMED[old]}': {_RENAMED_WHY}",
                where=t.where(where_key or old),
                next=f"rename the key to {_RENAMED[old]} in {t.source.name} (check the value "
                "is 1 + accepted/drafts)",
            )


def _parse_qualify_profile(t: Table, name: str) -> QualifyProfile:
    _refuse_renamed(t, t.data)
    _refuse_renamed(t, t.raw("reference", {}), "reference")
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
        min_tok_s=_positive(t, "min_tok_s"),
        max_ms_per_pass=_positive(t, "max_ms_per_pass"),
        min_aggregate_tok_s=_positive(t, "min_aggregate_tok_s"),
        needle_required=required,
        reference=tuple(t.str_map("reference", {}).items()),
        min_acceptance_length=_positive(t, "min_acceptance_length", minimum=1.0),
        min_acceptance_rate=_fraction(t, "min_acceptance_rate"),
        tolerance=_fraction(t, "tolerance") or 0.0,
        informational=_informational(t),
        markers=_markers(t),
        cold_start_protocol=t.choice("cold_start_protocol", PROTOCOLS, None),
    )


def _finite(t: Table, key: str) -> float | None:
    value = t.float(key, None)
    if value is not None and not math.isfinite(value):
        raise t.error(key, "a finite number", value)
    return value  # type: ignore[no-any-return]


def _positive(t: Table, key: str, minimum: float = 0.0) -> float | None:
    value = _finite(t, key)
    if value is not None and value < minimum:
        raise t.error(key, f"a number >= {minimum}", value)
    return value


def _fraction(t: Table, key: str) -> float | None:
    value = _finite(t, key)
    if value is not None and not 0 <= value <= 1:
        raise t.error(key, "a fraction between 0 and 1", value)
    return value


def _informational(t: Table) -> tuple[tuple[str, str], ...]:
    info = t.str_map("informational", {})
    for metric in info:
        if metric not in METRICS:
            raise t.error("informational", "metric names: " + ", ".join(METRICS), metric)
    return tuple(info.items())


def _markers(t: Table) -> tuple[str, ...]:
    markers: tuple[str, ...] = t.str_list("markers", ())
    for m in markers:
        try:
            saferegex.compile(m)  # matched in linear time: a pattern cannot hang qualify
        except saferegex.RegexError as exc:
            raise t.error("markers", f"regular expressions in the safe syntax ({exc})", m) from None
    return markers


def _parse_smoke(table: Table) -> tuple[Smoke, ...]:
    out = []
    for t in table.subs("smoke"):
        t.only("prompt", "max_tokens", "expect")
        out.append(
            Smoke(
                prompt=t.str("prompt"),
                max_tokens=t.int("max_tokens", 64, minimum=1),
                expect=t.str("expect", None),
            )
        )
    return tuple(out)


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
        "smoke",
        "thinking",
    )
    markers = _markers(table)
    holder = table.sub("profile")
    for n in holder.data:
        if validate.identifier_problem(n):
            raise holder.error(n, "a profile name of letters, digits, '.', '_', '-'", n)
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
        smoke=_parse_smoke(table),
        thinking=table.bool("thinking") if table.has("thinking") else None,
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


MAX_BOOTSTRAP = 1_000_000  # resamples: 2000 is the usual; a million is already ~minutes


def _bootstrap(t: Table) -> int:
    n = t.int("bootstrap", 2000, minimum=100)
    if n > MAX_BOOTSTRAP:
        raise t.error("bootstrap", f"an integer from 100 to {MAX_BOOTSTRAP}", n)
    return int(n)


SCORERS = ("rows", "in-process")
MAX_COLD_STARTS = 20  # a default: each start costs minutes
MIN_COLD_STARTS = 2  # one start cannot show that cold starts agree
PROTOCOLS = ("hash", "mean")


def _parse_fidelity(t: Table) -> FidelityConfig:
    t.only(
        "panel",
        "teacher",
        "top_k",
        "max_mean_kld",
        "min_top1",
        "bootstrap",
        "seed",
        "strict",
        "tolerance",
        "tolerance_source",
        "reference",
        "scorer",
        "cold_starts",
        "protocol",
    )
    common = {
        "top_k": t.int("top_k", 20, minimum=-1),
        "max_mean_kld": _positive(t, "max_mean_kld"),
        "min_top1": _fraction(t, "min_top1"),
        "bootstrap": _bootstrap(t),
        "seed": t.int("seed", 0, minimum=0),
        "strict": t.bool("strict", False),
        "tolerance": _fraction(t, "tolerance") or 0.0,
        "reference": tuple(t.str_map("reference", {}).items()),
        "scorer": t.choice("scorer", SCORERS, "rows"),
        "tolerance_source": t.str("tolerance_source", ""),
        "cold_starts": t.int("cold_starts", MIN_COLD_STARTS, minimum=1),
        "protocol": t.choice("protocol", PROTOCOLS, "hash"),
    }
    if not MIN_COLD_STARTS <= common["cold_starts"] <= MAX_COLD_STARTS:
        raise t.error(
            "cold_starts",
            f"{MIN_COLD_STARTS} to {MAX_COLD_STARTS} server starts (one start shows nothing "
            "about cold starts)",
            common["cold_starts"],
        )
    if common["scorer"] == "in-process" and common["top_k"] != -1:
        raise t.error("top_k", '-1 with scorer = "in-process" (it scores full rows)')
    if common["tolerance"] and not common["tolerance_source"]:
        raise t.error(
            "tolerance_source", 'where tolerance comes from (the card\'s words, or "default")'
        )
    if common["top_k"] == 0:
        raise t.error("top_k", "a positive integer, or -1 for the full vocabulary", 0)
    if not t.has("panel") and not t.has("teacher"):
        # FILL IN: the card's panel and teacher are not pinned yet; the gates say so (SKIP).
        return FidelityConfig(
            panel=None, panel_sha256=None, teacher=None, teacher_sha256=None, teacher_url=None,
            **common,
        )  # fmt: skip
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
        try:
            validate.http_url(url)
        except ValueError:
            raise teacher_t.error("url", "an http:// or https:// URL", url) from None
    else:
        teacher, teacher_sha = _file_ref(t, "teacher")
    return FidelityConfig(
        panel=panel,
        panel_sha256=panel_sha,
        teacher=teacher,
        teacher_sha256=teacher_sha,
        teacher_url=url,
        **common,
    )

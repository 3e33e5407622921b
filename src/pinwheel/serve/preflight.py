"""Preflight: is this box able to serve the profile? Answers in under 2 s, or names the fix.

Every probe is a subprocess or a file read, run concurrently: GPUs from
``nvidia-smi --query-gpu`` (CSV) against the ``[serve]`` profile, the
``nvidia-smi topo -m`` matrix parsed into NVLink/PCIe pairs (a warning for
tensor-parallel pairs without NVLink), CUDA 12.x nvcc, gcc/g++, ninja, the
engine's Python, free disk for the model, and the engine package registering
the fork's quantization method and architecture (read from its files, not
imported: importing vLLM takes longer than the whole preflight may).

The opt-in self-test (``--selftest``) copies a patterned buffer between every
GPU pair and compares checksums (a V100 build lost days to cross-socket PCIe
P2P that returned garbage with no error), and checks a half-precision GEMM
against an fp32 reference. It runs in the engine's Python through the kernel
wheel ``pinwheel_selftest`` when installed, else through torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel import cachelayout, documents, runner, untrusted, validate
from pinwheel.errors import PinwheelError
from pinwheel.manifest.image import Image
from pinwheel.manifest.serve import Engine, ServeConfig, ServeProfile
from pinwheel.serve import workers
from pinwheel.serve.gpufacts import (  # noqa: F401 (re-exported: preflight.X)
    GPU_QUERY,
    Gpu,
    Topology,
    _cc,
    parse_gpu_csv,
    parse_nvcc_release,
    parse_topo,
)
from pinwheel.serve.ranks import NVLS_OFF

if TYPE_CHECKING:
    from pinwheel.serve.allreduce import AllReduceOutcome

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
PYTHON_RANGE = ((3, 10), (3, 13))  # what vLLM supports


class PreflightFailed(PinwheelError):
    """One or more preflight checks failed (exit code 1); each printed its next command."""


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    next: str | None = None  # the command or edit that fixes it


# --------------------------------------------------------------------------- parsing


# --------------------------------------------------------------------------- probes


@dataclass(frozen=True)
class Options:
    profile: ServeProfile
    config: ServeConfig
    python: str  # the engine's interpreter
    model: Path | None
    devices: tuple[int, ...]  # physical GPU indices of the profile's ranks, in order
    selftest: bool = False
    allreduce_bytes: int = 256 << 20  # --selftest's NCCL all-reduce
    nvidia_smi: str = "nvidia-smi"
    timeout_s: float = 10.0
    environ: Mapping[str, str] = field(default_factory=dict)  # the children's base
    cuda_home: Path | None = None  # CUDA_HOME (pinwheel.options.host)
    search_path: str | None = None  # PATH (pinwheel.options.host); None: unset
    container_runtime: str | None = None  # the runtime program; default [serve.engine] runtime
    # a host Python with CUDA torch named by the user (--python / $PYTHON): under an image
    # engine the engine's torch is inside the image, so the all-reduce runs with this one
    torch_python: str | None = None
    cache: Path | None = None  # pinwheel's cache: a toolkit `pinwheel toolchain` provisioned
    # the manifest's `[build] python` ("3.12"): the wheels' cp tag, so the engine Python's
    # minor version must equal it (None: the manifest pins none)
    pinned_python: str | None = None


def _run(argv: Sequence[str], timeout: float) -> tuple[int, str] | None:
    """(exit code, stdout+stderr), or None when the program is not installed."""
    if shutil.which(argv[0]) is None and not Path(argv[0]).is_file():
        return None
    try:
        p = runner.run(runner.Command(tuple(argv), timeout=timeout, check=False))
    except PinwheelError as exc:  # could not start, or ran past the timeout
        return 127, exc.what
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


def check_gpus(opts: Options, gpus: tuple[Gpu, ...] | None, error: str | None) -> list[Check]:
    prof = opts.profile
    if prof.gpus == 0:
        return [Check("gpus", SKIP, f"profile '{prof.name}' needs no GPU")]
    if gpus is None:
        return [
            Check(
                "gpus",
                FAIL,
                error or "nvidia-smi not found",
                "install the NVIDIA driver (nvidia-smi) and check `nvidia-smi` lists the GPUs",
            )
        ]
    out = []
    by_index = {g.index: g for g in gpus}
    missing = [i for i in opts.devices if i not in by_index]
    listing = "; ".join(
        f"{g.index}: {g.name} cc {_cc(g.compute_capability)} {_gib(g)}" for g in gpus
    )
    if len(opts.devices) != prof.gpus or missing:
        out.append(
            Check(
                "gpu count",
                FAIL,
                f"profile '{prof.name}' needs {prof.gpus} GPUs, found {len(gpus)} ({listing})",
                f"run on a box with {prof.gpus} GPUs, or pass --profile for a smaller one",
            )
        )
        return out
    out.append(Check("gpu count", OK, f"{prof.gpus} of {len(gpus)}: {listing}"))
    chosen = [by_index[i] for i in opts.devices]
    if prof.compute_capability:
        want = prof.compute_capability.sm
        bad = [g for g in chosen if g.compute_capability is None or g.compute_capability.sm != want]
        out.append(
            Check(
                "compute capability",
                FAIL,
                ", ".join(f"GPU{g.index} is cc {_cc(g.compute_capability)}" for g in bad)
                + f"; the build targets cc {_cc(prof.compute_capability)}",
                "use the profile/manifest built for this GPU (`pinwheel preflight --profile NAME`)",
            )
            if bad
            else Check("compute capability", OK, f"all cc {_cc(prof.compute_capability)}")
        )
    if prof.gpu_memory_gib:
        need = prof.gpu_memory_gib * 1024 * 0.95  # drivers report a little under the nominal size
        small = [g for g in chosen if g.memory_mib is not None and g.memory_mib < need]
        out.append(
            Check(
                "gpu memory",
                FAIL,
                ", ".join(f"GPU{g.index} has {_gib(g)}" for g in small)
                + f"; the profile needs {prof.gpu_memory_gib} GiB each",
                "use GPUs with more memory or a profile with a smaller max_model_len",
            )
            if small
            else Check("gpu memory", OK, f">= {prof.gpu_memory_gib} GiB each")
        )
    return out


def _gib(g: Gpu) -> str:
    return "unified memory" if g.memory_mib is None else f"{g.memory_mib / 1024:.1f} GiB"


def check_topology(opts: Options, topo: Topology | None, error: str | None) -> list[Check]:
    prof = opts.profile
    if prof.gpus < 2 or prof.tensor_parallel_size < 2:
        return [Check("topology", SKIP, "no tensor-parallel group to check")]
    if topo is None:
        return [
            Check(
                "topology",
                WARN,
                error or "nvidia-smi topo -m gave nothing",
                "run `nvidia-smi topo -m` by hand",
            )
        ]
    absent = [d for d in opts.devices if d not in topo.gpus]
    if absent:
        listed = ", ".join(f"GPU{d}" for d in absent)
        return [Check("topology", SKIP, f"{listed} not in the matrix (see gpu count)")]
    slow = []
    for group in prof.tp_groups:
        phys = [opts.devices[r] for r in group if r < len(opts.devices)]
        for i, a in enumerate(phys):
            for b in phys[i + 1 :]:
                if not topo.nvlinked(a, b):
                    slow.append(f"GPU{a}-GPU{b} {topo.link(a, b) or '?'}")
    summary = f"{len(topo.nvlink_pairs)} NVLink pairs, {len(topo.pcie_pairs)} PCIe/system pairs"
    if slow:
        return [
            Check(
                "topology",
                WARN,
                f"{summary}; tensor-parallel pairs without NVLink: {', '.join(slow)}",
                "export NCCL_P2P_LEVEL=NVL (keep NCCL off PCIe P2P across sockets), "
                "then run `pinwheel preflight --selftest`",
            )
        ]
    return [Check("topology", OK, f"{summary}; every tensor-parallel pair is NVLinked")]


def cached_toolkits(cache: Path | None, major: str) -> list[Path]:
    """Toolkits of CUDA ``major`` that pinwheel provisioned into the cache (complete ones)."""
    if cache is None:
        return []
    toolchains = cachelayout.bucket(Path(cache), "toolchains")
    found = sorted(toolchains.glob(f"cuda-{major}.*"), reverse=True)
    return [
        root
        for root in found
        if (root / ".pinwheel-toolkit.json").is_file() and (root / "bin" / "nvcc").is_file()
    ]


def runtime_cuda_ok(want: str, release: str) -> bool:
    """nvcc ``release`` ("12.9") meets a profile's ``cuda`` ("12": any 12.x; "12.8": 12.8
    or a later 12.x; never another major)."""
    w = [int(x) for x in want.split(".")]
    r = [int(x) for x in release.split(".")[:2]]
    return r[0] == w[0] and (len(w) < 2 or r[1:2] >= w[1:2])


def _wanted(want: str) -> str:
    major, _, minor = want.partition(".")
    return f"CUDA {want} or a later {major}.x" if minor else f"CUDA {major}.x"


def check_nvcc(opts: Options) -> Check:
    want = str(opts.profile.cuda)
    major = want.split(".")[0]
    cached = [
        root
        for root in cached_toolkits(opts.cache, major)
        if runtime_cuda_ok(want, root.name.removeprefix("cuda-"))
    ]
    # Already provisioned: point at it rather than provisioning again.
    fix = (
        f"export CUDA_HOME={cached[0]}  ({cached[0].name.removeprefix('cuda-')} that "
        "`pinwheel toolchain` already provisioned into the cache)"
        if cached
        else f"provision {_wanted(want)} (`pinwheel toolchain`) and export CUDA_HOME to it"
    )
    candidates = []
    if opts.cuda_home is not None:
        candidates.append(str(opts.cuda_home / "bin" / "nvcc"))
    candidates += [shutil.which("nvcc", path=opts.search_path) or ""]
    candidates += ["/usr/local/cuda/bin/nvcc"]
    for nvcc in [c for c in candidates if c and Path(c).is_file()]:
        res = _run([nvcc, "--version"], opts.timeout_s)
        release = parse_nvcc_release(res[1]) if res else None
        if release and runtime_cuda_ok(want, release):
            return Check("cuda toolkit", OK, f"nvcc {release} at {nvcc}")
        if release:
            return Check(
                "cuda toolkit",
                FAIL,
                f"nvcc {release} at {nvcc}; TileLang/Triton JIT at start-up need "
                f"{_wanted(want)} ([serve.profile] cuda = {want!r})",
                fix,
            )
    return Check(
        "cuda toolkit",
        FAIL,
        "no nvcc (CUDA_HOME, PATH, /usr/local/cuda)"
        + (f"; the cache holds {cached[0].name} at {cached[0]}" if cached else ""),
        fix,
    )


def check_program(name: str, argv: Sequence[str], fix: str, timeout: float) -> Check:
    res = _run(argv, timeout)
    if res is None or res[0] != 0:
        return Check(name, FAIL, f"`{' '.join(argv)}` did not run", fix)
    return Check(name, OK, res[1].strip().splitlines()[0] if res[1].strip() else "present")


def probe_engine(opts: Options) -> tuple[dict[str, Any] | None, str | None]:
    res = _run(
        [opts.python, "-c", workers.source("engine_probe"), opts.config.engine.module],
        opts.timeout_s,
    )
    if res is None:
        return None, f"engine interpreter {opts.python!r} not found"
    if res[0] != 0:
        return None, res[1].strip().splitlines()[-1] if res[1].strip() else f"exit {res[0]}"
    try:
        probe = untrusted.answer_line(
            res[1], documents.EngineProbe, untrusted.WORKER, f"{opts.python} (engine probe)"
        )
    except PinwheelError as exc:
        return None, f"the engine probe's answer is malformed: {exc.what}"
    return {"python": list(probe.python), "path": probe.path, "version": probe.version}, None


def check_python(opts: Options, info: dict[str, Any] | None, error: str | None) -> Check:
    if info is None:
        return Check(
            "python",
            FAIL,
            error or "engine interpreter did not run",
            "pass --python PATH to the engine venv's python (`pinwheel install` makes one)",
        )
    v = tuple(info["python"][:2])
    text = ".".join(map(str, info["python"]))
    lo, hi = PYTHON_RANGE
    if not lo <= v <= hi:
        return Check(
            "python",
            FAIL,
            f"engine Python {text}; vLLM supports {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}",
            "recreate the engine venv with a supported Python and `pinwheel install` into it",
        )
    if opts.pinned_python is not None and f"{v[0]}.{v[1]}" != opts.pinned_python:
        return Check(
            "python",
            FAIL,
            f"engine Python {text} ({opts.python}), but [build] python pins "
            f"{opts.pinned_python}: the release's cp{opts.pinned_python.replace('.', '')} "
            "wheels do not install into it",
            "install the release into its own venv (`pinwheel install fetched-release --venv "
            f"engine-venv` makes it with Python {opts.pinned_python}, found on PATH, by uv or "
            "pyenv) and pass --python engine-venv/bin/python",
        )
    pin = ", as [build] python pins" if opts.pinned_python is not None else ""
    return Check("python", OK, f"engine Python {text} ({opts.python}){pin}")


def check_engine(engine: Engine, info: dict[str, Any] | None) -> Check:
    fix = "install this build's wheel: `pinwheel install` (stock vLLM lacks the fork's kernels)"
    if info is None or not info.get("path"):
        return Check(
            "engine", FAIL, f"'{engine.module}' is not importable by the engine Python", fix
        )
    root = Path(info["path"])
    missing = []
    if engine.quantization and not _mentions(
        root / "model_executor/layers/quantization/__init__.py", engine.quantization
    ):
        missing.append(f"quantization method '{engine.quantization}'")
    if engine.architecture and not _mentions(
        root / "model_executor/models/registry.py", engine.architecture
    ):
        missing.append(f"architecture '{engine.architecture}'")
    where = f"{engine.module} {info.get('version')} at {root}"
    if missing:
        return Check("engine", FAIL, f"{where} does not register {' or '.join(missing)}", fix)
    return Check(
        "engine",
        OK,
        f"{where} registers "
        + ", ".join(x for x in (engine.quantization, engine.architecture) if x),
    )


def check_runtime(opts: Options, image: Image) -> Check:
    """The container runtime the image engine needs is installed and answers."""
    program = opts.container_runtime or image.runtime
    res = _run([program, "--version"], opts.timeout_s)
    fix = (
        f"install {image.runtime} and the NVIDIA Container Toolkit "
        f"(the profile serves from the image {image.ref})"
    )
    if res is None or res[0] != 0:
        return Check("container runtime", FAIL, f"`{program} --version` did not run", fix)
    first = res[1].strip().splitlines()[0] if res[1].strip() else image.runtime
    return Check("container runtime", OK, first)


def check_image(opts: Options, image: Image, runtime: Check) -> Check:
    """The image is present locally under the pinned digest (a tag is never trusted)."""
    pull = f"{image.runtime} pull {image.ref}"
    if runtime.status != OK:
        return Check("image digest", SKIP, "no container runtime (see above)")
    program = opts.container_runtime or image.runtime
    res = _run(
        [program, "image", "inspect", "--format", "{{json .RepoDigests}}", image.ref],
        opts.timeout_s,
    )
    if res is None or res[0] != 0:
        return Check("image digest", FAIL, f"{image.ref} is not pulled", pull)
    try:
        digests = json.loads(res[1].strip().splitlines()[-1])
    except (ValueError, IndexError):
        digests = None
    if not isinstance(digests, list):
        return Check(
            "image digest", FAIL, f"`{program} image inspect` gave no RepoDigests list", pull
        )
    named = [
        d
        for d in digests
        if isinstance(d, str)
        and d.endswith("@" + image.digest)
        and d.split("@", 1)[0].split("/")[-2:] == image.name.split("/")[-2:]
    ]
    if not named:
        return Check(
            "image digest",
            FAIL,
            f"the local image's digests {digests} do not include {image.digest}",
            pull,
        )
    tag = f" (published as {image.tag})" if image.tag else ""
    return Check("image digest", OK, f"{named[0]}{tag}")


def check_runtime_pin(opts: Options) -> Check:
    """The engine venv's distributions against ``[serve.runtime]``: a pinned value that
    differs fails; one the manifest leaves as FILL IN, or a hash the venv does not record,
    is named unverified (a warning), never guessed."""
    from pinwheel.serve import runtimepin

    pin = opts.config.runtime
    assert pin is not None
    got = runtimepin.check(pin, opts.python)
    unverified = f"; unverified: {'; '.join(got.unverified)}" if got.unverified else ""
    if got.mismatches:
        first = got.mismatches[0]
        more = "".join(f"; {p.what} ({p.where})" for p in got.mismatches[1:])
        return Check("runtime pin", FAIL, f"{first.what} ({first.where}){more}{unverified}",
                     first.next)  # fmt: skip
    verified = ", ".join(got.verified) or "nothing"
    at = f"@{pin.revision}" if pin.revision else ""
    detail = f"[serve.runtime] {pin.repo}{at} in {got.venv}: verified {verified}{unverified}"
    if got.unverified:
        return Check("runtime pin", WARN, detail,
                     f"fill in the FILL IN keys of [serve.runtime] ({pin.where}) from the wheels "
                     f"of {pin.repo} at its revision (version from the wheel's file name, sha256 "
                     "of the file), install from the wheel files (pip records their sha256), "
                     "then run `pinwheel preflight`")  # fmt: skip
    return Check("runtime pin", OK, detail)


def _mentions(path: Path, name: str) -> bool:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return f'"{name}"' in text or f"'{name}'" in text


def check_disk(opts: Options) -> Check:
    need = opts.config.model_disk_gib
    if opts.model is None:
        return Check("disk", SKIP, f"no model path given ({opts.config.model_var} / --model)")
    if opts.model.is_dir() and any(opts.model.iterdir()):
        return Check("disk", OK, f"model present at {opts.model}")
    probe = opts.model
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 2**30
    if free < need:
        return Check(
            "disk",
            FAIL,
            f"{free:.0f} GiB free at {probe}, the model needs {need} GiB",
            f"free space or point {opts.config.model_var} at a bigger disk, then `pinwheel model`",
        )
    return Check(
        "disk",
        OK,
        f"{free:.0f} GiB free at {probe} (model needs {need} GiB); fetch it with `pinwheel model`",
    )


# The self-test runs in the engine's Python (where torch and the kernel wheel live).
def run_selftest(opts: Options, nbytes: int = 64 << 20) -> list[Check]:
    env_fix = (
        "check the driver and the engine's torch: "
        "`python -c 'import torch; print(torch.cuda.is_available())'`"
    )
    cmd = runner.Command(
        (opts.python, "-c", workers.source("selftest"), str(nbytes)),
        what="p2p self-test",
        timeout=300,
        check=False,
        env=opts.environ or None,
        env_set=dict(NVLS_OFF),  # NVLink multicast off in every child on shared machines
    )
    try:
        p = runner.run(cmd)
    except PinwheelError as exc:  # could not start, or ran past the timeout
        return [Check("p2p self-test", FAIL, exc.what, env_fix)]
    if p.returncode != 0:
        tail = (p.err_text.splitlines() or ["?"])[-1]
        return [Check("p2p self-test", FAIL, f"self-test crashed: {tail}", env_fix)]
    try:
        ans = untrusted.answer_line(
            p.text, documents.SelftestAnswer, untrusted.WORKER, "p2p self-test"
        )
    except PinwheelError as exc:
        return [Check("p2p self-test", FAIL, f"malformed answer: {exc.what}", env_fix)]
    checks = []
    pairs = ans.pairs
    bad = [f"GPU{r.src}->GPU{r.dst}" for r in pairs if not r.ok]
    if ans.devices < 2:
        checks.append(
            Check("p2p self-test", SKIP, f"{ans.devices} GPU visible: no pair to copy between")
        )
    elif bad:
        checks.append(
            Check(
                "p2p self-test",
                FAIL,
                f"corrupted copies ({ans.via}): {', '.join(bad)}",
                "export NCCL_P2P_DISABLE=1 (or NCCL_P2P_LEVEL=NVL) and check ACS/IOMMU "
                "settings in the BIOS; rerun `pinwheel preflight --selftest`",
            )
        )
    else:
        peer = sum(1 for r in pairs if r.peer)
        want = ans.devices * (ans.devices - 1)
        checks.append(
            Check(
                "p2p self-test",
                OK if len({(r.src, r.dst) for r in pairs}) == want else FAIL,
                f"{len(pairs)} directed pairs copied {nbytes >> 20} MiB intact "
                f"({peer} over peer access, via {ans.via})"
                + ("" if len({(r.src, r.dst) for r in pairs}) == want else f"; {want} expected"),
            )
        )
    gbad = [f"GPU{g.device} {g.err_kind} {g.err:.2e}" for g in ans.gemm if not g.ok]
    detail = ", ".join(
        f"GPU{g.device} {g.err_kind} {g.err:.1e}" + (" (PTX JIT)" if g.jit else "")
        for g in ans.gemm
    )
    checks.append(
        Check(
            "gemm self-test",
            FAIL,
            f"fp16 GEMM wrong: {', '.join(gbad)}",
            "reinstall the build's kernel wheel (`pinwheel install`) and check the GPU",
        )
        if gbad
        else Check(
            "gemm self-test",
            OK if ans.gemm else SKIP,
            (detail or "no GPU") + f" (via {ans.via})",
        )
    )
    return checks


# --------------------------------------------------------------------------- the whole preflight


def _run_at_once(tools: Mapping[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each probe in its own thread (they wait on subprocesses); their results by name."""
    with ThreadPoolExecutor(max_workers=len(tools)) as pool:
        futures = {k: pool.submit(f) for k, f in tools.items()}
        return {k: f.result() for k, f in futures.items()}


def preflight(opts: Options) -> tuple[Check, ...]:
    """Every check, probes run concurrently; never raises for a failed check."""
    smi = opts.nvidia_smi
    needs_gpu = opts.profile.gpus > 0

    def gpus() -> tuple[tuple[Gpu, ...] | None, str | None]:
        if not needs_gpu:
            return None, None
        res = _run(
            [smi, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"], opts.timeout_s
        )
        if res is None:
            return None, "nvidia-smi not found"
        if res[0] != 0:
            return None, res[1].strip()[:200]
        try:
            return parse_gpu_csv(res[1]), None
        except PinwheelError as exc:  # a malformed answer: the GPU check fails, saying why
            return None, exc.what[:300]

    def topo() -> tuple[Topology | None, str | None]:
        if opts.profile.tensor_parallel_size < 2:
            return None, None
        res = _run([smi, "topo", "-m"], opts.timeout_s)
        if res is None or res[0] != 0:
            return None, "nvidia-smi topo -m failed" + (f": {res[1].strip()[:200]}" if res else "")
        try:
            return parse_topo(res[1]), None
        except PinwheelError as exc:
            return None, exc.what[:300]

    image = opts.config.engine.image
    if image is not None:
        return _preflight_image(opts, image, gpus, topo)
    tools: dict[str, Callable[[], object]] = {
        "gpus": gpus,
        "topo": topo,
        "engine": lambda: probe_engine(opts),
        "nvcc": lambda: check_nvcc(opts),
        "gcc": lambda: check_program(
            "gcc",
            ["gcc", "-dumpfullversion"],
            "apt-get install -y gcc g++ (TileLang/Triton JIT compile at start-up)",
            opts.timeout_s,
        ),
        "g++": lambda: check_program(
            "g++", ["g++", "-dumpfullversion"], "apt-get install -y g++", opts.timeout_s
        ),
        "ninja": lambda: check_program(
            "ninja",
            ["ninja", "--version"],
            "apt-get install -y ninja-build (or pip install ninja in the engine venv)",
            opts.timeout_s,
        ),
        "disk": lambda: check_disk(opts),
    }
    got = _run_at_once(tools)
    g, g_err = got["gpus"]
    t, t_err = got["topo"]
    info, info_err = got["engine"]
    checks: list[Check] = []
    checks += check_gpus(opts, g, g_err)
    checks += check_topology(opts, t, t_err)
    checks.append(got["nvcc"])
    checks += [got["gcc"], got["g++"], got["ninja"]]
    checks.append(check_python(opts, info, info_err))
    checks.append(check_engine(opts.config.engine, info))
    checks.append(got["disk"])
    if opts.config.runtime is not None:
        checks.append(check_runtime_pin(opts))
    if opts.selftest:
        checks += (
            run_selftest(opts) + [run_allreduce(opts, g)]
            if needs_gpu
            else [Check("self-test", SKIP, "no GPU in this profile")]
        )
    return tuple(checks)


def _preflight_image(
    opts: Options,
    image: Image,
    gpus: Callable[[], tuple[tuple[Gpu, ...] | None, str | None]],
    topo: Callable[[], tuple[Topology | None, str | None]],
) -> tuple[Check, ...]:
    """An image engine: the runtime and the pinned digest instead of a venv's toolchain."""

    def runtime_and_image() -> tuple[Check, Check]:
        runtime = check_runtime(opts, image)
        return runtime, check_image(opts, image, runtime)

    tools: dict[str, Callable[[], object]] = {
        "gpus": gpus,
        "topo": topo,
        "image": runtime_and_image,
        "disk": lambda: check_disk(opts),
    }
    got = _run_at_once(tools)
    g, g_err = got["gpus"]
    t, t_err = got["topo"]
    inside = f"inside the image {image.ref}"
    checks: list[Check] = []
    checks += check_gpus(opts, g, g_err)
    checks += check_topology(opts, t, t_err)
    checks += list(got["image"])
    checks.append(Check("engine", SKIP, f"CUDA, compilers, Python and the engine are {inside}"))
    checks.append(got["disk"])
    if opts.selftest:
        checks.append(Check("self-test", SKIP, f"the self-test needs a venv engine; {inside}"))
        if opts.torch_python:
            checks.append(run_allreduce(dataclasses.replace(opts, python=opts.torch_python), g))
        else:
            checks.append(
                Check(
                    "nccl all-reduce",
                    SKIP,
                    f"the engine's torch is {inside}",
                    "pass --python PY (a host Python with CUDA torch) to run it on the host",
                )
            )
    return tuple(checks)


def allreduce_check(outcome: AllReduceOutcome, profile_name: str, gate: float | None) -> Check:
    """The preflight check: FAIL on a crash, a wrong sum, NVLS left on, or busbw under the gate."""
    from pinwheel.progress import human_bytes

    name = "nccl all-reduce"
    key = f"[serve.profile.{profile_name}] min_allreduce_gbps"
    rerun = "rerun `pinwheel preflight --selftest` with NCCL_DEBUG=INFO to see NCCL's transport"
    if outcome.failures:
        return Check(
            name,
            FAIL,
            f"{outcome.world} ranks ({outcome.backend}): " + "; ".join(outcome.failures),
            "check the engine's torch sees every GPU "
            "(`python -c 'import torch; print(torch.cuda.device_count())'`); " + rerun,
        )
    if not outcome.nvls_off:
        return Check(
            name,
            FAIL,
            "a rank ran with NVLink multicast on (NCCL_NVLS_ENABLE / "
            "TORCH_SYMM_MEM_DISABLE_MULTICAST / NVSHMEM_DISABLE_NVLS not set in its environment)",
            "report this: pinwheel sets them for every rank",
        )
    size = human_bytes(outcome.nbytes)
    if not outcome.sum_ok:
        return Check(
            name,
            FAIL,
            f"wrong sums over {outcome.world} GPUs ({size} float32): " + "; ".join(outcome.wrong),
            "export NCCL_P2P_LEVEL=NVL (or NCCL_P2P_DISABLE=1) and check ACS/IOMMU settings; "
            + rerun,
        )
    busbw = outcome.busbw_gbps if outcome.busbw_gbps is not None else 0.0
    what = (
        f"{outcome.world} x {outcome.device} ({outcome.backend}"
        + (f" {outcome.nccl}" if outcome.nccl else "")
        + f"), {size} float32: sum right on every rank; "
        f"bus bandwidth {busbw:.1f} GB/s (algbw {outcome.algbw_gbps or 0:.1f} GB/s, "
        f"{(outcome.seconds or 0) * 1e3:.3f} ms per all-reduce); NVLS off in every rank"
    )
    if outcome.world < 2:
        return Check(name, OK, f"{what}; one rank: no bus traffic, gate not applied")
    if gate is None:
        return Check(name, OK, f"{what}; not gated ({key} unset)")
    if not math.isfinite(busbw) or not busbw >= gate:  # NaN compares false: never a pass
        below = "not a finite bandwidth" if not math.isfinite(busbw) else "below the gate"
        return Check(
            name,
            FAIL,
            f"{what}; {below} {gate:g} GB/s ({key})",
            "check `nvidia-smi topo -m` (NVLink expected between tensor-parallel GPUs) "
            "and that no other job uses these GPUs; " + rerun,
        )
    return Check(name, OK, f"{what}; gate {gate:g} GB/s ({key})")


def run_allreduce(opts: Options, gpus: tuple[Gpu, ...] | None) -> Check:
    """NCCL all-reduce over the profile's GPUs, one process each (serve/allreduce.py)."""
    from pinwheel.serve.allreduce import AllReduceRequest, measure

    present = {g.index for g in gpus or ()}
    if not opts.devices or any(d not in present for d in opts.devices):
        return Check("nccl all-reduce", SKIP, "the profile's GPUs are not all present (gpu count)")
    outcome = measure(
        AllReduceRequest(
            python=opts.python,
            devices=opts.devices,
            environ=opts.environ,
            nbytes=opts.allreduce_bytes,
        )
    )
    return allreduce_check(outcome, opts.profile.name, opts.profile.min_allreduce_gbps)


def device_indices(profile: ServeProfile, devices: str | None) -> tuple[int, ...]:
    """Physical GPU indices of the profile's ranks: CUDA_VISIBLE_DEVICES order (PCI bus order)."""
    text = devices or profile.devices
    if not text:
        return tuple(range(profile.gpus))
    try:
        return validate.gpu_indices(text)
    except ValueError as exc:
        raise PinwheelError(
            f"CUDA_VISIBLE_DEVICES {text[:80]!r} is not a list of GPU indices: {exc}",
            where="--devices / CUDA_VISIBLE_DEVICES",
            next="use unique indices like 0,1,2,3 (UUIDs are not supported by preflight)",
        ) from None

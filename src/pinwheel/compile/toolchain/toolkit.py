"""A found CUDA toolkit: its version and the probe that proves it compiles every arch.

Every toolkit is probed by compiling a tiny kernel for each requested arch
before it is used: CUDA 13 dropped sm_70, and an nvcc that cannot emit the
manifest's arches must stop the build here, not an hour into it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pinwheel import options, runner
from pinwheel.cudaarch import parse_arch
from pinwheel.errors import PinwheelError


class ToolchainError(PinwheelError):
    """No usable CUDA toolkit, or provisioning one failed."""


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit that compiled a probe kernel for every requested arch."""

    root: Path
    nvcc: Path
    version: str  # "12.4.131"
    arches: tuple[str, ...]  # the arches it was probed for
    source: str  # where it came from: "CUDA_HOME", "PATH", "provisioned", ...

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` for build subprocesses: this toolkit first on PATH, CUDA_HOME set."""
        env = dict(base)
        env.update(
            CUDA_HOME=str(self.root),
            CUDA_PATH=str(self.root),
            CUDAToolkit_ROOT=str(self.root),
            CUDACXX=str(self.nvcc),
            PATH=os.pathsep.join([str(self.root / "bin"), options.value(env, "PATH", os.defpath)]),
        )
        return env

    def facts(self) -> dict[str, str]:
        """For provenance receipts."""
        return {"cuda": self.version, "nvcc": str(self.nvcc), "source": self.source}


_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


def nvcc_version(nvcc: Path, *, env: Mapping[str, str]) -> str:
    """``12.4.131`` from ``nvcc --version`` run in ``env``."""
    cmd = runner.Command(
        (str(nvcc), "--version"), env=env, timeout=60, check=False, error=ToolchainError
    )
    out = runner.run(cmd)
    m = _RELEASE.search(out.text)
    if out.returncode != 0 or not m:
        raise ToolchainError(
            f"`{nvcc} --version` gave no CUDA release line (exit {out.returncode})",
            where=str(nvcc),
            next="check that this is NVIDIA's nvcc",
        )
    return m.group(2)


_PROBE = r"""
#include <cuda_fp16.h>
// Touches fp16 and the tensor-core MMA that the self-tests rely on for sm_70+.
__global__ void pinwheel_probe(const __half* a, float* out) {
  out[threadIdx.x] = __half2float(a[threadIdx.x]) * 2.0f;
}
"""

# nvcc messages that deserve a tailored "why" and "what to do".
_DIAGNOSES = (
    (
        re.compile(r"Unsupported gpu architecture 'compute_(\d+)'"),
        "this nvcc cannot target sm_{0} (CUDA 13 dropped Volta sm_70 and older)",
        'use a CUDA 12.x toolkit: set [build] cuda = "12.4" and run `pinwheel toolchain`, '
        "which provisions one into the cache",
    ),
    (
        re.compile(r"unsupported GNU version|unsupported clang version"),
        "the host compiler is newer than this nvcc supports",
        "point CUDAHOSTCXX at a supported g++ (CUDA 12.4: gcc <= 13), or install g++-13",
    ),
)


def probe_arches(
    nvcc: Path, arches: tuple[str, ...], *, env: Mapping[str, str], cache: Path | None = None
) -> None:
    """Compile a tiny kernel for each arch in ``env``; raise saying why and what to do if one
    fails. With ``cache``: a probe that passed with the same toolkit files, host compiler and
    arches is not compiled again (:mod:`.probememo`)."""
    from pinwheel.compile.toolchain import probememo

    probe_key = probememo.key(nvcc, arches, env, _PROBE)
    if probememo.passed(cache, probe_key):
        return
    _probe(nvcc, arches, env=env)
    probememo.remember(cache, probe_key, arches)


def _probe(nvcc: Path, arches: tuple[str, ...], *, env: Mapping[str, str]) -> None:
    with tempfile.TemporaryDirectory(prefix="pinwheel-probe-") as tmp:
        src = Path(tmp) / "probe.cu"
        src.write_text(_PROBE)
        for arch in arches:
            target = dataclasses.replace(parse_arch(arch), ptx=True)  # SASS + PTX
            cmd = [
                str(nvcc),
                "-c",
                str(src),
                "-o",
                str(Path(tmp) / f"probe_{target.sm}{target.suffix}.o"),
                f"-gencode={target.gencode}",
            ]
            out = runner.run(
                runner.Command(tuple(cmd), env=env, timeout=300, check=False, error=ToolchainError)
            )
            if out.returncode == 0:
                continue
            message = (out.err_text or out.text).splitlines()
            detail = message[-1] if message else f"exit {out.returncode}"
            why, todo = f"nvcc failed: {detail}", "run the command by hand to see the full error"
            for pattern, reason, advice in _DIAGNOSES:
                m = pattern.search(out.err_text + "\n" + out.text)
                if m:
                    why, todo = reason.format(*m.groups()) + f" ({detail})", advice
                    break
            raise ToolchainError(
                f"toolkit cannot compile for arch {arch}: {why}",
                where=f"{nvcc} ({' '.join(cmd[1:2] + cmd[5:])})",
                next=todo,
            )

"""One process per GPU: start a worker script as N ranks of a torch.distributed group.

In: a frozen :class:`RankRequest` (the engine's Python, a worker script shipped
with pinwheel, its arguments, the physical GPUs, the caller's environment).
Out: one frozen :class:`RankResult` per rank (exit code, the JSON document the
worker printed last, the tail of its output). Ranks start through
:func:`pinwheel.runner.spawn`, each in its own process group, output to a log.
Never raises for a failed rank: the caller turns results into checks.

Each child runs with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/
``MASTER_PORT`` (torch.distributed's ``env://``), ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
and ``CUDA_VISIBLE_DEVICES`` set to the requested GPUs (so its local device
ordinal is its rank and the indices are nvidia-smi's), and with NVLink
multicast switched off (:data:`NVLS_OFF`): on shared machines a program using
it can take the host's GPUs out of service, so the values are forced, whatever
the caller's environment says. When one rank fails the others are stopped
(they would wait in a collective until the timeout).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pinwheel import runner
from pinwheel.errors import PinwheelError

# NCCL's NVLink SHARP (multicast), PyTorch's symmetric-memory multicast, NVSHMEM's NVLS.
NVLS_OFF: tuple[tuple[str, str], ...] = (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
)
WORKERS = Path(__file__).resolve().parent / "workers"
GRACE_S = 5.0  # how long the other ranks get once one has failed


@dataclass(frozen=True)
class RankRequest:
    python: str  # the engine's interpreter (has torch)
    script: Path  # a worker under pinwheel/serve/workers
    args: tuple[str, ...]
    devices: tuple[int, ...]  # physical GPU per rank; () = ranks on the CPU (gloo)
    world: int  # number of ranks; len(devices) when devices are given
    environ: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 300.0
    grace_s: float = GRACE_S  # once one rank has failed, how long the others get

    @property
    def backend(self) -> str:
        return "nccl" if self.devices else "gloo"


@dataclass(frozen=True)
class RankResult:
    rank: int
    device: int | None
    returncode: int | None  # None: stopped (timeout, or another rank failed)
    payload: Mapping[str, Any] | None  # the last stdout line, when it is a JSON object
    stderr_tail: str  # the rank's last output lines (stdout and stderr, interleaved)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.payload is not None

    def why(self) -> str:
        """One line for a failed rank."""
        if self.returncode is None:
            state = "stopped"
        elif self.returncode != 0:
            state = f"exit {self.returncode}"
        else:
            state = "no JSON result"
        last = (self.stderr_tail.strip().splitlines() or [""])[-1]
        return f"rank {self.rank}: {state}" + (f" ({last[:200]})" if last else "")


def child_env(
    environ: Mapping[str, str], *, rank: int, world: int, port: int, devices: Sequence[int]
) -> dict[str, str]:
    """The environment of one rank: the caller's, the rendezvous, the GPUs, NVLS off."""
    env = dict(environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PINWHEEL_RANK_BACKEND="nccl" if devices else "gloo",
        PYTHONUNBUFFERED="1",
    )
    if devices:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
    env.update(NVLS_OFF)
    return env


def run_ranks(req: RankRequest) -> tuple[RankResult, ...]:
    """Start every rank, wait for all (or stop the rest once one fails), read their results."""
    from pinwheel.serve.supervise import free_port

    if req.devices and len(req.devices) != req.world:
        raise PinwheelError(
            f"{req.world} ranks but {len(req.devices)} GPUs given",
            where="ranks",
            next="pass one GPU per rank",
        )
    if req.world < 1:
        raise PinwheelError("no ranks to start", where="ranks", next="pass at least one GPU")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="pinwheel-ranks-") as tmp:
        procs: list[tuple[runner.Process, Path]] = []
        try:
            for rank in range(req.world):
                log = Path(tmp) / f"{rank}.log"
                cmd = runner.Command(
                    (req.python, str(req.script), *req.args),
                    what=f"rank {rank} of {req.script.name}",
                    env=child_env(
                        req.environ, rank=rank, world=req.world, port=port, devices=req.devices
                    ),
                    output="log",
                    log_file=log,
                    new_session=True,
                    missing_hint="pass --python PATH to the engine's interpreter (it needs torch)",
                )
                procs.append((runner.spawn(cmd), log))
        except PinwheelError:
            for p, _ in procs:
                p.kill()
            raise
        codes = _wait([p for p, _ in procs], req.timeout_s, req.grace_s)
        out = []
        for rank, (_, log) in enumerate(procs):
            text = log.read_text(errors="replace")
            out.append(
                RankResult(
                    rank=rank,
                    device=req.devices[rank] if req.devices else None,
                    returncode=codes[rank],
                    payload=_last_json(text),
                    stderr_tail=_tail(text),
                )
            )
        return tuple(out)


def _wait(procs: list[runner.Process], timeout_s: float, grace_s: float) -> list[int | None]:
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return codes
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if now > deadline or (failed_at is not None and now - failed_at > grace_s):
            for p in procs:
                p.kill()  # its whole process group
            return codes
        time.sleep(0.05)


def _last_json(text: str) -> Mapping[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _tail(text: str, lines: int = 20) -> str:
    """The log's last lines, without the result line and without the log's command line."""
    kept = [x for x in text.strip().splitlines()[1:] if not x.lstrip().startswith("{")]
    return "\n".join(kept[-lines:])

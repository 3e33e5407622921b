"""A platform tag that tells the truth: ``manylinux_X_Y`` where auditwheel's policy holds.

auditwheel (as a library, :func:`auditwheel.wheel_abi.analyze_wheel_abi`) decides
the highest manylinux policy a wheel satisfies: symbol versions, the libraries it
links (only the policy's allowed set, nothing to graft), ISA extensions. The CUDA
and torch libraries a torch extension links are excluded explicitly, as
torch-extension wheels do: they come from the torch wheel and the driver at run
time, not from the system. auditwheel is a locked tool: without it the build stops
(:class:`LockedToolMissing`) instead of publishing the ``linux_<arch>`` name. When a
policy holds, :func:`retag` rewrites the wheel's
``WHEEL`` tags and file name (member order, timestamps and compression kept, so
the bytes stay a function of the input); otherwise the wheel stays
``linux_<arch>`` and the decision's ``reason`` says why (the release notes print it).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pinwheel.errors import PinwheelError, VerifyError


class LockedToolMissing(PinwheelError):
    """A tool the locks pin is not in pinwheel's environment: the build stops rather than
    publish a wheel under another name (another sha256) than the locked tool gives."""

# pinwheel's default exclusions (not auditwheel's): libraries a CUDA/torch extension
# loads from the torch wheel, the CUDA wheels or the driver, never from the system.
TORCH_AND_CUDA = (
    "libtorch*.so*",
    "libc10*.so*",
    "libshm.so*",
    "libcuda.so*",
    "libcudart.so*",
    "libcublas*.so*",
    "libcusparse*.so*",
    "libcusolver*.so*",
    "libcurand*.so*",
    "libcufft*.so*",
    "libnvrtc*.so*",
    "libnvToolsExt*.so*",
    "libnvJitLink*.so*",
    "libnccl*.so*",
    "libcudnn*.so*",
    "libcupti*.so*",
)


@dataclass(frozen=True)
class TagDecision:
    wheel: str
    platform: str  # "manylinux_2_34_x86_64" or "linux_x86_64"
    reason: str  # why this tag (the policy that held, or what kept it plain linux)
    excluded: tuple[str, ...] = TORCH_AND_CUDA

    @property
    def manylinux(self) -> bool:
        return self.platform.startswith("manylinux_")

    def to_json(self) -> dict[str, object]:
        return {"platform": self.platform, "reason": self.reason, "excluded": list(self.excluded)}


def _linux_tag(wheel: Path) -> str:
    platform = wheel.name[: -len(".whl")].rsplit("-", 1)[-1]
    return platform.split(".")[0]


def decide(wheel: Path, exclude: tuple[str, ...] = TORCH_AND_CUDA) -> TagDecision:
    """The manylinux policy auditwheel finds for ``wheel``, or why there is none."""
    current = _linux_tag(wheel)
    if not current.startswith("linux_"):
        return TagDecision(wheel.name, current, f"already tagged {current}", exclude)
    try:
        from auditwheel.error import NonPlatformWheelError
        from auditwheel.wheel_abi import analyze_wheel_abi
    except ImportError:
        # Issue 52: a launcher without auditwheel published `...-linux_x86_64.whl` where the
        # locked auditwheel gives `...-manylinux_2_38_x86_64.whl`: same member, another name
        # and sha256. The lock pins it, so it is there or the build stops.
        raise LockedToolMissing(
            f"auditwheel is not importable by pinwheel's Python, so {wheel.name}'s manylinux "
            "tag cannot be decided (the locks pin auditwheel: the `build` extra)",
            where=f"{wheel.name} (platform tag)",
            next="run pinwheel through tools/replay (its venv holds locks/replay.txt), or "
            "install the lock into this environment: `python -m pip install --require-hashes "
            "--no-deps -r locks/replay.txt`; then build again",
        ) from None
    logging.getLogger("auditwheel").setLevel(logging.ERROR)
    try:
        info = analyze_wheel_abi(
            None,
            None,
            wheel,
            frozenset(exclude),
            disable_isa_ext_check=False,
            allow_graft=False,
        )
    except NonPlatformWheelError:
        return TagDecision(wheel.name, current, "no ELF member: not a platform wheel", exclude)
    except Exception as exc:  # auditwheel's own errors are many and untyped
        return TagDecision(wheel.name, current, f"auditwheel could not analyse it: {exc}", exclude)
    policy = info.overall_policy
    if policy.name.startswith("manylinux_"):
        return TagDecision(
            wheel.name,
            policy.name,
            f"auditwheel: consistent with {policy.name} (symbol versions and linked "
            f"libraries; torch/CUDA libraries excluded)",
            exclude,
        )
    blocking = sorted(
        {lib for ref in info.external_refs.values() for lib in ref.libs if ref.libs}
    )
    if blocking:
        why = "links libraries outside every manylinux policy: " + ", ".join(blocking[:8])
    elif info.sym_policy.name.startswith("linux_"):
        why = "needs symbol versions newer than every manylinux policy"
    else:
        why = f"auditwheel finds no manylinux policy (symbols allow {info.sym_policy.name})"
    return TagDecision(wheel.name, current, why, exclude)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def retag(wheel: Path, platform: str, out_dir: Path) -> Path:
    """A copy of ``wheel`` in ``out_dir`` whose WHEEL tags and name carry ``platform``.

    Only ``*.dist-info/WHEEL`` and its RECORD row change; every other member is
    copied with its ZipInfo (name, time, mode, compression) in the original order.
    """
    current = _linux_tag(wheel)
    if current == platform:
        return wheel
    stem = wheel.name[: -len(".whl")]
    head, _, _ = stem.rpartition("-")
    target = out_dir / f"{head}-{platform}.whl"
    if target.resolve() == wheel.resolve():
        raise VerifyError(
            f"cannot retag {wheel.name} in place", where=str(wheel), next="pass another out_dir"
        )
    with zipfile.ZipFile(wheel) as src:
        infos = src.infolist()
        wheel_meta = next(
            (i.filename for i in infos if i.filename.endswith(".dist-info/WHEEL")), None
        )
        record = next((i.filename for i in infos if i.filename.endswith(".dist-info/RECORD")), None)
        if wheel_meta is None or record is None:
            raise VerifyError(
                "a wheel without .dist-info/WHEEL or RECORD cannot be retagged",
                where=wheel.name,
                next="rebuild the wheel",
            )
        lines = src.read(wheel_meta).decode("utf-8").splitlines()
        tagged = []
        for line in lines:
            if line.startswith("Tag: ") and line.endswith("-" + current):
                line = line[: -len(current)] + platform
            tagged.append(line)
        new_meta = ("\n".join(tagged) + "\n").encode()
        rows = []
        for row in src.read(record).decode("utf-8").splitlines():
            if row.startswith(wheel_meta + ","):
                row = f"{wheel_meta},{_record_hash(new_meta)},{len(new_meta)}"
            rows.append(row)
        new_record = ("\n".join(rows) + "\n").encode()
        tmp = target.with_name(f".{target.name}.part")
        with zipfile.ZipFile(tmp, "w") as dst:
            for info in infos:
                if info.filename == wheel_meta:
                    dst.writestr(info, new_meta)
                elif info.filename == record:
                    dst.writestr(info, new_record)
                else:
                    with src.open(info) as fh, dst.open(info, "w") as out:
                        while block := fh.read(1 << 20):
                            out.write(block)
    tmp.replace(target)
    return target

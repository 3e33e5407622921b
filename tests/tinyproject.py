"""Tiny real projects for the build-driver tests, committed into a real git upstream.

``STANDIN_SETUP``: a setuptools project whose build compiles a C shared object with gcc
and adds a ``.nv_fatbin`` section whose SASS arches follow TORCH_CUDA_ARCH_LIST, the way
nvcc would. It stands in for nvcc where no CUDA 12 toolkit can run (CI has none);
the slow tests use ``NVCC_SETUP``, which compiles a real .cu with the provisioned nvcc.
"""

from __future__ import annotations

STANDIN_SETUP = r"""
import os, struct, subprocess
from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

def arches():
    forced = os.environ.get("TINY_FORCE_SM")  # simulates a build that ignores the arch list
    if forced:
        return [int(forced)]
    listed = os.environ["TORCH_CUDA_ARCH_LIST"].split(";")
    return [int(a.split("+")[0].replace(".", "")) for a in listed]

def fatbin(sms):
    body = b""
    for sm in sms:
        payload = b"\x7fELF-standin".ljust(32, b"\0")
        head = struct.pack("<HHIQIIHHIIIQQQ", 2, 0x101, 64, len(payload), 0, 0, 8, 1, sm,
                           0, 0, 0x11, 0, 0)
        body += head + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body

class BuildWithSo(build_py):
    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "tiny")
        so = os.path.join(pkg, "_C.so")
        subprocess.check_call(["gcc", "-shared", "-fPIC", "-O2", "-o", so, "csrc/probe.c"])
        fb = os.path.join(self.build_lib, "device.fatbin")
        with open(fb, "wb") as fh:
            fh.write(fatbin(arches()))
        subprocess.check_call(["objcopy", "--add-section", ".nv_fatbin=" + fb, so])
        os.unlink(fb)
        keys = ("TORCH_CUDA_ARCH_LIST", "CUDAARCHS", "MAX_JOBS", "NVCC_THREADS",
                "SOURCE_DATE_EPOCH", "VLLM_VERSION_OVERRIDE")
        with open(os.path.join(pkg, "build_env.txt"), "w") as fh:
            fh.write("".join(f"{k}={os.environ.get(k)}\n" for k in keys))

class Binary(Distribution):
    def has_ext_modules(self):
        return True

setup(name="tiny", version=os.environ["SETUPTOOLS_SCM_PRETEND_VERSION"], packages=["tiny"],
      cmdclass={"build_py": BuildWithSo}, distclass=Binary)
"""

NVCC_SETUP = r"""
import os, subprocess
from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

def gencode():
    flags = []
    for item in os.environ["TORCH_CUDA_ARCH_LIST"].split(";"):
        sm = item.split("+")[0].replace(".", "")
        flags.append(f"-gencode=arch=compute_{sm},code=sm_{sm}")
        if item.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{sm},code=compute_{sm}")
    return flags

class BuildWithCuda(build_py):
    def run(self):
        super().run()
        so = os.path.join(self.build_lib, "tiny", "_C.so")
        nvcc = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
        # --strip-all: nvcc names a temp file (with its pid) in the symbol table.
        subprocess.check_call([nvcc, "-shared", "-Xcompiler", "-fPIC", "-O2", *gencode(),
                               "-Xlinker", "--strip-all", "-o", so, "csrc/scale.cu"])

class Binary(Distribution):
    def has_ext_modules(self):
        return True

setup(name="tiny", version=os.environ["SETUPTOOLS_SCM_PRETEND_VERSION"], packages=["tiny"],
      cmdclass={"build_py": BuildWithCuda}, distclass=Binary)
"""

# STANDIN_SETUP, but the shared object links every C file under csrc/ in the order
# os.walk lists them (what exllamav3's setup.py does with its .cu files).
WALK_SETUP = STANDIN_SETUP.replace(
    '''subprocess.check_call(["gcc", "-shared", "-fPIC", "-O2", "-o", so, "csrc/probe.c"])''',
    '''sources = [os.path.join(top, f) for top, _, files in os.walk("csrc") for f in files
                   if f.endswith(".c")]
        subprocess.check_call(["gcc", "-shared", "-fPIC", "-O2", "-o", so, *sources])''',
)
assert WALK_SETUP != STANDIN_SETUP


def walk_sources(count: int = 16) -> dict[str, str]:
    """C files for WALK_SETUP, each a function of its own size (the link order shows)."""
    files = {}
    for i in range(count):
        body = [f"int tiny_part_{i}_{j}(int x) {{ return x * {j + 3} ^ {i}; }}\n" for j in range(i)]
        files[f"csrc/part_{i:02d}.c"] = "".join(body) or f"int tiny_part_{i}(int x) {{ return x; }}\n"
    return files


SCALE_CU = r"""
__global__ void scale(float* x, float k, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= k;
}
extern "C" int tiny_scale(float* x, float k, int n) {
  scale<<<(n + 127) / 128, 128>>>(x, k, n);
  return 0;
}
"""

PROBE_C = "int tiny_probe(int x) { return 2 * x + 1; }\n"
INIT_PY = '"""tiny: a build-driver test project."""\n'

BUILD_TABLE = """
[build]
python = "{python}"
cuda = "12.4"
arches = ["7.0"]
ptx = {ptx}
label = "tinycard"
version = "0.4.1.dev3"
required_members = ["tiny/_C*.so", "tiny/__init__.py"]
env = {{ MAX_JOBS = "2", NVCC_THREADS = "{threads}"{extra_env} }}
"""


def project_files(setup_py: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        "setup.py": setup_py,
        "tiny/__init__.py": INIT_PY,
        "csrc/probe.c": PROBE_C,
        "csrc/scale.cu": SCALE_CU,
        **(extra or {}),
    }

"""The README's release walk runs as written (issue 53 item 2): a maintainer's key, signed
release and index, then a stranger's fetch, verify-release, install, pip and uv from the
index URL, against a real HTTP server on loopback (the README's own `python3 -m
http.server` line, on a free port).

The README marks these lines `# needs: build` (the generic README test skips them): here
two real wheels with their provenance stand in for `tools/replay build`'s output, in a
project folder with the fresh clone's `keys/allowed_signers` (no key yet), HOME empty.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pinwheel.checksums import sha256_file
from releasekit import make_key, make_wheel, write_manifest, write_provenance
from test_readme import README, Block, parse_blocks

pytestmark = pytest.mark.release

REPO = Path(__file__).resolve().parents[1]
MAINTAINER = "Journey: sign a release and serve its index"
STRANGER = "Journey: install a verified release"
LABEL = "glm53card.cu124"  # the first green build's wheel: +pw.glm53card.cu124


def _blocks() -> tuple[Block, Block]:
    blocks = parse_blocks(README.read_text())
    found = [next(b for b in blocks if b.section.startswith(title))
             for title in (MAINTAINER, STRANGER)]  # fmt: skip
    return found[0], found[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _script(blocks: tuple[Block, ...], port: int) -> list[str]:
    lines = ["set -e", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for block in blocks:
        for command in block.commands:
            if command.needs - {"build"}:
                continue  # tools/replay build: the wheels below stand in for it
            lines.append(f"echo '+ README.md:{command.line}' >&2")
            lines.append(command.text.replace("8000", str(port)))
    return lines


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A fresh clone's view: the manifest, keys/allowed_signers with no key, a build's
    wheels/ (two wheels, one needing the other, labelled as the first green build's) and
    nothing else."""
    root = tmp_path / "project"
    build = root / "wheels"
    # labelled as the first green build's wheel is: the README's VARIANT is that label
    make_wheel(build, "pwa", f"1.0+pw.{LABEL}", payload=20_000, seed=1,
               requires_dist=("pwb>=2",))  # fmt: skip
    make_wheel(build, "pwb", f"2.0+pw.{LABEL}", payload=8_000, seed=2)
    names = sorted(p.name for p in build.glob("*.whl"))
    write_provenance(build, {n: sha256_file(build / n) for n in names})
    write_manifest(root)
    (root / "keys").mkdir()
    shutil.copy(REPO / "keys" / "allowed_signers", root / "keys" / "allowed_signers")
    return root


def test_the_readme_walks_from_a_build_to_a_signed_index_and_a_stranger_s_install(
    project: Path, tmp_path: Path
) -> None:
    maintainer, stranger = _blocks()
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "UV_", "PINWHEEL_", "GITHUB_"))}  # fmt: skip
    env.update(HOME=str(home), PATH=os.pathsep.join([str(Path(sys.executable).parent),
               os.environ["PATH"]]), PINWHEEL_CACHE=str(tmp_path / "cache"),
               PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never",
               UV_CACHE_DIR=str(tmp_path / "uv-cache"))  # fmt: skip
    if shutil.which("uv", path=env["PATH"]) is None:
        pytest.skip("uv is not installed (pip install '.[test]')")
    port = _free_port()
    began = time.monotonic()
    done = subprocess.run(["bash", "-c", "\n".join(_script((maintainer, stranger), port))],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    took = time.monotonic() - began
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    out = done.stdout
    # the maintainer's key signed it, and the stranger checked that signature
    line = (project / "keys" / "allowed_signers").read_text().splitlines()[-1]
    assert line.startswith('kit-release namespaces="pinwheel,pinwheel-attestation" ')
    assert (home / ".ssh" / "pinwheel-release").is_file()
    assert "signature by kit-release" in out and "release OK" in out
    assert "attestation.intoto.jsonl: 3 subjects match, signed by kit-release" in out
    fetched = project / "fetched-release"
    assert sorted(p.name for p in fetched.iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in (project / "release").iterdir())
    for venv in ("engine-venv", "stranger", "stranger-uv"):
        got = subprocess.run([str(project / venv / "bin" / "python"), "-c",
                              "import pwa, pwb; print(pwa.VALUE, pwb.VALUE)"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert got.strip() == f"pwa 1.0+pw.{LABEL} pwb 2.0+pw.{LABEL}", venv
    size = sum(p.stat().st_size for p in (project / "release-index").rglob("*") if p.is_file())
    print(f"README walk: {took:.1f} s, release-index {size / 1024:.0f} KiB")


def test_the_walk_s_signature_check_is_real(project: Path, tmp_path: Path) -> None:
    """The same stranger's lines with another project's allowed_signers: fetch refuses."""
    maintainer, stranger = _blocks()
    _, other = make_key(tmp_path / "other", principal="someone-else")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "PINWHEEL_"))}
    env.update(HOME=str(home), PATH=os.pathsep.join([str(Path(sys.executable).parent),
               os.environ["PATH"]]), PINWHEEL_CACHE=str(tmp_path / "cache"))  # fmt: skip
    port = _free_port()
    script = _script((maintainer,), port)
    script.append(f"cp {other} keys/allowed_signers")
    script += _script((stranger,), port)[2:6]  # INDEX=..., then fetch
    done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 6, done.stderr[-3000:]
    assert "does not verify" in done.stderr and not (project / "fetched-release" / "SHA256SUMS").exists()

"""Boundary: container runtime arguments and a child's argv (docs/SECURITY.md).

Every value that reaches ``docker run`` / ``podman run`` is validated where it enters:
``CUDA_VISIBLE_DEVICES`` and ``HOST`` from the environment, the model directory (a
relative one would be a named volume), ``model_mount``. The SM120 card's real manifest
(an image engine); :func:`launch` is the argv ``pinwheel serve`` execs. No container
runtime runs here, so the argv is checked, not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.errors import ManifestError
from pinwheel.manifest import model as manifest
from pinwheel.serve.recipe import launch

ROOT = Path(__file__).resolve().parent.parent
SM120 = ROOT / "recipes" / "sm120-tp2" / "manifest.toml"

HOSTILE_DEVICES = [
    '0" --privileged -v /:/host "',
    "0,1 --privileged",
    "all",
    "0\n1",
    "nvidia.com/gpu=0 --device /dev/mem",
]


@pytest.mark.parametrize("devices", HOSTILE_DEVICES)
def test_hostile_devices_never_reach_the_runtime(devices: str) -> None:
    """Issue 34: CUDA_VISIBLE_DEVICES reached `--gpus "device=..."` / `--device` unchecked."""
    m = manifest.load(SM120)
    with pytest.raises(ValueError, match="GPU indices"):
        launch(m.serve, m.serve.profile("daily"), model="/m", devices=devices)


def test_cuda_visible_devices_from_the_environment_is_refused_where_it_enters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", HOSTILE_DEVICES[0])
    rc = main(["--manifest", str(SM120), "serve", "--profile", "daily", "--model", "/m"])
    err = capsys.readouterr().err
    assert rc == 2 and "--devices / $CUDA_VISIBLE_DEVICES" in err, err


def test_gpu_uuids_and_indices_are_accepted() -> None:
    m = manifest.load(SM120)
    uuid = "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
    argv = launch(m.serve, m.serve.profile("daily"), model="/m", devices=f"{uuid},1").argv
    assert f'"device={uuid},1"' in argv


def test_an_ipv6_host_is_bracketed_in_the_port_mapping() -> None:
    """Issue 34: an unbracketed IPv6 host in `-p` (`::1:8012:8012`) is read by the runtime
    as other fields."""
    m = manifest.load(SM120)
    argv = launch(m.serve, m.serve.profile("daily"), model="/m", host="::1", port=8012).argv
    assert argv[argv.index("-p") + 1] == "[::1]:8012:8012"
    with pytest.raises(ValueError):
        launch(m.serve, m.serve.profile("daily"), model="/m", host="0.0.0.0:1 -p 22", port=1)


@pytest.mark.parametrize("model", ["models", "glm:/etc", "/m,readonly=false", "/a\nb"])
def test_a_model_path_that_is_no_absolute_plain_path_never_reaches_v(model: str) -> None:
    """Issue 34: a relative model path becomes a named volume (`-v models:/model:ro`)."""
    m = manifest.load(SM120)
    with pytest.raises(ValueError):
        launch(m.serve, m.serve.profile("daily"), model=model)


@pytest.mark.parametrize("mount", ["/", "//", "/./", "/etc", "/usr/", "relative", "/a/../b"])
def test_model_mount_that_hides_the_container_root_or_a_system_dir_is_refused(
    tmp_path: Path, mount: str
) -> None:
    """Issue 34: model_mount = "/" mounts the model over the container's root."""
    text = SM120.read_text().replace('model_mount = "/model"', f'model_mount = "{mount}"')
    assert f'model_mount = "{mount}"' in text
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    for lock in SM120.parent.glob("torch-*.txt"):  # its [build.torch_lock], beside it
        (tmp_path / lock.name).write_bytes(lock.read_bytes())
    with pytest.raises(ManifestError, match="model_mount"):
        manifest.load(path)

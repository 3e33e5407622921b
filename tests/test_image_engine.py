"""An engine that is a container image pinned by digest (the SM120 card's serving path).

The recipe runs `docker run` / `podman run` of name@digest with the profile's GPUs, shared
memory, the model mounted read-only, the port and the image launcher's knobs; `preflight`
checks the runtime and that the local image carries the pinned digest. No container
runtime runs on these machines, so `docker` / `podman` / `nvidia-smi` here are stand-in
scripts that record their argv or print what the real programs print; the test says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.errors import ManifestError
from pinwheel.manifest import model as manifest
from pinwheel.serve.preflight import FAIL, OK, SKIP, Options, device_indices, preflight
from pinwheel.serve.recipe import launch, render_recipe

ROOT = Path(__file__).resolve().parent.parent
SM120 = ROOT / "recipes" / "sm120-tp2" / "manifest.toml"
DIGEST = "sha256:bb6d2516f88d963a0c8c10d85582c4580adc8754d506f62ce4915b84c095faca"
REF = f"verdictai/glm53-flash-exl3-k4@{DIGEST}"


def _recorder(bindir: Path, name: str) -> None:
    """A stand-in runtime that prints its argv as JSON (no container engine runs here)."""
    bindir.mkdir(exist_ok=True)
    prog = bindir / name
    prog.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c "
        "'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n"
    )
    prog.chmod(0o755)


def _run_recipe(recipe: Path, bindir: Path, profile: str, **env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    base["PATH"] = f"{bindir}{os.pathsep}{base['PATH']}"
    out = subprocess.run(
        ["bash", str(recipe), profile],
        env=base | env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("profile", ["daily", "accuracy", "long500k", "fidelity"])
def test_the_sm120_recipe_runs_the_pinned_digest_as_launch_does(tmp_path, profile):
    m = manifest.load(SM120)
    _recorder(tmp_path / "bin", "docker")
    env = {"SM120_MODEL": "/models/glm 5.3", "HOST": "127.0.0.1", "PORT": "8123"}
    got = _run_recipe(SM120.parent / m.serve.recipe, tmp_path / "bin", profile, **env)
    want = launch(
        m.serve, m.serve.profile(profile), model="/models/glm 5.3", host="127.0.0.1", port=8123
    )
    assert want.argv[0] == "docker" and got == list(want.argv[1:])
    assert got[:3] == ["run", "--rm", "--gpus"] and got[3] == '"device=0,1"'
    at = got.index(REF)  # the image by its digest, never the tag; the entrypoint replaced;
    # after it `serve /model` and only the engine's own flags and their values
    assert got[at - 2 : at] == ["--entrypoint", "vllm"] and got[at + 1 : at + 3] == ["serve", "/model"]
    assert all(w.startswith("--") or got[k - 1].startswith("--")
               for k, w in enumerate(got[at + 3 :], at + 3))  # fmt: skip
    assert not any(w.startswith(REF.split("@")[0] + ":") for w in got)
    assert "-v" in got and got[got.index("-v") + 1] == "/models/glm 5.3:/model:ro"
    assert got[got.index("-p") + 1] == "127.0.0.1:8123:8123"  # one variable, both sides
    assert got[got.index("--port") + 1] == "8123"  # and the engine listens on it
    assert "--init" in got and got[got.index("--ipc") + 1] == "host"
    knobs = {got[i + 1].split("=")[0] for i, w in enumerate(got) if w == "-e"}
    assert not knobs & {"PROFILE", "CACHE", "DCP", "MTP_TOKENS", "MODEL"}  # read on the host


def test_the_cache_directory_is_mounted_only_when_given(tmp_path):
    m = manifest.load(SM120)
    _recorder(tmp_path / "bin", "docker")
    recipe = SM120.parent / m.serve.recipe
    got = _run_recipe(recipe, tmp_path / "bin", "daily", SM120_MODEL="/m", SM120_CACHE_DIR="/c")
    want = launch(m.serve, m.serve.profile("daily"), model="/m", cache_dir="/c")
    assert got == list(want.argv[1:]) and "/c:/root/.cache" in got
    assert "/c:/root/.cache" not in _run_recipe(recipe, tmp_path / "bin", "daily", SM120_MODEL="/m")


def test_cuda_visible_devices_picks_the_gpus(tmp_path):
    m = manifest.load(SM120)
    _recorder(tmp_path / "bin", "docker")
    got = _run_recipe(
        SM120.parent / m.serve.recipe,
        tmp_path / "bin",
        "daily",
        SM120_MODEL="/m",
        CUDA_VISIBLE_DEVICES="1,3",  # the card's v71 pair
    )
    assert got[3] == '"device=1,3"'
    assert launch(m.serve, m.serve.profile("daily"), model="/m", devices="1,3").argv[4] == got[3]


def _podman_manifest(tmp_path: Path) -> Path:
    text = SM120.read_text().replace('runtime = "docker"', 'runtime = "podman"', 1)
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    (tmp_path / "patches").mkdir()
    _with_torch_lock(tmp_path)
    return path


def _with_torch_lock(folder: Path) -> None:
    """The SM120 manifest's [build.torch_lock], copied beside a copy of it."""
    for lock in SM120.parent.glob("torch-*.txt"):
        (folder / lock.name).write_bytes(lock.read_bytes())


def test_podman_gets_cdi_devices_and_host_networking(tmp_path):
    path = _podman_manifest(tmp_path)
    m = manifest.load(path)
    recipe = tmp_path / "serve.sh"
    recipe.write_text(render_recipe(m.serve, path.name))
    _recorder(tmp_path / "bin", "podman")
    got = _run_recipe(recipe, tmp_path / "bin", "accuracy", SM120_MODEL="/m")
    want = launch(m.serve, m.serve.profile("accuracy"), model="/m")
    assert want.argv[0] == "podman" and got == list(want.argv[1:])
    assert got[2:6] == ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]
    assert got[got.index("-p") + 1] == "0.0.0.0:8012:8012"


@pytest.mark.parametrize(
    "old,new,key",
    [
        (f'digest = "{DIGEST}"', 'digest = "latest"', "digest"),
        ('image = "verdictai/glm53-flash-exl3-k4"', 'image = "-v/etc:/x"', "image"),
        ('image = "verdictai/glm53-flash-exl3-k4"', 'image = "verdictai/x:v71"', "image"),
        ('runtime = "docker"', 'runtime = "sh"', "runtime"),
        ('model_mount = "/model"', 'model_mount = "/m/../etc"', "model_mount"),
        ("container_port = 8012", "container_port = 70000", "container_port"),
        ('card_knobs = { PROFILE = "daily" }', 'card_knobs = { "PROFILE; rm" = "daily" }',
         "card_knobs"),
        ('shm_size = "32g"', 'shm_size = "32g --privileged"', "shm_size"),
        ('entrypoint = "vllm"', 'entrypoint = "-x"', "entrypoint"),
        ('command = ["serve", "/model"]', 'command = ["serve", "--privileged"]', "command"),
        ('ipc = "host"', 'ipc = "none"', "ipc"),
        ('cache_mount = "/root/.cache"', 'cache_mount = "/"', "cache_mount"),

    ],
)
def test_bad_image_values_are_refused_with_file_and_line(tmp_path, old, new, key):
    text = SM120.read_text()
    assert old in text
    path = tmp_path / "manifest.toml"
    path.write_text(text.replace(old, new, 1))
    _with_torch_lock(tmp_path)
    with pytest.raises(ManifestError) as err:
        manifest.load(path)
    line = 1 + next(i for i, ln in enumerate(path.read_text().splitlines()) if new in ln)
    assert f"manifest.toml:{line}" in str(err.value) and f"'{key}'" in str(err.value)


@pytest.mark.parametrize(
    "old,new,why",
    [
        ("container_port = 8012", "container_port = 8013", "one variable for both sides"),
        ('  "--max-model-len", "499968",', '  "--max-model-len", "4096",', "--max-model-len equal"),
        ('  "--speculative-config", \'{"method":"mtp","num_speculative_tokens":3,',
         '  "--speculative-config", \'{"method":"mtp","num_speculative_tokens":2,',
         "--speculative-config equal"),
    ],
)
def test_an_engine_flag_or_port_that_disagrees_with_its_typed_key_is_refused(
    tmp_path, old, new, why
):
    text = SM120.read_text()
    assert old in text
    path = tmp_path / "manifest.toml"
    path.write_text(text.replace(old, new, 1))
    _with_torch_lock(tmp_path)
    with pytest.raises(ManifestError, match=why):
        manifest.load(path)


def test_image_keys_without_an_image_are_refused(tmp_path):
    text = (ROOT / "recipes" / "gb10-k2" / "manifest.toml").read_text()
    path = tmp_path / "manifest.toml"
    path.write_text(text.replace('module = "vllm"', f'module = "vllm"\ndigest = "{DIGEST}"', 1))
    with pytest.raises(ManifestError, match="only with image"):
        manifest.load(path)


# --------------------------------------------------------------------------- preflight


def _stand_ins(tmp_path: Path, digests: list[str] | None, runtime: bool = True) -> Path:
    """nvidia-smi for two SM120 GPUs; a docker that answers --version and image inspect."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(
        textwrap.dedent("""\
        #!/bin/sh
        case "$1" in
          topo) printf '\\tGPU0\\tGPU1\\nGPU0\\t X \\tNODE\\nGPU1\\tNODE\\t X \\n' ;;
          *) echo "0, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 97887, 0:1"
             echo "1, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 97887, 0:2" ;;
        esac
        """)
    )
    smi.chmod(0o755)
    if runtime:
        docker = bindir / "docker"
        answer = "exit 1" if digests is None else f"echo '{json.dumps(digests)}'"
        docker.write_text(
            "#!/bin/sh\n"
            f'echo "$@" >> {tmp_path / "docker.log"}\n'
            'case "$1" in\n'
            "  --version) echo 'Docker version 28.0.1, build 068a01e' ;;\n"
            f"  image) {answer} ;;\n"
            "esac\n"
        )
        docker.chmod(0o755)
    return bindir


def _checks(tmp_path, digests, runtime=True, profile="daily", **options):
    bindir = _stand_ins(tmp_path, digests, runtime)
    serve = manifest.load(SM120).serve
    prof = serve.profile(profile)
    checks = preflight(
        Options(
            profile=prof,
            config=serve,
            python="python3",
            model=None,
            devices=device_indices(prof, None),
            nvidia_smi=str(bindir / "nvidia-smi"),
            container_runtime=str(bindir / "docker"),
            **options,
        )
    )
    return {c.name: c for c in checks}


def test_preflight_finds_the_pinned_digest(tmp_path):
    checks = _checks(tmp_path, [f"docker.io/{REF}"])
    assert checks["container runtime"].status == OK
    assert (
        checks["image digest"].status == OK
        and "r19-sm120-tp2-ep2-v71" in checks["image digest"].detail
    )
    assert checks["gpu count"].status == OK and checks["compute capability"].status == OK
    assert checks["engine"].status == SKIP and "cuda toolkit" not in checks
    inspected = (tmp_path / "docker.log").read_text().splitlines()
    assert f"image inspect --format {{{{json .RepoDigests}}}} {REF}" in inspected


def test_preflight_refuses_an_absent_or_other_image(tmp_path):
    absent = _checks(tmp_path, None)["image digest"]
    assert absent.status == FAIL and absent.next == f"docker pull {REF}"
    other = "sha256:" + "0" * 64
    moved = _checks(tmp_path, [f"verdictai/glm53-flash-exl3-k4@{other}"])["image digest"]
    assert moved.status == FAIL and DIGEST in moved.detail and moved.next == f"docker pull {REF}"
    renamed = _checks(tmp_path, [f"someone/else@{DIGEST}"])["image digest"]
    assert renamed.status == FAIL


def test_preflight_without_a_runtime_names_the_fix(tmp_path):
    checks = _checks(tmp_path, [REF], runtime=False)
    assert checks["container runtime"].status == FAIL
    assert "NVIDIA Container Toolkit" in checks["container runtime"].next
    assert checks["image digest"].status == SKIP


def test_preflight_cli_prints_the_cards_known_issues(tmp_path, capsys):
    bindir = _stand_ins(tmp_path, [REF])
    code = main(
        [
            "--json",
            "--manifest",
            str(SM120),
            "preflight",
            "--nvidia-smi",
            str(bindir / "nvidia-smi"),
            "--container-runtime",
            str(bindir / "docker"),
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, doc
    assert any("long500k" in issue for issue in doc["known_issues"])
    assert {c["name"]: c["status"] for c in doc["checks"]}["image digest"] == OK


def _selftest_checks(tmp_path, torch_python):
    return _checks(tmp_path, [f"docker.io/{REF}"], selftest=True, environ=dict(os.environ),
                   torch_python=torch_python)  # fmt: skip


def test_image_engine_all_reduce_needs_a_host_python(tmp_path):
    """The card's TP2 all-reduce: the engine's torch is inside the image, so without
    --python the check says how to run it instead of passing silently."""
    c = _selftest_checks(tmp_path, None)["nccl all-reduce"]
    assert c.status == SKIP and "--python" in (c.next or "")


def test_image_engine_all_reduce_runs_with_the_given_python(tmp_path):
    """A host Python without torch: both ranks really start with it and the check fails
    with their error (on a GPU box with CUDA torch this is the two-GPU all-reduce)."""
    c = _selftest_checks(tmp_path, sys.executable)["nccl all-reduce"]
    assert c.status == FAIL
    assert "rank 0:" in c.detail and "rank 1:" in c.detail
    assert "No module named 'torch'" in c.detail


def test_preflight_names_the_image_not_a_python(tmp_path, capsys):
    bindir = _stand_ins(tmp_path, [REF])
    main(["--manifest", str(SM120), "preflight", "--nvidia-smi", str(bindir / "nvidia-smi"),
          "--container-runtime", str(bindir / "docker")])  # fmt: skip
    got = capsys.readouterr()
    out = " ".join((got.out + got.err).split())
    assert f"engine: the image {REF} (run by docker" in out and "engine python:" not in out


@pytest.mark.parametrize("model", ["/models/glm:5.3", "/models/a,b"])
def test_a_model_path_the_runtime_would_split_is_a_usage_error_not_a_traceback(
    tmp_path, capsys, monkeypatch, model
):
    """``-v SRC:DST:ro``: a model directory holding ':' or ',' used to end
    in a ValueError traceback; it is exit 2 naming --model and the variable."""
    _recorder(tmp_path / "bin", "docker")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    rc = main(["--manifest", str(SM120), "serve", "--model", model])
    got = capsys.readouterr()
    assert rc == 2, got
    assert "--model" in got.err and "Traceback" not in got.err + got.out

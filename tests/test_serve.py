"""[serve]: the card's profiles parse, the committed recipe equals the generated one,
and running the recipe launches exactly what `pinwheel qualify` launches."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.cudaarch import CudaArch
from pinwheel.errors import ManifestError
from pinwheel.manifest import model as manifest
from pinwheel.serve.recipe import launch, render_recipe

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "manifest.toml"


@pytest.fixture(scope="module")
def card():
    return manifest.load(MANIFEST)


def test_card_profile_has_the_cards_facts(card):
    serve = card.serve
    p = serve.profile("card")
    assert (p.gpus, p.compute_capability, p.gpu_memory_gib) == (4, CudaArch(70), 32)
    assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.max_model_len) == (4, 1, 131072)
    assert p.max_num_seqs == 1
    assert json.loads(p.speculative_json) == {
        "method": "mtp",
        "num_speculative_tokens": 3,
        "draft_sample_method": "greedy",
    }
    argv = launch(serve, p, model="/m").argv
    for flag in ("--trust-remote-code", "--enable-auto-tool-choice"):
        assert flag in argv
    pairs = dict(zip(argv, argv[1:], strict=False))
    assert pairs["--dtype"] == "half"
    assert pairs["--kv-cache-dtype"] == "fp8_e4m3"
    assert pairs["--gpu-memory-utilization"] == "0.92"
    assert pairs["--max-num-batched-tokens"] == "4096"
    assert pairs["--reasoning-parser"] == "deepseek_r1"
    assert pairs["--tool-call-parser"] == "glm47"
    env = launch(serve, p, model="/m").env
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] == "0"


def test_eight_gpu_profile_is_tp4_pp2_million_context_no_mtp(card):
    p = card.serve.profile("8gpu")
    assert (p.gpus, p.tensor_parallel_size, p.pipeline_parallel_size) == (8, 4, 2)
    assert p.max_model_len == 1_048_576
    assert p.speculative == ()
    assert p.tp_groups == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_committed_recipe_equals_the_generated_one(card):
    serve = card.serve
    committed = (ROOT / serve.recipe).read_text()
    assert committed == render_recipe(serve, MANIFEST.name), (
        "recipes/serve_glm53.sh drifted from [serve]: run `pinwheel serve --write-recipe`"
    )
    assert main(["serve", "--manifest", str(MANIFEST), "--check-recipe"]) == 0


def test_check_recipe_fails_after_an_edit(tmp_path, card):
    (tmp_path / "recipes").mkdir()
    text = MANIFEST.read_text().replace(
        '"--max-num-batched-tokens", "4096"', '"--max-num-batched-tokens", "8192"'
    )
    (tmp_path / "manifest.toml").write_text(text)
    (tmp_path / "recipes" / "serve_glm53.sh").write_text(
        (ROOT / "recipes/serve_glm53.sh").read_text()
    )
    assert main(["serve", "--manifest", str(tmp_path / "manifest.toml"), "--check-recipe"]) == 2


def _fake_python(tmp_path: Path) -> Path:
    """A stand-in interpreter that records its argv and the env the recipe exported."""
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        f"exec {shlex.quote(sys.executable)} -c 'import json,os,sys; "
        'print(json.dumps({"argv": sys.argv[1:], "env": dict(os.environ)}))\' "$@"\n'
    )
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("profile,seqs", [("card", None), ("card", "2"), ("8gpu", None)])
def test_recipe_runs_the_same_command_as_launch(tmp_path, card, profile, seqs):
    serve = card.serve
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "GLM53_SEQS")}
    env |= {
        "GLM53_MODEL": "/models/glm 5.3",
        "PYTHON": str(_fake_python(tmp_path)),
        "HOST": "127.0.0.1",
        "PORT": "8123",
    }
    if seqs:
        env["GLM53_SEQS"] = seqs
    out = subprocess.run(
        ["bash", str(ROOT / serve.recipe), profile],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout)
    want = launch(
        serve,
        serve.profile(profile),
        model="/models/glm 5.3",
        python="-",
        host="127.0.0.1",
        port=8123,
        max_num_seqs=int(seqs) if seqs else None,
    )
    # argv[0] of the fake python is `-c`'s script; the rest is what the server gets.
    assert got["argv"] == list(want.argv[1:])
    for key, value in want.env.items():
        assert got["env"][key] == value


def test_recipe_refuses_an_unknown_profile_and_a_missing_model(tmp_path, card):
    serve = card.serve
    env = dict(os.environ, GLM53_MODEL="/m", PYTHON=str(_fake_python(tmp_path)))
    bad = subprocess.run(
        ["bash", str(ROOT / serve.recipe), "nope"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown profile 'nope'" in bad.stderr
    env.pop("GLM53_MODEL")
    none = subprocess.run(
        ["bash", str(ROOT / serve.recipe)], env=env, capture_output=True, text=True
    )
    assert none.returncode != 0 and "set GLM53_MODEL" in none.stderr


@pytest.mark.parametrize("name", ["gb10-k2", "sm120-tp2"])
def test_system_manifests_load_and_their_recipes_match(name, capsys):
    path = ROOT / "recipes" / name / "manifest.toml"
    m = manifest.load(path)
    serve = m.serve
    p = serve.profile()
    (component,) = m.kernels
    assert not m.has_engine and component.name == "exllamav3"
    assert m.build.torch_index is None  # FILL IN: not on either card
    if name.startswith("gb10"):
        assert (p.compute_capability, p.num_speculative_tokens, p.gpus, p.cuda) == (
            CudaArch(121),
            2,
            1,
            "13",  # a major: any 13.x (the card names no toolkit)
        )
        assert m.build.arches == ("12.1",) and component.commit is None  # FILL IN: lock pins it
        assert m.build.torch is None  # FILL IN: the card's prebuilt wheels name no torch
        assert (m.model.shards, m.model.total_bytes) == (120, 97728721536)
        assert m.model.config["quantization_config.codebook"] == "mcg"
    else:
        assert (p.compute_capability, p.tensor_parallel_size) == (CudaArch(120), 2)
        assert serve.engine.image is not None and serve.engine.image.digest.startswith("sha256:")
        assert m.build.arches == ("12.0",) and component.builder == "torch-extension"
        assert component.commit == "c5d9c657966ffeeaa9353f0cc899f18629da4a13"
        assert [s.pr for s in component.steps] == [246, 234] and component.tree
        assert all(s.head and s.commits for s in component.steps)  # locked
    assert {q.name for q in m.qualify.profiles} == {q.name for q in serve.profiles}
    assert main(["--manifest", str(path), "serve", "--check-recipe"]) == 0, capsys.readouterr()


def _manifest_with(tmp_path: Path, serve_body: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(
        '[upstream]\nurl = "https://example.invalid/x.git"\n'
        'commit = "ec60883ad7187dc8aa29b3c30cae5a69e1cfa5cd"\n\n' + serve_body
    )
    return path


def test_a_typed_flag_repeated_in_args_is_rejected_with_its_line(tmp_path):
    path = _manifest_with(
        tmp_path,
        '[serve]\nrecipe = "r.sh"\n\n[serve.profile.a]\ngpus = 1\n'
        'max_model_len = 10\nmax_num_seqs = 1\nargs = ["--max-model-len", "9"]\n',
    )
    with pytest.raises(ManifestError) as err:
        manifest.load(path)
    assert "m.toml:12" in str(err.value) and "--max-model-len" in str(err.value)


def test_gpus_must_equal_tp_times_pp(tmp_path):
    path = _manifest_with(
        tmp_path,
        '[serve]\nrecipe = "r.sh"\n\n[serve.profile.a]\ngpus = 4\n'
        "tensor_parallel_size = 2\nmax_model_len = 10\nmax_num_seqs = 1\n",
    )
    with pytest.raises(ManifestError, match="tensor_parallel_size x pipeline_parallel_size = 2"):
        manifest.load(path)

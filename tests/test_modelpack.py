"""`pinwheel model check` on a model pack made here in the real safetensors format.

Each shard: 8-byte little-endian header length, a JSON header (dtype, shape,
data_offsets per tensor, padded to 8 bytes as the reference writer does), then
the tensor bytes; plus model.safetensors.index.json and config.json.
The hub half (`model fetch`) cannot be reached here and is not tested.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from pinwheel.cli import main
from pinwheel.errors import EXIT_USAGE, EXIT_VERIFY, VerifyError
from pinwheel.manifest import load
from pinwheel.release.modelpack import ModelConfig, check_model, safetensors_layout
from releasekit import write_manifest

pytestmark = pytest.mark.release


def write_shard(path: Path, tensors: dict[str, int]) -> int:
    """Write float32 tensors {name: element count}; return the file size."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, count in tensors.items():
        end = offset + 4 * count
        header[name] = {"dtype": "F32", "shape": [count], "data_offsets": [offset, end]}
        offset += 4 * count
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        for i, count in enumerate(tensors.values()):
            fh.write(struct.pack(f"<{count}f", *([float(i)] * count)))
    return path.stat().st_size


def make_pack(root: Path) -> dict[str, object]:
    root.mkdir(parents=True, exist_ok=True)
    shards = {
        "model-00001-of-00003.safetensors": {"embed.weight": 1000, "layers.0.w": 300},
        "model-00002-of-00003.safetensors": {"layers.1.w": 700},
        "model-00003-of-00003.safetensors": {"lm_head.weight": 1000},
    }
    total = 0
    weight_map = {}
    for name, tensors in shards.items():
        total += write_shard(root / name, tensors)
        weight_map.update({t: name for t in tensors})
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 4 * 3000}, "weight_map": weight_map})
    )
    (root / "config.json").write_text(
        json.dumps(
            {
                "model_type": "glm",
                "quantization_config": {"quant_method": "exl3", "bits": 2.1, "tile_order": "row"},
            }
        )
    )
    sha = hashlib.sha256((root / "model-00002-of-00003.safetensors").read_bytes()).hexdigest()
    return {"total": total, "sha2": sha}


@pytest.fixture
def pack(tmp_path: Path) -> tuple[Path, Path]:
    facts = make_pack(tmp_path / "glm")
    manifest = write_manifest(
        tmp_path,
        model=f"""
[model]
repo = "org/GLM-test-EXL3"
revision = "{"7" * 40}"
shards = 3
total_bytes = {facts["total"]}

[model.config]
"quantization_config.quant_method" = "exl3"
"quantization_config.bits" = 2.1
"quantization_config.tile_order" = "row"

[model.sha256]
"model-00002-of-00003.safetensors" = "{facts["sha2"]}"
""",
    )
    return manifest, tmp_path / "glm"


def check(manifest: Path, directory: Path, capsys) -> tuple[int, str]:
    rc = main(["--manifest", str(manifest), "model", "check", str(directory)])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def test_good_pack_passes(pack: tuple[Path, Path], capsys) -> None:
    rc, text = check(*pack, capsys)
    assert rc == 0, text
    assert "3 shards" in text and "1 hashes match" in text


def test_header_implied_size_matches_the_file(pack: tuple[Path, Path]) -> None:
    shard = pack[1] / "model-00001-of-00003.safetensors"
    implied, names = safetensors_layout(shard)
    assert implied == shard.stat().st_size
    assert names == {"embed.weight", "layers.0.w"}


def test_missing_shard(pack: tuple[Path, Path], capsys) -> None:
    (pack[1] / "model-00003-of-00003.safetensors").unlink()
    rc, text = check(*pack, capsys)
    assert rc == EXIT_VERIFY
    assert "model-00003-of-00003.safetensors: missing" in text
    assert "pinwheel model fetch" in text


def test_truncated_shard(pack: tuple[Path, Path], capsys) -> None:
    shard = pack[1] / "model-00002-of-00003.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    rc, text = check(*pack, capsys)
    assert rc == EXIT_VERIFY
    assert f"truncated: {len(data) - 100} bytes, header implies {len(data)}" in text
    assert "sha256" in text  # the pinned hash fails too
    assert "total_bytes pins" in text


def test_truncated_inside_the_header(pack: tuple[Path, Path], capsys) -> None:
    shard = pack[1] / "model-00001-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:20])
    rc, text = check(*pack, capsys)
    assert rc == EXIT_VERIFY and "truncated inside the" in text


def test_wrong_config_value(pack: tuple[Path, Path], capsys) -> None:
    config = json.loads((pack[1] / "config.json").read_text())
    config["quantization_config"]["quant_method"] = "gptq"
    del config["quantization_config"]["tile_order"]
    (pack[1] / "config.json").write_text(json.dumps(config))
    rc, text = check(*pack, capsys)
    assert rc == EXIT_VERIFY
    assert "quantization_config.quant_method = 'gptq', [model.config] requires 'exl3'" in text
    assert "quantization_config.tile_order absent" in text


def test_index_names_a_tensor_the_shard_lacks(pack: tuple[Path, Path], capsys) -> None:
    index = json.loads((pack[1] / "model.safetensors.index.json").read_text())
    index["weight_map"]["layers.9.w"] = "model-00002-of-00003.safetensors"
    (pack[1] / "model.safetensors.index.json").write_text(json.dumps(index))
    rc, text = check(*pack, capsys)
    assert rc == EXIT_VERIFY and "layers.9.w" in text


def test_pins_are_checked_even_without_hashes(pack: tuple[Path, Path]) -> None:
    manifest, directory = pack
    cfg: ModelConfig = load(manifest).model
    wrong = ModelConfig(cfg.repo, cfg.revision, 4, cfg.total_bytes, cfg.config, {}, None)
    with pytest.raises(VerifyError, match="3 shards, \\[model\\] shards pins 4"):
        check_model(directory, wrong)


def test_bad_model_table_names_the_key(tmp_path: Path, capsys) -> None:
    manifest = write_manifest(
        tmp_path,
        model="""
[model]
repo = "org/x"
revision = "main"
""",
    )
    rc = main(["--manifest", str(manifest), "model", "check", str(tmp_path)])
    assert rc == EXIT_USAGE
    err = capsys.readouterr().err
    assert "[model]" in err and "revision" in err


def test_model_fetch_refuses_an_unpinned_revision(tmp_path: Path, capsys) -> None:
    manifest = write_manifest(tmp_path, model='[model]\nrepo = "org/x"\n')
    rc = main(["--manifest", str(manifest), "model", "fetch", "--local-dir", str(tmp_path / "m")])
    assert rc == EXIT_USAGE  # README: 2, a bad manifest
    assert "no pinned revision" in capsys.readouterr().err


def test_config_nested_under_text_config_is_found(pack: tuple[Path, Path], capsys) -> None:
    config = json.loads((pack[1] / "config.json").read_text())
    (pack[1] / "config.json").write_text(json.dumps({"text_config": config}))
    rc, text = check(*pack, capsys)
    assert rc == 0, text


def test_model_fetch_refuses_a_missing_repo(tmp_path: Path, capsys) -> None:
    manifest = write_manifest(tmp_path, model=f'[model]\nrevision = "{"7" * 40}"\n')
    rc = main(["--manifest", str(manifest), "model", "fetch", "--local-dir", str(tmp_path / "m")])
    assert rc == EXIT_USAGE  # README: 2, a bad manifest
    assert "[model] has no repo" in capsys.readouterr().err

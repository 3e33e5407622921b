"""The SM120 recipe runs the image as the card's linked repository runs it, flag for flag.

The card (004, line 21) links its code; the facts its command depends on are listed in
``004-linked-runtime-facts.md`` beside the card (read from $PINWHEEL_CARDS_DIR, else
``../shared/seeds``; without it these tests skip and say so). This test parses that file
(the image, entrypoint, first arguments, container options, port, the 22 engine flags in
order, the 8 environment values) and holds :func:`launch` for every profile against it:
the daily profile equals the facts exactly; every other profile equals them with only
the changes the card names (each quoted below with its card line).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from pinwheel.manifest import model as manifest
from pinwheel.serve.recipe import launch

ROOT = Path(__file__).resolve().parent.parent
SM120 = ROOT / "recipes" / "sm120-tp2" / "manifest.toml"
FACTS = "004-linked-runtime-facts.md"

# What each profile changes from the facts' daily flags, as the card states it.
# None removes a flag; True adds a flag without a value (appended, in this order).
CHANGES: dict[str, dict[str, str | bool | None]] = {
    "daily": {},
    "accuracy": {  # line 62 "measured-safe 262,144-token FP8 ceiling"; line 282 CACHE=fp8_ds_mla
        "--kv-cache-dtype": "fp8_ds_mla",
        "--attention-backend": "FLASHINFER_MLA_SPARSE_SM120",  # line 212
        "--max-model-len": "262144",
    },
    "long500k": {  # lines 293-295 "MAX_NUM_BATCHED_TOKENS=1024 ... GPU_MEMORY_UTILIZATION=0.985"
        "--max-num-batched-tokens": "1024",
        "--gpu-memory-utilization": "0.985",
    },
    "fidelity": {  # line 129 "TP2, DCP1, eager execution, `fp8_ds_mla`, no MTP"
        "--decode-context-parallel-size": "1",
        "--kv-cache-dtype": "fp8_ds_mla",
        "--attention-backend": "FLASHINFER_MLA_SPARSE_SM120",  # line 212
        "--max-model-len": "262144",  # line 62
        "--speculative-config": None,
        "--enforce-eager": True,
    },
    "fidelity-nvfp4": {  # line 165 "TP2/DCP1/eager/no-MTP ... with `nvfp4_ds_mla`"
        "--decode-context-parallel-size": "1",
        "--speculative-config": None,
        "--enforce-eager": True,
    },
}


def _facts_text() -> str:
    env = os.environ.get("PINWHEEL_CARDS_DIR")
    d = Path(env) if env else ROOT.parent / "shared" / "seeds"
    if not (d / FACTS).is_file():
        pytest.skip(f"no {FACTS}: set PINWHEEL_CARDS_DIR (or keep ../shared/seeds) to check")
    return (d / FACTS).read_text()


def _row(text: str, name: str) -> str:
    m = re.search(rf"^\| {re.escape(name)} \| (.+?) \|$", text, re.M)
    assert m, name
    return m.group(1)


def _ticks(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def parse(text: str) -> dict[str, object]:
    """The facts file as data: what `docker run` and the engine are given."""
    section = text.split("## Engine flags", 1)[1].split("\n## ", 1)[0]
    flags: list[str] = []
    for item in _ticks(section.split("\n", 1)[1]):
        if item == "--speculative-config":
            spec = re.search(r"method\s+`(\w+)`,\s+(\d+)\s+speculative\s+tokens\s+and\s+draft"
                             r"\s+sample\s+method\s+`(\w+)`", section)  # fmt: skip
            assert spec
            value = {"method": spec[1], "num_speculative_tokens": int(spec[2]),
                     "draft_sample_method": spec[3]}  # fmt: skip
            flags += [item, json.dumps(value, separators=(",", ":"))]
        elif item.startswith("--"):
            flags += item.split(" ", 1)
    env_section = text.split("## Environment inside the container", 1)[1].split("\n## ", 1)[0]
    env = dict(re.findall(r"^\| ([A-Z][A-Z0-9_]+) \| (\S+) \|$", env_section, re.M))
    options = _row(text, "container options")
    shm = re.search(r"shared memory (\d+) GB", options)
    port = re.search(r"(\d+) on both sides", _row(text, "port"))
    assert shm and port
    name_tag, digest = _ticks(_row(text, "image"))[0].split("@")
    name, tag = name_tag.rsplit(":", 1)
    return {
        # pinwheel pulls by digest alone (a tag beside it is ignored by the runtime)
        "image": f"{name}@{digest}",
        "tag": tag,
        "entrypoint": _ticks(_row(text, "entrypoint"))[0],
        "command": _ticks(_row(text, "first arguments"))[0].split(),
        "init": "init process on" in options,
        "ipc_host": "IPC namespace of the host" in options,
        "shm": f"{shm[1]}g",
        "port": int(port[1]),
        "mount": re.search(r"read-only at `([^`]+)`", _row(text, "model mount"))[1],  # type: ignore[index]
        "devices": re.search(r"(\d) and (\d) by default", _row(text, "GPUs")).groups(),  # type: ignore[union-attr]
        "flags": flags,
        "env": env,
    }


def expected_flags(facts_flags: list[str], changes: dict[str, str | bool | None]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(facts_flags):
        flag = facts_flags[i]
        has_value = i + 1 < len(facts_flags) and not facts_flags[i + 1].startswith("--")
        value = facts_flags[i + 1] if has_value else None
        i += 2 if has_value else 1
        change = changes.get(flag, value if has_value else True)
        if change is None:
            continue
        out += [flag] if change is True else [flag, str(change)]
    out += [f for f, c in changes.items() if c is True and f not in facts_flags]
    return out


def test_the_facts_file_parses_to_the_22_flags_and_8_variables():
    facts = parse(_facts_text())
    flags = facts["flags"]
    assert isinstance(flags, list) and sum(f.startswith("--") for f in flags) == 22
    assert len(facts["env"]) == 8  # type: ignore[arg-type]
    assert facts["command"] == ["serve", "/model"] and facts["entrypoint"] == "vllm"
    image = manifest.load(SM120).serve.engine.image
    assert image is not None and (image.ref, image.tag) == (facts["image"], facts["tag"])


@pytest.mark.parametrize("profile", sorted(CHANGES))
def test_each_profile_runs_the_image_as_the_facts_say(profile):
    facts = parse(_facts_text())
    m = manifest.load(SM120)
    argv = list(launch(m.serve, m.serve.profile(profile), model="/models/glm", port=8012).argv)
    at = argv.index(str(facts["image"]))
    assert argv[at - 2 : at] == ["--entrypoint", facts["entrypoint"]]
    assert argv[at + 1 : at + 3] == facts["command"]
    want = expected_flags(facts["flags"], CHANGES[profile])  # type: ignore[arg-type]
    assert argv[at + 3 :] == want, "\n".join(
        f"{a!r:>60} {b!r}" for a, b in zip(argv[at + 3 :], want, strict=False)
    )
    runtime = argv[:at]
    assert "--init" in runtime and runtime[runtime.index("--ipc") + 1] == "host"
    assert runtime[runtime.index("--shm-size") + 1] == facts["shm"]
    assert runtime[runtime.index("--gpus") + 1] == '"device={},{}"'.format(*facts["devices"])  # type: ignore[misc]
    assert f"/models/glm:{facts['mount']}:ro" in runtime
    port = facts["port"]
    assert runtime[runtime.index("-p") + 1] == f"0.0.0.0:{port}:{port}"
    env = dict(runtime[i + 1].split("=", 1) for i, w in enumerate(runtime) if w == "-e")
    assert env == facts["env"]  # the facts' eight, and nothing the image ignores
    for knob in ("PROFILE", "CACHE", "DCP", "MTP_TOKENS", "MODEL"):
        assert knob not in env


def test_one_port_variable_moves_both_sides_and_the_engine():
    m = manifest.load(SM120)
    argv = list(launch(m.serve, m.serve.profile("daily"), model="/m", port=9001).argv)
    assert argv[argv.index("-p") + 1] == "0.0.0.0:9001:9001"
    assert argv[argv.index("--port") + 1] == "9001"


def test_a_flag_that_leaves_the_recipe_is_caught():
    facts = parse(_facts_text())
    m = manifest.load(SM120)
    text = SM120.read_text().replace('  "--disable-custom-all-reduce",', "", 1)
    path = SM120.parent / "m-mutated.toml"
    try:
        path.write_text(text)
        changed = manifest.load(path)
    finally:
        path.unlink()
    argv = list(launch(changed.serve, changed.serve.profile("daily"), model="/m").argv)
    assert "--disable-custom-all-reduce" not in argv
    assert expected_flags(facts["flags"], {}) != argv[argv.index(str(facts["image"])) + 3 :]  # type: ignore[arg-type]
    assert m.serve.profile("daily").args != changed.serve.profile("daily").args

"""One options resolver: every environment variable pinwheel reads is declared in
pinwheel.options, `pinwheel env` lists each with its flag and source, and the environment
stages get (and children inherit) is the declared variables plus a pass-through list."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pinwheel import options
from pinwheel.cli import Context, main

SRC = Path(__file__).resolve().parents[1] / "src" / "pinwheel"
# environ.get("X"), environ["X"], ctx.environ.get("X", ...), .startswith("X_") on a key
_READ = re.compile(r"""environ(?:\.get)?[\[(]\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")
_PREFIX = re.compile(r"""\b(?:k|key|name)\.startswith\(\s*["']([A-Z][A-Z0-9]*_)["']\s*\)""")


def names_read(text: str) -> set[str]:
    return set(_READ.findall(text)) | {p + "*" for p in _PREFIX.findall(text)}


def test_every_variable_a_module_reads_is_declared() -> None:
    undeclared = []
    for path in SRC.rglob("*.py"):
        if "workers" in path.parts or path.name == "options.py":
            continue  # programs of other interpreters read their own environment
        for name in names_read(path.read_text()):
            probe = name[:-1] + "X" if name.endswith("*") else name
            if options.declared(probe) is None:
                undeclared.append(f"{path.relative_to(SRC)}: {name}")
    assert not undeclared, "declare these in pinwheel.options.VARIABLES: " + str(undeclared)


def test_the_declaration_check_sees_a_planted_read() -> None:
    planted = 'x = environ.get("PINWHEEL_SECRET_KNOB")\ny = ctx.environ["CUDA_HOME"]\n'
    planted += 'z = [k for k in environ if k.startswith("FOO_")]\n'
    assert names_read(planted) == {"PINWHEEL_SECRET_KNOB", "CUDA_HOME", "FOO_*"}
    assert options.declared("PINWHEEL_SECRET_KNOB") is None
    assert options.declared("CUDA_HOME") is not None


def test_stages_get_declared_and_pass_through_variables_only() -> None:
    process = {
        "PATH": "/usr/bin", "CUDA_HOME": "/opt/cuda", "SCCACHE_DIR": "/c", "HOME": "/root",
        "LC_ALL": "C", "DOCKER_PASSWORD": "s3cr3t", "GIT_DIR": "/evil", "MY_MODEL": "/m",
        "LD_PRELOAD": "/evil.so", "BASH_ENV": "/evil.sh",
    }  # fmt: skip
    env = options.environment(process)
    assert env == {
        "PATH": "/usr/bin", "CUDA_HOME": "/opt/cuda", "SCCACHE_DIR": "/c", "HOME": "/root",
        "LC_ALL": "C",
    }  # fmt: skip
    assert options.environment(process, extra=["MY_MODEL"])["MY_MODEL"] == "/m"
    # The S3 credentials are declared: sccache's S3 backend and the object store sign with them.
    aws = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"}
    assert options.environment({**process, **aws}) == {**env, **aws}
    ctx = Context(manifest_path=Path("m.toml"), cache=Path("c"), mirrors={}, json=True,
                  offline=True)  # fmt: skip
    assert all(options.passes(k) for k in ctx.environ)


def test_each_value_says_where_it_came_from() -> None:
    rows = {
        r.var.name: r
        for r in options.resolve(
            {"PINWHEEL_CACHE": "/env/cache", "CXX": "g++-12", "SCCACHE_DIR": "/d"},
            {"--cache": None, "--mirror": "https://x.example/a.git=/m"},
        )
    }
    assert (rows["PINWHEEL_CACHE"].source, rows["PINWHEEL_CACHE"].value) == (
        "environment",
        "/env/cache",
    )
    assert rows["PINWHEEL_MIRRORS"].source == "flag"
    assert rows["PINWHEEL_BUILD_PYTHON"].source == "default"
    assert rows["CUDA_HOME"].source == "unset" and rows["CXX"].value == "g++-12"
    assert rows["SCCACHE_*"].value == "SCCACHE_DIR"  # names only: values may hold secrets
    flagged = options.resolve({"PINWHEEL_CACHE": "/env"}, {"--cache": "/flag"})
    assert next(r for r in flagged if r.var.name == "PINWHEEL_CACHE").source == "flag"


def test_pinwheel_env_lists_every_variable_with_its_flag(capsys, monkeypatch) -> None:
    monkeypatch.setenv("PINWHEEL_MIRRORS", "https://u:t0ken@x.example/a.git=/m")
    assert main(["env", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    listed = {v["name"]: v for v in doc["variables"]}
    assert set(listed) == {v.name for v in options.VARIABLES}
    assert listed["PINWHEEL_CACHE"]["flag"] == "--cache"
    assert listed["PINWHEEL_MIRRORS"]["source"] == "environment"
    assert "t0ken" not in json.dumps(doc)  # credentials redacted
    assert main(["env"]) == 0
    human = capsys.readouterr().out
    assert "PINWHEEL_TORCH_PYTHON" in human and "(--mirror)" in human and "t0ken" not in human

"""One declaration per option: every flag that has an environment variable is added by
``pinwheel.options.add_flag`` from its ``Var`` (flag, help, default), on the commands the
``Var`` names, and resolved by one chain (flag > variable > manifest key > default) that
says where each value came from.

The parser walked is the real one (``pinwheel.cli.build_parser``); the resolution is the
CLI's own (``options.from_args``, what ``Context.option`` calls); ``pinwheel env --json``
and ``pinwheel serve`` are run as a person runs them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pinwheel import options
from pinwheel.cli import _global_options, build_parser, main

ROOT = Path(__file__).resolve().parent.parent
FLAGGED = [v for v in options.VARIABLES if v.flag is not None]


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser under ``parser`` (itself, each subcommand, each sub-subcommand)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def _problems(parser: argparse.ArgumentParser) -> list[str]:
    """What drifts between ``parser`` and :data:`options.VARIABLES` (empty: nothing)."""
    problems: list[str] = []
    tagged: dict[tuple[tuple[str, ...], str], argparse.Action] = {}
    for path, p in _parsers(parser):
        command = path[0] if path else ""
        where = " ".join(("pinwheel", *path))
        for action in p._actions:
            name = getattr(action, options.FLAG_OF, None)
            if name is not None:
                var = options.by_name(name)
                tagged[(path, name)] = action
                if var.flag not in action.option_strings:
                    problems.append(f"{where}: {action.option_strings} is not {name}'s {var.flag}")
                if options.GLOBAL not in var.commands and command not in var.commands:
                    problems.append(f"{where}: {var.flag} ({name}) on a command {name} "
                                    f"does not list in Var.commands {var.commands}")  # fmt: skip
                if f"${name}" not in (action.help or ""):
                    problems.append(f"{where}: {var.flag}'s help does not name ${name}")
                continue
            for var in options.VARIABLES:  # a hand-written flag for a declared variable
                uses = options.GLOBAL in var.commands or command in var.commands
                if var.flag in action.option_strings and uses:
                    problems.append(f"{where}: {var.flag} is added by hand, not add_flag({var.name!r})")
                elif f"${var.name}" in (action.help or ""):
                    problems.append(f"{where}: {action.option_strings} names ${var.name} in its "
                                    "help but is not add_flag's (declare its flag in its Var)")  # fmt: skip
    for path, _ in _parsers(parser):
        command = path[0] if path else ""
        for var in FLAGGED:
            wanted = options.GLOBAL in var.commands or (len(path) == 1 and command in var.commands)
            if wanted and (path, var.name) not in tagged:
                problems.append(f"{' '.join(('pinwheel', *path))}: {var.name} declares {var.flag} "
                                "but the command has no add_flag for it")  # fmt: skip
    return problems


def test_every_declared_flag_is_added_from_its_declaration_and_nowhere_by_hand() -> None:
    parser = build_parser()
    commands = {path[0] for path, _ in _parsers(parser) if path}
    for var in FLAGGED:
        assert var.commands, f"{var.name} declares {var.flag} but no command takes it"
        assert set(var.commands) <= commands | {options.GLOBAL}, (var.name, var.commands)
    assert _problems(parser) == []


def test_the_walk_finds_a_hand_written_flag_and_a_missing_one() -> None:
    """The check above can fail: a flag added by hand, a help naming a variable and a
    declared flag no command adds are each reported."""
    parser = argparse.ArgumentParser(prog="pinwheel")
    _global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve")
    serve.add_argument("--host", help="bind address (default: $HOST)")
    serve.add_argument("--cache", help="somewhere")
    other = sub.add_parser("build")
    other.add_argument("--out", help="where (default: $PINWHEEL_WHEELHOUSE)")
    problems = "\n".join(_problems(parser))
    assert "pinwheel serve: --host is added by hand" in problems
    assert "pinwheel serve: --cache is added by hand" in problems
    assert "names $PINWHEEL_WHEELHOUSE" in problems
    assert "pinwheel serve: PORT declares --port but the command has no add_flag" in problems
    assert "pinwheel build: PINWHEEL_WHEELHOUSE declares --wheelhouse" in problems


def test_a_flags_help_is_made_from_its_declaration() -> None:
    text = dict(_parsers(build_parser("serve")))[("serve",)].format_help()
    flat = " ".join(text.split())
    assert "--port PORT the port `pinwheel serve` listens on (also $PORT, then [serve] port; " \
        "default: 8000)" in flat
    assert "(also $CUDA_VISIBLE_DEVICES; default: the profile's GPUs)" in flat
    top = " ".join(build_parser().format_help().split())
    assert "--cache DIR the cache directory (fetches, toolkits, builds) (also $PINWHEEL_CACHE; " \
        "default: $XDG_CACHE_HOME/pinwheel, else ~/.cache/pinwheel)" in top
    assert "(added to $PINWHEEL_MIRRORS; default: none)" in top


# -- behaviour: each flag against its variable, through the CLI's own resolution -------------

_REQUIRED = {"attribute": ["--out", "o"]}  # what a command needs to parse at all
_VALUES = {  # (flag value, variable value) where a path or a number is wanted
    "PINWHEEL_MIRRORS": ("https://x.example/a.git=/m/a", "https://y.example/b.git=/m/b"),
    "PORT": ("9001", "9002"),
    "CUDA_VISIBLE_DEVICES": ("0,1", "2"),
    "HOST": ("127.0.0.1", "::1"),
}
_ENV_NAME = {"<PREFIX>_PROFILE": "DEMO_PROFILE", "<[model] var>": "DEMO_MODEL"}


def _command(var: options.Var) -> str:
    return "env" if options.GLOBAL in var.commands else var.commands[0]


@pytest.mark.parametrize("name", [v.name for v in FLAGGED])
def test_flag_beats_variable_beats_manifest_beats_default(name: str) -> None:
    var = options.by_name(name)
    command = _command(var)
    flag_value, env_value = _VALUES.get(name, ("/from/flag", "/from/env"))
    env_name = _ENV_NAME.get(name)
    parser = build_parser(command)

    def parsed(*extra: str) -> argparse.Namespace:
        return parser.parse_args([command, *_REQUIRED.get(command, []), *extra])

    def chain(args: argparse.Namespace, env: dict[str, str], manifest: object = None):
        r = options.from_args(args, name, env, manifest=manifest, env_name=env_name)
        return r.value, r.source

    with_flag, without = parsed(str(var.flag), flag_value), parsed()
    env = {env_name or name: env_value}
    assert chain(with_flag, {}) == (flag_value, "flag")
    assert chain(without, env) == (env_value, "environment")
    if var.adds:  # --mirror: the flag's pairs come after the variable's
        assert chain(with_flag, env) == (f"{env_value},{flag_value}", "flag+environment")
    else:
        assert chain(with_flag, env) == (flag_value, "flag")
    assert chain(without, {}) == (var.default, "default")
    assert chain(without, {(env_name or name): ""}) == (var.default, "default")  # empty: unset
    if var.manifest_key is not None:
        assert chain(without, {}, manifest="from-manifest") == ("from-manifest", "manifest")
        assert chain(without, env, manifest="from-manifest") == (env_value, "environment")
        assert chain(with_flag, env, manifest="from-manifest") == (flag_value, "flag")


def test_pinwheel_env_reports_the_cache_from_flag_variable_and_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def cache_row(*argv: str) -> dict[str, str]:
        assert main(["env", "--json", *argv]) == 0
        doc = json.loads(capsys.readouterr().out)
        return next(v for v in doc["variables"] if v["name"] == "PINWHEEL_CACHE")

    monkeypatch.delenv("PINWHEEL_CACHE", raising=False)
    row = cache_row()
    assert (row["source"], row["value"]) == ("default", row["default"])
    assert row["flag"] == "--cache"
    monkeypatch.setenv("PINWHEEL_CACHE", str(tmp_path / "env"))
    row = cache_row()
    assert (row["source"], row["value"]) == ("environment", str(tmp_path / "env"))
    row = cache_row("--cache", str(tmp_path / "flag"))
    assert (row["source"], row["value"]) == ("flag", str(tmp_path / "flag"))
    assert main(["--cache", str(tmp_path / "before"), "env", "--json"]) == 0  # before it too
    doc = json.loads(capsys.readouterr().out)
    row = next(v for v in doc["variables"] if v["name"] == "PINWHEEL_CACHE")
    assert (row["source"], row["value"]) == ("flag", str(tmp_path / "before"))


def test_pinwheel_serve_takes_port_and_host_from_flag_then_variable_then_manifest(
    tmp_path: Path,
) -> None:
    """`pinwheel serve` run as a person runs it, with a stand-in Python that prints the
    command line the engine would get."""
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        f"exec {sys.executable} -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n"
    )
    python.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in ("PORT", "HOST", "PYTHON")}
    base |= {"GLM53_MODEL": "/m", "PYTHONPATH": str(ROOT / "src")}

    def served(env: dict[str, str], *flags: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-m", "pinwheel", "serve", "--manifest", str(ROOT / "manifest.toml"),
             *flags], env={**base, **env}, capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        argv: list[str] = json.loads(out.stdout)
        return argv

    def at(argv: list[str], flag: str) -> str:
        return argv[argv.index(flag) + 1]

    via_env = {"PYTHON": str(python)}
    argv = served(via_env)  # neither: [serve] port (8000 here), HOST's default
    assert (at(argv, "--port"), at(argv, "--host")) == ("8000", "0.0.0.0")
    argv = served({**via_env, "PORT": "8123", "HOST": "127.0.0.1"})
    assert (at(argv, "--port"), at(argv, "--host")) == ("8123", "127.0.0.1")
    argv = served({"PORT": "8123", "HOST": "127.0.0.1"}, "--port", "9999", "--host", "::1",
                  "--python", str(python))  # fmt: skip
    assert (at(argv, "--port"), at(argv, "--host")) == ("9999", "::1")

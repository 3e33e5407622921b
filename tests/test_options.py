"""One options resolver: every environment variable pinwheel reads is declared in
pinwheel.options, `pinwheel env` lists each with its flag and source, and the environment
stages get (and children inherit) is the declared variables plus a pass-through list."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from pinwheel import options
from pinwheel.cli import Context, main
from pinwheel.errors import UsageError

SRC = Path(__file__).resolve().parents[1] / "src" / "pinwheel"
# environ.get("X"), environ["X"], ctx.environ.get("X", ...), .startswith("X_") on a key
_READ = re.compile(r"""environ(?:\.get)?[\[(]\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""")
_PREFIX = re.compile(r"""\b(?:k|key|name)\.startswith\(\s*["']([A-Z][A-Z0-9]*_)["']\s*\)""")


def names_read(text: str) -> set[str]:
    """Every variable ``text`` reads by name: spelled ``environ`` (the regex) or through any
    other name bound to an environment mapping (``env = ctx.environ; env.get("X")``)."""
    found = set(_READ.findall(text)) | {p + "*" for p in _PREFIX.findall(text)}
    return found | {name for _, name in env_reads(ast.parse(text))}


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
    # the mapping under another name (cli/release_cmds.py read GITHUB_WORKFLOW_REF so, and
    # the options layer's child mapping never held it)
    aliased = ('env = ctx.environ\nserver = env.get("GITHUB_SERVER_URL", "")\n'
               'e2 = env\nif "X_KNOB" in e2: pass\nkids = dict(host.child)\nkids["Y_KNOB"]\n'
               'other = {}\nother.get("NOT_ENV")\n')  # fmt: skip
    assert names_read(aliased) == {"GITHUB_SERVER_URL", "X_KNOB", "Y_KNOB"}
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
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-k3y")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "s3ss10n")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    assert main(["env", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    text = json.dumps(doc)
    assert "s3cr3t-k3y" not in text and "s3ss10n" not in text  # a secret is said set, never shown
    shown = {v["name"]: v for v in doc["variables"]}
    assert shown["AWS_SECRET_ACCESS_KEY"]["value"] == options.HIDDEN
    assert shown["AWS_SECRET_ACCESS_KEY"]["source"] == "environment"
    assert shown["AWS_ACCESS_KEY_ID"]["value"] == "AKIDEXAMPLE"  # a key id is not a secret
    listed = {v["name"]: v for v in doc["variables"]}
    assert set(listed) == {v.name for v in options.VARIABLES}
    assert listed["PINWHEEL_CACHE"]["flag"] == "--cache"
    assert listed["PINWHEEL_MIRRORS"]["source"] == "environment"
    assert "t0ken" not in json.dumps(doc)  # credentials redacted
    assert main(["env"]) == 0
    human = capsys.readouterr().out
    assert "PINWHEEL_TORCH_PYTHON" in human and "(--mirror)" in human and "t0ken" not in human
    assert "s3cr3t-k3y" not in human and "s3ss10n" not in human


# -- stages get typed values, never a mapping to search ------------------------------------


def _declared_names() -> frozenset[str]:
    return frozenset(v.name for v in options.VARIABLES if v.prefix is None and v.name.isupper())


def _is_environment(node: ast.AST) -> bool:
    """The caller's environment as stages spell it: ``environ``, ``opts.environ``,
    ``request.environ``, ``host.child``. (A build environment pinwheel wrote itself, read
    back, is not searched for the caller's values.)"""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return name.endswith("environ") or name == "child"


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of one scope: a function's (or the module's) body, not its inner functions."""
    out, stack = [], list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack += list(ast.iter_child_nodes(node))
    return out


def _aliases(tree: ast.AST) -> set[str]:
    """Names bound to the caller's environment: ``env = ctx.environ``, ``e = host.child``,
    ``env = dict(os.environ)``, ``env = ctx.environ or {}`` (and an alias of an alias)."""
    found: set[str] = set()

    def environment_like(value: ast.AST) -> bool:
        if isinstance(value, ast.Call) and value.args:  # dict(environ), {**environ}
            value = value.args[0]
        if isinstance(value, ast.BoolOp):
            return any(environment_like(v) for v in value.values)
        if isinstance(value, ast.Dict):
            return any(k is None and environment_like(v) for k, v in
                       zip(value.keys, value.values, strict=True))  # fmt: skip
        return _is_environment(value) or (isinstance(value, ast.Name) and value.id in found)

    for _ in range(3):  # aliases of aliases
        for node in _own_nodes(tree):
            targets: list[ast.AST] = []
            value = None
            if isinstance(node, ast.Assign):
                targets, value = list(node.targets), node.value
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                targets, value = [node.target], node.value
            if value is None or not environment_like(value):
                continue
            for target in targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                found |= {t.id for t in elts if isinstance(t, ast.Name)}
    return found


def env_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every ``environ["NAME"]`` read, ``environ.get("NAME"...)`` and
    ``"NAME" in environ``, ``environ`` spelled any way: ``ctx.environ``, ``host.child`` or a
    name bound to one of them in the same function (or module)."""
    scopes = [tree, *(n for n in ast.walk(tree)
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))]  # fmt: skip
    return sorted({read for scope in scopes for read in _scope_reads(scope)})


def _scope_reads(tree: ast.AST) -> list[tuple[int, str]]:
    aliases = _aliases(tree)

    def env(node: ast.AST) -> bool:
        return _is_environment(node) or (isinstance(node, ast.Name) and node.id in aliases)

    found = []
    for node in _own_nodes(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice if env(node.value) else None
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
            and env(node.func.value)
        ):
            key = node.args[0]
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and env(node.comparators[0])
        ):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append((node.lineno, key.value))
    return found


def searches(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every read of the caller's environment (:func:`env_reads`) whose
    NAME is a declared environment variable: a stage searching it for a variable by name."""
    names = _declared_names()
    return [(line, name) for line, name in env_reads(tree) if name in names]


def _stage_modules() -> list[Path]:
    return [
        p for p in sorted(SRC.rglob("*.py"))
        if p.relative_to(SRC).parts[0] != "cli" and p.name != "options.py"
        and "workers" not in p.parts  # programs of other interpreters: their own environment
    ]  # fmt: skip


def test_no_stage_searches_a_mapping_for_a_declared_variable() -> None:
    offenders = [
        f"{path.relative_to(SRC)}:{line}: {name}"
        for path in _stage_modules()
        for line, name in searches(ast.parse(path.read_text()))
    ]
    assert not offenders, (
        "stages get typed values resolved in pinwheel.options (HostEnvironment), never an "
        "environment to search by name: " + "; ".join(offenders)
    )


def test_the_search_check_sees_planted_reads() -> None:
    planted = (
        'a = environ.get("CUDA_HOME")\nb = host.child["PATH"]\nc = "CXX" in environ\n'
        'd = req.environ.get("PINWHEEL_CANONICAL", "")\nenviron["PATH"] = "/bin"\n'
        'e = environ.get("CPATH")\nf = set_env["PATH"]\n'
    )
    assert sorted(n for _, n in searches(ast.parse(planted))) == [
        "CUDA_HOME", "CXX", "PATH", "PINWHEEL_CANONICAL",
    ]  # fmt: skip


# -- the resolver: typed values, hostile ones refused naming the variable and its flag --------


def test_the_resolver_types_what_stages_read(tmp_path: Path) -> None:
    process = {
        "PATH": "/opt/bin:/usr/bin", "HOME": "/home/u", "CUDA_HOME": "/opt/cuda",
        "CXX": "g++-13", "CMAKE_ARGS": "-DA=1 '-DB=two words'", "PINWHEEL_CANONICAL":
        "prefix-map", "PINWHEEL_WHEELHOUSE": "house", "SCCACHE_DIR": "/s", "SCCACHE_PATH":
        "/usr/bin/sccache", "ACTIONS_RESULTS_URL": "https://results.invalid/",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t", "NPM_TOKEN": "n0pe",
    }  # fmt: skip
    host = options.host(process)
    assert host.search_path == ("/opt/bin", "/usr/bin") and host.path == "/opt/bin:/usr/bin"
    assert (host.cuda_home, host.cuda_path) == (Path("/opt/cuda"), None)
    assert (host.cc, host.cxx, host.canonical) == (None, "g++-13", "prefix-map")
    assert host.cmake_args == ("-DA=1", "-DB=two words")
    assert host.cmake_args_text == "-DA=1 '-DB=two words'"
    assert host.wheelhouse == Path("house").absolute()
    assert host.sccache.binary == Path("/usr/bin/sccache")
    assert host.sccache.settings == {"SCCACHE_DIR": "/s", "SCCACHE_PATH": "/usr/bin/sccache"}
    assert host.sccache.actions_cache_url == "https://results.invalid/"
    assert "NPM_TOKEN" not in host.child and host.child["HOME"] == "/home/u"
    assert host.child["AWS_SECRET_ACCESS_KEY"] == "s3cr3t"  # declared: the S3 store signs
    assert host.sccache.aws.secret_access_key == "s3cr3t" and "s3cr3t" not in repr(host)
    bare = options.host({})
    assert bare.path is None and bare.cmake_args == () and bare.cmake_args_text is None
    moved = host.with_child(CC="/usr/bin/gcc-13", CXX="/usr/bin/g++-13", CUDAHOSTCXX="x")
    assert (moved.cc, moved.cxx, moved.child["CUDAHOSTCXX"]) == (
        "/usr/bin/gcc-13", "/usr/bin/g++-13", "x")  # fmt: skip


HOSTILE = [
    ("SCCACHE_CACHE_SIZE", "١٠G", "not a size"),  # Arabic-Indic digits: not ASCII
    ("SCCACHE_CACHE_SIZE", "10G\n", "not a size"),
    ("CUDA_HOME", "cuda-12.8", "not an absolute path"),
    ("CUDA_PATH", "/opt/cuda\x1b[2J", "control character"),
    ("PINWHEEL_TORCH_PYTHON", "venv/bin/python", "not an absolute path"),
    ("SCCACHE_PATH", "sccache", "not an absolute path"),
    ("PINWHEEL_WHEELHOUSE", "/w\nx", "control character"),
    ("CMAKE_ARGS", "-DNAME='unclosed", "cannot be split"),
    ("CMAKE_ARGS", "-DA=1\x00", "control character"),
    ("PINWHEEL_CANONICAL", "prefix_map", "not one of mount-namespace, prefix-map"),
    ("CXX", "--version", "an option, not a program"),
    ("CC", "gcc\r", "control character"),
    ("PATH", "/usr/bin\n/bin", "control character"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "why"), HOSTILE)
def test_a_hostile_value_is_refused_by_the_resolver_naming_it(name, value, why) -> None:
    with pytest.raises(UsageError) as err:
        options.host({"PATH": "/usr/bin", name: value})
    text = f"{err.value.what} {err.value.where} {err.value.next}"
    assert name in (err.value.where or "") and why in err.value.what, text
    assert err.value.next and "pinwheel env" in err.value.next
    flag = options.declared(name).flag  # type: ignore[union-attr]
    assert flag is None or flag in (err.value.where or "")


def test_a_hostile_value_stops_the_command_with_exit_2(tmp_path, monkeypatch, capsys) -> None:
    """Through the CLI: the resolver runs before the stage, the error names the variable."""
    manifest = tmp_path / "manifest.toml"
    manifest.write_text('[upstream]\nurl = "https://example.invalid/up.git"\ncommit = "'
                        + "0" * 40 + '"\n[build]\ncuda = "12.8"\narches = ["7.0"]\n')  # fmt: skip
    monkeypatch.setenv("CUDA_HOME", "relative/cuda")
    rc = main(["--manifest", str(manifest), "--cache", str(tmp_path / "c"), "toolchain",
               "--no-provision"])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "environment variable CUDA_HOME" in err and "not an absolute path" in err

"""One options resolver: every environment variable pinwheel reads is declared in
pinwheel.options, `pinwheel env` lists each with its flag and source, and the environment
stages get (and children inherit) is the declared variables plus a pass-through list."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

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


# -- nothing outside options indexes a mapping with an upper-case name ----------------------

_UPPER = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]*)*")
# Upper-case keys of vocabularies that are not environments, each with why: CMake's
# FetchContent keywords, glibc's symbol-version families, a release's checksum file name,
# substrings of an error's or a setup script's text. A new entry needs a reason as good.
NOT_ENVIRONMENT = {
    "source/buildsources.py": {"SOURCE_DIR", "CACHE", "GIT_REPOSITORY", "URL",
                               "PATCH_COMMAND", "GIT_SUBMODULES"},  # CMake arguments
    "wheels/abifloor.py": {"GLIBC", "<loop>"},  # symbol-version families (GLIBC, CXXABI)
    "wheels/check.py": {"GLIBC"},
    "release/assemble.py": {"<loop>"},  # the same families, from a recorded floor
    "release/sigstorebundle.py": {"SUMS"},  # SHA256SUMS: a subject's file name
    "wheels/wheelfile.py": {"CRC"},  # zipfile's error text
    "compile/reuse.py": {"VLLM_PRECOMPILED_WHEEL_LOCATION"},  # setup.py's text, searched
}  # fmt: skip


def _is_upper(value: object) -> bool:
    return isinstance(value, str) and len(value) >= 2 and _UPPER.fullmatch(value) is not None


def _bindings(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level ``NAME = value`` (a constant, a tuple of names...)."""
    out: dict[str, ast.expr] = {}
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])  # fmt: skip
        for target in targets:
            if isinstance(target, ast.Name) and node.value is not None:  # type: ignore[union-attr]
                out[target.id] = node.value  # type: ignore[union-attr]
    return out


def _src_bindings() -> dict[str, ast.expr]:
    """Every module's bindings: ``compcache.BUSTER`` resolves through another module."""
    out: dict[str, ast.expr] = {}
    for path in sorted(SRC.rglob("*.py")):
        out.update(_bindings(ast.parse(path.read_text())))
    return out


def upper_case_indexing(tree: ast.Module, others: dict[str, ast.expr] | None = None
                        ) -> list[tuple[int, str]]:  # fmt: skip
    """(line, key) of every ``m["NAME"]`` read, ``m.get/pop/setdefault("NAME")``,
    ``os.getenv("NAME")`` and ``"NAME" in m`` on any mapping whatever its name, where NAME
    is an upper-case literal, a name bound to one (here or in another module), or the
    target of a loop over a tuple of such names (key ``<loop>``)."""
    own = _bindings(tree)
    bound = {**(others or {}), **own}

    def constant(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and _is_upper(node.value):
            return str(node.value)
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        value = bound.get(name) if isinstance(name, str) else None
        if isinstance(value, ast.Constant) and _is_upper(value.value):
            return name
        return None

    def elements(node: ast.AST) -> list[ast.expr]:
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if isinstance(name, str) and name in bound:
            node = bound[name]
        return list(node.elts) if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []

    def bind(target: ast.AST, element: ast.AST, names: set[str]) -> None:
        if isinstance(target, ast.Name) and constant(element):
            names.add(target.id)
        elif (isinstance(target, ast.Tuple) and isinstance(element, ast.Tuple)
              and len(target.elts) == len(element.elts)):  # fmt: skip
            for t, e in zip(target.elts, element.elts, strict=True):
                bind(t, e, names)

    def keys(scope: ast.AST) -> list[tuple[int, ast.AST]]:
        out: list[tuple[int, ast.AST]] = []
        for node in ast.walk(scope):
            if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Store):
                out.append((node.lineno, node.slice))
            elif isinstance(node, ast.Call) and node.args and (
                (isinstance(node.func, ast.Attribute)
                 and node.func.attr in ("get", "pop", "setdefault", "getenv"))
                or (isinstance(node.func, ast.Name) and node.func.id == "getenv")
            ):  # fmt: skip
                out.append((node.lineno, node.args[0]))
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
                out.append((node.lineno, node.left))
        return out

    found = {(line, name) for line, key in keys(tree) if (name := constant(key)) is not None}
    for node in ast.walk(tree):  # a loop's target, within that loop only
        loops = ([(node.target, node.iter)] if isinstance(node, (ast.For, ast.AsyncFor))
                 else [(g.target, g.iter) for g in getattr(node, "generators", [])])  # fmt: skip
        names: set[str] = set()
        for target, it in loops:
            for element in elements(it):
                bind(target, element, names)
        found |= {(line, "<loop>") for line, key in keys(node) if names
                  and isinstance(key, ast.Name) and key.id in names}  # fmt: skip
    return sorted(found)


def test_nothing_outside_options_indexes_a_mapping_with_an_upper_case_name() -> None:
    others = _src_bindings()
    offenders, used = [], set()
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        if path.name == "options.py" or "workers" in path.parts:
            continue  # programs of other interpreters read their own environment
        for line, key in upper_case_indexing(ast.parse(path.read_text()), others):
            if key in NOT_ENVIRONMENT.get(rel, set()):
                used.add((rel, key))
            else:
                offenders.append(f"{rel}:{line}: {key}")
    assert not offenders, (
        "an environment value is read in pinwheel.options (a typed field of "
        "HostEnvironment, Launch or SccacheStore; a child's environment pinwheel composed "
        "through options.value/select), never by indexing a mapping: " + "; ".join(offenders)
    )
    stale = {(m, k) for m, keys in NOT_ENVIRONMENT.items() for k in keys} - used
    assert not stale, f"NOT_ENVIRONMENT lists what no module does any more: {sorted(stale)}"


def test_the_upper_case_check_sees_planted_reads_whatever_the_mapping_is_called() -> None:
    planted = ast.parse(
        'import os\nKNOB = "B_KNOB"\nNAMES = ("D_KNOB", "E_KNOB")\n'
        'kids = dict(host.child)\na = kids["A_KNOB"]\nb = anything.get(KNOB, "")\n'
        'c = "C_KNOB" in whatever\nfor n in NAMES:\n    x = env2[n]\n'
        'y = {k: m[k] for k in ("F_KNOB",) if k in m}\nz = os.getenv("G_KNOB")\n'
        'w = m.pop("H_KNOB", None)\nv = m[other.BUSTER]\n'
        'for key, var in (("region", "I_KNOB"),):\n    u = m.get(var)\n'
        'fine = m["lower"], m["X"], [k for k in m if k.isupper()]\nm["J_KNOB"] = "written"\n'
    )  # fmt: skip
    others = {"BUSTER": ast.Constant("SCCACHE_C_CUSTOM_CACHE_BUSTER")}
    assert [k for _, k in upper_case_indexing(planted, others)] == [
        "A_KNOB", "KNOB", "C_KNOB", "<loop>", "<loop>", "G_KNOB", "H_KNOB", "BUSTER",
        "<loop>",
    ]  # fmt: skip


# -- every declared variable reaches its typed field ----------------------------------------

_GITHUB = {"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://github.example",
           "GITHUB_WORKFLOW_REF": "o/r/.github/workflows/release.yml@refs/tags/v1"}  # fmt: skip
_STORE_FIELDS = {f.metadata["var"]: f.name for f in dataclasses.fields(options.SccacheStore)}


def _launch(process: dict[str, str]) -> options.Launch:
    return options.launch(process)


def _host(process: dict[str, str]) -> options.HostEnvironment:
    return options.host({"PATH": "/usr/bin", **process})


# name -> (the value set, what reads it back from the resolver's answer, what it must be)
REACHES: dict[str, tuple[str, Any, Any]] = {
    "PINWHEEL_CACHE": ("/c/pw", lambda p: _launch(p).default_cache(), Path("/c/pw")),
    "XDG_CACHE_HOME": ("/x", lambda p: _launch(p).default_cache(), Path("/x/pinwheel")),
    "PINWHEEL_MIRRORS": ("https://a.example/r.git=/m", lambda p: _launch(p).mirrors,
                         "https://a.example/r.git=/m"),
    "PINWHEEL_SAFE_DIRECTORIES": ("/shared/*", lambda p: _launch(p).safe_directories,
                                  "/shared/*"),
    "TERM": ("dumb", lambda p: _launch(p).term, "dumb"),
    "PINWHEEL_WHEELHOUSE": ("/w", lambda p: _host(p).wheelhouse, Path("/w")),
    "PINWHEEL_TORCH_PYTHON": ("/v/bin/python", lambda p: _host(p).torch_python,
                              Path("/v/bin/python")),
    "PINWHEEL_BUILD_PYTHON": ("python3.12", lambda p: _host(p).build_python, "python3.12"),
    "PINWHEEL_CANONICAL": ("prefix-map", lambda p: _host(p).canonical, "prefix-map"),
    "CUDA_HOME": ("/opt/cuda", lambda p: _host(p).cuda_home, Path("/opt/cuda")),
    "CUDA_PATH": ("/opt/cuda2", lambda p: _host(p).cuda_path, Path("/opt/cuda2")),
    "CC": ("gcc-13", lambda p: _host(p).cc, "gcc-13"),
    "CXX": ("g++-13", lambda p: _host(p).cxx, "g++-13"),
    "CMAKE_ARGS": ("-DA=1 -DB=2", lambda p: _host(p).cmake_args, ("-DA=1", "-DB=2")),
    "PATH": ("/a:/b", lambda p: options.host(p).search_path, ("/a", "/b")),
    "PYTHONPATH": ("/pp", lambda p: _host(p).pythonpath, "/pp"),
    "HOME": ("/home/u", lambda p: _host(p).home, Path("/home/u")),
    "UV_PYTHON_INSTALL_DIR": ("/uv", lambda p: _host(p).uv_python_install_dir, Path("/uv")),
    "PYENV_ROOT": ("/pyenv", lambda p: _host(p).pyenv_root, Path("/pyenv")),
    "SCCACHE_PATH": ("/bin/sccache", lambda p: _host(p).sccache.binary, Path("/bin/sccache")),
    "SCCACHE_CACHE_SIZE": ("5G", lambda p: (_host(p).sccache.size,
                                            _host(p).sccache.store.cache_size), ("5G", "5G")),
    "AWS_ACCESS_KEY_ID": ("AKID", lambda p: _host(p).sccache.aws.access_key_id, "AKID"),
    "AWS_SECRET_ACCESS_KEY": ("s", lambda p: _host(p).sccache.aws.secret_access_key, "s"),
    "AWS_SESSION_TOKEN": ("t", lambda p: _host(p).sccache.aws.session_token, "t"),
    "PINWHEEL_STORE_KEY": ("k" * 32, lambda p: (_host(p).sccache.store_key,
                                                "PINWHEEL_STORE_KEY" in _host(p).child),
                           ("k" * 32, False)),  # never a child's
    "ACTIONS_CACHE_URL": ("https://c.example/", lambda p: _host(p).sccache.actions_cache_url,
                          "https://c.example/"),
    "ACTIONS_RESULTS_URL": ("https://r.example/",
                            lambda p: _host(p).sccache.actions_cache_url, "https://r.example/"),
    "PYTHON": ("python3.11", lambda p: _host(p).python, "python3.11"),
    "CUDA_VISIBLE_DEVICES": ("0,1", lambda p: _host(p).devices, "0,1"),
    "HOST": ("127.0.0.1", lambda p: _host(p).listen_host, "127.0.0.1"),
    "PORT": ("8001", lambda p: _host(p).port, "8001"),
    "GITHUB_ACTIONS": ("true", lambda p: _host({**_GITHUB, "GITHUB_ACTIONS": "false", **p})
                       .github is not None, True),
    "GITHUB_SERVER_URL": ("https://ghe.example", lambda p: _host({**_GITHUB, **p})
                          .github.server_url, "https://ghe.example"),  # type: ignore[union-attr]
    "GITHUB_WORKFLOW_REF": ("a/b/.github/workflows/w.yml@refs/heads/main", lambda p: _host(
        {**_GITHUB, **p}).github.workflow_ref, "a/b/.github/workflows/w.yml@refs/heads/main"),
    "GITHUB_REPOSITORY": ("a/b", lambda p: _host({**_GITHUB, **p}).github.repository, "a/b"),
    "GITHUB_RUN_ID": ("42", lambda p: _host({**_GITHUB, **p}).github.run_id, "42"),
    "GITHUB_RUN_ATTEMPT": ("3", lambda p: _host({**_GITHUB, **p}).github.run_attempt, "3"),
    # read by the stage that composes a child's environment: it reaches ``child``
    "LDFLAGS": ("-Wl,-O1", lambda p: _host(p).child.get("LDFLAGS"), "-Wl,-O1"),
    # sccache's and the AWS chain's own settings: handed on as they are
    "SCCACHE_*": ("1", lambda p: _host(p).sccache.settings.get("SCCACHE_NO_DAEMON"), "1"),
    "ACTIONS_*": ("t", lambda p: _host(p).sccache.actions.get("ACTIONS_RUNTIME_TOKEN"), "t"),
    "AWS_*": ("prof", lambda p: _host(p).child.get("AWS_PROFILE"), "prof"),
    "PIP_*": ("https://i.example/", lambda p: _host(p).child.get("PIP_INDEX_URL"),
              "https://i.example/"),
    # names a manifest chooses ([serve] env_prefix, model_var): the CLI asks for them
    "<PREFIX>_PROFILE": ("fast", lambda p: options.environment(
        p, extra=["MYSRV_PROFILE"]).get("MYSRV_PROFILE"), "fast"),
    "<PREFIX>_SEQS": ("64", lambda p: options.environment(
        p, extra=["MYSRV_SEQS"]).get("MYSRV_SEQS"), "64"),
    "<[model] var>": ("/m", lambda p: options.environment(
        p, extra=["MY_MODEL"]).get("MY_MODEL"), "/m"),
    **{var: ("v1" if var.endswith("_DB") else "x",  # SccacheStore's, each by its field
             lambda p, f=field: getattr(_host(p).sccache.store, f),
             "v1" if var.endswith("_DB") else "x")
       for var, field in _STORE_FIELDS.items() if var != "SCCACHE_CACHE_SIZE"},
}  # fmt: skip
# the name a prefix or a manifest-chosen declaration is set as
_SET_AS = {"SCCACHE_*": "SCCACHE_NO_DAEMON", "ACTIONS_*": "ACTIONS_RUNTIME_TOKEN",
           "AWS_*": "AWS_PROFILE", "PIP_*": "PIP_INDEX_URL", "<PREFIX>_PROFILE":
           "MYSRV_PROFILE", "<PREFIX>_SEQS": "MYSRV_SEQS", "<[model] var>": "MY_MODEL"}  # fmt: skip


def test_every_declared_variable_has_a_reach_row() -> None:
    declared = {v.name for v in options.VARIABLES}
    assert set(REACHES) == declared, (
        f"declared but never read: {sorted(declared - set(REACHES))}; "
        f"read but not declared: {sorted(set(REACHES) - declared)}"
    )
    for var in _STORE_FIELDS:  # each of SccacheStore's variables is declared by name
        assert options.declared(var) is not None and options.declared(var).name == var  # type: ignore[union-attr]


@pytest.mark.parametrize("name", [v.name for v in options.VARIABLES])
def test_each_declared_variable_reaches_its_typed_field(name: str) -> None:
    value, read, expected = REACHES[name]
    set_as = _SET_AS.get(name, name)
    assert read({set_as: value}) == expected
    assert read({}) != expected  # unset, the field says something else: it is this variable's
    if not name.startswith("<") and options.declared(set_as) is not None:
        row = next(r for r in options.resolve({set_as: value}) if r.var.name == name)
        assert row.source == "environment"

"""The package's shape is the pipeline: stages import only earlier stages, never the CLI.

The import graph is read from the source with ``ast`` (every import, including
the ones inside functions), so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "pinwheel"
DOC = SRC.parents[1] / "docs" / "ARCHITECTURE.md"
# Stage order: a module may import its own stage, the foundation, and earlier stages.
STAGES = ("manifest", "source", "wheels", "compile", "release", "serve", "flows")


def foundation_of(doc: str) -> set[str]:
    """The foundation modules: the rows of ARCHITECTURE.md's first table (the one place
    they are listed; noxfile.py's strict mypy reads the same rows)."""
    section = doc.split("Foundation (any stage may import these):", 1)[1].split("\nStage 0", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", section, re.M))


FOUNDATION = foundation_of(DOC.read_text()) | {"__init__"}


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _ours(name: str) -> bool:
    return name == "pinwheel" or name.startswith("pinwheel.")


def _dynamic(node: ast.AST) -> str | None:
    """The module a ``importlib.import_module("...")`` or ``__import__("...")`` call names."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__")
    )
    arg = node.args[0]
    if named and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return "<computed>" if named else None


def imports(path: Path, package: str | None = None) -> set[str]:
    """Every pinwheel module ``path`` imports, resolved to a dotted name (``import_module``
    with a constant name included; a computed name is ``<computed>``)."""
    tree = ast.parse(path.read_text(), str(path))
    if package is None:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if (target := _dynamic(node)) is not None:
            if target == "<computed>" or _ours(target):
                found.add(target)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if _ours(a.name)}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not _ours(mod):
                continue
            found.add(mod)
            for alias in node.names:  # `from pinwheel.compile import engine` imports a module
                if (
                    (SRC.parent / (mod + "." + alias.name).replace(".", "/"))
                    .with_suffix(".py")
                    .exists()
                ):
                    found.add(f"{mod}.{alias.name}")
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in SRC.rglob("*.py")}


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "foundation"
    if parts[1] == "__main__":  # `python -m pinwheel` is the CLI's entry point
        return "cli"
    if parts[1] in STAGES or parts[1] == "cli":
        return parts[1]
    return "foundation" if parts[1] in FOUNDATION else parts[1]


def test_every_module_belongs_to_a_stage_or_the_foundation() -> None:
    strays = [m for m in graph() if stage_of(m) not in (*STAGES, "cli", "foundation")]
    assert not strays, f"modules outside the stage folders: {strays}"


def test_no_stage_imports_the_cli_or_a_later_stage() -> None:
    bad = []
    for module, deps in graph().items():
        mine = stage_of(module)
        if mine == "cli":
            continue
        for dep in deps:
            theirs = stage_of(dep)
            if theirs == "cli":
                bad.append(f"{module} -> {dep} (the CLI)")
            elif mine == "foundation" and theirs != "foundation":
                bad.append(f"{module} -> {dep} (foundation imports a stage)")
            elif mine in STAGES and theirs in STAGES and STAGES.index(theirs) > STAGES.index(mine):
                bad.append(f"{module} -> {dep} (a later stage)")
    assert not bad, "\n".join(bad)


def test_the_import_graph_has_no_cycle() -> None:
    nodes = graph()
    g = {m: {d for d in deps if d in nodes} for m, deps in nodes.items()}
    # Package __init__ re-exports are edges too; a cycle is a path back to the start.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(g.get(node, ())):
            if nxt == node or _is_parent_package(nxt, node):
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(g):
        if node not in state and (cycle := visit(node)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def _is_parent_package(candidate: str, module: str) -> bool:
    """Importing a submodule runs its package's __init__: not a cycle of ours."""
    return module.startswith(candidate + ".")


def test_the_checker_sees_a_planted_violation(tmp_path: Path) -> None:
    """The graph reader is not vacuous: lazy and relative imports inside functions are found."""
    mod = tmp_path / "x.py"
    mod.write_text(
        "def f():\n    from pinwheel.cli import main\n    from ..serve import qualify\n"
        "    return main, qualify\n"
    )
    found = imports(mod, package="pinwheel.compile")
    assert {"pinwheel.cli", "pinwheel.serve", "pinwheel.serve.qualify"} <= found
    assert stage_of("pinwheel.serve.qualify") == "serve" and stage_of("pinwheel.cli") == "cli"


# The runner is the one module that starts processes; it alone may hand a child this
# process's environment (when a Command asks to inherit it). The CLI resolves the
# environment into requests; no stage reads it.
_ENV_READERS = {"pinwheel.runner"}
_PROCESS_STARTERS = {"pinwheel.runner"}
_SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output", "getoutput"}
_OS_CALLS = {"system", "popen", "getenv", "getenvb", "putenv", "execv", "execve", "execvp",
             "execvpe", "execl", "execlp", "spawnv", "spawnve", "spawnl", "posix_spawn",
             "posix_spawnp", "fork", "forkpty"}  # fmt: skip


# Programs another interpreter runs (the engine's Python per rank, the build's Python, the
# namespace entry; started through the runner): they are not stages and import nothing from
# pinwheel; like any program they read their own environment and may start processes.
_WORKERS = re.compile(r"pinwheel\.\w+\.workers\.\w+")


def is_worker(module: str) -> bool:
    return bool(_WORKERS.fullmatch(module))


_ENV_NAMES = {"environ", "environb", "getenv", "getenvb"}
# Modules whose import alone means starting processes (asyncio's subprocess API included).
_PROCESS_MODULES = ("subprocess", "pty", "multiprocessing", "asyncio.subprocess",
                    "concurrent.futures.process")  # fmt: skip
_PROCESS_NAMES = {"asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell",
                  "concurrent.futures.ProcessPoolExecutor", "os.fork", "os.forkpty"}  # fmt: skip


def _starts(full: str) -> bool:
    return full in _PROCESS_NAMES or any(
        full == m or full.startswith(m + ".") for m in _PROCESS_MODULES
    )


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> what it is: ``import subprocess as sp`` gives sp -> subprocess."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def offences(path: Path, module: str) -> list[str]:
    """Environment reads and process starts in ``path`` that its module may not make:
    through any alias (``import subprocess as sp``, ``from os import environ as e``), and
    any import of a process-starting module (subprocess, pty, multiprocessing, asyncio's
    subprocesses, process pools) outside the runner."""
    if is_worker(module):
        return []
    tree = ast.parse(path.read_text(), str(path))
    alias = _aliases(tree)
    may_read = module in _ENV_READERS or stage_of(module) == "cli"
    may_start = module in _PROCESS_STARTERS
    called = {id(c.func) for c in ast.walk(tree) if isinstance(c, ast.Call)}
    found = []
    for node in ast.walk(tree):
        where = f"{module}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import) and not may_start:
            found += [f"{where} imports {a.name} (start processes through pinwheel.runner)"
                      for a in node.names if _starts(a.name)]  # fmt: skip
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            full = {f"{node.module}.{a.name}" for a in node.names}
            if not may_start and (_starts(node.module) or any(_starts(f) for f in full)):
                found.append(f"{where} imports from {node.module} (use pinwheel.runner)")
            if node.module == "os":
                names = {a.name for a in node.names}
                if names & _ENV_NAMES and not may_read:
                    found.append(f"{where} imports {sorted(names & _ENV_NAMES)} from os")
                if names & (_OS_CALLS - _ENV_NAMES) and not may_start:
                    found.append(f"{where} imports {sorted(names & _OS_CALLS)} from os")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = alias.get(node.value.id, node.value.id)
            full = f"{owner}.{node.attr}"
            if owner == "os" and node.attr in _ENV_NAMES:
                if not may_read:
                    found.append(f"{where} reads os.{node.attr}")
            elif id(node) in called and not may_start and (
                (owner == "subprocess" and node.attr in _SUBPROCESS_CALLS)
                or (owner == "os" and node.attr in _OS_CALLS)
                or full in _PROCESS_NAMES
            ):
                found.append(f"{where} calls {full} (use pinwheel.runner)")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            full = alias.get(node.id, "")
            if full.startswith("os.") and full[3:] in _ENV_NAMES and not may_read:
                found.append(f"{where} reads {full}")
    return found


def test_no_stage_reads_the_environment_or_starts_a_process_itself() -> None:
    bad = [o for p in SRC.rglob("*.py") for o in offences(p, module_name(p))]
    assert not bad, "\n".join(bad)


def test_the_environment_check_sees_a_planted_read(tmp_path: Path) -> None:
    mod = tmp_path / "x.py"
    mod.write_text(
        "import os, subprocess\nfrom os import environ\n"
        "def f():\n    subprocess.run(['true'])\n    return os.environ.get('HOME'), os.getenv('X')\n"
    )
    found = offences(mod, "pinwheel.compile.x")
    assert any("reads os.environ" in f for f in found)
    assert any("reads os.getenv" in f for f in found)
    assert any("subprocess.run" in f for f in found)
    assert any("imports ['environ']" in f for f in found)
    assert not offences(mod, "pinwheel.runner")
    assert not [f for f in offences(mod, "pinwheel.cli.x") if "environ" in f or "getenv" in f]


def test_the_process_check_sees_aliases_and_every_process_module(tmp_path: Path) -> None:
    mod = tmp_path / "x.py"
    mod.write_text(
        "import subprocess as sp\nimport os as o\nimport pty\nimport multiprocessing as mp\n"
        "import asyncio\nfrom asyncio import create_subprocess_exec as cse\n"
        "from concurrent.futures import ProcessPoolExecutor\nfrom os import environ as env\n"
        "async def f():\n    sp.Popen(['true'])\n    o.execvp('true', ['true'])\n"
        "    await asyncio.create_subprocess_shell('true')\n    o.fork()\n"
        "    return o.environ, env\n"
    )
    found = "\n".join(offences(mod, "pinwheel.serve.x"))
    for seen in ("imports subprocess", "calls subprocess.Popen", "calls os.execvp", "imports pty",
                 "imports multiprocessing", "calls asyncio.create_subprocess_shell",
                 "imports from asyncio", "imports from concurrent.futures", "calls os.fork",
                 "reads os.environ", "imports ['environ'] from os", "reads os.environ"):  # fmt: skip
        assert seen in found, (seen, found)
    assert not offences(mod, "pinwheel.runner") or all(
        "environ" in f for f in offences(mod, "pinwheel.runner")
    )


def test_no_module_imports_by_a_computed_name() -> None:
    # (a worker such as build_wheel imports the PEP 517 backend a tree names: not pinwheel's)
    bad = [m for m, deps in graph().items() if "<computed>" in deps and not is_worker(m)]
    assert not bad, f"import_module with a computed name (hidden from every reader): {bad}"


def test_the_import_reader_sees_import_module(tmp_path: Path) -> None:
    mod = tmp_path / "x.py"
    mod.write_text(
        "import importlib\nfrom importlib import import_module\n"
        "def f(name):\n    importlib.import_module('pinwheel.cli')\n"
        "    import_module('pinwheel.serve.qualify')\n    __import__('pinwheel.release')\n"
        "    return importlib.import_module(name)\n"
    )
    found = imports(mod, package="pinwheel.compile")
    assert {"pinwheel.cli", "pinwheel.serve.qualify", "pinwheel.release", "<computed>"} <= found


def prints(path: Path, module: str) -> list[str]:
    """Writes to the terminal in a stage module: ``print``, ``sys.stdout``/``stderr``."""
    if stage_of(module) not in STAGES or is_worker(module):
        return []
    tree = ast.parse(path.read_text(), str(path))
    alias = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{module}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if alias.get(node.func.id, node.func.id) in ("print", "pprint.pprint"):
                found.append(f"{where} calls print (report through the Reporter)")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            full = f"{alias.get(node.value.id, node.value.id)}.{node.attr}"
            if full in ("sys.stdout", "sys.stderr", "sys.__stdout__", "sys.__stderr__"):
                found.append(f"{where} uses {full}")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys":
            if {a.name for a in node.names} & {"stdout", "stderr", "__stdout__", "__stderr__"}:
                found.append(f"{where} imports a stream from sys")
    return found


def test_stages_never_print() -> None:
    bad = [o for p in SRC.rglob("*.py") for o in prints(p, module_name(p))]
    assert not bad, "\n".join(bad)


def test_the_print_check_sees_a_planted_print(tmp_path: Path) -> None:
    mod = tmp_path / "x.py"
    mod.write_text(
        "import sys\nimport sys as s\nfrom sys import stderr\n"
        "def f():\n    print('x')\n    sys.stdout.write('x')\n    s.stderr.flush()\n"
        "    text = \"print('inside a child program is fine')\"\n    return text\n"
    )
    found = "\n".join(prints(mod, "pinwheel.release.x"))
    for seen in ("calls print", "uses sys.stdout", "uses sys.stderr", "imports a stream"):
        assert seen in found, (seen, found)
    assert found.count("\n") == 3  # the child program's text is not a print
    assert not prints(mod, "pinwheel.cli.x")  # the CLI prints


def unfrozen_requests(path: Path) -> list[str]:
    """Classes named ``*Request`` that are not ``@dataclass(frozen=True)``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef) and node.name.endswith("Request"):
            frozen = any(
                isinstance(d, ast.Call)
                and getattr(d.func, "id", getattr(d.func, "attr", "")) == "dataclass"
                and any(k.arg == "frozen" and getattr(k.value, "value", False) is True
                        for k in d.keywords)  # fmt: skip
                for d in node.decorator_list
            )
            if not frozen:
                found.append(f"{path.name}:{node.lineno} {node.name}")
    return found


def test_requests_are_frozen() -> None:
    bad = [o for p in SRC.rglob("*.py") for o in unfrozen_requests(p)]
    requests = [p for p in SRC.rglob("*.py") if re.search(r"^class \w+Request\b", p.read_text(), re.M)]
    assert len(requests) >= 8  # the check has requests to look at
    assert not bad, f"requests that are not @dataclass(frozen=True): {bad}"


def test_the_frozen_check_sees_a_planted_mutable_request(tmp_path: Path) -> None:
    mod = tmp_path / "x.py"
    mod.write_text(
        "from dataclasses import dataclass\nimport dataclasses\n"
        "@dataclass\nclass AReq:\n    x: int\n"
        "@dataclass\nclass MutableRequest:\n    x: int\n"
        "@dataclasses.dataclass(frozen=False)\nclass OtherRequest:\n    x: int\n"
        "class PlainRequest:\n    pass\n"
        "@dataclasses.dataclass(frozen=True)\nclass GoodRequest:\n    x: int\n"
    )
    names = [f.split()[-1] for f in unfrozen_requests(mod)]
    assert names == ["MutableRequest", "OtherRequest", "PlainRequest"]


def test_the_foundation_is_read_from_the_architecture_doc() -> None:
    doc = DOC.read_text()
    assert {"errors", "runner", "validate", "net", "markup"} <= foundation_of(doc)
    assert not {"manifest", "compile", "wheels"} & foundation_of(doc)
    planted = doc.replace("| `markup` |", "| `markdown` |")
    assert "markdown" in foundation_of(planted) and "markup" not in foundation_of(planted)


def test_every_module_has_a_row_in_the_architecture_doc() -> None:
    doc = (SRC.parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    rows = set(re.findall(r"^\| `([\w.]+)` \|", doc, re.M))
    modules = {m.removeprefix("pinwheel.") for m in graph() if m not in ("pinwheel",)}
    modules -= {"__main__", *STAGES}  # a stage package's row is its section heading
    missing = sorted(modules - rows)
    stale = sorted(rows - modules)
    assert not missing, f"modules without a row in docs/ARCHITECTURE.md: {missing}"
    assert not stale, f"rows in docs/ARCHITECTURE.md naming no module: {stale}"


def _sibling(module: str, dep: str) -> bool:
    """``dep`` is ``module``'s own workers package or a worker beside it."""
    package = module.rsplit(".", 1)[0]
    return dep == package or (dep.rsplit(".", 1)[0] == package and is_worker(dep))


def test_worker_programs_import_nothing_from_pinwheel_and_are_what_the_stages_run() -> None:
    from pinwheel.compile import workers as compile_workers
    from pinwheel.serve import workers as serve_workers

    found = [
        f"{m} imports {sorted(deps)}"
        for p in SRC.rglob("*.py")
        if is_worker(m := module_name(p))
        # a worker may import its sibling workers (they travel together, e.g. the vLLM
        # extension package carries detkl); nothing else of pinwheel
        and (deps := {d for d in imports(p) - {"<computed>"} if not _sibling(m, d)})
    ]
    assert not found, "\n".join(found)
    for package in (compile_workers, serve_workers):
        for path in sorted(package.HERE.glob("[!_]*.py")):
            text = package.source(path.stem)
            compile(text, str(path), "exec")  # a program, whole, as the stage runs it
            assert text == path.read_text()


def embedded_programs(path: Path) -> list[int]:
    """Lines of string literals in ``path`` that are Python programs of 6+ lines (imports
    and statements that compile): what belongs in a file under a ``workers/`` folder."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text.count("\n") >= 6 and re.search(r"^(import|from) [\w.]+", text, re.M):
                try:
                    compile(text, "<literal>", "exec")
                except SyntaxError:
                    continue
                found.append(node.lineno)
    return found


def test_no_program_is_embedded_as_a_string() -> None:
    """A child program is a file under a ``workers/`` folder, not a literal handed to
    ``python -c`` (one- and two-line probes stay inline)."""
    paths = [*SRC.rglob("*.py"), SRC.parents[1] / "noxfile.py"]
    bad = [
        f"{p.name}:{line}"
        for p in paths
        if not (p.is_relative_to(SRC) and is_worker(module_name(p)))
        for line in embedded_programs(p)
    ]
    assert not bad, "programs embedded as strings (move them to a workers/ folder): " + str(bad)


def test_the_program_check_sees_a_planted_script(tmp_path: Path) -> None:
    mod = tmp_path / "x.py"
    mod.write_text(
        'DOC = """Not a program.\nimport this is prose\n\n\n\n\n\n"""\n'
        'PROBE = """\nimport json, sys\nout = {}\nfor a in sys.argv:\n    out[a] = 1\n'
        'if out:\n    print(json.dumps(out))\n"""\n'
    )
    assert embedded_programs(mod) == [9]  # PROBE's line; DOC is prose


# --------------------------------------------------------------------------- one stage per command

MAX_PARAMETERS = 10  # a stage function needing more takes a frozen request object


def wide_functions(path: Path, limit: int = MAX_PARAMETERS) -> list[str]:
    """Public functions (no leading underscore) with more than ``limit`` parameters."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            names = [n for n in names if n not in ("self", "cls")]
            if not node.name.startswith("_") and len(names) > limit:
                found.append(f"{path.name}:{node.lineno} {node.name} ({len(names)} parameters)")
    return found


def test_no_stage_function_takes_a_long_parameter_list() -> None:
    stage_files = [p for s in STAGES for p in (SRC / s).rglob("*.py")]
    bad = [o for p in stage_files for o in wide_functions(p)]
    assert not bad, f"take a frozen request instead: {bad}"


def _first_parameter(path: Path, name: str) -> tuple[str, int]:
    """(annotation of ``name``'s first parameter, how many parameters it has)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            return ast.unparse(a.args[0].annotation or ast.Constant("")), len(a.args + a.kwonlyargs)
    raise AssertionError(f"{path.name} has no {name}")


@pytest.mark.parametrize(
    ("module", "function", "request_type", "at_most"),
    [
        ("compile/engine.py", "build_engine", "EngineBuildRequest", 1),
        ("compile/engine.py", "plan_build", "EngineBuildRequest", 1),
        ("compile/pipeline.py", "build", "BuildRequest", 3),  # + reporter, phases
        ("compile/pipeline.py", "toolchain", "BuildRequest", 2),  # + reporter
    ],
)
def test_the_build_stage_takes_one_request(
    module: str, function: str, request_type: str, at_most: int
) -> None:
    annotation, count = _first_parameter(SRC / module, function)
    assert annotation == request_type and count <= at_most, (function, annotation, count)


def calls_named(path: Path, names: set[str]) -> list[str]:
    """Calls of a plain name in ``names`` (``BuildRequest(...)``, ``resolve_toolkit(...)``)."""
    where = module_name(path) if SRC in path.parents else path.name
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in names:
                found.append(f"{where}:{node.lineno} {node.func.id}")
    return found


def test_the_cli_makes_the_build_request_in_one_place_and_orchestrates_nothing() -> None:
    """Every build command's request comes from cli.replay_cmds.build_request; choosing the
    toolchain, reaching upstreams and resolving the toolkit are the stage's, not the CLI's."""
    cli = sorted((SRC / "cli").rglob("*.py"))
    made = [c for p in cli for c in calls_named(p, {"BuildRequest"})]
    assert [c.split(":")[0] for c in made] == ["pinwheel.cli.replay_cmds"], made
    steps = {"resolve_toolkit", "ToolkitRequest", "choose", "reach_all", "fetch_for"}
    orchestrated = [c for p in cli for c in calls_named(p, steps)]
    assert not orchestrated, f"stage steps run by the CLI: {orchestrated}"


def test_the_toolkit_is_resolved_in_one_place() -> None:
    """Outside the toolchain package, one function resolves a toolkit and one chooses the
    toolchain: pipeline's (build, toolchain and attribute's variants go through them)."""
    files = [p for p in SRC.rglob("*.py") if "toolchain" not in p.relative_to(SRC).parts]
    resolved = [c for p in files for c in calls_named(p, {"resolve_toolkit"})]
    chosen = [c for p in files for c in calls_named(p, {"choose"})]
    assert [c.split(":")[0] for c in resolved] == ["pinwheel.compile.pipeline"], resolved
    assert [c.split(":")[0] for c in chosen] == ["pinwheel.compile.pipeline"], chosen


def test_the_request_checks_see_planted_violations(tmp_path: Path) -> None:
    mod = tmp_path / "x.py"
    mod.write_text(
        "def wide(a, b, c, d, e, f, g, h, i, j, *, k):\n    pass\n"
        "def _private(a, b, c, d, e, f, g, h, i, j, k):\n    pass\n"
        "class C:\n    def m(self, a, b, c, d, e, f, g, h, i, j):\n        pass\n"
        "def cmd(ctx, args):\n    t = resolve_toolkit(ToolkitRequest(1))\n"
        "    return BuildRequest(t), x.resolve_toolkit(1)\n"
    )
    assert [w.split()[1] for w in wide_functions(mod)] == ["wide"]
    found = calls_named(mod, {"BuildRequest", "resolve_toolkit", "ToolkitRequest"})
    assert sorted(c.split()[-1] for c in found) == [
        "BuildRequest", "ToolkitRequest", "resolve_toolkit"
    ]  # fmt: skip


def pygit2_importers(root: Path) -> list[str]:
    """Modules under ``root`` that import pygit2 themselves (at any depth, aliased or not)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )  # fmt: skip
            if any(n == "pygit2" or n.startswith("pygit2.") for n in names):
                found.append(path.relative_to(root).as_posix())
                break
    return found


def test_only_source_libgit2_imports_pygit2() -> None:
    """libgit2 runs under the git policy only if every module takes it from
    `pinwheel.source.libgit2`, which applies the policy on import. wheels.provenance reads
    pygit2's version attributes for the receipt and never opens a repository (the wheel-set
    contract imports no stage but the manifest)."""
    assert pygit2_importers(SRC) == ["source/libgit2.py", "wheels/provenance.py"]


def test_the_pygit2_check_sees_a_planted_import(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f():\n    import pygit2 as g\n")
    (tmp_path / "b.py").write_text("from pygit2.enums import SortMode\n")
    (tmp_path / "c.py").write_text("from pinwheel.source.libgit2 import pygit2\n")
    assert pygit2_importers(tmp_path) == ["a.py", "b.py"]

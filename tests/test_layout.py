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
# Stage order: a module may import its own stage, the foundation, and earlier stages.
STAGES = ("manifest", "source", "wheels", "compile", "release", "serve")
FOUNDATION = {
    "errors", "fsutil", "checksums", "cudaarch", "progress", "runner", "heartbeat", "urls",
    "__init__", "untrusted", "validate", "saferegex", "oserrors", "httpget",
    # security foundation: confinement, the archive reader, Markdown escaping,
    # ownership (safe directories), the terminal sanitiser
    "confine", "archive", "markup", "ownership", "printable",
}  # fmt: skip


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, package: str | None = None) -> set[str]:
    """Every pinwheel module ``path`` imports, resolved to a dotted name."""
    tree = ast.parse(path.read_text(), str(path))
    if package is None:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pinwheel")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("pinwheel"):
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
             "execvpe", "spawnv", "spawnve", "posix_spawn", "posix_spawnp"}  # fmt: skip


# Programs the engine's Python runs, one process per rank (serve/ranks.py starts them through
# the runner): they are not stages and import nothing from pinwheel; like any program they
# read their own environment (RANK, WORLD_SIZE, the NVLS flags they report back).
_WORKERS = "pinwheel.serve.workers."


def offences(path: Path, module: str) -> list[str]:
    """Environment reads and process starts in ``path`` that its module may not make."""
    if module.startswith(_WORKERS):
        return []
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{module}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, attr = node.value.id, node.attr
            if owner == "os" and attr in ("environ", "environb", "getenv", "getenvb"):
                if module not in _ENV_READERS and stage_of(module) != "cli":
                    found.append(f"{where} reads os.{attr}")
            elif (owner == "subprocess" and attr in _SUBPROCESS_CALLS) or (
                owner == "os" and attr in _OS_CALLS - {"getenv", "getenvb"}
            ):
                called = any(isinstance(c, ast.Call) and c.func is node for c in ast.walk(tree))
                if called and module not in _PROCESS_STARTERS:
                    found.append(f"{where} calls {owner}.{attr} (use pinwheel.runner)")
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "subprocess"):
            names = {a.name for a in node.names}
            env = names & {"environ", "environb", "getenv", "getenvb"}
            if env and module not in _ENV_READERS and stage_of(module) != "cli":
                found.append(f"{where} imports {sorted(env)} from {node.module}")
            starts = names & ((_SUBPROCESS_CALLS | _OS_CALLS) - env)
            if starts and module not in _PROCESS_STARTERS:
                found.append(f"{where} imports {sorted(starts)} from {node.module}")
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


def test_every_module_has_a_row_in_the_architecture_doc() -> None:
    doc = (SRC.parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    rows = set(re.findall(r"^\| `([\w.]+)` \|", doc, re.M))
    modules = {m.removeprefix("pinwheel.") for m in graph() if m not in ("pinwheel",)}
    modules -= {"__main__", *STAGES}  # a stage package's row is its section heading
    missing = sorted(modules - rows)
    stale = sorted(rows - modules)
    assert not missing, f"modules without a row in docs/ARCHITECTURE.md: {missing}"
    assert not stale, f"rows in docs/ARCHITECTURE.md naming no module: {stale}"

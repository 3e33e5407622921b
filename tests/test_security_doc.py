"""docs/SECURITY.md is the threat model: every module it names enforces a rule and exists,
and every boundary names the tests that hold it, each of which exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "SECURITY.md"


def _boundaries() -> dict[str, str]:
    text = DOC.read_text()
    parts = re.split(r"^### (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _module_file(name: str) -> Path | None:
    rel = Path("src", *name.split("."))
    for candidate in (rel.with_suffix(".py"), rel / "__init__.py"):
        if (ROOT / candidate).is_file():
            return ROOT / candidate
    return None


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_the_threat_model_names_the_boundaries_the_issue_lists() -> None:
    names = " | ".join(_boundaries()).lower()
    for boundary in ("manifest", "upstream", "build-source", "cache", "release server",
                     "model pack", "engine server", "teacher", "environment", "receipts",
                     "container runtime", "terminal"):  # fmt: skip
        assert boundary in names, f"docs/SECURITY.md has no boundary for {boundary!r}"


def test_every_boundary_module_exists_and_every_boundary_names_existing_tests() -> None:
    boundaries = _boundaries()
    assert len(boundaries) >= 12
    for title, body in boundaries.items():
        modules = re.findall(r"Enforced by: `(pinwheel(?:\.\w+)+)`", body)
        assert modules, f"{title}: no 'Enforced by' module"
        for module in modules:
            assert _module_file(module) is not None, f"{title}: {module} does not exist"
        tests = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", body)
        assert tests, f"{title}: names no tests"
        for file, name in tests:
            path = ROOT / file
            assert path.is_file(), f"{title}: {file} does not exist"
            assert name in _test_names(path), f"{title}: {file}::{name} does not exist"


def test_the_rule_for_new_readers_is_stated() -> None:
    assert "Every new reader of an untrusted input names its boundary here" in DOC.read_text()

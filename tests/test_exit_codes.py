"""The README's exit-code table is what the CLI does: each row is read from README.md and
driven by a real command that ends with that code."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gitfixture import git
from pinwheel.cli import main
from releasekit import write_manifest
from test_card_gates import _qualify, _StandIn
from test_hostile_documents import _shard, _tensor
from test_replay import PICKS, steps_with_heads

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_codes() -> dict[int, str]:
    text = README.read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.+?) \|$", section, flags=re.M)
    return {int(code): meaning for code, meaning in rows}


def _ok(stack, tmp_path, capsys) -> int:
    return stack.cli(stack.write(steps_with_heads(stack, PICKS)), "plan")[0]


def _error(stack, tmp_path, capsys) -> int:  # a step that cannot run: offline, nothing cached
    m = stack.write(steps_with_heads(stack, PICKS))
    return main(["--manifest", str(m), "--cache", str(tmp_path / "empty"), "--offline", "run"])


def _error_serve_without_vllm(stack, tmp_path, capsys) -> int:
    from test_first_hour import _card_copy, run_cli

    root = _card_copy(tmp_path / "card")
    return run_cli("serve", "--model", str(tmp_path), "--python", sys.executable, cwd=root).returncode


def _bad_manifest(stack, tmp_path, capsys) -> int:
    m = stack.write([{"action": "pick", "pr": 1, "head": "zz"}])
    return stack.cli(m, "plan")[0]


def _bad_command_line(stack, tmp_path, capsys) -> int:
    manifest = write_manifest(tmp_path, model='[model]\nrepo = "org/m"\n')
    return main(["--manifest", str(manifest), "model", "check", str(tmp_path / "absent")])


def _unpinned_model_revision(stack, tmp_path, capsys) -> int:
    manifest = write_manifest(tmp_path, model='[model]\nrepo = "org/x"\n')
    return main(["--manifest", str(manifest), "model", "fetch", "--local-dir", str(tmp_path / "m")])


def _drift(stack, tmp_path, capsys) -> int:
    m = stack.write(steps_with_heads(stack, PICKS))
    assert stack.cli(m, "run")[0] == 0
    stack.up.checkout("pr2")
    git(stack.up.work, "commit", "-q", "--amend", "-m", "b: v2 (rewritten)")
    stack.up.publish({2: "pr2"})
    return stack.cli(m, "run")[0]


def _conflict(stack, tmp_path, capsys) -> int:
    steps = [{"action": "pick", "pr": 1}, {"action": "pick", "pr": 4}]
    return stack.cli(stack.write(steps_with_heads(stack, steps)), "run")[0]


def _mismatch(stack, tmp_path, capsys) -> int:
    return stack.cli(stack.write(steps_with_heads(stack, PICKS), tree="0" * 40), "run")[0]


def _verify(stack, tmp_path, capsys) -> int:
    pack = tmp_path / "glm"
    pack.mkdir()
    _shard(pack / "model.safetensors", {"w": _tensor()}, b"\0" * 8)
    (pack / "config.json").write_bytes(b"{")
    model = '[model]\nrepo = "org/m"\n[model.config]\nquant_method = "exl3"\n'
    manifest = write_manifest(tmp_path, model=model)
    return main(["--manifest", str(manifest), "model", "check", str(pack)])


def _gate(stack, tmp_path, capsys) -> int:
    handler = type("H", (_StandIn,), {"passes": 0, "served": "other"})
    return _qualify(tmp_path, handler)[0]


Scenario = Callable[..., int]
SCENARIOS: dict[int, list[Scenario]] = {
    0: [_ok],
    1: [_error, _error_serve_without_vllm],
    2: [_bad_manifest, _bad_command_line, _unpinned_model_revision],
    3: [_drift],
    4: [_conflict],
    5: [_mismatch],
    6: [_verify],
    7: [_gate],
}


def test_every_code_in_the_table_has_a_scenario_and_no_other_code_is_driven() -> None:
    codes = readme_codes()
    assert codes, "README.md has no exit-code table"
    assert set(codes) == set(SCENARIOS)


@pytest.mark.parametrize(
    "code,scenario",
    [(c, s) for c, group in sorted(SCENARIOS.items()) for s in group],
    ids=lambda v: v.__name__.lstrip("_") if callable(v) else str(v),
)
def test_the_command_exits_with_the_readmes_code(code, scenario, stack, tmp_path, capsys) -> None:
    assert readme_codes()[code]
    assert scenario(stack, tmp_path, capsys) == code

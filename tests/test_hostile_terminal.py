"""Boundary: everything pinwheel prints (docs/SECURITY.md, "the terminal").

Text pinwheel did not write reaches the terminal from manifest keys in errors, commit
subjects and authors in ``plan``, conflicting file names, ELF symbol names in ``check``,
a server's HTTP error body. ESC/OSC sequences, other control characters and bidi
overrides in it are shown visibly (``\\x1b``, ``\\u202e``) by the one sanitiser
(:func:`pinwheel.printable.shown`); ``--json`` strings stay exact (JSON escapes them).
Real manifests, real git repositories, a real ELF object from gcc, a real HTTP server.
"""

from __future__ import annotations

import json
import shutil

import pytest

from gitfixture import git
from pinwheel.cli import main

ESC_OSC = "\x1b]0;pwned\x07\x1b[2J"  # retitle the terminal, clear the screen
RLO = "\u202e"  # right-to-left override
RAW = ("\x1b", "\x07", "\u202e", "\x9b")


def _no_raw(text: str) -> None:
    found = [repr(c) for c in RAW if c in text]
    assert not found, f"raw control/bidi characters reached the terminal: {found}"


def test_a_manifest_key_in_an_error_is_shown_not_obeyed(tmp_path, capsys):
    """Issue 34: manifest keys in errors (an unknown key is named in the message)."""
    m = tmp_path / "manifest.toml"
    key = f"x{ESC_OSC}{RLO}y"
    m.write_text(
        '[upstream]\nurl = "https://example.invalid/x.git"\n'
        'commit = "0123456789abcdef0123456789abcdef01234567"\nbranch = "main"\n'
        f'"{json.dumps(key)[1:-1]}" = 1\n'
    )
    rc = main(["--manifest", str(m), "--cache", str(tmp_path / "c"), "plan"])
    err = capsys.readouterr().err
    assert rc == 2
    _no_raw(err)
    assert "\\x1b" in err and "\\u202e" in err
    # --json: the same text, exact, escaped by JSON itself
    rc = main(["--manifest", str(m), "--cache", str(tmp_path / "c"), "--json", "plan"])
    out = capsys.readouterr().out
    _no_raw(out)
    assert key in json.loads(out)["error"]["what"]


def test_commit_subjects_and_authors_in_plan_are_shown_not_obeyed(stack, capsys):
    """Issue 34: commit subjects and authors in `plan`."""
    stack.up.checkout("pr2")
    head = stack.up.commit({"b.txt": "beta v3\n"}, f"b: v3 {ESC_OSC}{RLO}gpj.exe",
                           author=f"Mal{ESC_OSC} <mal@example.org>")  # fmt: skip
    stack.up.publish({2: "pr2"})
    m = stack.write([{"action": "pick", "pr": 2, "head": head}])
    rc = stack.cli(m, "plan", as_json=False)[0]
    got = capsys.readouterr()
    assert rc == 0, got.err
    _no_raw(got.out + got.err)
    assert "gpj.exe" in got.out + got.err and "\\u202e" in got.out + got.err


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_conflicting_file_names_are_shown_not_obeyed(stack, capsys):
    """Issue 34: conflicting file names (a run stops at a conflict and lists them)."""
    name = f"e{ESC_OSC}{RLO}.txt"
    stack.up.checkout(stack.base, "pr5")
    (stack.up.work / name).write_text("five\n")
    git(stack.up.work, "add", "-A")
    five = stack.up.commit({}, "five", allow_empty=True)
    stack.up.checkout(stack.base, "pr6")
    (stack.up.work / name).write_text("six\n")
    six = stack.up.commit({}, "six", allow_empty=True)
    stack.up.publish({5: "pr5", 6: "pr6"})
    m = stack.write([{"action": "pick", "pr": 5, "head": five},
                     {"action": "pick", "pr": 6, "head": six}])  # fmt: skip
    rc = stack.cli(m, "run", as_json=False)[0]
    err = capsys.readouterr().err
    assert rc == 4, err
    _no_raw(err)
    assert "\\x1b]0;pwned" in err


def test_elf_symbol_names_in_check_are_shown_not_obeyed(tmp_path, capsys):
    """Issue 34: ELF symbol names in `check` come from the wheel itself. A real shared
    object from gcc whose versioned symbol name is rewritten in place (same length)."""
    from test_glibc_floor import NEW_C, compile_so, needs_glibc_234, wheel_of

    if needs_glibc_234.args[0]:
        pytest.skip("needs a glibc >= 2.34 build host")
    so = compile_so(tmp_path, "new", NEW_C)
    hostile = b"\x1b[2J\xe2\x80\xaepthread"  # ESC [ 2 J, U+202E, 14 bytes like the original
    assert len(hostile) == len(b"pthread_create")
    so.write_bytes(so.read_bytes().replace(b"pthread_create", hostile))
    wheel = wheel_of(tmp_path, "newer", {"new.so": so})
    rc = main(["check", str(wheel), "--arch", "7.0", "--allow-no-cuda", "--max-glibc", "2.31"])
    got = capsys.readouterr()
    assert rc != 0
    _no_raw(got.out + got.err)
    assert "\\x1b[2J\\u202epthread" in got.out + got.err


def test_a_servers_http_error_body_is_shown_not_obeyed(capsys):
    """Issue 34: a server's HTTP error body. The real client against a real server; the
    error it raises is printed by the CLI's one error printer."""
    from hostile_server import Server, answer
    from pinwheel.errors import PinwheelError
    from pinwheel.printable import shown
    from pinwheel.serve.client import Client

    body = f"{ESC_OSC}{RLO}overloaded".encode()
    with Server({"/v1/models": answer(body, status=500, ctype="text/plain")}) as srv:
        client = Client(srv.url, timeout=5, deadline=5)
        with pytest.raises(PinwheelError) as err:
            client.models()
        client.close()
    assert "\x1b" in str(err.value)  # the error carries it raw ...
    printed = shown(err.value)  # ... and the printer shows it
    _no_raw(printed)
    assert "\\x1b]0;pwned\\x07" in printed and "\\u202eoverloaded" in printed


def test_the_line_reporter_shows_what_stages_report(capsys):
    """Stages report through Reporter: tensor names, worker errors, directory names."""
    from pinwheel.progress import LineReporter

    LineReporter().info(f"tensor {ESC_OSC}{RLO}w \x9b31m")
    err = capsys.readouterr().err
    _no_raw(err)
    assert "\\x9b31m" in err

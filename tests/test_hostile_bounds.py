"""Hostile input, class 2: work that input could make unbounded, one table per loop.

The CMake FetchContent evaluator on a replayed tree (ReDoS in MATCHES, include
fan-out and self-inclusion, deep if() and parenthesis nesting, set() values that
double, quadratic parsing), regular expressions from manifests (qualify start-up
markers), the fidelity bootstrap and teacher .npz files, and network reads that
never end (--reuse-from). Each case must end in a clean answer or the project's
error naming the limit and the next step, within the suite's timeout: no hang,
no MemoryError, no RecursionError. No timing asserts: a regression hangs and
pytest-timeout fails it. Real parts: real git trees (pygit2), a real HTTP server.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import zipfile
from pathlib import Path

import pygit2
import pytest

from hostile_server import Server, answer, endless
from pinwheel import saferegex
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.source import buildsources
from pinwheel.source.buildsources import LimitExceeded, discover

pytestmark = pytest.mark.timeout(120)

DECLARE = """
include(FetchContent)
FetchContent_Declare(dep GIT_REPOSITORY https://example.invalid/dep.git GIT_TAG v1)
"""


def _tree(tmp_path: Path, files: dict[str, str]) -> tuple[pygit2.Repository, str]:
    repo = pygit2.init_repository(str(tmp_path / "repo"), bare=True)
    builder: dict[str, dict] = {}
    for path, text in files.items():
        node = builder
        *dirs, name = path.split("/")
        for d in dirs:
            node = node.setdefault(d, {})
        node[name] = repo.create_blob(text.encode())

    def write(node: dict) -> pygit2.Oid:
        tb = repo.TreeBuilder()
        for name, value in sorted(node.items()):
            if isinstance(value, dict):
                tb.insert(name, write(value), pygit2.enums.FileMode.TREE)
            else:
                tb.insert(name, value, pygit2.enums.FileMode.BLOB)
        return tb.write()

    return repo, str(write(builder))


def _used(tmp_path: Path, files: dict[str, str]) -> str:
    repo, tree = _tree(tmp_path, files)
    (dep,) = discover(repo, tree, ["7.0"], "12.4")
    return dep.used


# --------------------------------------------------------------------------- CMake evaluator

REDOS = "a" * 5000 + "!"

# case -> (CMakeLists.txt, the answer for `dep`): evaluation ends with an answer
CMAKE_ANSWERS: dict[str, tuple[str, str]] = {
    "MATCHES (a+)+$ on 5000 a": (
        f'set(V "{REDOS}")\nif(V MATCHES "(a+)+$")\n{DECLARE}endif()\n',
        "no",
    ),
    "MATCHES (a|aa)*c": (
        f'set(V "{REDOS}")\nif(V MATCHES "^(a|aa)*c$")\n{DECLARE}endif()\n',
        "no",
    ),
    "MATCHES (.*a){20}": (
        f'set(V "{REDOS}")\nif(V MATCHES "(.*a){{20}}b")\n{DECLARE}endif()\n',
        "no",
    ),
    "MATCHES a back-reference": (
        f'set(V "aa")\nif(V MATCHES "(a)\\1")\n{DECLARE}endif()\n',
        "unknown",
    ),
    "MATCHES a repeat over 100": (
        f'set(V "aa")\nif(V MATCHES "a{{1000}}")\n{DECLARE}endif()\n',
        "unknown",
    ),
    "MATCHES a true one": (f'set(V "sm_70")\nif(V MATCHES "^sm_[0-9]+$")\n{DECLARE}endif()\n', "yes"),
    "set() doubling 40 times": (
        'set(V "xxxxxxxx")\n'
        + 'set(V "${V}${V}")\n' * 40
        + f'if(V STREQUAL "x")\n{DECLARE}endif()\n',
        "unknown",
    ),
    "list(APPEND) growing": (
        'set(V "x")\n'
        + 'list(APPEND V "${V}" "${V}")\n' * 30
        + f'if(V STREQUAL "x")\n{DECLARE}endif()\n',
        "unknown",
    ),
    "60 parentheses in if()": (
        "if(" + "(" * 60 + "ON" + ")" * 60 + f")\n{DECLARE}endif()\n",
        "yes",
    ),
    "5000 NOTs": ("if(" + "NOT " * 5000 + f"ON)\n{DECLARE}endif()\n", "unknown"),
    "bracket comment with =": (f"#[==[ ]] {DECLARE} ]==]\n{DECLARE}", "yes"),
    "200000 bracket comments": ("#[[x]]\n" * 200_000 + DECLARE, "yes"),
    "an unterminated quote": (DECLARE + 'set(X "never closed\n' + "x" * 100_000, "yes"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CMAKE_ANSWERS))
def test_cmake_evaluation_ends_with_an_answer(case, tmp_path):
    text, used = CMAKE_ANSWERS[case]
    assert _used(tmp_path, {"CMakeLists.txt": text}) == used


# case -> (files, what the error names)
CMAKE_LIMITS: dict[str, tuple[dict[str, str], str]] = {
    "a file including itself": (
        {"CMakeLists.txt": "include(self.cmake)\n" + DECLARE, "self.cmake": "include(self.cmake)\n"},
        "include() nested more than",
    ),
    "include fan-out 4^6": (
        {
            "CMakeLists.txt": "include(c/l1.cmake)\n" * 4 + DECLARE,
            **{f"c/l{i}.cmake": f"include(c/l{i + 1}.cmake)\n" * 4 for i in range(1, 8)},
        },
        "more than 500 CMake files",
    ),
    "if() nested 5000 deep": (
        {"CMakeLists.txt": "if(ON)\n" * 5000 + DECLARE + "endif()\n" * 5000},
        "if() blocks nested more than",
    ),
    "parentheses nested 100 deep in a command": (
        {"CMakeLists.txt": "set(V " + "(" * 100 + ")" * 100 + ")\n" + DECLARE},
        "parentheses nested more than",
    ),
    "a 5 MiB CMakeLists.txt": (
        {"CMakeLists.txt": DECLARE + "#" * (5 << 20)},
        "larger than",
    ),
    "4 million words through 400 includes": (
        {
            "CMakeLists.txt": DECLARE + "include(c/x.cmake)\n" * 400,
            "c/x.cmake": "set(A" + " 1" * 10_000 + ")\n",
        },
        "steps of evaluation",
    ),
}


@pytest.mark.parametrize("case", sorted(CMAKE_LIMITS))
def test_cmake_past_a_limit_is_an_error_naming_it(case, tmp_path):
    files, gist = CMAKE_LIMITS[case]
    repo, tree = _tree(tmp_path, files)
    with pytest.raises(LimitExceeded) as err:
        discover(repo, tree, ["7.0"], "12.4")
    assert gist in err.value.what and "[[build.source]]" in (err.value.next or "")
    assert re.search(r"\.(txt|cmake):\d+$", err.value.where or ""), err.value.where


def test_the_limits_are_the_documented_ones():
    assert buildsources.MAX_INCLUDE_DEPTH == 12 and buildsources.MAX_FILES == 500


# --------------------------------------------------------------------------- safe regex

# pattern -> subjects: saferegex.search agrees with re.search on every one
AGREES: dict[str, list[str]] = {
    "(?i)exl3.*routed[ _-]?experts": ["INFO EXL3 model, Routed-Experts on", "exl3 routed", ""],
    "(?i)sparse[ _-]?mla": ["Using SPARSE_MLA backend", "sparse mla", "sparsemla", "sparse--mla"],
    r"^\d+\.\d+$": ["12.4", "12.4.1", "a12.4", "12."],
    "^(a|b)*c$": ["ababc", "abab", "c", ""],
    "x{2,3}y": ["xxy", "xy", "xxxxy"],
    "[^a-c]z": ["dz", "az", "z"],
    r"\w+@\w+": ["ada@example", "@x", "a@"],
    "colou?r": ["color", "colour", "colouur"],
    "(?:ab)+$": ["abab", "aba", "xab"],
    r"a\.b|c\*d": ["a.b", "axb", "c*d", "cd"],
    "[]x]": ["]", "x", "y"],
    "a.c": ["abc", "ac"],
}


@pytest.mark.parametrize("pattern", sorted(AGREES))
def test_safe_regex_answers_like_re(pattern):
    compiled = saferegex.compile(pattern)
    for subject in AGREES[pattern]:
        assert compiled.search(subject) == bool(re.search(pattern, subject)), subject


# pattern -> why it is refused
REFUSED: dict[str, str] = {
    r"(a)\1": "escape",
    "(?=a)b": "look-around",
    "(?<=a)b": "look-around",
    "(?P<n>a)": "look-around, named groups",
    "a{1000}": "count over",
    "a{5,2}": "count over",
    "*a": "nothing to repeat",
    "(a": "missing ')'",
    "a)": "unbalanced",
    "[a": "missing ']'",
    "[z-a]": "ends before it starts",
    "a++": "possessive",
    "x" * 1001: "longer than",
    "(" * 200 + ")" * 200: "nested more than",
    "(a{100}){100}": "more than 5000 states",
    "a\\": "trailing backslash",
    r"\bword": "escape",
}


@pytest.mark.parametrize("pattern", sorted(REFUSED))
def test_unsafe_patterns_are_refused_with_the_reason(pattern):
    with pytest.raises(saferegex.RegexError, match=re.escape(REFUSED[pattern])):
        saferegex.compile(pattern)


# pattern -> a subject that makes re backtrack for minutes: answered, no hang
REDOS_PATTERNS = {
    "(a+)+$": "a" * 50_000 + "b",
    "^(a|aa)*$": "a" * 50_000 + "b",
    "(a*)*b": "a" * 50_000,
    "(x+x+)+y": "x" * 50_000,
    "(.*a){12}b": "a" * 20_000,
    "^(([a-z])+.)+[A-Z]([a-z])+$": "a" * 20_000 + "!",
}


@pytest.mark.parametrize("pattern", sorted(REDOS_PATTERNS))
def test_redos_patterns_answer_without_backtracking(pattern):
    assert saferegex.search(pattern, REDOS_PATTERNS[pattern]) is False


def test_a_manifest_marker_outside_the_safe_syntax_is_refused_at_load(tmp_path, capsys):
    from pinwheel.cli import main

    good = (Path(__file__).parents[1] / "manifest.toml").read_text()
    bad = re.sub(r"^markers = \[.*?^\]", "markers = ['(?<=x)routed', '(a)\\\\1']", good,
                 count=1, flags=re.S | re.M)  # fmt: skip
    assert bad != good
    path = tmp_path / "manifest.toml"
    path.write_text(bad)
    for src in Path(__file__).parents[1].iterdir():  # the kernels, patches, panels beside it
        if src.name == "locks":  # hashed locks must resolve inside the manifest's folder
            shutil.copytree(src, tmp_path / src.name)
        elif src.name != "manifest.toml" and not src.name.startswith("."):
            (tmp_path / src.name).symlink_to(src)
    rc = main(["--manifest", str(path), "plan", "--offline"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "markers" in err and "safe syntax" in err, err
    assert "(?<=x)routed" in err and "next:" in err


def test_markers_are_searched_in_linear_time(tmp_path):
    from pinwheel.serve.qualify import check_markers

    log = tmp_path / "server.log"
    log.write_text("a" * 100_000 + "!\nINFO sparse_mla backend on\n")
    got = check_markers(["(a+)+$", "(?i)sparse[ _-]?mla"], log)
    assert [m.status for m in got] == ["missing", "found"]


# --------------------------------------------------------------------------- fidelity sizes


# (resamples, windows) -> refused before any array is made
@pytest.mark.parametrize(
    ("resamples", "units"), [(10**9, 2000), (10**6, 10**4), (2 * 10**9, 2), (3, 10**9)]
)
def test_a_bootstrap_past_the_draw_limit_is_refused_before_allocating(resamples, units):
    import numpy as np

    from pinwheel.serve import fidelity

    kld = np.zeros(units if units < 10**6 else 2)
    offsets = np.arange(units + 1) if units < 10**6 else np.array([0, 1, 2])
    if units >= 10**6:  # the position bootstrap: many positions in one window
        kld = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(units,), strides=(0,))
        offsets = np.array([0, units])
    with pytest.raises(UsageError, match="over the limit") as err:
        fidelity.bootstrap_ci(kld, offsets, resamples, 0)
    assert "lower bootstrap" in (err.value.next or "")


def test_blocked_bootstrap_gives_the_one_draw_answer(monkeypatch):
    import numpy as np

    from pinwheel.serve import fidelity

    kld = np.random.default_rng(3).random(500)
    offsets = np.array([0, 100, 250, 400, 500])
    whole = fidelity.bootstrap_ci(kld, offsets, 2000, 7)
    monkeypatch.setattr(fidelity, "BOOTSTRAP_BLOCK", 37)
    assert fidelity.bootstrap_ci(kld, offsets, 2000, 7) == whole


@pytest.mark.parametrize("value", [10**6 + 1, 10**12])
def test_a_manifest_bootstrap_past_its_maximum_is_refused(value, tmp_path):
    from pinwheel.manifest.serve import _bootstrap
    from pinwheel.manifest.table import Table

    table = Table("qualify.fidelity", 0, "[qualify.fidelity]", {"bootstrap": value},
                  tmp_path / "manifest.toml")  # fmt: skip
    with pytest.raises(PinwheelError, match="from 100 to 1000000"):
        _bootstrap(table)


def _npz(members: dict[str, bytes], compress: bool = False) -> bytes:
    buf = io.BytesIO()
    kind = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", kind) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _npy(dtype: str, shape: tuple[int, ...], body: bytes = b"") -> bytes:
    import numpy as np

    one = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        one, {"descr": dtype, "fortran_order": False, "shape": shape}
    )
    return one.getvalue() + body


def _good_members() -> dict[str, bytes]:
    import numpy as np

    arrays = {
        "offsets": np.array([0, 2], np.int64),
        "target": np.array([1, 2], np.int32),
        "target_logprob": np.zeros(2, np.float32),
        "top_ids": np.zeros((2, 1), np.int32),
        "top_logprobs": np.zeros((2, 1), np.float32),
        "meta": np.frombuffer(
            json.dumps({"schema": "pinwheel.teacher/1", "panel_sha256": "a" * 64}).encode(),
            np.uint8,
        ),
    }
    out = {}
    for name, value in arrays.items():
        one = io.BytesIO()
        np.lib.format.write_array(one, value, allow_pickle=False)
        out[name + ".npy"] = one.getvalue()
    return out


# case -> (members changed, what the message names)
NPZ: dict[str, tuple[dict[str, bytes], str, bool]] = {
    "full declares 6 GiB": ({"full.npy": _npy("<f4", (400_000, 4096))}, "declares", False),
    "a deflate bomb (128 MiB from ~130 KiB)": (
        {"full.npy": _npy("<f4", (4096, 8192), b"\0" * (4096 * 8192 * 4))}, "is compressed", True),
    "a stored member over the limit": (
        {"full.npy": _npy("<f4", (4096, 4097), b"\0" * (4096 * 4097 * 4))}, "over the", False),
    "target is float64": ({"target.npy": _npy("<f8", (2,), b"\0" * 16)}, "a teacher stores", False),
    "a pickled object array": ({"top_ids.npy": _npy("|O", (2, 1), b"\0" * 16)}, "a teacher stores", False),
    "an unexpected member": ({"evil.npy": _npy("<f4", (1,), b"\0" * 4)}, "unexpected member", False),
    "not a zip": ({}, "not a usable teacher file", False),
    "offsets not rising": ({"offsets.npy": _npy("<i8", (2,), b"\0" * 16)}, "offsets are not", False),
    "top_ids rows differ": ({"top_ids.npy": _npy("<i4", (3, 1), b"\0" * 12)}, "are not both", False),
    "npy version 9": ({"target.npy": b"\x93NUMPY\x09\x00" + b"\0" * 32}, "not a usable teacher", False),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NPZ))
def test_a_hostile_teacher_npz_is_refused_before_numpy_allocates(case, monkeypatch):
    from pinwheel.serve import fidelity

    changed, gist, compress = NPZ[case]
    data = b"PK not a zip" if case == "not a zip" else _npz({**_good_members(), **changed}, compress)
    monkeypatch.setattr(fidelity, "MAX_TEACHER", 64 * 1024 * 1024)  # 128 MiB bomb > 64 MiB
    with pytest.raises(UsageError) as err:
        fidelity.load_teacher(data, "teacher.npz", limit=fidelity.MAX_TEACHER)
    assert gist in str(err.value) and "recapture" in (err.value.next or ""), str(err.value)


def test_the_good_npz_loads():
    from pinwheel.serve import fidelity

    assert fidelity.load_teacher(_npz(_good_members()), "t").positions == 2


# --------------------------------------------------------------------------- network reads


# route for SHA256SUMS -> what the --reuse-from error names
REUSE: dict[str, tuple[object, str]] = {
    "SHA256SUMS trickles": (endless(b"a", pause=0.2), "deadline"),
    "SHA256SUMS never ends": (endless(b"a" * 65536), "more than"),
    "SHA256SUMS 404": (None, "not found (HTTP 404"),
    "a host that does not resolve": ("dns", "cannot connect"),
    "a redirect loop (302)": ("loop", "HTTP 302"),
    "Content-Length abc": ("abc", "bad Content-Length"),
}


@pytest.mark.parametrize("case", sorted(REUSE))
def test_reuse_from_a_hostile_url_ends_cleanly(case, tmp_path, monkeypatch):
    from hostile_server import raw_headers
    from pinwheel.compile import reuse

    route, gist = REUSE[case]
    routes = {}
    if route == "dns":
        with pytest.raises(reuse.ReuseError) as err:
            reuse.candidates("http://no-such-host.invalid/r/", tmp_path / "cache")
        assert gist in err.value.what and err.value.next
        return
    if route == "loop":
        routes["/r/SHA256SUMS"] = raw_headers([("Location", "/r/SHA256SUMS"),
                                               ("Content-Length", "0")], status=302)  # fmt: skip
    elif isinstance(route, str):
        routes["/r/SHA256SUMS"] = raw_headers([("Content-Length", route)], b"x")
    elif route is not None:
        routes["/r/SHA256SUMS"] = route
    routes["/r/provenance.json"] = answer(b"{}")
    monkeypatch.setattr(reuse, "REUSE_DEADLINE", 2.0)
    monkeypatch.setattr(reuse, "REUSE_SMALL", 1 << 20)
    with Server(routes) as srv, pytest.raises(reuse.ReuseError) as err:
        reuse.candidates(srv.url + "/r/", tmp_path / "cache")
    assert gist in err.value.what and "--reuse-from" in (err.value.where or "")
    assert err.value.next

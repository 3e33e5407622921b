"""What a replayed tree's own build would download: its CMake ``FetchContent`` declarations.

In: a replayed tree (read from git, no checkout) and the arches + CUDA version
the manifest builds for. Out: one :class:`Declared` per dependency name — URL,
declared ref (``GIT_TAG``) or ``URL`` + hash, the project's override variable
(``VLLM_CUTLASS_SRC_DIR``), the patches its PATCH_COMMAND applies, its
submodules, whether the build uses it for these arches, and whether it is
pinned (a 40-hex GIT_TAG, or a URL with a hash; a tag or branch is not).

"Used" comes from a small CMake evaluator that follows ``include()`` from
CMakeLists.txt and reads ``if()`` conditions three-valued: what it can decide
from the manifest (``VLLM_GPU_LANG``, the CUDA compiler version, arch-list
intersections, variables set from literals) it decides; anything else makes
the answer ``unknown`` rather than a guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from pinwheel import saferegex, validate
from pinwheel.cudaarch import CudaArch, parse_arch
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.source.libgit2 import pygit2

FULL_SHA = validate.GIT_SHA
YES, NO, UNKNOWN = "yes", "no", "unknown"

# The tree is input: every loop of the evaluator is bounded. A tree past a limit is an
# error naming the file, the line and the limit (never a hang or a RecursionError); a
# value past MAX_VALUE becomes unknown.
MAX_INCLUDE_DEPTH = 12  # include() inside include() ...
MAX_FILES = 500  # CMake files read in all (include fan-out)
MAX_FILE_BYTES = 4 * 1024 * 1024  # one CMake file
MAX_NESTING = 64  # if()/foreach()/function() blocks inside each other
MAX_PARENS = 64  # parentheses inside one if() condition
MAX_VALUE = 256 * 1024  # characters of one variable's value
MAX_WORK = 2_000_000  # commands run + condition tokens read, for the whole tree
MAX_MATCH_SUBJECT = 64 * 1024  # characters a MATCHES is tried on; longer: unknown


@dataclass(frozen=True)
class Declared:
    name: str
    url: str | None  # GIT_REPOSITORY or URL
    ref: str | None  # GIT_TAG as written (variables expanded)
    url_hash: str | None  # URL_HASH
    variables: tuple[str, ...]  # the project's override variables (SOURCE_DIR branch)
    patches: tuple[str, ...]  # tree paths PATCH_COMMAND applies
    submodules: tuple[str, ...]  # GIT_SUBMODULES
    used: str  # yes | no | unknown, for the arches asked about
    where: str  # file:line of the declaration

    @property
    def pinned(self) -> bool:
        if self.url_hash:
            return True
        return bool(self.ref and FULL_SHA.fullmatch(self.ref))

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "url": self.url,
            "ref": self.ref,
            "url_hash": self.url_hash,
            "variables": list(self.variables),
            "patches": list(self.patches),
            "submodules": list(self.submodules),
            "used": self.used,
            "pinned": self.pinned,
            "where": self.where,
        }


# --------------------------------------------------------------------------- CMake text


@dataclass(frozen=True)
class Command:
    name: str  # lowercased
    args: tuple[str, ...]
    line: int


_BRACKET_OPEN = re.compile(r"#\[=*\[")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)("?)', re.S)
_WORD = re.compile(r'[^\s()#"]+')


def commands(text: str) -> Iterator[Command]:
    """CMake command invocations, with quoted and bracket arguments and comments handled."""
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c == "#":
            bracket = _BRACKET_OPEN.match(text, i)
            if bracket:
                close = "]" + "=" * (len(bracket.group()) - 3) + "]"
                end = text.find(close, bracket.end())
                line += text.count("\n", i, end if end >= 0 else n)
                i = n if end < 0 else end + len(close)
            else:
                j = text.find("\n", i)
                i = n if j < 0 else j
        elif c.isalpha() or c == "_":
            m = _IDENT.match(text, i)
            assert m
            name = m.group(0)
            j = i + len(name)
            while j < n and text[j] in " \t":
                j += 1
            if j < n and text[j] == "(":
                start_line = line
                args, j, line = _arguments(text, j + 1, line)
                yield Command(name.lower(), tuple(args), start_line)
                i = j
            else:
                i = j
        else:
            i += 1


def _arguments(text: str, i: int, line: int) -> tuple[list[str], int, int]:
    """One command's arguments: linear in the text (each character is looked at once)."""
    args: list[str] = []
    depth, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            m = _QUOTED.match(text, i)
            assert m
            args.append(m.group(1))
            line += m.group(1).count("\n")
            i = m.end()
        elif c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in " \t\r\n":
            if c == "\n":
                line += 1
            i += 1
        elif c == "(":
            depth += 1
            if depth > MAX_PARENS:
                raise _limit(f"parentheses nested more than {MAX_PARENS} deep", line)
            args.append("(")
            i += 1
        elif c == ")":
            if depth == 0:
                return args, i + 1, line
            depth -= 1
            args.append(")")
            i += 1
        else:
            m = _WORD.match(text, i)
            assert m
            args.append(m.group())
            i = m.end()
    return args, n, line


class LimitExceeded(PinwheelError):
    """The tree's CMake is larger or deeper than the evaluator follows."""


def _limit(what: str, line: int | str, path: str | None = None) -> LimitExceeded:
    where = f"{path}:{line}" if path else f"line {line}"
    return LimitExceeded(
        f"the tree's CMake goes past pinwheel's evaluator limits: {what}",
        where=where,
        next="pin each build-time source by hand in a [[build.source]] table "
        "(pinwheel then does not need to evaluate the tree's CMake)",
    )


# --------------------------------------------------------------------------- evaluation

_KEYWORDS = {
    "GIT_REPOSITORY", "GIT_TAG", "URL", "URL_HASH", "SOURCE_DIR", "PATCH_COMMAND", "COMMAND",
    "GIT_SUBMODULES", "GIT_SUBMODULES_RECURSE", "GIT_PROGRESS", "GIT_SHALLOW", "BINARY_DIR",
    "CONFIGURE_COMMAND", "BUILD_COMMAND", "INSTALL_COMMAND", "UPDATE_COMMAND", "SUBBUILD_DIR",
    "SOURCE_SUBDIR", "DOWNLOAD_EXTRACT_TIMESTAMP", "EXCLUDE_FROM_ALL", "SYSTEM",
    "FIND_PACKAGE_ARGS", "OVERRIDE_FIND_PACKAGE", "TEST_COMMAND", "DOWNLOAD_COMMAND",
    "GIT_REMOTE_NAME",
}  # fmt: skip


def _cmake_arch(text: str) -> CudaArch | None:
    """A CMake arch entry such as ``9.0a``, ``10.0f`` or ``8.0+PTX`` (any case), else None."""
    if "." not in text:  # CMake lists write major.minor; a bare number is something else
        return None
    try:
        return parse_arch(text)
    except UsageError:
        return None


def loose_intersection(supported: str, wanted: Sequence[str]) -> list[str]:
    """vLLM's ``cuda_archs_loose_intersection``, as far as pinning needs it: the wanted arches
    whose major.minor a supported entry names; ``+PTX`` entries also cover newer minors of
    the same major (and beyond); ``f`` family entries cover the same major."""
    out = []
    for arch in wanted:
        want = _cmake_arch(arch)
        if want is None:
            continue
        key = divmod(want.sm, 10)
        for entry in filter(None, supported.split(";")):
            have = _cmake_arch(entry)
            if have is None:
                continue
            major = have.sm // 10
            if (
                want.sm == have.sm
                or (have.ptx and want.sm >= have.sm)
                or (have.suffix == "f" and key[0] == major)
            ):
                out.append(arch)
                break
    return out


@dataclass
class _State:
    tree: pygit2.Tree
    repo: pygit2.Repository
    arches: tuple[str, ...]
    cuda: str
    variables: dict[str, str | None] = field(default_factory=dict)  # None: unknown value
    found: dict[str, list[tuple[str, dict[str, list[str]], str, str]]] = field(
        default_factory=dict
    )  # name -> [(where, fields, used, override var)]
    files: int = 0  # CMake files read
    work: int = 0  # commands run + condition tokens read
    nesting: int = 0  # blocks open now

    def spend(self, n: int, path: str, line: int) -> None:
        self.work += n
        if self.work > MAX_WORK:
            raise _limit(f"more than {MAX_WORK} steps of evaluation", line, path)

    def set(self, name: str, value: str | None) -> None:
        self.variables[name] = value if value is None or len(value) <= MAX_VALUE else None


class _Return(Exception):
    """``return()`` in a taken branch: stop the current file."""


def discover(
    repo: pygit2.Repository, tree_id: str, arches: Sequence[str], cuda: str
) -> tuple[Declared, ...]:
    """Every FetchContent dependency the tree's CMake declares, judged for ``arches``."""
    tree = repo[tree_id].peel(pygit2.Tree)
    state = _State(tree=tree, repo=repo, arches=tuple(arches), cuda=cuda)
    state.variables.update(
        {
            "VLLM_GPU_LANG": "CUDA",
            "VLLM_TARGET_DEVICE": "cuda",
            "CUDA_ARCHS": ";".join(arches),
            "CMAKE_CUDA_COMPILER_VERSION": cuda,
            "CMAKE_SYSTEM_PROCESSOR": "x86_64",
        }
    )
    if "CMakeLists.txt" in tree:
        _run_file(state, "CMakeLists.txt", YES, 0)
    return tuple(_merge(name, entries) for name, entries in sorted(state.found.items()))


def _merge(name: str, entries: list[tuple[str, dict[str, list[str]], str, str]]) -> Declared:
    """One name may be declared on several branches (override / fork / default)."""
    overrides = tuple(dict.fromkeys(v for _, f, _, v in entries if v and "SOURCE_DIR" in f))
    fetching = [(w, f, u) for w, f, u, _ in entries if "GIT_REPOSITORY" in f or "URL" in f]
    rank = {YES: 0, UNKNOWN: 1, NO: 2}
    fetching.sort(key=lambda e: rank[e[2]])
    if not fetching:
        where, fields_, used = entries[0][0], entries[0][1], entries[0][2]
    else:
        where, fields_, used = fetching[0]

    def first(key: str) -> str | None:
        values = fields_.get(key) or []
        return values[0] if values else None

    patches = tuple(a for a in fields_.get("PATCH_COMMAND", []) if a.endswith(".patch"))
    return Declared(
        name=name,
        url=first("GIT_REPOSITORY") or first("URL"),
        ref=first("GIT_TAG"),
        url_hash=first("URL_HASH"),
        variables=overrides,
        patches=patches,
        submodules=tuple(fields_.get("GIT_SUBMODULES", [])),
        used=used,
        where=where,
    )


def _read(state: _State, path: str) -> str | None:
    try:
        blob = state.tree[path]
    except KeyError:
        return None
    obj = state.repo.get(blob.id)
    if not isinstance(obj, pygit2.Blob):
        return None
    try:
        if obj.size > MAX_FILE_BYTES:
            raise _limit(f"a CMake file larger than {MAX_FILE_BYTES} bytes", 1, path)
        return obj.data.decode(errors="replace")
    except KeyError:  # a blob a partial mirror lacks
        return None


def _run_file(state: _State, path: str, ctx: str, depth: int, line: int = 0) -> None:
    if depth > MAX_INCLUDE_DEPTH:
        raise _limit(f"include() nested more than {MAX_INCLUDE_DEPTH} deep", line, path)
    state.files += 1
    if state.files > MAX_FILES:
        raise _limit(f"more than {MAX_FILES} CMake files included", line, path)
    text = _read(state, path)
    if text is None:
        return
    if len(text) > MAX_FILE_BYTES:
        raise _limit(f"a CMake file larger than {MAX_FILE_BYTES} bytes", 1, path)
    try:
        cmds = list(commands(text))
    except LimitExceeded as exc:
        exc.where = f"{path}:{exc.where.removeprefix('line ')}" if exc.where else path
        raise
    try:
        _run(state, cmds, path, ctx, depth)
    except _Return:
        return


def _and(a: str, b: str) -> str:
    if NO in (a, b):
        return NO
    return YES if a == b == YES else UNKNOWN


def _run(state: _State, cmds: list[Command], path: str, ctx: str, depth: int) -> None:
    """Walk commands; ``ctx`` is whether this code runs (yes / unknown)."""
    i = 0
    while i < len(cmds):
        c = cmds[i]
        state.spend(1 + len(c.args), path, c.line)
        if c.name in ("function", "macro"):
            i = _skip_block(cmds, i, c.name, "end" + c.name)
            continue
        if c.name == "if":
            i = _run_if(state, cmds, i, path, ctx, depth)
            continue
        if c.name in ("foreach", "while"):
            i = _skip_block(cmds, i, c.name, "end" + c.name)
            continue
        _apply(state, c, path, ctx, depth)
        i += 1


def _skip_block(cmds: list[Command], i: int, start: str, end: str) -> int:
    level = 0
    while i < len(cmds):
        if cmds[i].name == start:
            level += 1
        elif cmds[i].name == end:
            level -= 1
            if level == 0:
                return i + 1
        i += 1
    return i


def _run_if(state: _State, cmds: list[Command], i: int, path: str, ctx: str, depth: int) -> int:
    """Split if/elseif/else/endif at this level, then run the branches that may run."""
    if state.nesting >= MAX_NESTING:
        raise _limit(f"if() blocks nested more than {MAX_NESTING} deep", cmds[i].line, path)
    state.nesting += 1
    try:
        return _run_branches(state, cmds, i, path, ctx, depth)
    finally:
        state.nesting -= 1


def _run_branches(
    state: _State, cmds: list[Command], i: int, path: str, ctx: str, depth: int
) -> int:
    branches: list[tuple[tuple[str, ...] | None, list[Command]]] = [(cmds[i].args, [])]
    level, j = 0, i + 1
    while j < len(cmds):
        state.spend(1, path, cmds[j].line)
        c = cmds[j]
        if c.name == "if":
            level += 1
        elif c.name == "endif":
            if level == 0:
                break
            level -= 1
        elif level == 0 and c.name == "elseif":
            branches.append((c.args, []))
            j += 1
            continue
        elif level == 0 and c.name == "else":
            branches.append((None, []))
            j += 1
            continue
        branches[-1][1].append(c)
        j += 1
    earlier = NO  # whether an earlier branch was taken
    for cond, body in branches:
        value = YES if cond is None else _condition(state, list(cond))
        runs = NO if earlier == YES else _and(value, YES if earlier == NO else UNKNOWN)
        # Branches that do not run are still read (ctx "no"): their declarations are
        # listed as unused, and an override's SOURCE_DIR branch names the variable.
        _run(state, body, path, _and(ctx, runs), depth)
        if value == YES and earlier == NO:
            earlier = YES
        elif value != NO and earlier != YES:
            earlier = UNKNOWN
    return j + 1


def _expand(state: _State, text: str) -> str | None:
    """``${VAR}`` and ``$ENV{VAR}`` (unset in the no-override world); None when unknown."""
    unknown = False
    size = len(text)

    def sub(m: re.Match[str]) -> str:
        nonlocal unknown, size
        if m.group(1) == "ENV" or unknown:
            return ""
        value = state.variables.get(m.group(2))
        size += len(value or "")
        if (m.group(2) in state.variables and value is None) or size > MAX_VALUE:
            unknown = True  # an unknown value, or one past MAX_VALUE: never built
            return ""
        return value or ""

    out = _VAR_REF.sub(sub, text)
    return None if unknown else out


_VAR_REF = re.compile(r"\$(ENV)?\{([A-Za-z0-9_.+-]+)\}")


def _condition(state: _State, args: list[str]) -> str:
    """CMake if() arguments -> yes / no / unknown (NOT, AND, OR, parentheses, STREQUAL,
    MATCHES, VERSION_*, DEFINED, IN_LIST, plain variables and constants)."""
    pos = 0
    nested = 0

    def atom() -> str:
        nonlocal pos, nested
        if pos >= len(args):
            return UNKNOWN
        tok = args[pos]
        if tok == "(":
            pos += 1
            nested += 1
            if nested > MAX_PARENS:
                return UNKNOWN
            value = expr()
            nested -= 1
            if pos < len(args) and args[pos] == ")":
                pos += 1
            return value
        if tok == "NOT":
            pos += 1
            nested += 1  # NOT NOT NOT ... recurses like a parenthesis
            if nested > MAX_PARENS:
                return UNKNOWN
            value = atom()
            nested -= 1
            return {YES: NO, NO: YES}.get(value, UNKNOWN)
        if tok == "DEFINED":
            pos += 2
            name = args[pos - 1]
            if name.startswith("ENV{"):
                return NO  # the no-override world: pinwheel sets these itself
            if name in state.variables:
                return YES if state.variables[name] is not None else UNKNOWN
            return NO
        left = tok
        pos += 1
        if pos < len(args) and args[pos] in _BINARY:
            op = args[pos]
            right = args[pos + 1] if pos + 1 < len(args) else ""
            pos += 2
            return _binary(state, left, op, right)
        return _truth(state, left)

    def conj() -> str:
        nonlocal pos
        value = atom()
        while pos < len(args) and args[pos] == "AND":
            pos += 1
            value = _and(value, atom())
        return value

    def expr() -> str:
        nonlocal pos
        value = conj()
        while pos < len(args) and args[pos] == "OR":
            pos += 1
            other = conj()
            value = YES if YES in (value, other) else (NO if value == other == NO else UNKNOWN)
        return value

    try:
        return expr()
    except IndexError:
        return UNKNOWN


_BINARY = {
    "STREQUAL", "MATCHES", "VERSION_GREATER_EQUAL", "VERSION_GREATER", "VERSION_LESS",
    "VERSION_LESS_EQUAL", "VERSION_EQUAL", "IN_LIST", "EQUAL", "LESS", "GREATER",
}  # fmt: skip


def _value(state: _State, token: str) -> str | None:
    """A token as a value: ``${X}`` expanded, a bare known variable name dereferenced."""
    if "${" in token or "$ENV{" in token:
        return _expand(state, token)
    if token in state.variables:
        return state.variables[token]
    return token


def _binary(state: _State, left: str, op: str, right: str) -> str:
    a, b = _value(state, left), _value(state, right)
    if a is None or b is None:
        return UNKNOWN
    if op == "STREQUAL":
        return YES if a == b else NO
    if op == "MATCHES":
        if len(a) > MAX_MATCH_SUBJECT:
            return UNKNOWN
        try:  # a pattern from the tree: matched in linear time, or unknown
            return YES if saferegex.search(b, a) else NO
        except saferegex.RegexError:
            return UNKNOWN
    if op.startswith("VERSION_"):
        va, vb = _version(a), _version(b)
        if va is None or vb is None:
            return UNKNOWN
        result = {
            "VERSION_GREATER_EQUAL": va >= vb,
            "VERSION_GREATER": va > vb,
            "VERSION_LESS": va < vb,
            "VERSION_LESS_EQUAL": va <= vb,
            "VERSION_EQUAL": va == vb,
        }[op]
        return YES if result else NO
    if op == "IN_LIST":
        listed = state.variables.get(right)
        if listed is None:
            return UNKNOWN
        return YES if a in listed.split(";") else NO
    return UNKNOWN


def _version(text: str) -> tuple[int, ...] | None:
    parts = text.strip().split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


_FALSY = {"", "0", "OFF", "NO", "FALSE", "N", "IGNORE", "NOTFOUND"}


def _truth(state: _State, token: str) -> str:
    if token.upper() in _FALSY or token.upper().endswith("-NOTFOUND"):
        return NO
    if token.upper() in {"1", "ON", "YES", "TRUE", "Y"}:
        return YES
    value = _value(state, token)
    if value is None:
        return UNKNOWN
    if token in state.variables or "${" in token:
        return NO if value.upper() in _FALSY or value.upper().endswith("-NOTFOUND") else YES
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
        return NO  # an unset variable is false
    return UNKNOWN


def _apply(state: _State, c: Command, path: str, ctx: str, depth: int) -> None:
    args = list(c.args)
    if ctx == NO and c.name not in ("include", "fetchcontent_declare"):
        return  # code that does not run sets nothing
    if c.name == "set" and args:
        name = args[0]
        values = [a for a in args[1:] if a not in ("CACHE", "PARENT_SCOPE", "FORCE")]
        if "CACHE" in args:
            values = values[:1]
        expanded = [_expand(state, v) for v in values]
        if ctx != YES or any(v is None for v in expanded):
            if ctx == YES or name not in state.variables:
                state.set(name, None)
            return
        state.set(name, ";".join(v for v in expanded if v is not None))
    elif c.name == "list" and len(args) >= 2 and args[0] == "APPEND":
        name = args[1]
        expanded = [_expand(state, v) for v in args[2:]]
        old = state.variables.get(name, "")
        if ctx != YES or old is None or any(v is None for v in expanded):
            state.set(name, None)
            return
        state.set(name, ";".join(filter(None, [old, *(v or "" for v in expanded)])))
    elif c.name == "cuda_archs_loose_intersection" and len(args) >= 3:
        supported, wanted = _expand(state, args[1]), _expand(state, args[2])
        if ctx != YES or supported is None or wanted is None:
            state.set(args[0], None)
            return
        state.set(
            args[0], ";".join(loose_intersection(supported, [w for w in wanted.split(";") if w]))
        )
    elif c.name == "include" and args:
        target = _expand(state, args[0])
        if target is None:
            return
        target = target.replace("${CMAKE_CURRENT_LIST_DIR}", str(PurePosixPath(path).parent))
        rel = _tree_path(path, target)
        if rel is not None:
            _run_file(state, rel, ctx, depth + 1, c.line)
    elif c.name == "return" and ctx == YES:
        raise _Return
    elif c.name == "fetchcontent_declare" and args:
        _declare(state, c, path, ctx)


def _tree_path(current: str, target: str) -> str | None:
    """A path inside the tree for an include() target (relative to the source root or the
    including file's directory); None for modules like ``FetchContent``."""
    if "/" not in target and not target.endswith(".cmake"):
        return None
    parts: list[str] = []
    for part in PurePosixPath(target).parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in (".", "/"):
            parts.append(part)
    return "/".join(parts) if parts else None


def _declare(state: _State, c: Command, path: str, ctx: str) -> None:
    name, rest = c.args[0], list(c.args[1:])
    fields: dict[str, list[str]] = {}
    key = None
    for arg in rest:
        if arg in _KEYWORDS:
            key = arg
            fields.setdefault(key, [])
            continue
        if key is None:
            continue
        value = _expand(state, arg)
        if key in ("PATCH_COMMAND", "COMMAND"):
            key = "PATCH_COMMAND"
            fields.setdefault(key, [])
            if arg.endswith(".patch"):
                here = str(PurePosixPath(path).parent)
                resolved = arg.replace("${CMAKE_CURRENT_LIST_DIR}", here)
                resolved = resolved.replace("${CMAKE_CURRENT_SOURCE_DIR}", "")
                value = _tree_path(path, resolved) or resolved
        fields[key].append(value if value is not None else arg)
    override = ""
    if "SOURCE_DIR" in fields:
        m = re.fullmatch(r"\$\{([A-Za-z0-9_]+)\}", (c.args[c.args.index("SOURCE_DIR") + 1]))
        override = m.group(1) if m else ""
    where = f"{path}:{c.line}"
    state.found.setdefault(name.lower(), []).append((where, fields, ctx, override))


def summarize(declared: Sequence[Declared], pinned: Mapping[str, object]) -> list[str]:
    """Human lines for ``plan``: one per dependency."""
    lines = []
    for d in declared:
        state = "pinned in manifest" if d.name in pinned else (
            "pinned by the tree" if d.pinned else "UNPINNED"
        )  # fmt: skip
        what = f"{d.url or '(override only)'} @ {d.ref or d.url_hash or '?'}"
        override = f", override {', '.join(d.variables)}" if d.variables else ""
        lines.append(f"  {d.name}: {what}; used: {d.used}; {state}{override} ({d.where})")
    return lines

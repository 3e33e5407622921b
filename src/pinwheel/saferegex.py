"""Regular expressions from untrusted text, matched in time linear in the subject.

Python's ``re`` backtracks: ``(a+)+$`` on forty ``a`` and a ``b`` runs for
minutes, and a regex cannot be interrupted. The patterns a manifest or a
replayed tree supplies (qualify start-up markers, CMake ``if(... MATCHES ...)``)
are compiled here instead, into a Thompson NFA that is simulated state set by
state set, with the state sets cached as DFA states. Work per subject character
is bounded by the pattern's size, whatever the pattern.

The syntax is the common subset of CMake's and Python's: literals, ``.``,
bracket classes (ranges, negation, ``\\d \\w \\s`` and their negations), the
escapes ``\\. \\t \\n`` and friends, groups ``(...)`` and ``(?:...)``, ``|``,
``* + ?`` (a lazy ``?`` suffix is accepted: a yes/no search does not depend on
it), counted repeats ``{m}``, ``{m,}``, ``{m,n}`` (up to :data:`MAX_REPEAT`),
anchors ``^ $ \\A \\Z`` and a leading ``(?i)``. ``$`` matches at the very end only
(CMake's meaning; Python's ``$`` also matches before a final newline).
Back-references and look-around cannot be matched in linear time; they are
refused with :class:`RegexError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_PATTERN = 1000  # characters
MAX_REPEAT = 100  # largest count in {m,n}
MAX_STATES = 5000  # NFA states after counted repeats are expanded
MAX_DFA = 2000  # cached DFA states; past it the cache starts over (still linear)


class RegexError(ValueError):
    """A pattern outside the safe syntax, or too large."""


# --------------------------------------------------------------------------- parsing

Pred = Callable[[str], bool]


# A parsed pattern: ("cat", [...]), ("alt", [...]), ("star", node, ...) and so on.
Node = tuple[Any, ...]


@dataclass
class _Node:
    kind: str  # "char" | "split" | "bol" | "eol" | "match"
    pred: Pred | None = None
    out: int = -1
    out2: int = -1


def _class_pred(items: list[tuple[str, str] | Pred], negate: bool, fold: bool) -> Pred:
    ranges = [i for i in items if isinstance(i, tuple)]
    funcs = [i for i in items if not isinstance(i, tuple)]

    def inside(c: str) -> bool:
        for lo, hi in ranges:
            if lo <= c <= hi:
                return True
        return any(f(c) for f in funcs)

    if fold:

        def test(c: str) -> bool:
            return inside(c) or inside(c.lower()) or inside(c.upper())

    else:
        test = inside
    return (lambda c: not test(c)) if negate else test


_CLASS_ESCAPES: dict[str, Pred] = {
    "d": lambda c: "0" <= c <= "9",
    "D": lambda c: not ("0" <= c <= "9"),
    "w": lambda c: c.isalnum() or c == "_",
    "W": lambda c: not (c.isalnum() or c == "_"),
    "s": lambda c: c in " \t\n\r\f\v",
    "S": lambda c: c not in " \t\n\r\f\v",
}
_LITERAL_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


class _Parser:
    """Recursive descent into a tiny AST: ("lit", pred) ("cat", [..]) ("alt", [..])
    ("rep", node, min, max|None) ("bol",) ("eol",) ("empty",)."""

    def __init__(self, pattern: str):
        self.p = pattern
        self.i = 0
        self.fold = False
        self.depth = 0
        if self.p.startswith("(?i)"):
            self.fold = True
            self.i = 4

    def error(self, what: str) -> RegexError:
        return RegexError(f"{what} at position {self.i} of {self.p!r}")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def parse(self) -> Node:
        node = self.alt()
        if self.i != len(self.p):
            raise self.error("unbalanced ')'")
        return node

    def alt(self) -> Node:
        self.depth += 1
        if self.depth > 100:
            raise self.error("groups nested more than 100 deep")
        branches = [self.cat()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.cat())
        self.depth -= 1
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def cat(self) -> Node:
        items = []
        while self.peek() not in (None, "|", ")"):
            items.append(self.repeat())
        return ("cat", items) if items else ("empty",)

    def repeat(self) -> Node:
        node = self.atom()
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{" and self._counted():
                lo, hi = self._counted_value()
            else:
                return node
            if node[0] in ("bol", "eol", "empty"):
                raise self.error("a repeat of an anchor or of nothing")
            if self.peek() == "?":  # lazy: same yes/no answer
                self.i += 1
            elif self.peek() == "+":
                raise self.error("possessive repeats are not supported")
            node = ("rep", node, lo, hi)

    def _counted(self) -> bool:
        j = self.p.find("}", self.i)
        body = self.p[self.i + 1 : j] if j > 0 else ""
        parts = body.split(",")
        return 1 <= len(parts) <= 2 and all(p.isdigit() or (k == 1 and p == "") for k, p in
                                            enumerate(parts)) and parts[0] != ""  # fmt: skip

    def _counted_value(self) -> tuple[int, int | None]:
        j = self.p.index("}", self.i)
        body = self.p[self.i + 1 : j]
        self.i = j + 1
        lo_s, _, hi_s = body.partition(",")
        if len(lo_s) > 4 or len(hi_s) > 4:
            raise self.error(f"a count over {MAX_REPEAT}")
        lo = int(lo_s)
        hi = lo if "," not in body else (int(hi_s) if hi_s else None)
        if lo > MAX_REPEAT or (hi is not None and (hi > MAX_REPEAT or hi < lo)):
            raise self.error(f"a count over {MAX_REPEAT} or a range that ends before it starts")
        return lo, hi

    def atom(self) -> Node:
        c = self.p[self.i]
        self.i += 1
        if c == "(":
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                raise self.error("look-around, named groups and inline flags are not supported")
            node = self.alt()
            if self.peek() != ")":
                raise self.error("missing ')'")
            self.i += 1
            return node
        if c == "^":
            return ("bol",)
        if c == "$":
            return ("eol",)
        if c == ".":
            return ("lit", lambda ch: ch != "\n")
        if c == "[":
            return ("lit", self.bracket())
        if c == "\\":
            return self.escape()
        if c in "*+?":
            raise self.error("nothing to repeat")
        if c == ")":
            raise self.error("unbalanced ')'")
        return ("lit", self.literal(c))

    def literal(self, c: str) -> Pred:
        if self.fold and c.lower() != c.upper():
            low = c.lower()
            return lambda ch: ch.lower() == low
        return lambda ch: ch == c

    def escape(self) -> Node:
        if self.i >= len(self.p):
            raise self.error("a trailing backslash")
        c = self.p[self.i]
        self.i += 1
        if c in _CLASS_ESCAPES:
            return ("lit", _CLASS_ESCAPES[c])
        if c == "A":
            return ("bol",)
        if c == "Z":
            return ("eol",)
        if c in _LITERAL_ESCAPES:
            return ("lit", self.literal(_LITERAL_ESCAPES[c]))
        if c.isalnum():  # \1 back-references, \b, \x.. and the rest
            raise self.error(f"the escape \\{c} is not supported")
        return ("lit", self.literal(c))

    def bracket(self) -> Pred:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        items: list[tuple[str, str] | Pred] = []
        first = True
        while True:
            if self.i >= len(self.p):
                raise self.error("missing ']'")
            c = self.p[self.i]
            self.i += 1
            if c == "]" and not first:
                break
            first = False
            if c == "\\" and self.i < len(self.p):
                e = self.p[self.i]
                self.i += 1
                if e in _CLASS_ESCAPES:
                    items.append(_CLASS_ESCAPES[e])
                    continue
                if e.isalnum() and e not in _LITERAL_ESCAPES:
                    raise self.error(f"the escape \\{e} is not supported in a class")
                c = _LITERAL_ESCAPES.get(e, e)
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                hi = self.p[self.i + 1]
                self.i += 2
                if hi == "\\" and self.i < len(self.p):
                    hi = _LITERAL_ESCAPES.get(self.p[self.i], self.p[self.i])
                    self.i += 1
                if hi < c:
                    raise self.error(f"the range {c}-{hi} ends before it starts")
                items.append((c, hi))
            else:
                items.append((c, c))
        return _class_pred(items, negate, self.fold)


# --------------------------------------------------------------------------- NFA


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[_Node] = []

    def add(self, node: _Node) -> int:
        if len(self.nodes) >= MAX_STATES:
            raise RegexError(f"the pattern expands to more than {MAX_STATES} states")
        self.nodes.append(node)
        return len(self.nodes) - 1

    def build(self, ast: Node, nxt: int) -> int:
        """Nodes for ``ast`` that continue to ``nxt``; returns the entry node."""
        kind = ast[0]
        if kind == "empty":
            return nxt
        if kind == "lit":
            return self.add(_Node("char", ast[1], nxt))
        if kind in ("bol", "eol"):
            return self.add(_Node(kind, None, nxt))
        if kind == "cat":
            for item in reversed(ast[1]):
                nxt = self.build(item, nxt)
            return nxt
        if kind == "alt":
            entries = [self.build(b, nxt) for b in ast[1]]
            entry = entries[-1]
            for e in reversed(entries[:-1]):
                entry = self.add(_Node("split", None, e, entry))
            return entry
        if kind == "rep":
            _, body, lo, hi = ast
            if hi is None:  # body{lo,}: lo copies, then a loop
                loop = self.add(_Node("split", None, -1, nxt))
                self.nodes[loop].out = self.build(body, loop)
                entry = loop
            else:  # optional copies for hi - lo, innermost last
                entry = nxt
                for _ in range(hi - lo):
                    entry = self.add(_Node("split", None, self.build(body, entry), nxt))
                    # each optional copy may be skipped straight to the end
            for _ in range(lo):
                entry = self.build(body, entry)
            return entry
        raise AssertionError(kind)  # pragma: no cover


@dataclass(frozen=True)
class Pattern:
    """A compiled safe pattern: :meth:`search` answers whether it matches anywhere."""

    pattern: str
    _nodes: tuple[_Node, ...]
    _start: int

    def _closure(
        self, states: set[int] | frozenset[int], at_start: bool, at_end: bool = False
    ) -> frozenset[int]:
        """States reachable without reading a character (``^`` only at the start; ``$``
        only at the end: elsewhere it is kept as a state and decided at the end)."""
        seen: set[int] = set()
        stack = list(states)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            node = self._nodes[s]
            if node.kind == "split":
                stack += [node.out, node.out2]
            elif (node.kind == "bol" and at_start) or (node.kind == "eol" and at_end):
                stack.append(node.out)
        return frozenset(seen)

    def _accepts_at_end(self, states: frozenset[int], at_start: bool) -> bool:
        reach = self._closure(states, at_start, at_end=True)
        return any(self._nodes[s].kind == "match" for s in reach)

    def search(self, subject: str) -> bool:
        """True when the pattern matches somewhere in ``subject`` (like ``re.search``)."""
        nodes = self._nodes
        current = self._closure({self._start}, True)
        restart = self._closure({self._start}, False)
        cache: dict[tuple[frozenset[int], str], frozenset[int]] = {}
        done: dict[frozenset[int], bool] = {}
        for ch in subject:
            hit = done.get(current)
            if hit is None:
                hit = done[current] = any(nodes[s].kind == "match" for s in current)
            if hit:
                return True
            key = (current, ch)
            step = cache.get(key)
            if step is None:
                moved = {
                    nodes[s].out
                    for s in current
                    if nodes[s].kind == "char" and nodes[s].pred(ch)  # type: ignore[misc]
                }
                step = self._closure(moved, False) | restart
                if len(cache) >= MAX_DFA:
                    cache.clear()
                    done.clear()
                cache[key] = step
            current = step
        return self._accepts_at_end(current, not subject)


def compile(pattern: str) -> Pattern:  # noqa: A001 - the module's one entry point
    """``pattern`` compiled, or RegexError naming what is outside the safe syntax."""
    if len(pattern) > MAX_PATTERN:
        raise RegexError(f"the pattern is longer than {MAX_PATTERN} characters")
    ast = _Parser(pattern).parse()
    b = _Builder()
    match = b.add(_Node("match"))
    start = b.build(ast, match)
    return Pattern(pattern, tuple(b.nodes), start)


def search(pattern: str, subject: str) -> bool:
    return compile(pattern).search(subject)

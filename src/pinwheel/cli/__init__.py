"""The thin CLI: global options resolved once into a :class:`Context`, then one stage call.

Each stage registers its subcommands from its own module under ``pinwheel.cli``
(see :func:`build_parser`); this file only wires them together and turns
:class:`~pinwheel.errors.PinwheelError` into a message and an exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pinwheel import __version__, options, ownership
from pinwheel.cli.stopsignal import Terminated, terminate_as_interrupt
from pinwheel.errors import EXIT_ERROR, EXIT_USAGE, PinwheelError, UsageError
from pinwheel.manifest import Manifest, load
from pinwheel.printable import shown
from pinwheel.progress import SILENT, LineReporter, Reporter
from pinwheel.urls import redact, redact_tree

if TYPE_CHECKING:  # rich is imported when a command first prints through it
    from rich.console import Console

EPILOG = """exit codes: 0 ok, 1 error, 2 bad manifest or usage, 3 drift (PR head moved),
4 conflict, 5 tree or rebuild mismatch, 6 verification failed, 7 qualification gate failed
environment: `pinwheel env` lists every variable pinwheel reads, its flag and its source"""


MANIFEST_NAME = "manifest.toml"
ERROR_SCHEMA = "pinwheel.error/1"


def find_manifest(start: Path, safe: Sequence[str] = ()) -> Path:
    """``manifest.toml`` in ``start`` or the nearest directory above it, as git finds ``.git``.

    The search stops at the top of a git checkout (a directory holding ``.git``), so a
    manifest above the repository is never picked up; with none found the answer is
    ``start/manifest.toml``, whose absence the loader reports. A manifest found so (not
    named with ``--manifest``) is used only when its file and folder are the user's
    (:mod:`pinwheel.ownership`; ``safe``: the :data:`~pinwheel.ownership.SAFE_ENV` list).
    """
    here = start.absolute()
    for directory in (here, *here.parents):
        candidate = directory / MANIFEST_NAME
        if candidate.exists():
            ownership.check(
                [directory, candidate], what="the manifest found at", flag="--manifest",
                safe=safe,
            )  # fmt: skip
            return candidate
        if (directory / ".git").exists():
            break
    return here / MANIFEST_NAME


def default_cache() -> Path:
    return options.launch(os.environ).default_cache()


def parse_mirrors(
    items: Sequence[str], env: str | None, safe: Sequence[str] | None = None
) -> dict[str, str]:
    """``URL=PATH`` pairs from PINWHEEL_MIRRORS (space or comma separated) then --mirror.
    A mirror the environment names (not ``--mirror``) is checked to be the user's
    (:mod:`pinwheel.ownership`) when ``safe`` is given."""
    from_env = [p for p in (env or "").replace(",", " ").split() if p]
    pairs = from_env + list(items)
    mirrors: dict[str, str] = {}
    for i, pair in enumerate(pairs):
        url, sep, path = pair.partition("=")
        if not sep or not url or not path:
            raise UsageError(
                f"bad mirror mapping {pair!r}: expected URL=PATH",
                where="--mirror / PINWHEEL_MIRRORS",
                next="e.g. --mirror https://github.com/1CatAI/1Cat-vLLM.git=/srv/mirrors/1cat.git",
            )
        from pinwheel.validate import git_url_problem

        problem = git_url_problem(url)
        if problem or path.startswith("-"):
            raise UsageError(
                f"bad mirror mapping {redact(pair)!r}: "
                + (f"URL: {problem}" if problem else "PATH starts with '-'"),
                where="--mirror / PINWHEEL_MIRRORS",
                next="give URL=PATH with a repository URL and a mirror path "
                "(write ./-name for a path that starts with '-')",
            )
        if safe is not None and i < len(from_env):
            ownership.check([path], what="the mirror", flag="--mirror", safe=safe)
        mirrors[url] = path
    return mirrors


@dataclass
class Context:
    """Options resolved once; commands read from here, never from os.environ."""

    manifest_path: Path
    cache: Path
    mirrors: dict[str, str]
    json: bool
    offline: bool
    # The declared variables and the pass-through list (pinwheel.options), not all of
    # os.environ: what stages are handed and what their children inherit.
    environ: Mapping[str, str] = field(
        default_factory=lambda: options.environment(os.environ), repr=False
    )
    verbose: bool = False
    command: str = ""  # "plan", "cache-du", ...: names the JSON schema
    emitted: bool = False  # one JSON document per run: set once emit wrote it
    _manifest: Manifest | None = None
    _console: Console | None = None
    _reporter: Reporter | None = None
    _host: options.HostEnvironment | None = None

    @property
    def console(self) -> Console:
        """A rich console on stderr (only on a terminal; literal text, no markup)."""
        if self._console is None:
            from pinwheel.cli.reporting import console

            self._console = console()
        return self._console

    @property
    def host(self) -> options.HostEnvironment:
        """The declared variables typed and checked (:func:`pinwheel.options.host`), once;
        a bad value is a usage error naming the variable and its flag."""
        if self._host is None:
            self._host = options.host(self.environ)
        return self._host

    def variable(self, name: str) -> str | None:
        """A variable the manifest names (``[serve] env_prefix``, ``model_var``), read here."""
        return self.environ.get(name) or os.environ.get(name)

    def option(
        self, args: argparse.Namespace, name: str, *, manifest: object = None,
        env_name: str | None = None,
    ) -> options.Resolved:
        """Declared variable ``name`` for this command: its flag, else the variable (named
        ``env_name`` where the manifest makes the name), else ``manifest`` (the manifest key's
        value), else the default (:func:`pinwheel.options.resolve_var`)."""
        process = self.environ
        if env_name is not None:
            process = {env_name: self.variable(env_name) or ""}
        return options.from_args(args, name, process, manifest=manifest, env_name=env_name)

    @property
    def is_terminal(self) -> bool:
        return sys.stderr.isatty() and options.launch(self.environ).term != "dumb"

    @property
    def reporter(self) -> Reporter:
        """Progress for stages: nothing with --json, rich on a terminal, plain lines otherwise."""
        if self._reporter is None:
            if self.json:
                self._reporter = SILENT
            elif self.is_terminal:
                from pinwheel.cli.reporting import RichReporter

                self._reporter = RichReporter(self.console, verbose=self.verbose)
            else:
                self._reporter = LineReporter(verbose=self.verbose)
        return self._reporter

    def say(self, text: str, style: str | None = None) -> None:
        """A human line on stderr (coloured with ``style`` on a terminal); nothing with --json."""
        if self.json:
            return
        if style and self.is_terminal:
            self.console.print(shown(text), style=style, markup=False, highlight=False)
        else:
            print(shown(text), file=sys.stderr, flush=True)

    def manifest(self, *, allow_short: bool = False) -> Manifest:
        if allow_short:
            return load(self.manifest_path, allow_short=True)
        if self._manifest is None:
            self._manifest = load(self.manifest_path)
        return self._manifest

    def emit(self, payload: dict[str, Any], human: str | None = None) -> None:
        """Machine output on stdout with --json; human text otherwise."""
        if self.json:
            if "schema" not in payload:
                payload = {"schema": f"pinwheel.{self.command or 'output'}/1", **payload}
            text = json.dumps(redact_tree(payload), indent=2, sort_keys=True, default=str)
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            self.emitted = True
        elif human:
            print(shown(human))



class _Parser(argparse.ArgumentParser):
    """argparse that remembers its usage error, so ``--json`` can put it in the document."""

    last_error: str | None = None

    def error(self, message: str) -> Any:
        _Parser.last_error = message
        return super().error(message)


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # On subcommands the defaults are SUPPRESS so `pinwheel --json plan` and
    # `pinwheel plan --json` both work without one overriding the other.
    d = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    parser.add_argument(
        "--manifest",
        default=d(None),
        help="manifest file (default: manifest.toml here or in the nearest directory above)",
    )
    options.add_flag(parser, "PINWHEEL_CACHE", default=d(None), metavar="DIR")
    options.add_flag(
        parser, "PINWHEEL_MIRRORS", action="append", default=d([]), metavar="URL=PATH"
    )
    parser.add_argument("--offline", action="store_true", default=d(False), help="no network")
    parser.add_argument("--json", action="store_true", default=d(False), help="JSON on stdout")
    parser.add_argument(
        "--verbose", "-v", action="store_true", default=d(False),
        help="also show each command run and per-step detail",
    )  # fmt: skip


_COMMON = _Parser(add_help=False)
_global_options(_COMMON, top=False)


class _Unbuilt:
    """A subcommand this command line does not run: every call to build it is a no-op."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kw: self


def command(sub: Any, name: str, help: str, func: Any) -> argparse.ArgumentParser:
    """Add a subcommand that also accepts the global options after its name. When the
    command line runs another one (``sub.only``), this one is listed by name and help only
    (for ``--help`` and usage errors) and its options are not built."""
    only = getattr(sub, "only", None)
    if only is not None and only != name:
        sub.add_parser(name, help=help, add_help=False)
        return _Unbuilt()  # type: ignore[return-value]
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=help, parents=[_COMMON]
    )
    parser.set_defaults(func=func)
    return parser


def refuse_url(value: str, *, reads: str, then: Sequence[str], dest: str, flag: str = "",
               glob: str = "", source: str | None = None) -> None:
    """A URL given where a command reads a local folder or file (``pinwheel install URL``)
    is refused by name, before it is read as a path (``http:/host/...``). ``reads`` says
    what the command reads; ``then`` is the command (its words after ``pinwheel``) that
    reads ``dest`` once ``pinwheel fetch URL --dest DEST`` has written it, and ``glob`` a
    shell pattern appended as it is (``fetched-release/*.whl``: the shell expands it);
    ``source`` what to fetch when not ``value`` itself (a wheel's release folder)."""
    import re

    if not re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://", value):
        return
    from pinwheel.printable import shown_cmd

    url = redact(value)
    fetch = redact(source) if source is not None else url
    command = f"pinwheel {then[0]}" + (f" {flag}" if flag else "")
    raise UsageError(
        f"{command} reads {reads}, not a URL",
        where=url,
        next=f"fetch it first: `{shown_cmd('pinwheel', 'fetch', fetch, '--dest', dest)} && "
        f"{shown_cmd('pinwheel', *then)}{' ' + glob if glob else ''}`",
    )


def action(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A sub-subcommand (``cache du``, ``model check``): global options work after it too."""
    return sub.add_parser(name, help=help, description=help, parents=[_COMMON])  # type: ignore[no-any-return]


def _command_name(args: argparse.Namespace) -> str:
    """``plan``, ``cache-du``, ``model-check``: the name in each JSON document's schema."""
    parts = [str(args.command or "")]
    for attr in ("cache_action", "model_command"):
        if getattr(args, attr, None):
            parts.append(str(getattr(args, attr)))
    return "-".join(p for p in parts if p)


def _error_document(
    command: str, exit_code: int, what: str, where: str | None = None, next: str | None = None
) -> str:
    """The one JSON document a failed ``--json`` run prints on stdout."""
    doc = {
        "schema": ERROR_SCHEMA,
        "ok": False,
        "command": command,
        "exit_code": exit_code,
        "error": {"what": what, "where": where, "next": next},
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` runs, read past the global options before it; None when
    that cannot be told (then every subcommand is built)."""
    pre = _Parser(add_help=False)
    _global_options(pre, top=True)
    pre.add_argument("command", nargs="?")
    pre.add_argument("rest", nargs=argparse.REMAINDER)
    try:
        known, _ = pre.parse_known_args(list(argv))
    except SystemExit:
        return None
    return str(known.command) if known.command else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``only``: build the options of that subcommand alone (the
    one ``argv`` runs), listing the others by name and help."""
    parser = _Parser(
        prog="pinwheel",
        description="Pinned, replayable, verified engine builds, driven by manifest.toml.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pinwheel {__version__}")
    _global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.only = only  # type: ignore[attr-defined]  # read by command()
    # The modules that contribute subcommands, in the order `--help` lists them.
    from pinwheel.cli import (
        attribute_cmds,
        build_cmds,
        cache_cmds,
        env_cmds,
        release_cmds,
        replay_cmds,
        serve_cmds,
    )

    for module in (
        replay_cmds, build_cmds, release_cmds, serve_cmds, attribute_cmds, cache_cmds, env_cmds
    ):
        module.register(sub)
    return parser


def ctx_cache(args: argparse.Namespace, safe: Sequence[str] | None = None) -> Path:
    """``--cache``, absolute: build paths under it reach compilers and provenance. A cache
    not named with ``--cache`` (``$PINWHEEL_CACHE``, the default) is checked to be the
    user's (:mod:`pinwheel.ownership`) when ``safe`` is given."""
    chosen = options.from_args(args, "PINWHEEL_CACHE", os.environ)
    if chosen.source == "flag" and chosen.value:
        return Path(chosen.value).absolute()
    cache = default_cache()
    if safe is not None:
        ownership.check([cache], what="the cache", flag="--cache", safe=safe)
    return cache


def _wants_json(argv: Sequence[str]) -> bool:
    return "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = _subcommand(argv)
    parser = build_parser(only)
    _Parser.last_error = None
    try:
        args = parser.parse_args(argv)
        if only is not None and args.command != only:  # told wrong: parse with every one
            parser = build_parser()
            args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed its usage error (or --help / --version)
        code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
        if code and _wants_json(argv):
            what = _Parser.last_error or "bad command line (usage on stderr)"
            sys.stdout.write(_error_document("", code, what, next="pinwheel --help"))
        return code
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    ctx: Context | None = None
    try:
        said = options.launch(os.environ)
        safe = ownership.parse_safe(said.safe_directories)
        ctx = Context(
            manifest_path=Path(args.manifest)
            if getattr(args, "manifest", None)
            else find_manifest(Path.cwd(), safe),
            cache=ctx_cache(args, safe),
            mirrors=parse_mirrors(args.mirror, said.mirrors, safe),
            json=args.json,
            offline=args.offline,
            verbose=args.verbose,
            command=_command_name(args),
        )
        with terminate_as_interrupt():
            return int(args.func(ctx, args) or 0)
    except PinwheelError as err:
        message = shown(err)
        if args.json and not (ctx and ctx.emitted):
            sys.stdout.write(
                _error_document(
                    _command_name(args),
                    err.exit_code,
                    redact(err.what),
                    redact(err.where) if err.where else None,
                    redact(err.next) if err.next else None,
                )
            )
        if sys.stderr.isatty():
            from rich.text import Text

            from pinwheel.cli.reporting import console

            console().print(Text("error:", style="bold red"), Text(message))
        else:
            print(f"error: {message}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt as stop:
        code = stop.exit_code if isinstance(stop, Terminated) else 130
        why = f"stopped by {stop}" if isinstance(stop, Terminated) else "interrupted"
        print(f"{why}; nothing was half-written (writes are atomic)", file=sys.stderr)
        if args.json and not (ctx and ctx.emitted):
            sys.stdout.write(_error_document(_command_name(args), code, why))
        return code
    except Exception as err:
        from pinwheel.source import faults

        # libgit2 errors that escaped a stage: a full disk or a damaged cache, said so.
        if type(err).__module__.split(".")[0] not in ("pygit2", "_pygit2") and not isinstance(
            err, OSError
        ):
            raise
        fault: PinwheelError | None
        if isinstance(err, OSError):  # one mapping for every stage: path, what, next
            from pinwheel.oserrors import explain

            fault = explain(err, ctx_cache(args))
        else:
            fault = faults.classify_exception(err, ctx_cache(args))
        if fault is not None:
            print(f"error: {shown(fault)}", file=sys.stderr)
            if args.json and not (ctx and ctx.emitted):
                sys.stdout.write(
                    _error_document(
                        _command_name(args),
                        fault.exit_code,
                        redact(fault.what),
                        fault.where and redact(fault.where),
                        fault.next and redact(fault.next),
                    )
                )
            return fault.exit_code

        print(f"error: {shown(err)}", file=sys.stderr)
        if args.json and not (ctx and ctx.emitted):
            sys.stdout.write(_error_document(_command_name(args), EXIT_ERROR, redact(str(err))))
        return EXIT_ERROR

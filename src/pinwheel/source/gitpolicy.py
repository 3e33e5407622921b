"""The one git policy: what every git process and every libgit2 call runs under.

Neither the user's, the system's nor a repository's configuration may make git
run a command, read a file or use a transport pinwheel did not choose:

- no system or global config (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``,
  and no inherited ``GIT_*`` variable such as ``GIT_SSH_COMMAND`` or ``GIT_CONFIG_PARAMETERS``);
- a protocol allowlist (``GIT_ALLOW_PROTOCOL``: git then behaves as if
  ``protocol.allow=never`` with only these allowed, overriding any config), so
  ``ext::`` and ``fd::`` never run, whatever ``protocol.ext.allow`` says;
- per command: no hooks, no fsmonitor, no credential helper, no signing;
- a repository's own config is read first and refused unless every key is one
  ``git init`` writes (:func:`check_repo_config`): ``config``, ``config.worktree``
  (``extensions.worktreeConfig``) and the config of a ``commondir`` target, which
  must be the repository a ``git worktree add`` made the worktree of: ``fsck.skipList``, hooks,
  ``core.sshCommand``, ``core.alternateRefsCommand``, filters, merge drivers,
  ``include.path`` and the like can name files or commands, and ``-c`` cannot
  unset an additive key such as ``fsck.skipList``;
- libgit2 (pygit2): global, XDG, system and program-data search paths emptied
  (:func:`apply_libgit2`), run once by :mod:`pinwheel.source.libgit2`, the one module
  that imports pygit2 (every other module takes it from there).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from pinwheel import runner
from pinwheel.errors import PinwheelError
from pinwheel.validate import GIT_SCHEMES

ALLOW_PROTOCOL = ":".join(GIT_SCHEMES)

# What git itself does for alternates when core.alternateRefsCommand is unset (the
# alternate's refs as "haves"), written as the command: an override that keeps fetches
# from a mirror attached as an alternate as cheap as before. git runs it as
# `sh -c 'VALUE "$@"' VALUE <alternate>` (with GIT_CONFIG_PARAMETERS unset, as for its
# own default command; the environment's GIT_CONFIG_NOSYSTEM and GIT_CONFIG_GLOBAL hold).
ALTERNATE_REFS = "f() { git --git-dir=\"$1\" for-each-ref '--format=%(objectname)'; }; f"

# Per-command settings: the second fence after the environment. Every key git (2.39 to
# 2.47) reads as a command to run, or a program or file to use, that has a fixed name
# (git-config(1)) and that a value can switch off (diff.external cannot: the subcommands
# that read it get --no-ext-diff, :data:`SUBCOMMAND_OPTIONS`); keys with a driver or
# remote in their name (filter.<d>.smudge,
# remote.<r>.uploadpack, ...) cannot be listed here and are refused by the repository
# config whitelist (:data:`SAFE_REPO_KEYS`) instead.
COMMAND_CONFIG = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("core.askPass", ""),
    ("credential.helper", ""),
    ("core.sshCommand", "ssh"),
    ("core.alternateRefsCommand", ALTERNATE_REFS),
    ("core.alternateRefsPrefixes", ""),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("core.pager", "cat"),
    ("gpg.program", "false"),
    ("gpg.openpgp.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.x509.program", "false"),
    ("gpg.ssh.defaultKeyCommand", "false"),
    ("core.attributesFile", os.devnull),
    ("core.excludesFile", os.devnull),
    ("fsck.skipList", os.devnull),
    ("fetch.fsck.skipList", os.devnull),
    ("receive.fsck.skipList", os.devnull),
    ("uploadpack.packObjectsHook", ""),
    ("log.showSignature", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("protocol.allow", "never"),
    *((f"protocol.{scheme}.allow", "always") for scheme in GIT_SCHEMES),
)

# Keys a repository's own config may hold: what `git init`, `git worktree` and the
# partial-clone machinery write. Anything else is refused before git runs there.
SAFE_REPO_KEYS = frozenset(
    {
        "core.repositoryformatversion",
        "core.filemode",
        "core.bare",
        "core.logallrefupdates",
        "core.ignorecase",
        "core.precomposeunicode",
        "core.symlinks",
        "core.autocrlf",
        "core.sparsecheckout",
        "core.sparsecheckoutcone",
        "extensions.objectformat",
        "extensions.worktreeconfig",
        "extensions.partialclone",
        "extensions.preciousobjects",
        "index.sparse",
        "gc.auto",
        "gc.autodetach",
    }
)


# Keys no `-c` value can switch off (an empty diff.external is still run): options given
# to the subcommands that would read them.
SUBCOMMAND_OPTIONS = {
    "diff": ("--no-ext-diff", "--no-textconv"),
    "log": ("--no-ext-diff", "--no-textconv"),
    "show": ("--no-ext-diff", "--no-textconv"),
}


def subcommand_options(args: list[str] | tuple[str, ...]) -> list[str]:
    """``args`` with :data:`SUBCOMMAND_OPTIONS` put right after the subcommand."""
    if args and args[0] in SUBCOMMAND_OPTIONS:
        return [args[0], *SUBCOMMAND_OPTIONS[args[0]], *args[1:]]
    return list(args)


def fixed_env() -> dict[str, str]:
    """What every git process's environment is set to (inherited ``GIT_*`` are dropped)."""
    return {
        "LC_ALL": "C",
        "LANG": "C",
        "TZ": "UTC",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ADVICE": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ALLOW_PROTOCOL": ALLOW_PROTOCOL,
        "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_NO_REPLACE_OBJECTS": "1",
    }


def config_args() -> list[str]:
    """``-c key=value`` pairs that go before every git subcommand."""
    args: list[str] = []
    for key, value in COMMAND_CONFIG:
        args += ["-c", f"{key}={value}"]
    return args


# --------------------------------------------------------------------------- repository config


def _gitdir(location: Path) -> Path | None:
    """The git directory git would use for a bare repo, a work tree or a linked worktree."""
    location = Path(location)
    dot = location / ".git"
    if dot.is_file():  # a linked worktree or a submodule: "gitdir: PATH"
        text = dot.read_text(errors="replace").strip()
        if not text.startswith("gitdir:"):
            return None
        gitdir = Path(text[7:].strip())
        return gitdir if gitdir.is_absolute() else (location / gitdir)
    if dot.is_dir():
        return dot
    if (location / "HEAD").exists() and (location / "objects").is_dir():
        return location
    return None


def _common(gitdir: Path) -> Path:
    """The common directory a ``commondir`` file names, refused unless it is what
    ``git worktree add`` writes: the repository whose ``worktrees/<name>`` this is."""
    common = gitdir / "commondir"
    if not common.exists():
        return gitdir
    rel = Path(common.read_text(errors="replace").strip())
    target = rel if rel.is_absolute() else gitdir / rel
    real, here = Path(os.path.realpath(target)), Path(os.path.realpath(gitdir))
    if here.parent.name != "worktrees" or here.parent.parent != real:
        raise PinwheelError(
            f"refusing a repository whose commondir file points elsewhere ({rel}): git would "
            "read that directory's config and objects",
            where=str(common),
            next="remove the repository (`pinwheel cache clean`) and run again",
        )
    return real


def config_files(location: Path) -> list[Path]:
    """Every config file git reads for the repository at ``location`` (its own, not the
    user's or the system's): the common directory's ``config``, and ``config.worktree``
    of the worktree and of the common directory (read under ``extensions.worktreeConfig``).
    Included files are not followed: ``include.*`` and ``includeIf.*`` are refused keys."""
    gitdir = _gitdir(location)
    if gitdir is None:
        return []
    common = _common(gitdir)
    found = [common / "config", gitdir / "config.worktree"]
    if common != gitdir:
        found.append(common / "config.worktree")
    return [p for p in dict.fromkeys(found) if os.path.lexists(p)]


def config_file(location: Path) -> Path | None:
    """The main config file git would read for a bare repo, a work tree or a worktree."""
    gitdir = _gitdir(location)
    return None if gitdir is None else _common(gitdir) / "config"


_checked: dict[Path, tuple[int, int, int]] = {}


def check_repo_config(location: Path) -> None:
    """Refuse a repository any of whose config files (:func:`config_files`) holds a key
    outside :data:`SAFE_REPO_KEYS`: the keys pinwheel's own repositories are made with."""
    for path in config_files(location):
        _check_file(path)


def _check_file(path: Path) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    if _checked.get(path) == stamp:
        return
    proc = runner.run(
        runner.Command(
            argv=("git", "config", "--file", str(path), "--no-includes", "--list", "--null"),
            what="git config --list",
            env_set=fixed_env(),
            env_unset_prefixes=("GIT_",),
            check=False,
            missing_hint="install git (2.38 or newer) and put it on PATH",
        )
    )
    if proc.returncode != 0:
        raise PinwheelError(
            "the repository's config cannot be read: "
            + (proc.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1],
            where=str(path),
            next="remove the repository (`pinwheel cache clean`) and run again",
        )
    keys = []
    for entry in proc.stdout.split(b"\0"):
        if entry:
            keys.append(entry.split(b"\n", 1)[0].decode(errors="replace").lower())
    bad = sorted({k for k in keys if k not in SAFE_REPO_KEYS})
    if bad:
        raise PinwheelError(
            "refusing a repository whose config sets "
            + ", ".join(ascii(k)[1:-1] for k in bad[:5])
            + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")
            + ": a repository's config may not name files or commands for pinwheel's git",
            where=str(path),
            next="remove those keys from the repository's config, or remove the repository "
            "(`pinwheel cache clean`) and run again",
        )
    _checked[path] = stamp


# --------------------------------------------------------------------------- libgit2


def apply_libgit2(pygit2: ModuleType) -> None:
    """libgit2 reads no global, XDG, system or program-data config (idempotent)."""
    levels = pygit2.enums.ConfigLevel
    for level in (levels.GLOBAL, levels.XDG, levels.SYSTEM, levels.PROGRAMDATA):
        pygit2.settings.search_path[level] = ""

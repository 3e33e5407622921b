"""Hostile input, class "a command runs": manifests, repositories, a user's git config,
generated scripts and release tags must never make pinwheel (or what it writes) run one.

Each case has a sentinel: the command the hostile value carries would create MARK.
Real parts: git repositories made with the git CLI, the real git and bash, the real
loader, the recipe generator's script executed by bash with a stub engine (a Python
script that records its argv: no vLLM runs here).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gitfixture import UPSTREAM_URL, Upstream, git
from pinwheel.errors import ManifestError, PinwheelError
from pinwheel.manifest import load

SHA = "0123456789abcdef0123456789abcdef01234567"
UPSTREAM = f'[upstream]\nurl = "{UPSTREAM_URL}"\ncommit = "{SHA}"\nbranch = "main"\n'


@pytest.fixture
def mark(tmp_path: Path) -> Path:
    return tmp_path / "MARK"


@pytest.fixture
def hostile_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user whose global git config allows the ext:: transport (and names a helper)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        '[protocol "ext"]\n\tallow = always\n[protocol]\n\tallow = always\n'
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    return home


def _build_table(sources: str) -> str:
    return UPSTREAM + '\n[build]\ncuda = "12.4"\narches = ["7.0"]\n' + sources


# --------------------------------------------------------------------------- manifest URLs

BAD_SOURCES = {
    "source-url-ext": (
        f'[[build.source]]\nname = "dep"\nurl = "ext::sh -c touch% @MARK@"\ncommit = "{SHA}"\n',
        "key 'url'",
    ),
    "source-url-option": (
        f'[[build.source]]\nname = "dep"\nurl = "--upload-pack=touch @MARK@"\ncommit = "{SHA}"\n',
        "key 'url'",
    ),
    "source-url-fd": (
        f'[[build.source]]\nname = "dep"\nurl = "fd::17"\ncommit = "{SHA}"\n',
        "key 'url'",
    ),
    "source-url-plain-http-remote": (
        '[[build.source]]\nname = "dep"\nurl = "http://example.invalid/dep.git"\n'
        f'commit = "{SHA}"\n',
        "loopback",
    ),
    "submodule-url-ext": (
        f'[[build.source]]\nname = "dep"\nurl = "https://example.invalid/dep.git"\n'
        f'commit = "{SHA}"\n[[build.source.submodule]]\npath = "csrc/cutlass"\n'
        f'url = "ext::sh -c touch% @MARK@"\ncommit = "{SHA}"\n',
        "key 'url'",
    ),
    "submodule-url-option": (
        f'[[build.source]]\nname = "dep"\nurl = "https://example.invalid/dep.git"\n'
        f'commit = "{SHA}"\n[[build.source.submodule]]\npath = "csrc/cutlass"\n'
        f'url = "-oProxyCommand=touch @MARK@"\ncommit = "{SHA}"\n',
        "key 'url'",
    ),
    "submodule-path-climbs": (
        f'[[build.source]]\nname = "dep"\nurl = "https://example.invalid/dep.git"\n'
        f'commit = "{SHA}"\n[[build.source.submodule]]\npath = "../../x"\n'
        f'url = "https://example.invalid/sub.git"\ncommit = "{SHA}"\n',
        "key 'path'",
    ),
    "source-ref-option": (
        f'[[build.source]]\nname = "dep"\nurl = "https://example.invalid/dep.git"\n'
        f'commit = "{SHA}"\nref = "--upload-pack=touch"\n',
        "key 'ref'",
    ),
    "source-reason-newline": (
        '[[build.source]]\nname = "dep"\nomit = true\nreason = "x\\n## Forged"\n',
        "key 'reason'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SOURCES))
def test_build_source_values_are_validated_like_upstream_url(case, tmp_path, mark):
    table, needle = BAD_SOURCES[case]
    path = tmp_path / "m.toml"
    path.write_text(_build_table(table.replace("@MARK@", str(mark))))
    with pytest.raises(ManifestError) as err:
        load(path)
    assert needle in str(err.value), str(err.value)
    assert "next:" in str(err.value)
    assert not mark.exists()


BAD_TABLES = {
    "torch-path": ('cuda = "12.4"\narches = ["7.0"]\ntorch = "../../../x"\n', "key 'torch'"),
    "torch-newline": ('cuda = "12.4"\narches = ["7.0"]\ntorch = "2.9.1\\n--index-url"\n', "torch"),
    "env-key-shell": ('cuda = "12.4"\narches = ["7.0"]\nenv = { "A;touch x" = "1" }\n', "env"),
    "cache-size-newline": (
        'cuda = "12.4"\narches = ["7.0"]\n[build.cache]\nsize = "20G\\n"\n',
        "key 'size'",
    ),
    "runner-label-newline": (
        'cuda = "12.4"\narches = ["7.0"]\nrunner_labels = ["gpu\\nrun: x"]\n',
        "runner_labels",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_build_table_values_are_validated(case, tmp_path):
    body, needle = BAD_TABLES[case]
    path = tmp_path / "m.toml"
    path.write_text(UPSTREAM + "\n[build]\n" + body)
    with pytest.raises(ManifestError) as err:
        load(path)
    assert needle in str(err.value), str(err.value)


def test_release_tag_starting_with_dash_is_refused_at_load_and_never_an_option(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(
        UPSTREAM + '\n[release.github]\nrepo = "acme/engine"\ntag = "--notes-file=/etc/shadow"\n'
    )
    with pytest.raises(ManifestError) as err:
        load(path)
    assert "key 'tag'" in str(err.value) and "'-'" in str(err.value)


def test_github_plan_puts_the_tag_after_double_dash(tmp_path):
    from pinwheel.manifest.release import GithubTarget
    from pinwheel.release.assemble import Verified
    from pinwheel.release.targets.github import github_plan

    release = tmp_path / "release"
    release.mkdir()
    (release / "RELEASE_NOTES.md").write_text("notes\n")
    verified = Verified(dir=release, sums={"a.whl": "0" * 64}, signed_by=None)
    manifest = load(_write(tmp_path, UPSTREAM))
    plan = github_plan(verified, GithubTarget(repo="acme/engine", tag="v1.0"), manifest)
    cmd = plan["command"]
    assert cmd[cmd.index("--") + 1] == "v1.0" and cmd.index("--") > cmd.index("--notes-file")
    # A tag that reached the planner some other way (not through the loader) is refused too.
    with pytest.raises(PinwheelError, match="starts with '-'"):
        github_plan(verified, GithubTarget(repo="acme/engine", tag="--notes-file=/x"), manifest)


def _write(tmp: Path, text: str) -> Path:
    path = tmp / "plain.toml"
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- git's own config


def test_user_config_allowing_ext_never_runs_a_transport_command(tmp_path, mark, hostile_home):
    """resolve_ref of a remote URL used to opt into the user's config: ext:: then ran."""
    from pinwheel.source.cache import Cache

    cache = Cache(tmp_path / "cache", {})
    with pytest.raises(PinwheelError):
        cache.resolve_ref(f"ext::sh -c touch% {mark}", "HEAD")
    assert not mark.exists(), "the ext:: transport ran a command"


def test_lock_refuses_a_cmake_declared_ext_url_under_a_permissive_user_config(
    tmp_path, mark, hostile_home
):
    from pinwheel.source.buildpins import pin
    from pinwheel.source.buildsources import Declared
    from pinwheel.source.cache import Cache

    declared = Declared(
        name="dep", url=f"ext::sh -c touch% {mark}", ref="v1.0", url_hash=None, variables=(),
        patches=(), submodules=(), used="yes", where="CMakeLists.txt:3",
    )  # fmt: skip
    with pytest.raises(PinwheelError) as err:
        pin(declared, Cache(tmp_path / "cache", {}))
    assert "refusing URL" in err.value.what and "next" in str(err.value)
    assert not mark.exists()


@pytest.mark.parametrize(
    "url",
    ["ext::sh -c touch% @MARK@", "--upload-pack=touch @MARK@", "-oProxyCommand=x:y"],
)
def test_lock_never_pins_a_hostile_submodule_url_from_gitmodules(tmp_path, mark, url):
    """A build source's .gitmodules is repository content: validated before lock writes it."""
    from pinwheel.source.buildpins import pin
    from pinwheel.source.buildsources import Declared
    from pinwheel.source.cache import Cache

    sub = Upstream(tmp_path / "sub")
    sub_commit = sub.commit({"README": "sub\n"}, "sub")
    dep = Upstream(tmp_path / "dep")
    dep.commit({"VALUE.txt": "one\n"}, "one")
    hostile = url.replace("@MARK@", str(mark))
    (dep.work / ".gitmodules").write_text(
        f'[submodule "cutlass"]\n\tpath = csrc/cutlass\n\turl = {hostile}\n'
    )
    git(dep.work, "add", ".gitmodules")
    git(dep.work, "update-index", "--add", "--cacheinfo", f"160000,{sub_commit},csrc/cutlass")
    git(dep.work, "commit", "-q", "-m", "submodule")
    head = git(dep.work, "rev-parse", "HEAD")
    dep.publish()
    dep_url = "https://example.invalid/dep.git"
    declared = Declared(
        name="dep", url=dep_url, ref=head, url_hash=None, variables=(), patches=(),
        submodules=("csrc/cutlass",), used="yes", where="CMakeLists.txt:3",
    )  # fmt: skip
    with pytest.raises(PinwheelError) as err:
        pin(declared, Cache(tmp_path / "cache", {dep_url: str(dep.bare)}))
    assert "submodule csrc/cutlass URL" in err.value.what
    assert not mark.exists()


def _cache_repo(tmp_path: Path, key: str, value: str) -> Path:
    from pinwheel.source.cache import Cache

    cache = Cache(tmp_path / "cache", {})
    repo = cache._ensure_repo("https://example.invalid/acme/engine.git")
    subprocess.run(["git", "config", "--file", str(repo / "config"), key, value], check=True)
    return repo


def test_cache_repo_config_naming_fsck_skiplist_is_refused_and_never_read(tmp_path, capsys):
    secret = tmp_path / "secret"
    secret.write_text("TOP-SECRET-LINE\n")
    _cache_repo(tmp_path, "fsck.skipList", str(secret))
    from pinwheel.cli import main

    rc = main(["--cache", str(tmp_path / "cache"), "cache", "verify"])
    out = capsys.readouterr()
    assert "TOP-SECRET-LINE" not in out.out + out.err
    assert rc != 0 and "fsck.skiplist" in (out.out + out.err)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("core.fsmonitor", "touch @MARK@; false"),
        ("core.hooksPath", "@HOOKS@"),
        ("core.sshCommand", "touch @MARK@; false"),
        ("include.path", "@MARK@.cfg"),
    ],
)
def test_repository_config_naming_a_command_or_file_is_refused(tmp_path, mark, key, value):
    """A worktree of a cache repository: `git add -A` refreshes the index (fsmonitor runs)."""
    from pinwheel.source import gitcli

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "post-index-change").write_text(f"#!/bin/sh\ntouch {mark}\n")
    (hooks / "post-index-change").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    (work / "a.txt").write_text("a\n")
    value = value.replace("@MARK@", str(mark)).replace("@HOOKS@", str(hooks))
    subprocess.run(["git", "config", "--file", str(work / ".git/config"), key, value], check=True)
    with pytest.raises(PinwheelError) as err:
        gitcli.git(["add", "-A"], cwd=work)
    assert key.lower() in err.value.what and "next" in str(err.value)
    assert not mark.exists()


def test_libgit2_reads_no_global_config(tmp_path, hostile_home):
    """libgit2 fixes its search paths when it starts: a fresh interpreter with that HOME."""
    (hostile_home / ".gitconfig").write_text("[user]\n\tname = Global Mallory\n")
    probe = (
        "import sys\nfrom pinwheel.source.libgit2 import pygit2\n"
        "repo = pygit2.init_repository(sys.argv[1], bare=True)\n"
        "print('user.name' in repo.config)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "r")],
        env={**os.environ, "HOME": str(hostile_home)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- serve recipes

STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as fh:
    fh.write(json.dumps({{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in
        ("CUDA_VISIBLE_DEVICES", "SAFE", "ALSO")}}}}) + "\\n")
"""

SERVE = """
[serve]
recipe = "{recipe}"
env_prefix = "M"
default = {default}
[serve.env]
{env}
[serve.profile.{profile}]
gpus = 0
max_model_len = 64
max_num_seqs = 2
args = {args}
{devices}
"""

# Values a manifest may hold: they must reach the engine literally, never as shell code.
SAFE_BUT_NASTY = dict(
    recipe="serve.sh",
    default='"cpu"',
    profile="cpu",
    env='SAFE = "$(touch @MARK@)`touch @MARK@`\'; touch @MARK@ #"\nALSO = "a b \\" c"',
    args='["--x=$(touch @MARK@)", "--y", "; touch @MARK@"]',
    devices='devices = "0,1"',
)

# Values that cannot be written safely as a word of a script: refused at load.
HOSTILE = {
    "default-profile-substitution": dict(profile='"$(touch @MARK@)"', default='"$(touch @MARK@)"'),
    "profile-name-quote": dict(profile='"a\'b"', default='"a\'b"'),
    "devices-injection": dict(devices='devices = "0}\\"; touch @MARK@; : \\"{"'),
    "env-key-injection": dict(env='"X=1; touch @MARK@; Y" = "v"'),
    "env-value-newline": dict(env='SAFE = "a\\ntouch @MARK@"'),
    "recipe-path-newline": dict(recipe="x\\ntouch @MARK@\\n.sh"),
    "recipe-path-quote": dict(recipe="x'$(touch @MARK@)'.sh"),
    "args-newline": dict(args='["--x\\ntouch @MARK@"]'),
}


def _serve_manifest(tmp: Path, mark: Path, **over: str) -> Path:
    values = {**SAFE_BUT_NASTY, **over}
    text = UPSTREAM + SERVE.format(**values)
    path = tmp / "m.toml"
    path.write_text(text.replace("@MARK@", str(mark)))
    return path


def _run_recipe(tmp: Path, recipe: Path) -> list[dict]:
    stub = tmp / "engine"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    log = tmp / "engine.log"
    env = {"PATH": os.environ["PATH"], "PYTHON": str(stub), "M_MODEL": str(tmp / "model"),
           "STUB_LOG": str(log)}  # fmt: skip
    proc = subprocess.run(["bash", str(recipe)], env=env, capture_output=True, text=True, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    import json

    return [json.loads(line) for line in log.read_text().splitlines()]


def test_recipe_passes_nasty_values_to_the_engine_literally(tmp_path, mark):
    from pinwheel.serve.recipe import render_recipe

    m = load(_serve_manifest(tmp_path, mark))
    recipe = tmp_path / "serve.sh"
    recipe.write_text(render_recipe(m.serve, m.path.name))
    (call,) = _run_recipe(tmp_path, recipe)
    assert not mark.exists(), "the recipe ran a command from a manifest value"
    assert f"--x=$(touch {mark})" in call["argv"] and f"; touch {mark}" in call["argv"]
    assert call["env"]["SAFE"] == f"$(touch {mark})`touch {mark}`'; touch {mark} #"
    assert call["env"]["ALSO"] == 'a b " c' and call["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_recipe_from_a_hostile_manifest_never_runs_a_command(case, tmp_path, mark):
    """Either the loader refuses the value (and says where), or the generated script, run
    with a stub engine, runs nothing but the engine."""
    from pinwheel.serve.recipe import render_recipe

    path = _serve_manifest(tmp_path, mark, **HOSTILE[case])
    try:
        m = load(path)
    except ManifestError as err:
        assert "[serve" in str(err) and "next:" in str(err)
        return
    recipe = tmp_path / "serve.sh"
    recipe.write_text(render_recipe(m.serve, m.path.name))
    _run_recipe(tmp_path, recipe)
    assert not mark.exists(), "the recipe ran a command from a manifest value"


def test_recipe_generator_refuses_unsafe_words_it_is_handed_directly(tmp_path, mark):
    """The generator's own fence: a config built without the loader still cannot inject."""
    import dataclasses

    from pinwheel.serve.recipe import render_recipe

    m = load(_serve_manifest(tmp_path, mark))
    bad_profile = dataclasses.replace(m.serve.profiles[0], name=f"$(touch {mark})")
    cases = [
        dataclasses.replace(m.serve, default_profile=f"$(touch {mark})"),
        dataclasses.replace(m.serve, profiles=(bad_profile,), default_profile=bad_profile.name),
        dataclasses.replace(m.serve, env=((f"X;touch {mark};Y", "v"),)),
        dataclasses.replace(m.serve, env=(("SAFE", "a\ntouch x"),)),
    ]
    for config in cases:
        with pytest.raises(ValueError, match="shell recipe"):
            render_recipe(config, "m.toml")
    text = render_recipe(m.serve, f"m\ntouch {mark}\n.toml")
    assert f"\ntouch {mark}" not in text  # the manifest's file name stays inside a comment

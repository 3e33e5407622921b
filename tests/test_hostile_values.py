"""Hostile input, class 3: values that used to reach int() or a URL parser raw.

One table per value kind (ports, counts, sizes, Content-Length, hosts and IPv6
literals, URLs), each applied with fullmatch: a trailing newline, a sign, an
underscore, a non-ASCII digit or a value out of range is refused with the reason.
Then the places that read them: the manifest ([build] torch_index, [build.cache]
size), the environment (SCCACHE_CACHE_SIZE; PORT and <PREFIX>_SEQS in the
generated recipe, run by a real bash), a server URL, and HTTP headers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pinwheel import validate
from pinwheel.errors import PinwheelError, UsageError
from pinwheel.options import host as host_of

ROOT = Path(__file__).parents[1]

PORTS_GOOD = {"1": 1, "8000": 8000, "65535": 65535, 443: 443}
PORTS_BAD = [
    "0", "65536", "80\n", " 80", "80 ", "+80", "-1", "8_0", "0x50", "", "\u0663",
    "99999999999999999999999", True, 80.0, None, 0, 70000, -5,
]  # fmt: skip


@pytest.mark.parametrize(("value", "want"), sorted(PORTS_GOOD.items(), key=str))
def test_ports_in_range_are_read(value, want):
    assert validate.port(value) == want


@pytest.mark.parametrize("value", PORTS_BAD, ids=repr)
def test_other_ports_are_refused(value):
    with pytest.raises(ValueError, match="port"):
        validate.port(value)


SIZES_GOOD = {"20G": 20 << 30, "500M": 500 << 20, "1": 1, "3T": 3 << 40, "64K": 64 << 10}
SIZES_BAD = ["20G\n", "-1G", "1.5G", "20GB", "20 G", " 20G", "0", "0G", "", "G", "1e3", "20g",
             "\u0662\u0660G", "9" * 16]  # fmt: skip


@pytest.mark.parametrize(("value", "want"), sorted(SIZES_GOOD.items()))
def test_sizes_are_read_in_powers_of_1024(value, want):
    assert validate.size(value) == want


@pytest.mark.parametrize("value", SIZES_BAD, ids=repr)
def test_other_sizes_are_refused(value):
    with pytest.raises(ValueError):
        validate.size(value)


LENGTHS_GOOD = {"0": 0, "123": 123, " 12\t": 12}
LENGTHS_BAD = ["abc", "-1", "1,2", "12a", "", "\u0661\u0662", "0x10", "+5", "1e3", "1 2",
               "9" * 20]  # fmt: skip


@pytest.mark.parametrize(("value", "want"), sorted(LENGTHS_GOOD.items()))
def test_content_lengths_are_read(value, want):
    assert validate.content_length(value) == want


@pytest.mark.parametrize("value", LENGTHS_BAD, ids=repr)
def test_other_content_lengths_are_refused(value):
    with pytest.raises(ValueError, match="byte count"):
        validate.content_length(value)


HOSTS_GOOD = {
    "localhost": "localhost",
    "127.0.0.1": "127.0.0.1",
    "::1": "[::1]",
    "[::1]": "[::1]",
    "[2001:db8:0:0:0:0:0:1]": "[2001:db8::1]",
    "fe80::1%eth0": "[fe80::1%eth0]",
    "download.pytorch.org": "download.pytorch.org",
}
HOSTS_BAD = ["[example.com]", "::g", "exa mple", "-bad.com", "a" * 64 + ".com", "host\n",
             "[::1", "1:2:3:4:5:6:7:8:9", "fe80::1%eth 0", "", "a..b"]  # fmt: skip


@pytest.mark.parametrize(("value", "want"), sorted(HOSTS_GOOD.items()))
def test_hosts_and_ipv6_literals_are_read(value, want):
    assert validate.host(value) == want


@pytest.mark.parametrize("value", HOSTS_BAD, ids=repr)
def test_other_hosts_are_refused(value):
    with pytest.raises(ValueError):
        validate.host(value)


URLS_GOOD = ["https://download.pytorch.org/whl/cu128", "http://[::1]:8000/v1",
             "http://127.0.0.1:8000", "https://[2001:db8::1]/simple/"]  # fmt: skip
URLS_BAD = {
    "https://download.pytorch.org/whl/cu128\n": "whitespace",
    " https://x.org": "whitespace",
    "ftp://x.org/": "not a https or http URL",
    "https://": "names no host",
    "https://x.org:99999/": "out of range",
    "https://x.org:abc/": "abc",
    "https://user:pw@x.org/": "credentials",
    "https://[::g]/": "IPv6",
    "http://x.org:0/": "port 0",
    "https://exa_mple.org/": "not a host name",
    "https://x.org/\x00": "control",
    "": "empty",
}


@pytest.mark.parametrize("value", URLS_GOOD)
def test_http_urls_are_read(value):
    assert validate.http_url(value) == value


@pytest.mark.parametrize("value", sorted(URLS_BAD), ids=repr)
def test_other_urls_are_refused(value):
    with pytest.raises(ValueError, match=re.escape(URLS_BAD[value])):
        validate.http_url(value)


# --------------------------------------------------------------------------- where they are read


def _manifest(tmp_path: Path, edit) -> Path:
    text = edit((ROOT / "manifest.toml").read_text())
    for src in ROOT.iterdir():
        if src.name == "locks":  # hashed locks must resolve inside the manifest's folder
            shutil.copytree(src, tmp_path / src.name)
        elif src.name != "manifest.toml" and not src.name.startswith("."):
            (tmp_path / src.name).symlink_to(src)
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    return path


def _cache_endpoint(url: str):
    return lambda t: t + f'\n[build.cache]\nbackend = "redis"\nendpoint = "{url}"\n'


# manifest edit -> the key the error names
def _index(url: str):
    return lambda t: t.replace("[build]\n", f'[build]\ntorch_index = "{url}"\n', 1)


def _cache_size(size: str):
    return lambda t: t + f'\n[build.cache]\nsize = "{size}"\n'


# manifest edit -> the key the error names
def _sigstore(key: str, value: str):
    return lambda text: text + f'\n[release.sigstore]\n{key} = "{value}"\n'


MANIFEST_VALUES = {
    "torch_index with a trailing newline": (
        _index("https://download.pytorch.org/whl/cu128\\n"), "torch_index"),
    "torch_index over http": (_index("http://download.pytorch.org/whl/cu128"), "torch_index"),
    "torch_index port out of range": (_index("https://x.org:70000/whl"), "torch_index"),
    "torch_index with credentials": (_index("https://u:p@x.org/whl"), "torch_index"),
    "torch_index IPv6 that is not": (_index("https://[::g]/whl"), "torch_index"),
    "cache size with a trailing newline": (_cache_size("20G\\n"), "size"),
    "cache size negative": (_cache_size("-1G"), "size"),
    "cache size fractional": (_cache_size("1.5G"), "size"),
    "cache endpoint port out of range": (_cache_endpoint("redis://cache.internal:99999"), "endpoint"),
    "cache endpoint port not a number": (_cache_endpoint("redis://cache.internal:63x9"), "endpoint"),
    "cache endpoint scheme": (_cache_endpoint("ftp://cache.internal"), "endpoint"),
    "cache endpoint IPv6 that is not": (_cache_endpoint("redis://[::g]:6379"), "endpoint"),
    "cache endpoint with a newline": (_cache_endpoint("redis://cache.internal:6379\\n"), "endpoint"),
    "sigstore workflow climbing out": (_sigstore("workflow", "../../evil.yml"), "workflow"),
    "sigstore workflow outside .github": (_sigstore("workflow", "release.yml"), "workflow"),
    "sigstore workflow with a newline": (_sigstore("workflow", ".github/workflows/r.yml\\n"), "workflow"),
    "sigstore issuer over http": (_sigstore("issuer", "http://token.actions.githubusercontent.com"), "issuer"),
    "sigstore repository with a path": (_sigstore("repository", "a/b/c"), "repository"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MANIFEST_VALUES))
def test_manifest_values_are_checked_at_load(case, tmp_path, capsys):
    from pinwheel.cli import main

    edit, key = MANIFEST_VALUES[case]
    good = (ROOT / "manifest.toml").read_text()
    assert edit(good) != good, "the edit must change the manifest"
    path = _manifest(tmp_path, edit)
    rc = main(["--manifest", str(path), "plan", "--offline"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and f"key '{key}'" in err and "next:" in err, err


@pytest.mark.parametrize("value", ["10G\n", "-1", "lots", "1.5G"])
def test_sccache_cache_size_from_the_environment_is_checked(value, tmp_path):
    from pinwheel.compile import compcache
    from pinwheel.manifest.build import CacheConfig

    with pytest.raises(UsageError, match="SCCACHE_CACHE_SIZE") as err:
        compcache.plan(CacheConfig(), tmp_path, host_of({"SCCACHE_CACHE_SIZE": value}))
    assert "20G" in (err.value.next or "")
    ok = compcache.plan(CacheConfig(), tmp_path, host_of({"SCCACHE_CACHE_SIZE": "10G"}))
    assert ok.server_env["SCCACHE_CACHE_SIZE"] == "10G"


# (variable, value) -> the generated recipe refuses it before exec
RECIPE_ENV = [
    ("PORT", "0"), ("PORT", "65536"), ("PORT", "080"), ("PORT", "abc"), ("PORT", "8000 --x"),
    ("PORT", "123456"), ("PORT", "-1"), ("GLM53_SEQS", "abc"), ("GLM53_SEQS", "0"),
    ("GLM53_SEQS", ""), ("GLM53_SEQS", "4; rm -rf /"), ("GLM53_SEQS", "1000000"),
]  # fmt: skip


def _recipe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ["PATH"], "GLM53_MODEL": "/models/glm", "PYTHON": "echo", **env}
    return subprocess.run(
        ["bash", str(ROOT / "recipes" / "serve_glm53.sh"), "card"],
        env=full, capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(("var", "value"), RECIPE_ENV)
def test_the_recipe_refuses_bad_ports_and_counts_from_the_environment(var, value):
    out = _recipe({var: value})
    assert out.returncode == 2 and f"{var}={value}" in out.stderr and not out.stdout


def test_the_recipe_passes_good_values_through():
    out = _recipe({"PORT": "65535", "GLM53_SEQS": "8"})
    assert out.returncode == 0, out.stderr
    assert "--port 65535" in out.stdout and "--max-num-seqs 8" in out.stdout


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:99999", "http://h:abc", "ftp://h", "http://:80", "http://h:0"]
)
def test_a_bad_server_url_is_refused_before_connecting(url):
    from pinwheel.serve.client import Client

    with pytest.raises(PinwheelError, match="bad server URL") as err:
        Client(url)
    assert "--url" in (err.value.next or "")


def test_an_ipv6_server_url_is_read():
    from pinwheel.serve.client import Client

    c = Client("http://[::1]:8123")
    assert (c._host, c._port) == ("::1", 8123)


@pytest.mark.parametrize(
    ("header", "want"),
    [("bytes 5-9/10", 5), ("bytes 5-9/*", 5), ("bytes 5-9/10 junk", None), ("bytes -5-9/10", None),
     ("bytes 5-9/10\nX", None), ("bytes \u0665-9/10", None)],
)  # fmt: skip
def test_content_range_is_read_with_fullmatch(header, want):
    from pinwheel.release.download import _content_range_start

    assert _content_range_start(header) == want


@pytest.mark.parametrize("endpoint", ["redis://h:99999", "redis://h:abc", "redis://[::1]:70000"])
def test_a_bad_endpoint_from_the_environment_is_a_probe_answer_not_a_traceback(endpoint):
    from pinwheel.compile.compcache import _tcp

    assert "cannot read a port" in (_tcp(endpoint, 6379) or "")


# what `pinwheel serve` / `qualify` read from the environment and flags before launch()
SERVE_ENV = {
    "PORT=abc": ({"PORT": "abc"}, None, "$PORT"),
    "PORT=0": ({"PORT": "0"}, None, "$PORT"),
    "PORT=70000": ({"PORT": "70000"}, None, "$PORT"),
    "PORT with a newline": ({"PORT": "8000\n"}, None, "$PORT"),
    "--port 65536": ({}, 65536, "--port"),
    "--port -1": ({}, -1, "--port"),
}


@pytest.mark.parametrize("case", sorted(SERVE_ENV))
def test_serve_ports_from_the_environment_and_flags_are_checked(case, tmp_path):
    import argparse

    from pinwheel.cli import Context
    from pinwheel.cli.serve_cmds import _port

    env, flag, where = SERVE_ENV[case]
    ctx = Context(manifest_path=tmp_path / "m.toml", cache=tmp_path, mirrors={}, json=False,
                  offline=True, environ=env)  # fmt: skip
    with pytest.raises(UsageError) as err:
        _port(ctx, argparse.Namespace(port=flag))
    assert err.value.where == where and "port" in err.value.what and err.value.next


@pytest.mark.parametrize("value", ["abc", "0", "100000", "4 ", "-2", "\u0664"])
def test_serve_seqs_from_the_environment_are_checked(value, tmp_path):
    from pinwheel.cli import Context
    from pinwheel.cli.serve_cmds import _seqs

    ctx = Context(manifest_path=tmp_path / "m.toml", cache=tmp_path, mirrors={}, json=False,
                  offline=True, environ={"GLM53_SEQS": value})  # fmt: skip
    with pytest.raises(UsageError) as err:
        _seqs(ctx, "GLM53_SEQS")
    assert err.value.where == "$GLM53_SEQS"
    ok = Context(manifest_path=tmp_path / "m.toml", cache=tmp_path, mirrors={}, json=False,
                 offline=True, environ={"GLM53_SEQS": "8"})  # fmt: skip
    assert _seqs(ok, "GLM53_SEQS") == 8


# --------------------------------------------------------------------------- member names
# The one name rule (archive members, SHA256SUMS entries, model-pack shards, manifest paths).

MEMBERS_GOOD = ["a.whl", "pkg/mod.py", "a/b/c.so", "...", "a..b", "x/.hidden", "\u00e9t\u00e9.txt"]
MEMBERS_BAD = {
    "": "empty",
    "/etc/passwd": "absolute",
    "C:/x": "absolute",
    "c:\\x": "absolute",
    "\\\\server\\share": "absolute",
    "../x": "'..'",
    "a/../../x": "'..'",
    "a\\..\\x": "'..'",
    "a/..": "'..'",
    "a\x00b": "NUL",
    "a\nb": "control",
    "a\x1b[31m": "control",
    "a\x7f": "control",
}


@pytest.mark.parametrize("name", MEMBERS_GOOD)
def test_names_that_stay_inside_their_folder_pass(name):
    assert validate.member_problem(name) is None


@pytest.mark.parametrize(("name", "why"), sorted(MEMBERS_BAD.items()), ids=repr)
def test_names_that_reach_outside_are_refused_with_the_reason(name, why):
    problem = validate.member_problem(name)
    assert problem is not None and why.lower() in problem.lower(), problem


def test_every_reader_applies_the_one_name_rule():
    from pinwheel.checksums import _unsafe_name

    for name in MEMBERS_BAD:
        assert _unsafe_name(name, flat=False) is not None, name
        assert validate.rel_path_problem(name) is not None, name


# --------------------------------------------------------------------------- versions (PEP 440)

VERSIONS_GOOD = ["2.9.1", "2.9.1+cu128", "1.5.2.dev1486", "1!2.0", "2.9.1rc1", "0.4.post2"]
VERSIONS_BAD = [
    "2.9.1\n", " 2.9.1", "2.9.1 ", "abc", "2.9.1+", "1.0+cu 128", "\u0662.\u0660", "1.0\x00",
    "", "-1.0", "1.0 --index-url x", None, 2.9,
]  # fmt: skip


@pytest.mark.parametrize("value", VERSIONS_GOOD)
def test_pep440_versions_pass(value):
    assert validate.version_problem(value) is None


@pytest.mark.parametrize("value", VERSIONS_BAD, ids=repr)
def test_other_versions_are_refused(value):
    assert validate.version_problem(value) is not None

"""`[serve.runtime]`: the serving venv's pinned wheels, checked by `pinwheel preflight`.

The pin is parsed like every manifest table (file:line errors at load); the GB10
manifest carries the card's wheel repository with every value the card does not give
left as FILL IN. Preflight reads a real venv (``python -m venv``, a wheel installed by
real pip from a file, so ``direct_url.json`` holds its sha256): a matching pin passes,
a FILL IN is named unverified, a differing version or hash fails naming the
distribution, the manifest key and the next command. The venv is a tree someone else
filled: a linked dist-info, control characters and a 5,000-digit version in METADATA
are refused, never followed or printed raw.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pinwheel.checksums import sha256_file
from pinwheel.cli import main
from pinwheel.errors import ManifestError
from pinwheel.manifest import model
from pinwheel.serve.preflight import FAIL, OK, WARN, Options, check_runtime_pin
from releasekit import make_wheel

pytestmark = pytest.mark.release

ROOT = Path(__file__).resolve().parent.parent
CPU = ROOT / "tests" / "fixtures" / "qualify-cpu.toml"


def _manifest(tmp_path: Path, runtime: str) -> model.Manifest:
    path = tmp_path / "manifest.toml"
    path.write_text(CPU.read_text() + "\n" + runtime)
    return model.load(path)


def _runtime(version: str | None = None, sha256: str | None = None, name: str = "pwrt",
             revision: str | None = None) -> str:  # fmt: skip
    lines = ["[serve.runtime]", 'repo = "owner/runtime-wheels"']
    if revision is not None:
        lines.append(f'revision = "{revision}"')
    lines += ["", "[[serve.runtime.wheel]]", f'name = "{name}"']
    if version is not None:
        lines.append(f'version = "{version}"')
    if sha256 is not None:
        lines.append(f'sha256 = "{sha256}"')
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> tuple[Path, Path]:
    """A real venv with the wheel pwrt 1.0 installed by pip from a file."""
    base = tmp_path_factory.mktemp("rt")
    wheel = make_wheel(base / "wheels", "pwrt", "1.0", payload=500, seed=3)
    env = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin/python"), "install",
                    "-q", "--no-index", "--disable-pip-version-check", str(wheel)],
                   check=True)  # fmt: skip
    return env, wheel


def _copy(venv: Path, tmp_path: Path) -> Path:
    """A copy of the venv to make hostile (bin/python stays a link, as venv made it)."""
    out = tmp_path / "venv"
    shutil.copytree(venv, out, symlinks=True)
    return out


def _dist_info(env: Path) -> Path:
    (found,) = env.glob("lib/python3.*/site-packages/pwrt-1.0.dist-info")
    return found


def _check(m: model.Manifest, env: Path):
    serve = m.serve
    assert serve is not None
    opts = Options(profile=serve.profile(), config=serve, python=str(env / "bin/python"),
                   model=None, devices=())  # fmt: skip
    return check_runtime_pin(opts)


# --------------------------------------------------------------------------- the manifest


def test_the_gb10_manifest_pins_the_cards_wheels_and_leaves_the_rest_fill_in():
    m = model.load(ROOT / "recipes" / "gb10-k2" / "manifest.toml")
    pin = m.serve.runtime
    assert pin is not None
    assert pin.repo == "vcruz305/GLM-5.3-Flash-EXL3-K2-spark-vllm" and pin.revision is None
    assert [(w.name, w.version, w.sha256) for w in pin.wheels] == [
        ("vllm", None, None), ("exllamav3", None, None)]  # fmt: skip
    text = (ROOT / "recipes" / "gb10-k2" / "manifest.toml").read_text()
    for key in ("revision", "version", "sha256"):
        assert f"# {key}: FILL IN:" in text
    assert pin.wheels[0].where.startswith("manifest.toml:")  # a line to edit


@pytest.mark.parametrize(
    ("runtime", "said"),
    [
        (_runtime(version="1.0\\u001b[2J"), "key 'version'"),  # a control character
        (_runtime(version="1." + "9" * 5000), "key 'version'"),  # a huge number
        (_runtime(sha256="abc"), "key 'sha256'"),
        (_runtime(name="-e"), "key 'name'"),
        (_runtime() + '\n[[serve.runtime.wheel]]\nname = "PWRT"\n', "each distribution once"),
        ('[serve.runtime]\nrepo = "owner/x"\n', "key 'wheel'"),
        ('[serve.runtime]\nrepo = "owner/x"\nrevision = "abc1234"\n[[serve.runtime.wheel]]\n'
         'name = "a"\n', "key 'revision'"),
        (_runtime().replace("repo =", "url ="), "unknown key 'url'"),
    ],
)
def test_a_bad_pin_is_a_manifest_error_with_its_line(tmp_path, runtime, said):
    with pytest.raises(ManifestError) as err:
        _manifest(tmp_path, runtime)
    assert said in str(err.value) and "manifest.toml:" in err.value.where


# --------------------------------------------------------------------------- preflight


def test_a_matching_pin_is_verified(venv, tmp_path):
    env, wheel = venv
    check = _check(_manifest(tmp_path, _runtime("1.0", sha256_file(wheel), revision="a" * 40)),
                   env)  # fmt: skip
    assert check.status == OK, check
    assert f"[serve.runtime] owner/runtime-wheels@{'a' * 40} in {env}" in check.detail
    assert "verified pwrt 1.0 (version, sha256)" in check.detail
    assert "unverified" not in check.detail


def test_fill_in_values_are_named_unverified(venv, tmp_path):
    env, _wheel = venv
    check = _check(_manifest(tmp_path, _runtime()), env)
    assert check.status == WARN
    assert "revision is FILL IN" in check.detail
    assert "pwrt 1.0: version is FILL IN (manifest.toml:" in check.detail
    assert "pwrt 1.0: sha256 is FILL IN (manifest.toml:" in check.detail
    assert "verified nothing" in check.detail and "pinwheel preflight" in check.next


def test_a_wrong_version_fails_naming_the_distribution_key_and_next_command(venv, tmp_path):
    env, wheel = venv
    m = _manifest(tmp_path, _runtime("1.1", sha256_file(wheel)))
    check = _check(m, env)
    assert check.status == FAIL
    line = next(n for n, ln in enumerate(m.path.read_text().splitlines(), 1)
                if ln == 'version = "1.1"')  # fmt: skip
    assert check.detail.startswith("pwrt: the venv has 1.0, the manifest pins 1.1 "
                                   f"(manifest.toml:{line}: [[serve.runtime.wheel]] #1 key "
                                   "'version')")  # fmt: skip
    assert "pip install --no-deps --force-reinstall pwrt-*.whl" in check.next
    assert "pinwheel preflight" in check.next


def test_a_wrong_sha256_fails(venv, tmp_path):
    env, wheel = venv
    check = _check(_manifest(tmp_path, _runtime("1.0", "0" * 64)), env)
    assert check.status == FAIL
    assert f"installed from a wheel of sha256 {sha256_file(wheel)}" in check.detail
    assert "key 'sha256'" in check.detail


def test_a_wheel_that_is_not_installed_fails(venv, tmp_path):
    env, _wheel = venv
    check = _check(_manifest(tmp_path, _runtime(name="vllm")), env)
    assert check.status == FAIL and "vllm is not installed in" in check.detail


def test_an_index_install_records_no_hash_and_says_so(venv, tmp_path):
    """pip writes no direct_url.json for an index install: the hash is unverified."""
    env = _copy(venv[0], tmp_path)
    (_dist_info(env) / "direct_url.json").unlink()
    check = _check(_manifest(tmp_path, _runtime("1.0", sha256_file(venv[1]))), env)
    assert check.status == WARN
    assert "pwrt 1.0: the venv records no sha256 for it" in check.detail
    assert "verified pwrt 1.0 (version)" in check.detail


@pytest.mark.parametrize("same", [True, False], ids=["matching", "other-bytes"])
def test_the_install_lock_gives_the_hash_where_direct_url_json_has_none(venv, tmp_path, same):
    """A venv `pinwheel install` made from a lock: the lock's wheel for the installed name,
    version and tags is the hash, the way runtime-lock reads it."""
    from pinwheel.release import envlock, pylock

    env = _copy(venv[0], tmp_path)
    (_dist_info(env) / "direct_url.json").unlink()
    sha = sha256_file(venv[1])
    locked = pylock.LockedFile("pwrt-1.0-py3-none-any.whl",
                               "https://wheels.invalid/pwrt-1.0-py3-none-any.whl",
                               sha if same else "e" * 64)  # fmt: skip
    lock = envlock.EnvLock(env, None, (envlock.Pinned("pwrt", "1.0", (locked,), "lock"),), (),
                           (), ())  # fmt: skip
    (env / "pylock.pinwheel-resolved.toml").write_text(envlock.render(lock))
    check = _check(_manifest(tmp_path, _runtime("1.0", sha, revision="b" * 40)), env)
    if same:
        assert check.status == OK and "verified pwrt 1.0 (version, sha256)" in check.detail
    else:
        assert check.status == FAIL
        assert f"installed from a wheel of sha256 {'e' * 64}, the manifest pins {sha}" in (
            check.detail)


def test_a_python_outside_a_venv_fails(tmp_path):
    m = _manifest(tmp_path, _runtime("1.0"))
    serve = m.serve
    opts = Options(profile=serve.profile(), config=serve, python=str(tmp_path / "python"),
                   model=None, devices=())  # fmt: skip
    check = check_runtime_pin(opts)
    assert check.status == FAIL and "not in a venv" in check.detail and "--python" in check.next


# --------------------------------------------------------------------------- hostile venvs


def test_a_linked_dist_info_is_refused_not_followed(venv, tmp_path):
    env = _copy(venv[0], tmp_path)
    info = _dist_info(env)
    elsewhere = tmp_path / "elsewhere.dist-info"
    shutil.move(info, elsewhere)
    os.symlink(elsewhere, info)
    check = _check(_manifest(tmp_path, _runtime("1.0")), env)
    assert check.status == FAIL
    assert "pwrt: its dist-info 'pwrt-1.0.dist-info'" in check.detail and "link" in check.detail


def test_a_linked_metadata_is_refused(venv, tmp_path):
    env = _copy(venv[0], tmp_path)
    meta = _dist_info(env) / "METADATA"
    (tmp_path / "other").write_text("Metadata-Version: 2.1\nName: pwrt\nVersion: 1.0\n")
    meta.unlink()
    os.symlink(tmp_path / "other", meta)
    check = _check(_manifest(tmp_path, _runtime("1.0")), env)
    assert check.status == FAIL and "refused" in check.detail


@pytest.mark.parametrize(
    "version", ["1.0\x1b[2J\x07", "1." + "9" * 5000], ids=["control", "huge"]
)
def test_a_hostile_version_in_metadata_is_refused_and_never_printed_raw(venv, tmp_path, version):
    env = _copy(venv[0], tmp_path)
    meta = _dist_info(env) / "METADATA"
    text = meta.read_text()
    meta.write_text(text.replace("Version: 1.0\n", f"Version: {version}\n", 1))
    check = _check(_manifest(tmp_path, _runtime("1.0")), env)
    assert check.status == FAIL and "refused" in check.detail and "Version" in check.detail
    assert "\x1b" not in check.detail and "\x07" not in check.detail
    assert len(check.detail) < 1000


def test_a_huge_number_in_direct_url_json_is_refused(venv, tmp_path):
    env = _copy(venv[0], tmp_path)
    url = _dist_info(env) / "direct_url.json"
    url.write_text(url.read_text()[:-1].rstrip().rstrip("}") + ', "n": 1' + "0" * 5000 + "}}")
    check = _check(_manifest(tmp_path, _runtime("1.0")), env)
    assert check.status == FAIL and "direct_url.json" in check.detail


# --------------------------------------------------------------------------- the command


def test_preflight_fails_on_a_mismatch_and_names_the_key(venv, tmp_path, capsys):
    env, wheel = venv
    m = _manifest(tmp_path, _runtime("2.0", sha256_file(wheel)))
    code = main(["preflight", "--manifest", str(m.path), "--python", str(env / "bin/python")])
    assert code == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "runtime pin: pwrt: the venv has 1.0, the manifest pins 2.0" in err
    assert "[[serve.runtime.wheel]] #1 key 'version'" in err

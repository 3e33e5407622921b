"""Hostile input, class "trusted unverified, leaked or forged": a provenance the verified
SHA256SUMS does not cover, values in it that would become pip options, credentials in
URLs that reach receipts, notes and error lines, and untrusted text that forges
Markdown sections in RELEASE_NOTES.md and report.md.

Real parts: real wheels and files, the real install path with the installer's process
calls recorded (no package index is reachable here: the recorded argv is what pip or
uv would have run), the CLI's main(), the real report and notes renderers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from pinwheel.checksums import sha256_file
from pinwheel.cli import main
from pinwheel.errors import VerifyError
from pinwheel.release import install as install_mod
from releasekit import make_wheel, write_manifest, write_provenance

WHEEL = "exllamav3-0.0.43-py3-none-any.whl"
EVIL_INDEX = "https://evil.example.invalid/simple"


def _release(tmp: Path, torch: dict, *, listed: bool, tamper: bool = False) -> tuple[Path, dict]:
    rel = tmp / "rel"
    rel.mkdir()
    make_wheel(rel, "exllamav3", "0.0.43")
    prov = rel / "provenance.json"
    prov.write_text(json.dumps({"schema": "pinwheel.provenance/1", "torch": torch}))
    sums = {WHEEL: sha256_file(rel / WHEEL)}
    if listed:
        sums["provenance.json"] = sha256_file(prov)
    if tamper:  # changed after SHA256SUMS was made (and verified)
        prov.write_text(json.dumps({"torch": {"version": "2.1.0", "index": EVIL_INDEX}}))
    return rel, sums


def _install(monkeypatch, rel: Path, sums: dict) -> list[list[str]]:
    seen: list[list[str]] = []
    monkeypatch.setattr(install_mod, "verify_release",
                        lambda *a, **k: SimpleNamespace(sums=sums, signed_by=None))  # fmt: skip
    monkeypatch.setattr(install_mod, "find_uv", lambda: None)
    monkeypatch.setattr(install_mod, "_ensure_venv", lambda *a: [])
    monkeypatch.setattr(install_mod, "_run",
                        lambda cmd, what, venv: seen.append(list(cmd)) or tuple(cmd))  # fmt: skip
    install_mod.install(
        install_mod.InstallRequest(rel, rel.parent / "venv", torch_backend=None, installer="pip",
                                   allow_unsigned=True)  # fmt: skip
    )
    return seen


def test_install_ignores_a_provenance_the_verified_sums_do_not_list(tmp_path, monkeypatch):
    rel, sums = _release(tmp_path, {"version": "2.9.1", "index": EVIL_INDEX}, listed=False)
    seen = _install(monkeypatch, rel, sums)
    assert seen, "install ran nothing"
    assert not any(EVIL_INDEX in arg for cmd in seen for arg in cmd), (
        "pip asked an unverified index"
    )


def test_install_refuses_a_provenance_changed_after_its_sums(tmp_path, monkeypatch):
    rel, sums = _release(tmp_path, {"version": "2.9.1"}, listed=True, tamper=True)
    with pytest.raises(VerifyError, match="differs from the verified SHA256SUMS"):
        _install(monkeypatch, rel, sums)


@pytest.mark.parametrize(
    ("torch", "needle"),
    [
        ({"version": "2.9.1\n--index-url=https://evil.example.invalid/simple"}, "version"),
        ({"version": "--index-url=https://evil.example.invalid/simple"}, "version"),
        ({"version": "2.9.1", "index": "http://evil.example.invalid/simple"}, "index"),
        ({"version": "2.9.1", "index": "--extra-index-url=x"}, "index"),
        ({"version": "2.9.1", "index": "file:///etc"}, "index"),
    ],
)
def test_install_validates_every_value_it_passes_on(tmp_path, monkeypatch, torch, needle):
    """Even a listed (verified) provenance: values reach pip only as a version / https index."""
    rel, sums = _release(tmp_path, torch, listed=True)
    with pytest.raises(VerifyError) as err:
        _install(monkeypatch, rel, sums)
    assert needle in err.value.what and "nothing" not in (err.value.next or "x")


# --------------------------------------------------------------------------- secrets


def test_receipts_never_hold_credentials(tmp_path):
    from pinwheel.wheels.provenance import write_receipt

    payload = {
        "schema": "pinwheel.provenance/1",
        "components": [{"sources": [{
            "url": "https://bot:ghp_SECRET1@example.invalid/dep.git",
            "submodules": [{"url": "https://example.invalid/sub.git?access_token=SECRET2"}],
        }]}],
    }  # fmt: skip
    text = write_receipt(tmp_path, payload).read_text()
    assert "SECRET1" not in text and "SECRET2" not in text
    assert "https://bot:***@example.invalid/dep.git" in text and "access_token=***" in text


def test_error_lines_never_print_a_token_query(tmp_path, capsys):
    url = "https://example.invalid/acme/engine.git?access_token=TOKEN123"
    manifest = tmp_path / "m.toml"
    manifest.write_text(f'[upstream]\nurl = "{url}"\ncommit = "{"a" * 40}"\n')
    rc = main(["--manifest", str(manifest), "--cache", str(tmp_path / "c"),
               "--mirror", f"{url}={tmp_path / 'no-such-mirror'}", "plan"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc != 0 and "access_token=***" in err
    assert "TOKEN123" not in err


@pytest.mark.parametrize(
    "url",
    [
        "https://u:p4ss@h.example/x?sig=S1GN&X-Amz-Signature=S1GN&private_token=S1GN#token=S1GN",
        "redis://:S1GN@cache.internal:6379",
    ],
)
def test_redaction_covers_userinfo_and_token_parameters(url):
    from pinwheel.urls import redact

    assert "S1GN" not in redact(url) and "p4ss" not in redact(url)
    assert "S1GN" not in redact(f"fetch {url} failed")


# --------------------------------------------------------------------------- markup


def _forged_headings(text: str) -> list[str]:
    """Heading lines outside fenced code blocks that carry the hostile marker."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("#") and "Forged" in line:
            found.append(line)
    return found


def _raw(text: str, *needles: str) -> list[str]:
    """Needles that occur without a Markdown backslash escape in front of their first char."""
    return [n for n in needles if re.search(r"(?<!\\)" + re.escape(n), text)]


def test_release_notes_escape_untrusted_text(tmp_path):
    from pinwheel.manifest import load
    from pinwheel.release.assemble import release_config, render_notes

    manifest = write_manifest(tmp_path)
    text = manifest.read_text().replace(
        'title = "Fix MTP init on SM70"',
        'title = "x | <img src=x onerror=alert(1)> [a](javascript:y)"',
    )
    manifest.write_text(text)
    m = load(manifest)
    build = tmp_path / "build"
    build.mkdir()
    write_provenance(build, {})
    prov = json.loads((build / "provenance.json").read_text())
    prov["steps"][0]["commits"][0]["author"] = "Eve\n## Forged author section"
    prov["components"] = [{
        "name": "engine", "kind": "engine", "wheel": "e.whl", "sha256": "0" * 64,
        "source": {"url": "https://u:SECRET@example.invalid/x.git"},
        "sources": [
            {"name": "dep", "omitted": True, "reason": "gone\n## Forged section\n<script>x</script>"},
            {"name": "dep2", "url": "https://example.invalid/d.git?access_token=SECRET",
             "commit": "c" * 40, "ref": "v1`\n# Forged heading"},
        ],
    }]  # fmt: skip
    notes = render_notes(m, prov, {}, {"model": "m\n# Forged qualification"}, release_config(m))
    lines = notes.splitlines()
    assert not _forged_headings(notes)
    assert not _raw(notes, "<img", "<script>", "](javascript", "[a]")
    assert "SECRET" not in notes
    # One table row per step: the title's '|' did not split the row into more cells.
    step_rows = [ln for ln in lines if ln.startswith("| 1 |")]
    assert len(step_rows) == 1 and step_rows[0].count(" | ") == 6 - 1


def test_report_escapes_the_servers_model_id_and_answers(tmp_path):
    from pinwheel.serve.receipt import Receipt
    from pinwheel.serve.report import render_markdown

    receipt = Receipt(
        schema="pinwheel.qualify/1", verdict="PASS", profile="cpu",
        manifest={"path": "m.toml", "name": "m", "sha256": "0" * 64}, provenance=None,
        server={"url": "http://127.0.0.1:8000", "model": "m`\n# Forged heading <script>",
                "version": "0.1\n## Forged version"},
        started="2026-12-01T00:00:00Z", seconds=1.0, markers=(), decode=(), summary={},
        concurrency=(), needles=(), gates=(), reference={},
        error="boom\n```\n# Forged after the fence",
    )  # fmt: skip
    text = render_markdown(receipt, {})
    assert not _forged_headings(text)
    # The model id stays inside its code span (literal there: no HTML, no heading).
    assert "model `m' # Forged heading <script>`" in text
    assert text.count("```") == 2  # the error's own fence did not close the block

"""Release notes name upstream PRs as owner/repo#N with links and never mention anyone."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pinwheel.manifest import load
from pinwheel.release.assemble import github_slug, release_config, render_notes
from releasekit import write_manifest, write_provenance


def _notes(tmp_path: Path, url: str) -> str:
    manifest = write_manifest(tmp_path)
    text = manifest.read_text().replace("https://example.invalid/up.git", url)
    text = text.replace(
        'title = "Fix MTP init on SM70"', 'title = "Fix MTP init (thanks @alice, cc @bob-2)"'
    )
    manifest.write_text(text)
    build = tmp_path / "b"
    build.mkdir()
    write_provenance(build, {})
    prov = json.loads((build / "provenance.json").read_text())
    prov["upstream"]["url"] = url
    prov["steps"][0]["commits"][0]["author"] = "Ada @ada-dev <ada@example.org>"
    m = load(manifest)
    return render_notes(m, prov, {}, None, release_config(m))


def test_pr_links_name_the_upstream_repository(tmp_path: Path) -> None:
    notes = _notes(tmp_path, "https://github.com/1CatAI/1Cat-vLLM.git")
    assert "[1CatAI/1Cat-vLLM#11](https://github.com/1CatAI/1Cat-vLLM/pull/11)" in notes
    assert "[1CatAI/1Cat-vLLM#12](https://github.com/1CatAI/1Cat-vLLM/pull/12)" in notes
    assert not re.search(r"\| #1[12] \|", notes)  # a bare #N links the release repo's issue


def test_mentions_are_code_and_authors_are_code_spans(tmp_path: Path) -> None:
    notes = _notes(tmp_path, "https://github.com/1CatAI/1Cat-vLLM.git")
    assert "thanks `@alice`, cc `@bob-2`" in notes
    assert "`Ada @ada-dev <ada@example.org>`" in notes
    outside_code = re.sub(r"`[^`]*`", "", notes)
    assert not re.search(r"(?<![\w])@[A-Za-z0-9]", outside_code), outside_code


def test_a_non_github_upstream_gets_no_misleading_link(tmp_path: Path) -> None:
    notes = _notes(tmp_path, "https://example.invalid/up.git")
    assert "upstream PR 11" in notes and "](https://github.com" not in notes


def test_github_slug() -> None:
    assert (
        github_slug("https://github.com/ai-bond/flash-attention-v100.git")
        == "ai-bond/flash-attention-v100"
    )
    assert github_slug("git@github.com:owner/repo") == "owner/repo"
    assert github_slug("https://github.com/owner/repo/extra") is None
    assert github_slug("https://gitlab.com/owner/repo.git") is None

"""The object store's backends are a table: a new backend is one maker and one row, and
nothing else in compile/ dispatches on the backend's name."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from pinwheel import options
from pinwheel.compile import compcache, objbackends, objstore
from pinwheel.options import AwsCredentials, SccacheStore

SRC = Path(__file__).resolve().parents[1] / "src" / "pinwheel"


KEY = "the-backend-table-tests-store-key-32-characters"  # PINWHEEL_STORE_KEY


def _plan(backend: str, env: Mapping[str, str]) -> compcache.Plan:
    return compcache.Plan(
        backend=backend, server_env=dict(env), binary=None, disabled=None, store_key=KEY,
        store=options.host(env).sccache.store,
    )


def test_a_new_backend_is_one_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    def shelf(store: SccacheStore, aws: AwsCredentials) -> objbackends.Backend:
        assert store.dir is not None
        made.append(store.dir)
        return objbackends.LocalDir(Path(store.dir))

    monkeypatch.setitem(objbackends.BACKENDS, "shelf", shelf)
    store, said = objstore.for_plan(_plan("shelf", {"SCCACHE_DIR": str(tmp_path / "s")}), cold=False)
    assert store is not None and made == [str(tmp_path / "s")], said
    assert store.backend.describe() == said


def test_an_unknown_backend_names_the_rows_there_are() -> None:
    store, why = objstore.for_plan(_plan("gcs", {}), cold=False)
    assert store is None
    assert why == "the gcs backend has no object store (local, redis, s3)"


def test_unreadable_settings_are_no_store_with_the_reason(tmp_path: Path) -> None:
    store, why = objstore.for_plan(_plan("local", {}), cold=False)
    assert store is None and why == "the local settings cannot be read: no local cache directory"
    store, why = objstore.for_plan(_plan("local", {"SCCACHE_DIR": str(tmp_path)}), cold=False)
    assert store is not None, why


def test_no_other_module_dispatches_on_a_backend_name() -> None:
    chain = re.compile(r"backend\s*(?:==|!=|in)\s*\(?\s*\"(?:local|redis|s3)\"")
    found = [
        f"{p.relative_to(SRC)}:{n}"
        for p in sorted((SRC / "compile").rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if chain.search(line) and p.name != "compcache.py"  # sccache's own settings
    ]
    assert not found, found

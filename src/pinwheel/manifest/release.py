"""The ``[release]`` and ``[model]`` tables: where a release goes and the pack it serves."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pinwheel import validate
from pinwheel.manifest.table import Table


@dataclass(frozen=True)
class IndexTarget:
    url: str  # twine --repository-url (an upload endpoint of a PEP 503 index)


@dataclass(frozen=True)
class GithubTarget:
    repo: str  # owner/name
    tag: str | None  # default: [result].tag


@dataclass(frozen=True)
class HubTarget:
    repo: str
    revision: str  # branch the upload commits to
    parent_commit: str | None  # pin: refuse if the branch moved since
    repo_type: str
    path_in_repo: str


@dataclass(frozen=True)
class SigstoreIdentity:
    """Who must have signed a Sigstore bundle beside the release (``[release.sigstore]``):
    the certificate's SAN is ``https://github.com/REPOSITORY/WORKFLOW@refs/tags/TAG`` and
    its OIDC issuer is ``issuer``."""

    repository: str | None  # owner/name; default: [release.github] repo
    workflow: str  # default: .github/workflows/release.yml (this repository's)
    issuer: str  # default: GitHub Actions' OIDC issuer


DEFAULT_SIGSTORE_WORKFLOW = ".github/workflows/release.yml"
GITHUB_ACTIONS_ISSUER = "https://token.actions.githubusercontent.com"


@dataclass(frozen=True)
class ReleaseConfig:
    source: Path  # the build output (wheels/)
    dir: Path  # where `pinwheel release` assembles
    signing_key: Path | None
    allowed_signers: Path | None
    principal: str | None
    torch_backend: str | None
    index: IndexTarget | None
    github: GithubTarget | None
    huggingface: HubTarget | None
    sigstore: SigstoreIdentity


def _path(t: Table, key: str, default: str | None = None) -> Path | None:
    value = t.str(key, default)
    if value is None:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else t.source.parent / path


def repo_problem(value: object) -> str | None:
    if not isinstance(value, str) or value.count("/") != 1:
        return "owner/name"
    owner, name = value.split("/")
    return validate.identifier_problem(owner) or validate.identifier_problem(name)


def _path_in_repo_problem(value: object) -> str | None:
    return None if value == "." else validate.rel_path_problem(value)


def _workflow_problem(value: object) -> str | None:
    if validate.rel_path_problem(value) or not re.fullmatch(
        r"\.github/workflows/[A-Za-z0-9_.\-]+\.ya?ml", str(value)
    ):
        return ".github/workflows/NAME.yml"
    return None


def _issuer_problem(value: object) -> str | None:
    pattern = r"https://[A-Za-z0-9.\-]+(/[\w.\-/]*)?"
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        return "an https:// URL"
    return None


def _principal_problem(value: object) -> str | None:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.@+\-]*", value):
        return "letters, digits and . _ @ + - (an email-like identity)"
    return None


def parse_release_table(t: Table) -> ReleaseConfig:
    t.only(
        "source",
        "dir",
        "signing_key",
        "allowed_signers",
        "principal",
        "torch_backend",
        "index",
        "github",
        "huggingface",
        "sigstore",
    )
    index = github = hub = None
    if t.has("index"):
        it = t.sub("index")
        it.only("url")
        index_url = it.str("url")
        if validate.index_url_problem(index_url):
            raise it.error(
                "url", "an https:// (or http://) upload URL of a package index", index_url
            )
        index = IndexTarget(url=index_url)
    if t.has("github"):
        gt = t.sub("github")
        gt.only("repo", "tag")
        repo = gt.checked("repo", repo_problem, "owner/name")
        github = GithubTarget(
            repo=repo, tag=gt.checked("tag", validate.tag_problem, "a release tag name", None)
        )
    if t.has("huggingface"):
        ht = t.sub("huggingface")
        ht.only("repo", "revision", "parent_commit", "repo_type", "path_in_repo")
        hub = HubTarget(
            repo=ht.checked("repo", repo_problem, "owner/name"),
            revision=ht.checked("revision", validate.ref_problem, "a branch name", "main"),
            parent_commit=ht.sha("parent_commit", None),
            repo_type=ht.choice("repo_type", ("model", "dataset"), "model"),
            path_in_repo=ht.checked(
                "path_in_repo", _path_in_repo_problem, "a relative path in the repo", "."
            ),
        )
    repository, workflow, issuer = None, DEFAULT_SIGSTORE_WORKFLOW, GITHUB_ACTIONS_ISSUER
    if t.has("sigstore"):
        st = t.sub("sigstore")
        st.only("repository", "workflow", "issuer")
        repository = st.checked("repository", repo_problem, "owner/name", None)
        workflow = st.checked(
            "workflow", _workflow_problem, "a workflow file's path in the repository", workflow
        )
        issuer = st.checked("issuer", _issuer_problem, "an https:// OIDC issuer URL", issuer)
    sigstore = SigstoreIdentity(
        repository=repository or (github.repo if github else None),
        workflow=workflow,
        issuer=issuer,
    )
    return ReleaseConfig(
        source=_path(t, "source", "wheels"),  # type: ignore[arg-type]
        dir=_path(t, "dir", "release"),  # type: ignore[arg-type]
        signing_key=_path(t, "signing_key"),
        allowed_signers=_path(t, "allowed_signers"),
        principal=t.checked("principal", _principal_problem, "a signer identity", None),
        torch_backend=t.checked(
            "torch_backend", validate.identifier_problem, "a backend name like cu128", None
        ),
        index=index,
        github=github,
        huggingface=hub,
        sigstore=sigstore,
    )


@dataclass(frozen=True)
class ModelConfig:
    repo: str | None  # fetch refuses without it; check works offline without it
    revision: str | None  # full commit SHA; fetch refuses without it
    shards: int | None
    total_bytes: int | None  # sum of the shard files' sizes
    config: Mapping[str, Any]  # dotted config.json key -> required value
    sha256: Mapping[str, str]  # file -> sha256
    local_dir: str | None


def parse_model_table(t: Table) -> ModelConfig:
    t.only("repo", "revision", "shards", "total_bytes", "config", "sha256", "local_dir")
    required: dict[str, Any] = {}
    if t.has("config"):
        ct = t.sub("config")
        for key, value in ct.data.items():
            if isinstance(value, dict | list):
                raise ct.error(
                    key, "a string, number or boolean (use dotted keys for nesting)", value
                )
            required[key] = value
    hashes: dict[str, str] = {}
    if t.has("sha256"):
        st = t.sub("sha256")
        for name in st.data:
            if validate.rel_path_problem(name):
                raise st.error(name, "a file path inside the model pack (no '/', '..')", name)
            hashes[name] = st.sha256(name)
    return ModelConfig(
        repo=t.checked("repo", repo_problem, "owner/name", None),
        revision=t.sha("revision", None),
        shards=t.int("shards", None, minimum=1),
        total_bytes=t.int("total_bytes", None, minimum=1),
        config=required,
        sha256=hashes,
        local_dir=t.str("local_dir", None),
    )

"""Publishing to the Hugging Face Hub: the release folder committed to a repository at a
branch (``release.hub``, the only Hugging Face code; not tested here: the hub cannot be
reached where pinwheel is tested)."""

from __future__ import annotations

from pinwheel.errors import UsageError
from pinwheel.release.targets.contract import Published, PublishRequest


class HuggingFace:
    name = "hf"
    summary = "a Hugging Face Hub repository ([release.huggingface]), by huggingface_hub"
    flags = ()

    def publish(self, request: PublishRequest) -> Published:
        from pinwheel.release.hub import upload_folder

        hub = request.config.huggingface
        if hub is None:
            raise UsageError(
                "no Hugging Face target",
                where="[release.huggingface] repo",
                next="set [release.huggingface] repo and revision",
            )
        directory, manifest = request.release.dir, request.manifest
        url = upload_folder(
            directory,
            repo=hub.repo,
            revision=hub.revision,
            parent_commit=hub.parent_commit,
            repo_type=hub.repo_type,
            path_in_repo=hub.path_in_repo,
            message=f"pinwheel release {manifest.result.tag or manifest.name}",
        )
        return Published(
            {"repo": hub.repo, "revision": hub.revision, "commit": url},
            f"uploaded {directory} to {hub.repo}@{hub.revision}: {url}",
        )


TARGET = HuggingFace()

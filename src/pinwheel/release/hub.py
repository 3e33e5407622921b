"""The only code that talks to the Hugging Face Hub: one upload, one download.

NOT TESTED: the hub cannot be reached where pinwheel is developed and tested.
Everything before (release assembly, verification) and after (``model check``)
is tested; these two calls are kept small so reading them is the review.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pinwheel.errors import PinwheelError


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise PinwheelError(
            "huggingface_hub is not installed",
            next="`pip install -e '.[release]'` from the pinwheel checkout",
        ) from None
    return huggingface_hub


def upload_folder(
    folder: Path,
    *,
    repo: str,
    revision: str,
    parent_commit: str | None,
    repo_type: str,
    path_in_repo: str,
    message: str,
) -> str:
    """Commit ``folder`` to ``repo`` at branch ``revision``; returns the commit URL.

    ``parent_commit`` pins the branch head we expect: the hub refuses the commit
    if someone pushed in between, instead of silently stacking on their work.
    """
    hub = _hub()
    info = hub.HfApi().upload_folder(
        folder_path=str(folder),
        repo_id=repo,
        repo_type=repo_type,
        revision=revision,
        path_in_repo=path_in_repo,
        commit_message=message,
        parent_commit=parent_commit,
    )
    return str(getattr(info, "commit_url", info))


def snapshot_download(
    *, repo: str, revision: str, local_dir: Path, allow_patterns: list[str] | None = None
) -> Path:
    """Download ``repo`` at the pinned commit ``revision`` into ``local_dir`` (resumes)."""
    hub = _hub()
    path = hub.snapshot_download(
        repo_id=repo,
        revision=revision,
        local_dir=str(local_dir),
        allow_patterns=allow_patterns,
    )
    return Path(path)

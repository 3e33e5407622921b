"""Stage 0, the manifest: ``manifest.toml`` in, one frozen, validated :class:`Manifest` out.

``model`` holds the core (upstream, steps, identity, result) and ``load``;
``build``, ``release`` and ``serve`` type the stage tables; ``table`` is the
reader they all use. Every other stage takes its inputs from here; nothing
else reads TOML.
"""

from pinwheel.manifest.model import (
    CORE_TABLES,
    STAGE_TABLES,
    Identity,
    Manifest,
    Result,
    Upstream,
    load,
    loads,
)
from pinwheel.manifest.steps import ACTIONS, Resolution, Step
from pinwheel.manifest.table import FULL_SHA, SHA256, SHORT_SHA, Table, check_file_sha

__all__ = [
    "ACTIONS",
    "CORE_TABLES",
    "FULL_SHA",
    "SHA256",
    "SHORT_SHA",
    "STAGE_TABLES",
    "Identity",
    "Manifest",
    "Resolution",
    "Result",
    "Step",
    "Table",
    "Upstream",
    "check_file_sha",
    "load",
    "loads",
]

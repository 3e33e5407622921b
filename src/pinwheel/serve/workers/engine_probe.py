"""Preflight's engine probe, in the engine's Python: where MODULE is and its version.

Argument: MODULE. Prints one JSON object: python, path, version.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util as u
import json
import sys

spec = u.find_spec(sys.argv[1])
loc = list(spec.submodule_search_locations or []) if spec else []
version: str | None
try:
    version = md.version(sys.argv[1])
except md.PackageNotFoundError:
    version = next(
        (
            d.version
            for d in md.distributions()
            if (d.metadata["Name"] or "").lower().startswith(sys.argv[1])
        ),
        None,
    )
print(
    json.dumps(
        {"python": list(sys.version_info[:3]), "path": loc[0] if loc else None, "version": version}
    )
)

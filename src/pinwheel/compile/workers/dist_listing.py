"""Runs in the build's Python: every distribution it can import, first on sys.path first.

Arguments: the locked venv's site-packages, then optionally a JSON object naming where
other directories' packages come from ({directory: "torch-lock"}: a torch venv pinwheel made
from a hashed lock). Prints one JSON list: name, version, the sha256 of its RECORD lines less
what an installer writes for its own machine, where it comes from ("lock", a label given for
its directory, else "machine"), and whether an earlier entry shadows it (compile.lockedvenv
records it in provenance).
"""

import hashlib
import json
import os
import sys
from importlib.metadata import distributions

SKIP = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}
own = os.path.realpath(sys.argv[1])
labels = {os.path.realpath(k): str(v) for k, v in
          (json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}).items()}
seen, out = set(), []
for entry in sys.path:
    if not entry or not os.path.isdir(entry):
        continue
    for dist in sorted(distributions(path=[entry]), key=lambda d: str(d.metadata["Name"])):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-").replace(".", "-")
        lines = []
        for line in (dist.read_text("RECORD") or "").splitlines():
            path = line.rsplit(",", 2)[0]
            if not path or path.startswith("..") or path.split("/")[-1] in SKIP:
                continue
            if "__pycache__/" in path:
                continue
            lines.append(line)
        digest = hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()
        out.append({"name": name, "version": dist.version, "record_sha256": digest,
                    "from": "lock" if os.path.realpath(entry) == own
                    else labels.get(os.path.realpath(entry), "machine"),
                    "shadowed": name in seen})
        seen.add(name)
print(json.dumps(out))

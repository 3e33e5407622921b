"""Runs in the build's Python, started ``-I -S``: every distribution it would import, first
on its path first, and the files of its own site-packages held to their RECORDs.

``-S``: the site module does not run, so no ``.pth`` file and no ``sitecustomize`` /
``usercustomize`` executes while the venv is listed (a hand-placed one would otherwise
run inside the check that is meant to catch it). The path the build's Python would have
is made here instead, without executing anything: the interpreter's own entries, then the
locked venv's site-packages, then the folders its ``.pth`` files name (``import`` lines
are never run; a ``.pth`` no locked distribution installed is a problem).

Arguments: the locked venv's site-packages, a JSON object naming where other directories'
packages come from ({directory: "torch-lock"}: a torch venv pinwheel made from a hashed
lock), and the names of files in site-packages pinwheel itself writes (its overlay
``.pth``), and "0" to skip hashing the files (their signed stat memo holds:
compile.venvmemo). Prints two JSON lines: the problems ({"unowned": [...], "modified":
[...], "hashed": how many files were hashed}),
then the list: name, version, the sha256 of its RECORD lines less what an installer
writes for its own machine, where it comes from ("lock", a label given for its directory,
else "machine"), and whether an earlier entry shadows it (compile.lockedvenv records it).
"""

import base64
import hashlib
import json
import os
import sys
from importlib.metadata import distributions

SKIP = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}
STARTUP = ("sitecustomize", "usercustomize")  # modules Python imports at every start
own = os.path.realpath(sys.argv[1])
labels = {os.path.realpath(k): str(v) for k, v in
          (json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}).items()}
ours = set(json.loads(sys.argv[3])) if len(sys.argv) > 3 else set()
hash_files = sys.argv[4] != "0" if len(sys.argv) > 4 else True
hashed = 0


def pth_folders(site):
    """Folders the .pth files of ``site`` add, as site.addpackage would (never executing)."""
    found = []
    for name in sorted(os.listdir(site)):
        if not name.endswith(".pth") or not os.path.isfile(os.path.join(site, name)):
            continue
        with open(os.path.join(site, name), encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip()
                if not line or line.startswith("#") or line.startswith(("import ", "import\t")):
                    continue
                folder = os.path.join(site, line)
                if os.path.isdir(folder):
                    found.append(folder)
    return found


def file_problems(dist, site):
    """Files of ``dist`` (in ``site``) whose bytes are not the sha256 its RECORD names."""
    global hashed
    bad = []
    for line in (dist.read_text("RECORD") or "").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) != 3 or not parts[1].startswith("sha256=") or parts[0].startswith(".."):
            continue
        path = os.path.join(site, parts[0])
        hashed += 1
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
        except OSError:
            bad.append(parts[0])
            continue
        want = parts[1][len("sha256="):]
        if base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() != want:
            bad.append(parts[0])
    return bad


path = [p for p in sys.path if p and os.path.realpath(p) != own] + [own, *pth_folders(own)]
seen, out, owned, modified = set(), [], set(), []
for entry in path:
    if not entry or not os.path.isdir(entry):
        continue
    real = os.path.realpath(entry)  # once per folder, not per RECORD line
    mine = real == own
    found = []
    for dist in distributions(path=[entry]):
        meta = dist.metadata  # parsed once: each .metadata parses METADATA again
        found.append((str(meta["Name"]), meta, dist))
    for _key, meta, dist in sorted(found, key=lambda f: f[0]):
        name = (meta["Name"] or "").lower().replace("_", "-").replace(".", "-")
        lines = []
        for line in (dist.read_text("RECORD") or "").splitlines():
            path_ = line.rsplit(",", 2)[0]
            if mine and path_:
                owned.add(path_.split("/")[0])
            if not path_ or path_.startswith("..") or path_.split("/")[-1] in SKIP:
                continue
            if "__pycache__/" in path_:
                continue
            lines.append(line)
        if mine and hash_files:
            modified += [f"{name}: {p}" for p in file_problems(dist, entry)]
        digest = hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()
        out.append({"name": name, "version": meta["Version"], "record_sha256": digest,
                    "from": "lock" if mine else labels.get(real, "machine"),
                    "shadowed": name in seen})
        seen.add(name)
unowned = sorted(
    n for n in os.listdir(own)
    if (n.endswith(".pth") or n.split(".")[0] in STARTUP) and n not in owned and n not in ours
)
print(json.dumps({"unowned": unowned, "modified": sorted(modified),
                  "hashed": hashed}))
print(json.dumps(out))

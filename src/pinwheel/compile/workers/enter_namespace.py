"""Inside the build's new mount namespace: a tmpfs at the canonical root, the real cache
(and toolkit) bound at their canonical paths, header views bound over their folders, the
toolkit's front ends covered by a launcher that runs each at a fixed pid; then exec the
build in ``cwd``. Run by ``sys.executable -I`` (see compile/canonical.py).

Arguments: ROOT CWD N (REAL CANON)*N M (COPY COVERS)*M K FRONT*K -- CMD...

A front end's launcher: the program itself is bound at ROOT/.pid/I/NAME first, then a
``/bin/sh`` script bound over its path execs ``unshare --pid --fork --kill-child`` with
it: the program runs as process 1 of a PID namespace of its own (this namespace's root may
make one), whoever starts it and however many run at once.
"""

import os
import shlex
import shutil
import subprocess
import sys

root, cwd, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
pairs = sys.argv[4 : 4 + 2 * n]
m = int(sys.argv[4 + 2 * n])
views = sys.argv[5 + 2 * n : 5 + 2 * n + 2 * m]
k = int(sys.argv[5 + 2 * n + 2 * m])
fronts = sys.argv[6 + 2 * n + 2 * m : 6 + 2 * n + 2 * m + k]
cmd = sys.argv[7 + 2 * n + 2 * m + k :]
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "--", "pinwheel", root], check=True)
for real, canon in zip(pairs[::2], pairs[1::2], strict=True):
    os.makedirs(canon)
    subprocess.run(["mount", "--rbind", "--", real, canon], check=True)
for copy, covers in zip(views[::2], views[1::2], strict=True):
    subprocess.run(["mount", "--bind", "--", copy, covers], check=True)
unshare = shutil.which("unshare") if fronts else None
for i, front in enumerate(fronts):
    if unshare is None:
        raise SystemExit("pinwheel: no unshare on PATH for the fixed-pid front ends")
    place = os.path.join(root, ".pid", str(i))
    os.makedirs(place)
    stash = os.path.join(place, os.path.basename(front))
    open(stash, "wb").close()
    subprocess.run(["mount", "--bind", "--", front, stash], check=True)
    launcher = os.path.join(place, "launcher")
    run = f"{shlex.quote(unshare)} --pid --fork --kill-child -- {shlex.quote(stash)}"
    with open(launcher, "w") as f:
        f.write(f'#!/bin/sh\nexec {run} "$@"\n')
    os.chmod(launcher, 0o755)
    subprocess.run(["mount", "--bind", "--", launcher, front], check=True)
os.chdir(cwd)
os.execvp(cmd[0], cmd)

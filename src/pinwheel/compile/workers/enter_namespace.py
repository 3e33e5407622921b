"""Inside the build's new mount namespace: a tmpfs at the canonical root, the real cache
(and toolkit) bound at their canonical paths, header views bound over their folders;
then exec the build in ``cwd``. Run by ``sys.executable -I`` (see compile/canonical.py).

Arguments: ROOT CWD N (REAL CANON)*N M (COPY COVERS)*M -- CMD...
"""

import os
import subprocess
import sys

root, cwd, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
pairs = sys.argv[4 : 4 + 2 * n]
m = int(sys.argv[4 + 2 * n])
views = sys.argv[5 + 2 * n : 5 + 2 * n + 2 * m]
cmd = sys.argv[6 + 2 * n + 2 * m :]
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "--", "pinwheel", root], check=True)
for real, canon in zip(pairs[::2], pairs[1::2], strict=True):
    os.makedirs(canon)
    subprocess.run(["mount", "--rbind", "--", real, canon], check=True)
for copy, covers in zip(views[::2], views[1::2], strict=True):
    subprocess.run(["mount", "--bind", "--", copy, covers], check=True)
os.chdir(cwd)
os.execvp(cmd[0], cmd)

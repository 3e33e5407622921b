"""Runs in the interpreter the venv is based on (-I: no PYTHONPATH, no user site).

Prints one JSON line: the base interpreter, its version, its site folders and the PEP 508
marker values (compile.lockedvenv evaluates the lock's markers with them).
"""

import json
import os
import platform
import sys

site: list[str] = []
for p in sys.path:
    if site or os.path.basename(p) in ("site-packages", "dist-packages"):
        if p and os.path.isdir(p):
            site.append(os.path.realpath(p))
base = getattr(sys, "_base_executable", None) or sys.executable
markers = {
    "implementation_name": sys.implementation.name,
    "implementation_version": platform.python_version(),
    "os_name": os.name, "platform_machine": platform.machine(),
    "platform_release": platform.release(), "platform_system": platform.system(),
    "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "sys_platform": sys.platform,
}
print(json.dumps({"base": os.path.realpath(base), "version": platform.python_version(),
                  "site": site, "markers": markers}))
